"""`plan --model S --teacher T ...` (distillation) and `plan --task grpo|ppo|dpo ...` (RL):
the options into planner.training.posttrain's set-ups, the search, the report, --out."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from planner.cli.common import check_quiet, note, written_text
from planner.cli.options import Options
from planner.cli.request import build_request, timing
from planner.errors import UserError
from planner.training.posttrain import RL_TASKS, DistillDefaults, RLDefaults, teacher_weight_bytes

if TYPE_CHECKING:
    from planner.hardware.gpus import GpuSpec
    from planner.layouts.layout import SearchSpace
    from planner.models.spec import ModelSpec
    from planner.search.posttrain import PosttrainPlan
    from planner.training.setup import TrainingSetup


def refuse_unsupported(o: Options) -> None:
    """What the post-training plans do not take, each with its way out."""
    if o.tokens is not None and o.teacher is None:
        raise UserError("--tokens sets a distillation's length; an RL run's is --rl-steps N")
    if o.plot is not None:
        raise UserError("--plot draws a training plan; post-training plans print their phases instead")
    if o.method not in (None, "full"):
        raise UserError("post-training plans train the full model; drop --method")
    if o.crosscheck:
        raise UserError("--crosscheck compares a plain training plan with DeepSpeed's estimators; drop it here")


# options of one kind of post-training, with the default a plan without it sees (cli.options.Options)
DISTILL_ONLY = tuple(f.name for f in fields(DistillDefaults))
RL_ONLY = (*(f.name for f in fields(RLDefaults)), "rl_steps")


def stray_option(o: Options) -> str | None:
    """A distillation option without --teacher or an RL option without --task grpo|ppo|dpo
    (they would be ignored): the refusal, or None."""
    defaults = {f.name: f.default for f in fields(Options)}
    if o.teacher is None:
        given = [n for n in DISTILL_ONLY if getattr(o, n) != defaults[n]]
        if given:
            return f"--{given[0].replace('_', '-')} is a distillation option: it needs --teacher"
    if o.task not in RL_TASKS:
        given = [n for n in RL_ONLY if getattr(o, n) != defaults[n]]
        if given:
            return f"--{given[0].replace('_', '-')} is an RL option: it needs --task grpo, ppo or dpo"
    return None


def posttrain(o: Options) -> None:
    """Distillation (--teacher) or RL (--task grpo|ppo|dpo)."""
    check_quiet(o)
    refuse_unsupported(o)
    stray = stray_option(o)
    if stray:
        raise UserError(stray)
    if o.teacher is not None and o.task == "load":
        raise UserError("--teacher plans a distillation run; --task load sizes inference: give one of them")
    if o.teacher is not None and o.task in RL_TASKS:
        raise UserError(f"--teacher distils with a logit loss; --task {o.task} trains from rewards: give one of them")
    if o.task in RL_TASKS:
        from planner.training.setup import MAX_SEQ_LEN

        if o.prompt_len + o.response_len > MAX_SEQ_LEN:
            raise UserError(f"--prompt-len + --response-len = {o.prompt_len + o.response_len:,} tokens exceeds "
                            f"{MAX_SEQ_LEN:,}; shorten one of them")
        o = replace(o, seq_len=o.prompt_len + o.response_len)
    m, gpu, setup, space, n_gpus = build_request(o)
    t = timing(o, gpu)
    plan: PosttrainPlan
    if o.teacher is not None:
        plan = distill(o, m, gpu, setup, space, n_gpus, t)
        if o.tokens is not None:        # whole steps of the global batch
            plan = replace(plan, steps=max(1, math.ceil(o.tokens / (setup.global_batch * setup.seq_len))))
    else:
        plan = replace(rl(o, m, gpu, setup, space, n_gpus, t), steps=o.rl_steps)
    from planner.report import posttrain as report

    written: list[Path] = []
    if o.out is not None and plan.fits:
        from planner.emit.posttrain import POSTTRAIN_FILE_NAMES, posttrain_files
        from planner.emit.write import write_files

        written = write_files(o.out, posttrain_files(plan, report.posttrain_json(plan)), force=o.force,
                              owned=POSTTRAIN_FILE_NAMES)
    if o.as_json:
        click.echo(json.dumps(report.posttrain_json(plan), indent=2))
    elif o.quiet:
        click.echo(report.posttrain_quiet(plan))
    else:
        click.echo(report.posttrain_text(plan))
    if written:
        note(written_text(o.out, written), o.aside)
    if not plan.fits:
        if o.out is not None:
            raise UserError(f"no plan fits, so nothing was written to --out {o.out}")
        sys.exit(2)


def distill(o: Options, m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, space: SearchSpace, n_gpus: int | None,
            t: dict[str, Any]) -> PosttrainPlan:
    from planner.models.spec import load_model
    from planner.search.posttrain import plan_distill
    from planner.training.posttrain import DistillSetup

    assert o.teacher is not None
    teacher = load_model(o.teacher)
    if teacher.vocab_size != m.vocab_size:
        raise UserError(f"--teacher {o.teacher} has a vocabulary of {teacher.vocab_size:,} tokens and {m.name} "
                        f"{m.vocab_size:,}: a logit loss needs one tokenizer; pick a teacher of the same family")
    d = DistillSetup(teacher=teacher.name, teacher_weight_bytes=teacher_weight_bytes(o.teacher_precision),
                     teacher_quant=o.teacher_quant, teacher_sharding=o.teacher_sharding, kd_loss=o.kd_loss,
                     kd_hidden_layers=o.kd_hidden_layers, offline_topk=o.kd_offline_topk)
    if d.kd_hidden_layers > min(m.n_layers, teacher.n_layers):
        raise UserError(f"--kd-hidden-layers {d.kd_hidden_layers} exceeds the layers of the student "
                        f"({m.n_layers}) or the teacher ({teacher.n_layers})")
    if d.offline_topk and d.offline_topk > m.vocab_size:
        raise UserError(f"--kd-offline-topk {d.offline_topk} exceeds the vocabulary ({m.vocab_size:,})")
    return plan_distill(m, teacher, gpu, setup, d, space, n_gpus=n_gpus, max_gpus=o.max_gpus,
                        cluster=t["cluster"], efficiency=t["efficiency"])


def rl(o: Options, m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, space: SearchSpace, n_gpus: int | None,
       t: dict[str, Any]) -> PosttrainPlan:
    from planner.search.posttrain import plan_rl, splits_kv_heads
    from planner.training.posttrain import RLSetup

    if not splits_kv_heads(m, o.rollout_tp):
        raise UserError(f"--rollout-tp {o.rollout_tp} does not split the {m.n_kv_heads} KV heads of {m.name} evenly")
    if n_gpus is not None and n_gpus % o.rollout_tp:
        raise UserError(f"--rollout-tp {o.rollout_tp} does not divide --n-gpus {n_gpus}")
    rls = RLSetup(task=o.task, prompt_len=o.prompt_len, response_len=o.response_len, response_mean=o.response_mean,
                  group_size=o.group_size,
                  prompts_per_step=o.prompts_per_step, placement=o.rollout, engine_tp=o.rollout_tp,
                  engine_memory_fraction=o.rollout_memory_fraction, offload_train_states=o.offload_train_states,
                  off_policy_steps=o.rl_async)
    return plan_rl(m, gpu, setup, rls, space, n_gpus=n_gpus, max_gpus=o.max_gpus,
                   cluster=t["cluster"], efficiency=t["efficiency"])


def measure_teacher(o: Options, m: Any, hf_config: dict[str, Any], setup: Any, lay: Any) -> None:
    """`plan measure --teacher T`: a distillation step under MemTracker beside the prediction."""
    from planner.fmt import gib
    from planner.measure.distill import compare_distill
    from planner.models.spec import load_hf_config, load_model
    from planner.training.posttrain import DistillSetup

    assert o.teacher is not None
    if lay.n_gpus > 1:
        raise UserError("plan measure --teacher runs one process: drop --dp/--tp/--pp (the teacher's terms are "
                        "per rank; sharding divides them)")
    teacher = load_model(o.teacher)
    if teacher.vocab_size != m.vocab_size:
        raise UserError(f"--teacher {o.teacher} has a vocabulary of {teacher.vocab_size:,} tokens and {m.name} "
                        f"{m.vocab_size:,}: a logit loss needs one tokenizer")
    if o.kd_offline_topk:
        raise UserError("plan measure --teacher measures online distillation: drop --kd-offline-topk")
    d = DistillSetup(teacher=teacher.name, teacher_weight_bytes=teacher_weight_bytes(o.teacher_precision),
                     kd_loss=o.kd_loss, kd_hidden_layers=o.kd_hidden_layers)
    c = compare_distill(m, teacher, hf_config, load_hf_config(o.teacher), setup, d, lay)
    if o.as_json:
        click.echo(json.dumps({"model": m.name, "teacher": teacher.name, "predicted_bytes": c.predicted_bytes,
                               "measured_bytes": c.measured_bytes, "error": c.error,
                               "predicted_student_bytes": c.predicted_student_bytes,
                               "measured_student_bytes": c.measured_student_bytes,
                               "predicted_extra_bytes": c.predicted_extra_bytes, "extra_error": c.extra_error,
                               "terms": c.terms, "peak_phase": c.measured.peak_phase}, indent=2))
        return
    line = (f"{m.name} distilled from {teacher.name}: predicted {gib(c.predicted_bytes, 4)}, measured "
            f"{gib(c.measured_bytes, 4)} ({c.error:+.1%})")
    if o.quiet:
        click.echo(line)
        return
    click.echo("\n".join([
        line,
        f"  student's own step: predicted {gib(c.predicted_student_bytes, 4)}, "
        f"measured {gib(c.measured_student_bytes, 4)}",
        f"  the teacher's terms: predicted {gib(c.predicted_extra_bytes, 4)}, measured "
        f"{gib(c.measured_bytes - c.measured_student_bytes, 4)} ({c.extra_error:+.1%}); "
        f"peak at the {c.terms['peak_moment']}",
        "  MemTracker on the CPU, tracked tensors only (no CUDA context, NCCL or fragmentation)"]))
