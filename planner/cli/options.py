"""The command line's typed options object (Options), which every command builds once from
click's values, and the helpers the option modules share. click's decorators live by concern:
layout_options.py (the model, GPUs, degrees, batch, recomputation), training_options.py (the
training set-up: precision, optimizer, kernels, the stack's runtime, memory allowances),
task_options.py (what trains: fine-tuning methods, --task, distillation and RL), cost_options.py
(the cluster, tokens, prices, solver) and output_options.py (what is written and printed); their
value types: types.py, sizes.py.

A new option is one entry in a decorator list of those modules plus one field of Options (with
the default a command without that option sees); the commands read it as ``o.name``. A default
is written once: a training set-up option's is TrainingSetup's (training.setup.DEFAULT_SETUP),
a post-training option's is training.posttrain's DISTILL_DEFAULTS or RL_DEFAULTS; Options reads them, and
click reads Options (``default=default_of(name)``) or those objects, also for the help text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from planner.emit import EmitOptions
from planner.layouts.layout import AXES
from planner.training.posttrain import (
    DISTILL_DEFAULTS,
    RL_DEFAULTS,
)
from planner.training.setup import DEFAULT_SETUP as _S
from planner.training.setup import (
    MAX_SEARCH_GPUS,
)

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
_DD, _RD = DISTILL_DEFAULTS, RL_DEFAULTS
_EMIT = EmitOptions()           # what --out writes by default


@dataclass(frozen=True, kw_only=True)
class Options:
    """Every option of `plan`, `plan explain` and `plan measure`, as click parsed it; an
    option a command does not take keeps its default here (None: not given)."""

    # the model, the GPU and the layout (layout_options)
    model_name: str | None = None
    gpu_name: str | None = None
    n_gpus: int | None = None
    max_gpus: int = MAX_SEARCH_GPUS   # the largest count the search tries (--max-gpus)
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    optimizer_instances: int = 1      # megatron-core's num_distributed_optimizer_instances
    zero: int | None = None
    fsdp: str | None = None
    # the defaults of the training set-up's options are TrainingSetup's (training.setup.DEFAULT_SETUP)
    fsdp_pipeline_grad_sync: str = _S.fsdp_pipeline_grad_sync   # FSDP under pp: reduce-scatter when
    pp_balance: str = _S.pp_balance        # the pipeline split: even, or embedding and loss counted as layers
    pp_layout: str | None = None           # the split stated in megatron-core's layout syntax (held in pp_balance)
    pp_microbatch_group: int = _S.pp_microbatch_group   # interleaved 1F1B's micro-batch group N (0: pp)
    cross_entropy: str = _S.cross_entropy  # Megatron-Core's loss kernel: native, or Transformer Engine's
    moe_a2a_overlap: str = _S.moe_a2a_overlap   # Megatron-Core's expert-parallel all-to-all overlap
    cuda_graphs: str = _S.cuda_graphs      # Megatron-Core's CUDA graphs: none, moe, full-iteration
    fp8_attention: bool = _S.fp8_attention  # Transformer Engine's FP8 attention (--stack megatron)
    moe_dispatcher: str = _S.moe_dispatcher  # Megatron-Core's token dispatcher: alltoall, or flex (DeepEP/HybridEP)
    vp: int | None = None
    sp: bool | None = None
    micro_batch: int | None = None
    seq_len: int | None = None        # None: training.checks.default_seq_len of the model
    global_batch: int | None = None
    global_batch_tokens: float | None = None
    grad_accum: int | None = None
    recompute: str | None = None
    recompute_every: int = _S.recompute_every     # checkpoint one block in k (TrainingSetup.recompute_every)
    recompute_method: str | None = None      # Megatron-LM's uniform | block (--stack megatron --recompute full)
    recompute_num_layers: int | None = None  # its --recompute-num-layers
    recompute_modules: str | None = None     # Megatron-Core's --recompute-modules (comma-separated)
    compile: bool = _S.compile        # torch.compile per block (--stack torchtitan)
    ds_checkpointing: str = _S.ds_checkpointing   # DeepSpeed activation checkpointing (--stack deepspeed)
    offload_activations: int = _S.offload_activations     # Megatron-Core's cpu_offloading_num_layers (--stack megatron)
    mtp: int = _S.mtp_layers          # multi-token prediction modules (Megatron-Core mtp_num_layers)
    precision: str = _S.precision
    fp8_recipe: str = "auto"          # the --stack's recipe (training.fp8.resolve_recipe)
    fp8_param_gather: bool = _S.fp8_param_gather
    bf16_layers: tuple[int, int] = _S.bf16_layers   # Megatron-Core's first/last layers in BF16 (START, END)
    moe_imbalance: float = _S.moe_imbalance
    optimizer: str = _S.optimizer
    attention: str = _S.attention
    kernels: str = _S.kernels
    fragmentation: float | None = None      # None: training.setup.Overheads' fragmentation
    usable_memory: float = _S.usable_memory_fraction
    fit_confidence: float | None = None     # report.intervals.memory_band: fit at its upper end
    time_confidence: float | None = None    # timing.intervals.upper_factor: plan at the step time's upper end
    as_json: bool = False
    # fine-tuning (method_options)
    method: str | None = None
    lora_rank: int | None = None
    lora_alpha: int | None = None
    lora_targets: str | None = None
    lora_dropout: float | None = None
    quant: str | None = None
    trainable_layers: int | None = None
    images_per_sample: int = _S.images_per_sample      # a vision-language model's images per sequence
    freeze_vision: bool = True                          # --freeze-vision/--train-vision (training.images)
    # --task (task_options)
    task: str = "train"
    mla_cache: str | None = None      # --task load, MLA models: the KV cache layout (memory.inference)
    # post-training (posttrain_options; the defaults: training.posttrain DISTILL_DEFAULTS, RL_DEFAULTS)
    teacher: str | None = None
    teacher_precision: str = _DD.teacher_precision
    teacher_quant: str = _DD.teacher_quant
    teacher_sharding: str = _DD.teacher_sharding
    kd_loss: str = _DD.kd_loss
    kd_hidden_layers: int = _DD.kd_hidden_layers
    kd_offline_topk: int = _DD.kd_offline_topk
    prompt_len: int = _RD.prompt_len
    response_len: int = _RD.response_len
    response_mean: int = _RD.response_mean
    group_size: int = _RD.group_size
    prompts_per_step: int = _RD.prompts_per_step
    rollout: str = _RD.rollout
    rollout_tp: int = _RD.rollout_tp
    rollout_memory_fraction: float = _RD.rollout_memory_fraction
    offload_train_states: bool = _RD.offload_train_states
    rl_async: int = _RD.rl_async
    rl_steps: int | None = None
    # step time and tokens (time_options)
    topology: str | None = None
    tokens: float | None = None
    calibration: Path | None = None     # a `plan calibrate` file (planner.timing.calibrate)
    # the cost objective (cost_options)
    deadline: str | None = None
    budget: float | None = None
    objective: str | None = None
    prices_path: Path | None = None
    solver: str = "auto"
    # outputs (output_options)
    out: Path | None = None
    force: bool = False
    plot: Path | None = None
    crosscheck: bool = False
    offload_optimizer: str = _S.offload_optimizer
    offload_params: str = _S.offload_params
    stack: str | None = None          # --out's stack (planner.stacks); None: what fits the layout
    scheduler: str = _EMIT.scheduler  # --out's scheduler files (emit.EmitOptions' default)
    quiet: bool = False

    @classmethod
    def from_click(cls, values: Mapping[str, Any]) -> Options:
        """Options from click's keyword values; a value click leaves None keeps the default
        where the default is not None (an option the command does not declare)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"Options has no field {unknown[0]!r}")
        return cls(**{k: v for k, v in values.items() if v is not None or default_of(k) is None})

    def as_mapping(self) -> dict[str, Any]:
        """The options by name (for planner.report.advice, which reads options by name)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def unsplit_where_not_given(self) -> Options:
        """These options with every parallel axis (AXES) not given set to 1: the one layout a
        measurement or a log ran, whose axes not named are not split."""
        degrees: dict[str, Any] = {a.name: getattr(self, a.name) or 1 for a in AXES}
        return replace(self, **degrees)

    @property
    def aside(self) -> bool:
        """Notes (files written, progress) leave stdout when it holds JSON or the one-line answer."""
        return self.as_json or self.quiet



def default_of(name: str) -> Any:
    """The default of Options' field ``name``: what a command without that option sees."""
    return next(f.default for f in fields(Options) if f.name == name)


def apply_options(opts: list[Decorator], f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` under the decorators ``opts``, the first one outermost (first in the help)."""
    for opt in reversed(opts):
        f = opt(f)
    return f

