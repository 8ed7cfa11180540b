"""Megatron-DeepSpeed's arguments (pretrain_gpt.py) for a plan that --stack deepspeed runs with
tensor or pipeline parallelism (planner.stacks.runs_megatron_deepspeed): Megatron's tensor
parallelism, DeepSpeed's pipeline engine and ZeRO-0/1, as BLOOM 176B (Le Scao et al. 2022,
arXiv:2211.05100, Sec. 3.4: TP 4 x PP 12 x DP 8, ZeRO-1, bf16) and MT-NLG 530B (Smith et al.
2022, arXiv:2201.11990, Sec. 2) trained. ds_config.json (planner.emit.deepspeed) holds the
batch, precision, optimizer and ZeRO settings; these arguments point at it.

Names: microsoft/Megatron-DeepSpeed megatron/arguments.py at commit 060fb402 (_add_network_size_
args, _add_training_args, _add_distributed_args, _add_zero_args (--zero-stage),
_add_activation_checkpoint_args (--deepspeed-activation-checkpointing, --partition-activations,
--checkpoint-in-cpu); deepspeed.add_config_arguments: --deepspeed, --deepspeed_config). BLOOM's
ALiBi positions and embedding LayerNorm are the BigScience fork's (bigscience-workshop/
Megatron-DeepSpeed: --position-embedding-type alibi, --embed-layernorm).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.emit import EmitOptions, check_options, chosen
from planner.errors import UserError

if TYPE_CHECKING:
    from planner.api import PlanResult

FLAG = "flag"
# every flag written here, with its type (FLAG: store_true), for parse_args
ARGUMENTS: dict[str, object] = {
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int, "--num-attention-heads": int,
    "--max-position-embeddings": int, "--seq-length": int, "--position-embedding-type": ["absolute", "alibi"],
    "--embed-layernorm": FLAG, "--micro-batch-size": int, "--global-batch-size": int,
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int, "--no-pipeline-parallel": FLAG,
    "--bf16": FLAG, "--fp16": FLAG, "--checkpoint-activations": FLAG, "--deepspeed-activation-checkpointing": FLAG,
    "--partition-activations": FLAG, "--checkpoint-in-cpu": FLAG, "--zero-stage": int, "--deepspeed": FLAG,
    "--deepspeed_config": str, "--lr": float, "--weight-decay": float, "--clip-grad": float,
    "--adam-beta1": float, "--adam-beta2": float, "--adam-eps": float,
    # _add_training_args, _add_learning_rate_args (same commit; BLOOM's scripts give these five)
    "--train-samples": int, "--min-lr": float, "--lr-decay-style": ["constant", "linear", "cosine"],
    "--lr-warmup-samples": int, "--lr-decay-samples": int,
}


def to_megatron_deepspeed_args(r: PlanResult, opts: EmitOptions = EmitOptions(),
                               ds_config: str = "ds_config.json") -> list[str]:
    """pretrain_gpt.py's arguments for the chosen plan (data and tokenizer arguments are the
    user's). Megatron-DeepSpeed's data-parallel size is world / (tp x pp), the planner's dp."""
    cand = chosen(r)
    check_options(r, opts)
    lay, s, m = cand.layout, r.setup, r.model
    if lay.sp:
        raise UserError("Megatron-DeepSpeed's arguments (microsoft/Megatron-DeepSpeed 060fb402) have no sequence "
                        "parallelism; no files written (plan with --no-sp)")
    args = ["--num-layers", str(m.n_layers), "--hidden-size", str(m.d_model), "--ffn-hidden-size", str(m.d_ff),
            "--num-attention-heads", str(m.n_heads), "--seq-length", str(lay.seq_len),
            "--max-position-embeddings", str(max(m.max_positions or 0, lay.seq_len))]
    if m.position == "alibi":
        args += ["--position-embedding-type", "alibi"]
    if m.embedding_norm:
        args += ["--embed-layernorm"]
    args += ["--micro-batch-size", str(lay.micro_batch), "--global-batch-size", str(lay.global_batch),
             "--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp)]
    if lay.pp == 1:        # DeepSpeed's pipeline engine off (args.ds_pipeline_enabled)
        args += ["--no-pipeline-parallel"]
    if s.precision in ("bf16-mixed", "bf16"):
        args += ["--bf16"]
    elif s.precision == "fp16-mixed":
        args += ["--fp16"]
    if lay.recompute == "full":
        args += ["--checkpoint-activations", "--deepspeed-activation-checkpointing"]
        if s.ds_checkpointing.startswith("partitioned"):
            args += ["--partition-activations"]
        if "cpu" in s.ds_checkpointing:
            args += ["--checkpoint-in-cpu"]
    args += ["--zero-stage", str(lay.zero_stage), "--deepspeed", "--deepspeed_config", ds_config,
             "--weight-decay", repr(opts.weight_decay), "--clip-grad", repr(opts.grad_clip),
             "--adam-beta1", repr(opts.betas[0]), "--adam-beta2", repr(opts.betas[1]), "--adam-eps", repr(opts.eps)]
    # the run's length and schedule, as for Megatron-LM (planner.emit.schedule; issue 33)
    from planner.emit.megatron import schedule_args
    from planner.emit.schedule import training_schedule
    return args + schedule_args(training_schedule(r, opts))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False)
    for flag, kind in ARGUMENTS.items():
        if kind == FLAG:
            p.add_argument(flag, action="store_true")
        elif isinstance(kind, list):
            p.add_argument(flag, choices=kind)
        else:
            p.add_argument(flag, type=kind)     # type: ignore[arg-type]
    return p


def parse_args(args: Sequence[str]) -> argparse.Namespace:
    """Parse ``args`` with ARGUMENTS; argparse.ArgumentError for an unknown flag or a bad value."""
    ns, extra = parser().parse_known_args(list(args))
    if extra:
        raise argparse.ArgumentError(None, f"unrecognized arguments: {' '.join(extra)}")
    return ns
