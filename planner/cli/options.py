"""The command line's options: click's decorators and the typed options object (Options)
that every command builds once from click's values (their value types: types.py, sizes.py).

A new option is one entry in a decorator list below plus one field of Options (with the
default a command without that option sees); the commands read it as ``o.name``. A default
is written once: a training set-up option's is TrainingSetup's (training.setup.DEFAULT_SETUP),
a post-training option's is training.posttrain's DISTILL_DEFAULTS or RL_DEFAULTS; Options reads them, and
click reads Options (``default=_default(name)``) or those objects, also for the help text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import click

from planner.cli.complete import complete_gpus, complete_models, complete_topologies
from planner.cli.sizes import SeqLength, SequenceCount, TokenBatch
from planner.cli.types import Dollars, FiniteFloatRange, OutputPath, TokenCount
from planner.emit import SCHEDULERS, EmitOptions
from planner.layouts.layout import AXES, FSDP_STAGE, SearchSpace
from planner.training.checks import MAX_MOE_IMBALANCE, MAX_RECOMPUTE_EVERY, MIN_USABLE_MEMORY
from planner.training.finetune import (
    FREEZE_TRAINABLE_LAYERS,
    LORA_ALPHA,
    LORA_RANK,
    METHODS,
    QLORA_ALPHA,
    QLORA_RANK,
    QUANTS,
)
from planner.training.fp8 import FP8_RECIPE_CHOICES
from planner.training.moe_runtime import A2A_OVERLAPS, CUDA_GRAPHS, DISPATCHERS
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
from planner.training.setup import (
    ATTENTION,
    CROSS_ENTROPIES,
    DS_CHECKPOINTING,
    FSDP_PIPELINE_GRAD_SYNCS,
    KERNELS,
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_MICRO_BATCH,
    MAX_SEARCH_GPUS,
    MAX_SEQ_LEN,
    OFFLOAD,
    OPTIMIZERS,
    PP_BALANCES,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    STACKS,
)
from planner.training.setup import DEFAULT_SETUP as _S

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
_DD, _RD = DISTILL_DEFAULTS, RL_DEFAULTS
_EMIT = EmitOptions()           # what --out writes by default
_SPACE = SearchSpace()          # the search's defaults (micro-batches tried)


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
        return cls(**{k: v for k, v in values.items() if v is not None or _default(k) is None})

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


def _default(name: str) -> Any:
    return next(f.default for f in fields(Options) if f.name == name)


def _apply(opts: list[Decorator], f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(opts):
        f = opt(f)
    return f


def _degree(name: str, more: str = "") -> Decorator:
    return click.option(f"--{name}", type=click.IntRange(1, MAX_GPUS), default=None,
                        help=f"Fix the {name.upper()} degree (default: searched).{more}")


def layout_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `plan` and the commands that take a layout."""
    return _apply([
        click.option("--model", "model_name", metavar="NAME|PATH", shell_complete=complete_models,
                     help="A preset (`plan models`), a Hugging Face config.json, or ORG/NAME from the "
                          "Hugging Face cache."),
        click.option("--gpus", "gpu_name", metavar="NAME", shell_complete=complete_gpus,
                     help="GPU type (`plan gpus`), e.g. h100, or your GPU's TOML file (./my-gpu.toml); "
                          "`plan --tokens` takes a list to choose from, e.g. h100,a100."),
        click.option("--n-gpus", type=click.IntRange(1, MAX_GPUS), default=None,
                     help="Fix the GPU count (default: the smallest that fits)."),
        click.option("--max-gpus", type=click.IntRange(1, MAX_GPUS), default=_default("max_gpus"), show_default=True,
                     help="The largest GPU count the search tries."),
        *(_degree(a.name, a.note) for a in AXES),
        click.option("--etp", type=click.IntRange(1, MAX_GPUS), default=None,
                     help="Expert tensor-parallel size, dividing --tp (Megatron's "
                          "--expert-tensor-parallel-size; default: equal to tp)."),
        click.option("--optimizer-instances", type=click.IntRange(1, MAX_GPUS), default=1, show_default=True,
                     help="HSDP over distributed-optimizer instances (--stack megatron, --zero 1 or --fsdp full; "
                          "megatron-core's num_distributed_optimizer_instances): docs/options.md."),
        click.option("--zero", type=click.IntRange(0, 3), default=None, help="Fix the ZeRO stage (0-3)."),
        click.option("--fsdp", type=click.Choice([s.removeprefix("fsdp-") for s in FSDP_STAGE]), default=None,
                     help="Shard with PyTorch FSDP instead of ZeRO."),
        click.option("--fsdp-pipeline-grad-sync", type=click.Choice(FSDP_PIPELINE_GRAD_SYNCS),
                     default=_default("fsdp_pipeline_grad_sync"),
                     show_default=True,
                     help="FSDP under a pipeline: reduce-scatter the gradients once a step (PyTorch's pipeline "
                          "schedules; unsharded gradients held until then) or after every micro-batch (into "
                          "sharded fp32 gradients, as Llama 3 trained). No effect without FSDP and pp > 1."),
        click.option("--pp-balance", type=click.Choice(PP_BALANCES), default=_default("pp_balance"), show_default=True,
                     help="The pipeline's layer split: 'embedding-loss' counts the embedding and the loss as one "
                          "layer each, so the first and last stages hold one block fewer (Llama 3's balance; "
                          "Megatron-LM's --account-for-embedding/loss-in-pipeline-split). Needs pp x vp to divide "
                          "the layers + 2."),
        click.option("--pp-microbatch-group", type=click.IntRange(0, MAX_GLOBAL_BATCH),
                     default=_default("pp_microbatch_group"),
                     help="Interleaved 1F1B (vp > 1): micro-batches run through one model chunk before the next "
                          "(Megatron-Core's microbatch_group_size_per_vp_stage; 0: pp, its default). Stage r's "
                          "warm-up holds (pp - r - 1) x 2 + (vp - 1) x N chunks; Megatron-Core accepts N from pp "
                          "to the micro-batches per step, Llama 3's schedule fewer."),
        click.option("--cross-entropy", type=click.Choice(CROSS_ENTROPIES), default=_default("cross_entropy"),
                     show_default=True,
                     help="--stack megatron's loss: 'native' keeps the logits' exp in fp32 for backward "
                          "(Megatron-Core's vocab-parallel cross entropy); 'te' is Transformer Engine's, which keeps "
                          "only the 16-bit logits with their gradient written in place (Megatron-Core's "
                          "cross_entropy_fusion_impl; Megatron-Bridge's Llama 3 recipes)."),
        click.option("--moe-a2a-overlap", type=click.Choice(A2A_OVERLAPS), default=_default("moe_a2a_overlap"),
                     show_default=True,
                     help="--stack megatron, MoE with ep > 1: hide the expert-parallel all-to-alls under another "
                          "micro-batch's compute (Megatron-Core's overlap_moe_expert_parallel_comm); 'auto' where "
                          "Megatron-Core runs it (no full recomputation, at most one MTP layer; with pp, vp set)."),
        click.option("--cuda-graphs", type=click.Choice(CUDA_GRAPHS), default=_default("cuda_graphs"),
                     show_default=True,
                     help="--stack megatron's CUDA graphs: 'moe' captures attention and the MoE router and "
                          "preprocessing (a dropless MoE layer still syncs its token counts to the host), "
                          "'full-iteration' the whole step, without that sync (Megatron-Core's cuda_graph_impl and "
                          "cuda_graph_scope)."),
        click.option("--moe-dispatcher", type=click.Choice(DISPATCHERS), default=_default("moe_dispatcher"),
                     show_default=True,
                     help="--stack megatron's MoE token dispatcher: 'alltoall' sends each routed copy of a token to "
                          "its expert's rank; 'flex' (DeepEP or HybridEP) sends a token once per remote node and "
                          "forwards it over NVLink there, which cuts the cross-node all-to-all."),
        click.option("--fp8-attention", is_flag=True, default=_default("fp8_attention"),
                     help="--stack megatron with --precision fp8: Transformer Engine's FP8 fused attention "
                          "(Megatron-Core's fp8_dot_product_attention)."),
        click.option("--vp", type=click.IntRange(1, 64), default=None,
                     help="Virtual stages per pipeline rank (interleaved 1F1B)."),
        click.option("--sp/--no-sp", default=None, help="Sequence parallelism with tp (default: on when tp > 1)."),
        click.option("--micro-batch", type=click.IntRange(1, MAX_MICRO_BATCH), default=None,
                     help=f"Fix the micro-batch (default: searched over {', '.join(map(str, _SPACE.micro_batches))})."),
        click.option("--seq-len", type=SeqLength(MAX_SEQ_LEN), default=None,
                     help="Sequence length in tokens: 4096, 8k, 128k (k = 1,024)  [default: "
                          f"{_S.seq_len}, or a learned "
                          "position table's length where shorter: GPT-2 1024, BERT 512]."),
        click.option("--global-batch", type=SequenceCount(MAX_GLOBAL_BATCH), default=None,
                     help=f"Sequences per optimizer step  [default: {_S.global_batch}]."),
        click.option("--global-batch-tokens", type=TokenBatch(), default=None,
                     help="Tokens per optimizer step instead: 4M, 512k (binary: 4M = 4,194,304), "
                          "divided by --seq-len to the nearest whole sequence."),
        click.option("--grad-accum", type=click.IntRange(1, MAX_GLOBAL_BATCH), default=None,
                     help="Gradient-accumulation steps (sets the global batch; needs --micro-batch and --dp)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default=None,
                     help="Activation recomputation (default: searched). Under --stack torchtitan, selective is "
                          "its SelectiveAC per-op policy and full its FullAC."),
        click.option("--recompute-every", type=click.IntRange(1, MAX_RECOMPUTE_EVERY),
                     default=_default("recompute_every"), show_default=True,
                     help="Checkpoint one block in k with --recompute; the others keep everything (torchtitan <= 0.2 "
                          "selective_ac_option=k, Megatron-LM: use --recompute-method block)."),
        click.option("--recompute-method", type=click.Choice(RECOMPUTE_METHODS), default=None,
                     help="--stack megatron --recompute full: uniform checkpoints groups of --recompute-num-layers "
                          "layers (each keeps its input); block checkpoints the first N layers of each (virtual) "
                          f"pipeline stage and keeps everything of the rest  [default: {_S.recompute_method}]."),
        click.option("--recompute-num-layers", type=click.IntRange(1, MAX_RECOMPUTE_EVERY), default=None,
                     help="N for --recompute-method (Megatron-LM --recompute-num-layers; needs --pp fixed when "
                          f"N > 1 or block)  [default: {_S.recompute_num_layers}]."),
        click.option("--ds-checkpointing", type=click.Choice(DS_CHECKPOINTING),
                     default=_default("ds_checkpointing"), show_default=True,
                     help="--stack deepspeed with --recompute full: DeepSpeed's partition_activations and/or "
                          "cpu_checkpointing for the checkpointed inputs."),
        click.option("--recompute-modules", metavar="LIST", default=None,
                     help="--stack megatron --recompute selective: the modules Megatron-Core recomputes, "
                          "comma-separated: core_attn, layernorm, moe_act, mla_up_proj, mlp (its "
                          "recompute_modules)  [default: core_attn]."),
        click.option("--offload-activations", type=click.IntRange(0, 1 << 20), default=_default("offload_activations"),
                     metavar="N",
                     help="--stack megatron, pp 1, no recomputation: the saved activations of N layers go to "
                          "CPU memory in forward and return in backward (Megatron-Core's "
                          "cpu_offloading_num_layers); the host copy is on the host memory line  "
                          f"[default: {_S.offload_activations}]."),
        click.option("--mtp", type=click.IntRange(0, 64), default=_default("mtp"), metavar="N",
                     help="--stack megatron: N multi-token prediction modules on the last pipeline stage, each a "
                          "block, a projection and its own loss (DeepSeek-V3 Sec. 2.2; Megatron-Core's "
                          f"mtp_num_layers)  [default: {_S.mtp_layers}]."),
        click.option("--compile", is_flag=True, default=_default("compile"),
                     help="torch.compile each block (--stack torchtitan: compile.components=['model'])."),
        click.option("--precision", type=click.Choice(PRECISIONS), default=_default("precision"), show_default=True,
                     help="nvfp4: bf16 mixed precision whose blocks' linear layers run Transformer Engine's "
                          "NVFP4 recipe (Blackwell)."),
        click.option("--fp8-recipe", type=click.Choice(FP8_RECIPE_CHOICES), default=_default("fp8_recipe"),
                     show_default=True,
                     help="Under --precision fp8: tensorwise (torchao, float8 all-gather; under --stack megatron "
                          "Transformer Engine's current scaling), rowwise (torchao; torchtitan's default), delayed "
                          "(Transformer Engine; Megatron-LM's), blockwise (DeepSeek-V3), mxfp8 (Transformer "
                          "Engine, 1x32 blocks). auto: the --stack's default, rowwise without one."),
        click.option("--fp8-param-gather", is_flag=True, default=_default("fp8_param_gather"),
                     help="--stack megatron, --precision fp8: keep the blocks' linear weights in FP8 only, no "
                          "16-bit copy (Megatron-LM --fp8-param-gather; Megatron-Bridge's FP8 recipes set it)."),
        click.option("--moe-imbalance", type=FiniteFloatRange(1.0, MAX_MOE_IMBALANCE),
                     default=_default("moe_imbalance"), show_default=True,
                     help="MoE routing: tokens the most loaded expert-parallel rank receives over its balanced "
                          "share (scales its expert activations, expert GEMMs and all-to-alls). 1.0 balanced; "
                          "Switch Transformer trains with capacity factor 1.25 (Fedus et al. 2021, Table 1)."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=_default("optimizer"), show_default=True),
        click.option("--attention", type=click.Choice(ATTENTION), default=_default("attention"), show_default=True,
                     help="flash/SDPA, or eager that materialises the s x s scores."),
        click.option("--kernels", type=click.Choice(KERNELS), default=_default("kernels"), show_default=True,
                     help="eager PyTorch ops (Hugging Face models) or fused Megatron kernels; auto: fused with "
                          "tp/pp/cp."),
        click.option("--fragmentation", type=FiniteFloatRange(0, 1), default=None,
                     help="Allocator fragmentation as a fraction of tensor memory  "
                          f"[default: {_S.overheads.fragmentation:.2f}]."),
        click.option("--usable-memory", type=FiniteFloatRange(MIN_USABLE_MEMORY, 1), default=_default("usable_memory"),
                     show_default=True,
                     help="Fraction of the GPU's memory a plan may use."),
        confidence_option("--fit-confidence", "Fit at the upper end of the memory interval at this level (from "
                                              "the memory model's measured errors) instead of at the predicted peak."),
        confidence_option("--time-confidence", "Plan with step times that are not exceeded with this "
                                               "confidence (out-of-sample errors on published runs), so "
                                               "--deadline is met with it."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema in docs/options.md)."),
    ], f)


# The levels of the interval tables (report/memory_intervals.json, timing/step_intervals.json),
# spelt here so that the CLI's import reads no table (tests/test_cli_help.py checks they agree)
CONFIDENCE_LEVELS = ("0.5", "0.8", "0.9", "0.95")


def confidence_option(name: str, help_text: str) -> Decorator:
    """--fit-confidence or --time-confidence: one of CONFIDENCE_LEVELS, as a float (None: not given)."""
    return click.option(name, type=click.Choice(CONFIDENCE_LEVELS), default=None,
                        callback=lambda _c, _p, v: None if v is None else float(v), help=help_text)


def method_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The fine-tuning method (planner.training.finetune), for `plan` and `plan measure`."""
    return _apply([
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
        "--task", type=click.Choice(["train", "load", *RL_TASKS]), default=_default("task"), show_default=True,
        help="train: a training plan; load: the memory to hold the model for inference (weights at "
             "--precision or --quant, KV cache for --micro-batch sequences of --seq-len tokens); grpo, ppo, "
             "dpo: an RL step with its rollout engine, memory and time by phase (docs/post-training.md).")(f)


def distill_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Distillation (--teacher) settings, for `plan` and `plan measure` (docs/post-training.md)."""
    return _apply([
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
    return _apply([
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


def _offload(name: str, help_text: str) -> Decorator:
    """--offload-optimizer or --offload-params: where ZeRO/FSDP keeps that state (OFFLOAD)."""
    return click.option(f"--{name.replace('_', '-')}", type=click.Choice(OFFLOAD), default=_default(name),
                        show_default=True, help=help_text)


def _stack(help_text: str) -> Decorator:
    """--stack: a training stack of planner.stacks.STACKS (None: what fits the layout)."""
    return click.option("--stack", type=click.Choice(STACKS), default=None, help=help_text)


def offload_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--offload-optimizer and --offload-params as `plan explain` takes them."""
    return _apply([
        _offload("offload_optimizer", "As for `plan`: optimizer states in CPU memory or on NVMe."),
        _offload("offload_params", "As for `plan`: parameters in CPU memory or on NVMe."),
    ], f)


def stack_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--stack as `plan explain` takes it: the memory profile the terms follow."""
    return _stack("As for `plan`: the training stack whose memory profile the terms follow.")(f)


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the main `plan` command: configs to write, and DeepSpeed's cross-check."""
    return _apply([
        click.option("--out", type=OutputPath(file_okay=False, path_type=Path), default=None, metavar="DIR",
                     help="Write the plan's configs here, only those its stack reads: ds_config.json and hostfile, "
                          "accelerate_config.yaml, train.py (DeepSpeed, hf), torchtitan_job.py, megatron_args.txt; "
                          "launch.sh, slurm.sbatch, pytorchjob.yaml, plan.json."),
        click.option("--force", is_flag=True, help="With --out or --plot, overwrite existing files."),
        click.option("--plot", type=OutputPath(dir_okay=False, path_type=Path), default=None, metavar="FILE",
                     help="Draw the plan into FILE (.png or .svg): memory per rank by category against the "
                          "GPU's capacity, and time (with --tokens, cost) against GPU count."),
        click.option("--crosscheck", is_flag=True,
                     help="Compare model states with DeepSpeed's own estimators (imports deepspeed, ~2 s)."),
        _offload("offload_optimizer",
                 "ZeRO-Offload: optimizer states (and fp32 gradients) in CPU memory or on NVMe; "
                 "the GPU memory left and the CPU memory per node are planned (ZeRO-1 or higher)."),
        _offload("offload_params",
                 "ZeRO-Infinity / FSDP CPU offload: parameters in CPU memory or on NVMe "
                 "(ZeRO-3 or FSDP full sharding; FSDP also moves gradients and optimizer states)."),
        # emit (issue 19): which stack --out writes for, and which scheduler files
        _stack("The training stack: its memory profile (recompute policies, loss, kernels) and the "
               "configs --out writes  [default: what fits the layout: megatron for tp/pp/cp (fused "
               "kernels), hf for FSDP without them, torchtitan for FSDP with pp under --kernels "
               "eager, deepspeed for ZeRO]."),
        click.option("--scheduler", type=click.Choice(SCHEDULERS), default=_default("scheduler"),
                     show_default=True, help="Scheduler files --out writes: slurm.sbatch, pytorchjob.yaml (Kubeflow)."),
    ], f)


def time_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the step-time model: the cluster's wiring and the tokens to train on."""
    return _apply([
        click.option("--topology", metavar="NAME|PATH", default=None, shell_complete=complete_topologies,
                     help="Cluster topology: a shipped one (`plan topologies`) or a TOML file  "
                          "[default: the GPU's own, e.g. dgx-h100 for h100]."),
        click.option("--tokens", type=TokenCount(), default=None,
                     help="Tokens to train on (2e12, 300B): the plan then minimises the cost (or time) of "
                          "training on them, over GPU counts (and the GPU types --gpus lists), by an ILP."),
        calibration_option,
    ], f)


def calibration_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--calibration FILE: the efficiency and overhead `plan calibrate` fitted to the user's logs."""
    return click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="FILE", help="Apply a `plan calibrate` file: its matmul fraction and "
                                             "allocator overhead, fitted to your own logs (same GPU type).")(f)


def prices_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--prices", "prices_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="PATH", help="A TOML file overriding entries of the price catalog (`plan gpus`).")(f)


# cost.solve.SOLVERS, spelt here so that the CLI's import loads no pulp (tests/test_cli_help.py checks they agree)
SOLVERS = ("auto", "highs", "cbc")


def solver_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--solver", type=click.Choice(SOLVERS), default=_default("solver"), show_default=True,
                        help="The ILP solver: HiGHS when highspy is installed (auto), else PuLP's bundled CBC.")(f)


def cost_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the cost objective (`plan --tokens`): constraints, prices, the solver."""
    return _apply([
        click.option("--deadline", metavar="DURATION|DATE", default=None,
                     help="With --tokens: finish within this long (30d, 12h, 2w) or by this date (2026-03-01)."),
        click.option("--budget", type=Dollars(), default=None,
                     help="With --tokens: spend at most this many US dollars (250k, 1.5M)."),
        click.option("--objective", type=click.Choice(["cost", "time"]), default=None,
                     help="With --tokens: what to minimise  [default: cost]."),
        prices_option,
        solver_option,
    ], f)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--quiet: the answer on one line, for scripts."""
    return click.option("--quiet", "-q", "quiet", is_flag=True,
                        help="Print only the answer, on one line (not with --json).")(f)
