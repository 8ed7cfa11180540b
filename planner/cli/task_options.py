"""click's options of what trains: the fine-tuning method (LoRA, QLoRA, freeze), --task (training,
inference memory, RL), distillation (--teacher) and RL settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from planner.cli.complete import complete_models
from planner.cli.options import apply_options, default_of
from planner.cli.types import FiniteFloatRange
from planner.training.finetune import (
    FREEZE_TRAINABLE_LAYERS,
    LORA_ALPHA,
    LORA_RANK,
    METHODS,
    QLORA_ALPHA,
    QLORA_RANK,
    QUANTS,
)
from planner.training.posttrain import (
    DISTILL_DEFAULTS,
    KD_CHUNKS,
    KD_LOSSES,
    RL_DEFAULTS,
    RL_TASKS,
    ROLLOUT_PLACEMENTS,
    TEACHER_SHARDINGS,
    TEACHER_WEIGHT_BYTES,
)
from planner.training.setup import DEFAULT_SETUP as _S
from planner.training.setup import (
    MAX_SEQ_LEN,
)

_DD, _RD = DISTILL_DEFAULTS, RL_DEFAULTS


def method_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The fine-tuning method (planner.training.finetune), for `plan` and `plan measure`."""
    return apply_options([
        click.option("--method", type=click.Choice([*METHODS, "auto"]), default="full", show_default=True,
                     help="What trains: full; lora (16-bit frozen base, adapters); qlora (4-bit NF4 base, "
                          "16-bit adapters, paged 8-bit AdamW); freeze (only the last blocks); auto: full, "
                          "lora or qlora, whichever fits on the fewest GPUs (full first on a tie)."),
        click.option("--lora-rank", type=click.IntRange(1, 65536), default=None,
                     help=f"LoRA rank r  [default: {LORA_RANK}; qlora: {QLORA_RANK}]."),
        click.option("--lora-alpha", type=click.IntRange(1, 1 << 20), default=None,
                     help="LoRA alpha (scales the update, costs no memory)  "
                          f"[default: {LORA_ALPHA}; qlora: {QLORA_ALPHA}]."),
        click.option("--lora-targets", metavar="LIST", default=None,
                     help="Comma-separated layers to adapt: attention, mlp, all-linear, or module names "
                          "(q_proj,v_proj)  [default: PEFT's for the architecture; qlora: all-linear]."),
        click.option("--lora-dropout", type=FiniteFloatRange(0, 1, max_open=True), default=None,
                     help="LoRA dropout; > 0 keeps a mask and a copy of each adapted input  [default: 0]."),
        click.option("--quant", type=click.Choice(QUANTS), default=None,
                     help="Store the frozen base's linear weights as int8, int4 or nf4 (--method lora, "
                          "or --task load)  [default: none; qlora: nf4]."),
        click.option("--trainable-layers", type=click.IntRange(1, 1 << 20), default=None,
                     help="With --method freeze: how many of the last blocks train  "
                          f"[default: {FREEZE_TRAINABLE_LAYERS}]."),
        click.option("--images-per-sample", type=click.IntRange(0, 4096), default=_S.images_per_sample,
                     metavar="N",
                     help="Vision-language models: N images in each sequence, at the size the config gives; their "
                          "tokens count within --seq-len  [default: 0, text-only data: the image side's weights "
                          "are still held]."),
        click.option("--freeze-vision/--train-vision", default=True,
                     help="Vision-language models: keep the vision encoder and projector frozen (weights only, "
                          "forward only), as LLaMA-Factory's defaults do, or train them (--method full)  "
                          "[default: --freeze-vision]."),
    ], f)



# memory.inference.MLA_CACHES, spelt here so that the CLI's import loads no numpy
# (tests/test_inference.py checks they agree)
MLA_CACHES = ("latent", "per-head")


def task_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`plan --task load`: inference memory instead of a training plan."""
    f = click.option(
        "--mla-cache", type=click.Choice(MLA_CACHES), default=None,
        help="--task load, MLA models (DeepSeek-V3, Kimi K2): latent caches the compressed latent and "
             "the rotary key (projections absorbed: vLLM, SGLang, transformers 5); per-head caches each "
             "head's K and V (not absorbed)  [default: latent].")(f)
    return click.option(
        "--task", type=click.Choice(["train", "load", *RL_TASKS]), default=default_of("task"), show_default=True,
        help="train: a training plan; load: the memory to hold the model for inference (weights at "
             "--precision or --quant, KV cache for --micro-batch sequences of --seq-len tokens); grpo, ppo, "
             "dpo: an RL step with its rollout engine, memory and time by phase (docs/post-training.md).")(f)


def distill_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Distillation (--teacher) settings, for `plan` and `plan measure` (docs/post-training.md)."""
    return apply_options([
        click.option("--teacher", metavar="NAME|PATH", default=None, shell_complete=complete_models,
                     help="Distil --model from this teacher (a preset or config.json): its frozen weights, "
                          "forward, logits and the KD loss join the plan."),
        click.option("--teacher-precision", type=click.Choice(list(TEACHER_WEIGHT_BYTES)),
                     default=_DD.teacher_precision, show_default=True),
        click.option("--teacher-quant", type=click.Choice(QUANTS), default=_DD.teacher_quant, show_default=True,
                     help="Store the teacher's linear weights as int8, int4 or nf4."),
        click.option("--teacher-sharding", type=click.Choice(TEACHER_SHARDINGS), default=_DD.teacher_sharding,
                     show_default=True, help="Hold the teacher whole on each GPU, sharded over dp (FSDP, "
                                             "torchtune) or split like the student over tp x pp (ModelOpt); auto: "
                                             "the least memory the layout allows."),
        click.option("--kd-loss", type=click.Choice(KD_LOSSES), default=_DD.kd_loss, show_default=True,
                     help=f"torchtune's KL loss over {KD_CHUNKS} token chunks, or over all tokens at once."),
        click.option("--kd-hidden-layers", type=click.IntRange(0, 1024), default=_DD.kd_hidden_layers,
                     show_default=True,
                     help="Hidden-state (MSE) losses on N layer pairs beside the logit loss."),
        click.option("--kd-offline-topk", type=click.IntRange(0, 1 << 20), default=_DD.kd_offline_topk,
                     show_default=True,
                     help="Distil offline from stored top-k teacher logits (no teacher on the GPUs); 0: online."),
    ], f)


def posttrain_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Distillation and RL (--task grpo|ppo|dpo) settings of `plan` (docs/post-training.md)."""
    return apply_options([
        distill_options,
        click.option("--prompt-len", type=click.IntRange(1, MAX_SEQ_LEN), default=_RD.prompt_len, show_default=True),
        click.option("--response-len", type=click.IntRange(1, MAX_SEQ_LEN), default=_RD.response_len,
                     show_default=True,
                     help="Generated tokens per response at most (DPO: the longer answer)."),
        click.option("--response-mean", type=click.IntRange(0, MAX_SEQ_LEN), default=_RD.response_mean,
                     help="Mean response length (the KV reads, decode FLOPs and the packed tokens trained on); "
                          "the longest response still sets the decode steps  [default: --response-len]."),
        click.option("--group-size", type=click.IntRange(1, 4096), default=_RD.group_size, show_default=True,
                     help="Responses per prompt (GRPO's num_generations)."),
        click.option("--prompts-per-step", type=click.IntRange(1, 1 << 20), default=_RD.prompts_per_step,
                     show_default=True,
                     help="Prompts per RL step (DPO: preference pairs)."),
        click.option("--rollout", type=click.Choice(ROLLOUT_PLACEMENTS), default=_RD.rollout, show_default=True,
                     help="Generate on the training GPUs, or on as many GPUs of their own."),
        click.option("--rollout-tp", type=click.IntRange(1, 64), default=_RD.rollout_tp, show_default=True,
                     help="The engine's tensor-parallel size (vLLM tensor_parallel_size)."),
        click.option("--rollout-memory-fraction", type=FiniteFloatRange(0.05, 1.0),
                     default=_RD.rollout_memory_fraction, show_default=True,
                     help="vLLM's gpu_memory_utilization: the engine's share of each GPU (TRL colocated: 0.3)."),
        click.option("--offload-train-states/--keep-train-states", default=_RD.offload_train_states,
                     show_default=True,
                     help="Move the policy's training states to the host while the engine generates (verl, "
                          "NeMo-RL), or keep them (TRL)."),
        click.option("--rl-async", type=click.IntRange(0, 1 << 10), default=_RD.rl_async, show_default=True,
                     help="Asynchronous RL, N steps off-policy (NeMo-RL's async GRPO, max_trajectory_age_steps): "
                          "generation on --rollout separate GPUs overlaps training; 0: on-policy."),
        click.option("--rl-steps", type=click.IntRange(1, 1 << 30), default=None,
                     help="RL steps to run: the plan adds the run's hours and GPU-hours."),
    ], f)

