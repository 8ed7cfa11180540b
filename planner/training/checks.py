"""What a training set-up may hold for a model, as one table of (rule, message).

The command line parses each option within its range; the Python API takes a TrainingSetup
as the caller built it. Both pass it through ``check_setup`` (planner.cli.request.
build_request, planner.api.plan and evaluate_layout), so that a value the CLI refuses is
refused, in the same one line, by the API (issue 32, W11: ``seq_len=-1`` planned on 2 GPUs,
``usable_memory_fraction=0`` raised ZeroDivisionError). Each message names the option and,
in brackets, the TrainingSetup field.

Sources of the model-dependent rules: a learned position table has ``n_positions`` /
``max_position_embeddings`` rows, and an index past it fails in the embedding lookup
(transformers GPT2Model and BertEmbeddings: ``self.wpe(position_ids)``,
``self.position_embeddings(position_ids)``); a LoRA adapter's rank is at most the smaller
side of the matrix it adapts (Hu et al. 2021, arXiv:2106.09685, Sec. 4: r << min(d, k)),
at most d_model for every adapted linear; freezing trains the last N blocks of the
n_layers the model has (LLaMA-Factory's freeze_trainable_layers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.errors import UserError
from planner.models.spec import ModelSpec
from planner.training.finetune import METHODS
from planner.training.fp8 import FP4_GPUS, RECIPES
from planner.training.images import image_refusal
from planner.training.layer_precision import bf16_layer_refusal
from planner.training.moe_runtime import A2A_OVERLAPS, CUDA_GRAPHS, DISPATCHERS
from planner.training.pp_layout import LayoutError, check, is_layout, shown
from planner.training.setup import (
    ATTENTION,
    DEFAULT_SETUP,
    DS_CHECKPOINTING,
    FSDP_PIPELINE_GRAD_SYNCS,
    KERNELS,
    MAX_GLOBAL_BATCH,
    MAX_SEQ_LEN,
    MEMORY_STACKS,
    OFFLOAD,
    OPTIMIZERS,
    PP_BALANCES,
    PRECISIONS,
    RECOMPUTE_METHODS,
    TrainingSetup,
)

LOW_PRECISIONS = ("fp8", "nvfp4")      # the block GEMMs in FP8 or FP4 (training.fp8)
DEFAULT_SEQ_LEN = DEFAULT_SETUP.seq_len
MAX_MOE_IMBALANCE = 64.0        # --moe-imbalance's upper bound: every token on one of 64 ranks
MAX_RECOMPUTE_EVERY = 1024      # --recompute-every's and --recompute-num-layers' upper bound
MIN_USABLE_MEMORY = 0.05        # --usable-memory's lower bound


def is_int_in(x: Any, lo: int, hi: int) -> bool:
    """An int (not a bool) within [lo, hi]."""
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def is_float_in(x: Any, lo: float, hi: float) -> bool:
    """A finite real number (int or float, not a bool) within [lo, hi]."""
    return (isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            and lo <= x <= hi)


@dataclass(frozen=True, slots=True)
class SetupRule:
    """``fails(m, setup)`` is true where the set-up cannot be planned for model ``m``;
    ``message(m, setup)`` says why in one line, naming the option (and the field)."""

    name: str
    fails: Callable[[ModelSpec, TrainingSetup], bool]
    message: Callable[[ModelSpec, TrainingSetup], str]


def _choice(field: str, option: str, choices: tuple[str, ...]) -> SetupRule:
    return SetupRule(f"{field}-known", lambda m, s: getattr(s, field) not in choices,
                     lambda m, s: (f"{option} {getattr(s, field)!r} ({field}) is not one of "
                                   f"{', '.join(choices)}"))


def _split_refusal(m: ModelSpec, s: TrainingSetup) -> str | None:
    """Why the pipeline split (pp_balance: a rule's name, or a layout stated with --pp-layout) cannot
    be planned for ``m``, or None (training.pp_layout.check: megatron-core's validate_layer_layout)."""
    if not isinstance(s.pp_balance, str) or not is_layout(s.pp_balance):
        return None if s.pp_balance in PP_BALANCES else (
            f"--pp-balance {s.pp_balance!r} (pp_balance) is not one of {', '.join(PP_BALANCES)}")
    try:
        check(s.pp_balance, m.n_layers, s.mtp_layers)
    except LayoutError as e:
        return f"--pp-layout {shown(s.pp_balance)} {e}"
    return None


def learned_positions(m: ModelSpec) -> int:
    """The rows of the model's learned position table (GPT-2's n_positions, BERT's
    max_position_embeddings), or 0 where positions are not learned (rotary, ALiBi)."""
    return m.max_positions if m.position == "learned" and m.max_positions > 0 else 0


def default_seq_len(m: ModelSpec) -> int:
    """The sequence a plan takes without --seq-len: 4096, or a learned position table's
    length where that is shorter (GPT-2: 1024, BERT: 512), since no token may sit past it."""
    table = learned_positions(m)
    return min(DEFAULT_SEQ_LEN, table) if table else DEFAULT_SEQ_LEN


def positions_refusal(m: ModelSpec, seq_len: int) -> str | None:
    """Why ``seq_len`` tokens run past the model's learned position table (training and
    --task load alike), or None (issue 32, W8: BERT planned at 1M tokens)."""
    table = learned_positions(m)
    if not table or seq_len <= table:
        return None
    return (f"--seq-len {seq_len:,} is past {m.name}'s learned position table of {table:,} positions; "
            f"give --seq-len {table} or less")


def _low_precision_way_out(ft: Any) -> str:
    """What low-precision training cannot run and the way out, naming what the user gave: --method
    qlora or freeze (a --method freeze was told to "drop --quant", which it had not given) or --quant."""
    if ft.method in ("qlora", "freeze"):
        return f"--method {ft.method}: use --method full or lora, or --precision bf16-mixed"
    return f"--quant {ft.quant}: drop --quant, or use --precision bf16-mixed"


SETUP_RULES: tuple[SetupRule, ...] = (
    SetupRule("seq-len", lambda m, s: not is_int_in(s.seq_len, 1, MAX_SEQ_LEN),
              lambda m, s: f"--seq-len {s.seq_len!r} (seq_len) must be a whole number from 1 to {MAX_SEQ_LEN:,}"),
    SetupRule("global-batch", lambda m, s: not is_int_in(s.global_batch, 1, MAX_GLOBAL_BATCH),
              lambda m, s: (f"--global-batch {s.global_batch!r} (global_batch) must be a whole number of "
                            f"sequences from 1 to {MAX_GLOBAL_BATCH:,}")),
    _choice("precision", "--precision", PRECISIONS),
    _choice("optimizer", "--optimizer", OPTIMIZERS),
    _choice("attention", "--attention", ATTENTION),
    _choice("kernels", "--kernels", KERNELS),
    _choice("stack", "--stack", MEMORY_STACKS),
    _choice("offload_optimizer", "--offload-optimizer", OFFLOAD),
    _choice("offload_params", "--offload-params", OFFLOAD),
    _choice("ds_checkpointing", "--ds-checkpointing", DS_CHECKPOINTING),
    _choice("fsdp_pipeline_grad_sync", "--fsdp-pipeline-grad-sync", FSDP_PIPELINE_GRAD_SYNCS),
    SetupRule("pp-split", lambda m, s: _split_refusal(m, s) is not None, lambda m, s: str(_split_refusal(m, s))),
    _choice("recompute_method", "--recompute-method", RECOMPUTE_METHODS),
    _choice("fp8_recipe", "--fp8-recipe", (*RECIPES, "nvfp4")),
    SetupRule("method-known", lambda m, s: s.finetune.method not in METHODS,
              lambda m, s: f"--method {s.finetune.method!r} is not one of {', '.join(METHODS)}"),
    SetupRule("usable-memory", lambda m, s: not is_float_in(s.usable_memory_fraction, MIN_USABLE_MEMORY, 1.0),
              lambda m, s: (f"--usable-memory {s.usable_memory_fraction!r} (usable_memory_fraction) must be a "
                            f"fraction from {MIN_USABLE_MEMORY:g} to 1")),
    SetupRule("fragmentation", lambda m, s: not is_float_in(s.overheads.fragmentation, 0.0, 1.0),
              lambda m, s: (f"--fragmentation {s.overheads.fragmentation!r} (overheads.fragmentation) must be a "
                            f"fraction from 0 to 1")),
    SetupRule("moe-imbalance", lambda m, s: not is_float_in(s.moe_imbalance, 1.0, MAX_MOE_IMBALANCE),
              lambda m, s: (f"--moe-imbalance {s.moe_imbalance!r} (moe_imbalance) must be a number from 1 to "
                            f"{MAX_MOE_IMBALANCE:g}")),
    _choice("moe_a2a_overlap", "--moe-a2a-overlap", A2A_OVERLAPS),
    _choice("cuda_graphs", "--cuda-graphs", CUDA_GRAPHS),
    _choice("moe_dispatcher", "--moe-dispatcher", DISPATCHERS),
    SetupRule("megatron-runtime-stack",
              lambda m, s: (s.cuda_graphs != "none" or s.fp8_attention or s.moe_a2a_overlap == "on"
                            or s.moe_dispatcher != "alltoall") and s.stack != "megatron",
              lambda m, s: ("--cuda-graphs, --fp8-attention, --moe-dispatcher flex and --moe-a2a-overlap on are "
                            "Megatron-Core's settings: add --stack megatron")),
    SetupRule("fp8-attention-precision", lambda m, s: s.fp8_attention and s.precision_spec.fp8 is None,
              lambda m, s: "--fp8-attention runs under an FP8 recipe: add --precision fp8 (or drop --fp8-attention)"),
    SetupRule("bf16-layers", lambda m, s: bf16_layer_refusal(s, m.n_layers) is not None,
              lambda m, s: str(bf16_layer_refusal(s, m.n_layers))),
    SetupRule("moe-imbalance-dense", lambda m, s: s.moe_imbalance != 1.0 and not m.is_moe,
              lambda m, s: f"--moe-imbalance needs a mixture-of-experts model; {m.name} is dense"),
    SetupRule("recompute-every", lambda m, s: not is_int_in(s.recompute_every, 1, MAX_RECOMPUTE_EVERY),
              lambda m, s: (f"--recompute-every {s.recompute_every!r} (recompute_every) must be a whole number "
                            f"from 1 to {MAX_RECOMPUTE_EVERY}")),
    SetupRule("recompute-num-layers",
              lambda m, s: not is_int_in(s.recompute_num_layers, 1, MAX_RECOMPUTE_EVERY),
              lambda m, s: (f"--recompute-num-layers {s.recompute_num_layers!r} (recompute_num_layers) must be "
                            f"a whole number from 1 to {MAX_RECOMPUTE_EVERY}")),
    SetupRule("optimizer-state-bytes",
              lambda m, s: s.optimizer_state_bytes is not None and not is_float_in(s.optimizer_state_bytes, 0, 64),
              lambda m, s: f"optimizer_state_bytes {s.optimizer_state_bytes!r} must be from 0 to 64 bytes"),
    SetupRule("low-precision-methods", lambda m, s: s.precision in LOW_PRECISIONS
              and (s.finetune.method in ("qlora", "freeze") or s.finetune.quant != "none"),
              lambda m, s: (f"--precision {s.precision} is modelled for full training and LoRA (a 16-bit base whose "
                            "linear layers run the low-precision GEMMs), not " + _low_precision_way_out(s.finetune))),
    SetupRule("trainable-layers",
              lambda m, s: s.finetune.method == "freeze" and s.finetune.trainable_layers > m.n_layers,
              lambda m, s: (f"--trainable-layers {s.finetune.trainable_layers} is more than the {m.n_layers} "
                            f"blocks of {m.name}; give 1 to {m.n_layers} (or --method full)")),
    SetupRule("lora-rank", lambda m, s: s.finetune.is_lora and s.finetune.lora_rank > m.d_model,
              lambda m, s: (f"--lora-rank {s.finetune.lora_rank} is more than the width {m.d_model} of {m.name}'s "
                            f"layers (a rank is at most the smaller side of the adapted matrix); give 1 to "
                            f"{m.d_model}")),
    SetupRule("learned-positions", lambda m, s: positions_refusal(m, s.seq_len) is not None,
              lambda m, s: str(positions_refusal(m, s.seq_len))),
    SetupRule("images", lambda m, s: image_refusal(m, s.images_per_sample, s.seq_len,
                                                   s.finetune.freeze_vision) is not None,
              lambda m, s: str(image_refusal(m, s.images_per_sample, s.seq_len, s.finetune.freeze_vision))),
)


def setup_refusal(m: ModelSpec, setup: TrainingSetup) -> str | None:
    """The message of the first rule of SETUP_RULES the set-up breaks for ``m``, or None."""
    for rule in SETUP_RULES:
        if rule.fails(m, setup):
            return rule.message(m, setup)
    return None


def check_setup(m: ModelSpec, setup: TrainingSetup) -> None:
    """UserError (one line) where the set-up breaks a rule of SETUP_RULES for ``m``."""
    if not isinstance(m, ModelSpec):
        raise UserError(f"the model must be a ModelSpec (planner.load_model('llama3.1-8b')), not {type(m).__name__}")
    if not isinstance(setup, TrainingSetup):
        raise UserError(f"the set-up must be a TrainingSetup, not {type(setup).__name__}")
    why = setup_refusal(m, setup)
    if why is not None:
        raise UserError(why)


def precision_refusal(gpu: Any, precision: str) -> str | None:
    """Why ``gpu`` (a GpuSpec) cannot train at ``precision``, or None: bf16 needs bf16 tensor
    cores (not a V100), fp8 FP8 tensor cores (Hopper, Ada or later), nvfp4 FP4 tensor cores
    (Blackwell: training.fp8.FP4_GPUS). The CLI refuses such a plan; the advice proposes no
    such GPU."""
    if precision.startswith("bf16") and gpu.bf16_flops_per_s is None:
        return f"{gpu.full_name} has no bf16 support; use --precision fp16-mixed or fp32"
    if precision == "fp8" and gpu.fp8_flops_per_s is None:
        return f"{gpu.full_name} has no FP8 tensor cores (Hopper, Ada or later); use --precision bf16-mixed"
    if precision == "nvfp4" and (gpu.name not in FP4_GPUS or gpu.fp8_flops_per_s is None):
        return (f"{gpu.full_name} has no FP4 tensor cores (Blackwell: {', '.join(FP4_GPUS)}); "
                "use --precision fp8 or bf16-mixed")
    return None


def tokens_refusal(setup: TrainingSetup, tokens: float, what: str = "--tokens",
                   batch: str = "--global-batch") -> str | None:
    """Why ``tokens`` cannot be trained on as a run of optimizer steps: fewer than one global
    batch of tokens is less than one step (issue 32, W9: 12 tokens were "trained" in 0.0007 s
    with a step of 235 s). None when at least one step's worth."""
    per_step = setup.global_batch * setup.seq_len
    if tokens >= per_step:
        return None
    return (f"{what} {tokens:,.0f} is less than one optimizer step ({setup.global_batch:,} sequences x "
            f"{setup.seq_len:,} tokens = {per_step:,} tokens); give {what} {per_step:,} or more, or a smaller "
            f"{batch}")

