"""ds_config.json for a plan.

``to_deepspeed_config`` returns a plain dict; the tests parse it with DeepSpeed's own
``deepspeed.runtime.config.DeepSpeedConfig`` at the plan's data-parallel size
(tests/deepspeed_config.py; see docs/facts.md for why dist is patched).

Field names and meanings: DeepSpeed's config reference ("ZeRO optimizations",
"Batch size", "BFLOAT16/FP16 training", "Activation checkpointing") and its pydantic
models in deepspeed/runtime/zero/config.py and offload_config.py.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from planner.emit import EmitOptions, chosen
from planner.layouts.layout import Layout
from planner.memory.model import rank_params, stage_layers

if TYPE_CHECKING:
    from planner.api import PlanResult

# DeepSpeed's default dynamic loss scaling for fp16 (DeepSpeed config docs, "FP16 training")
FP16_LOSS_SCALING = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                     "hysteresis": 2, "min_loss_scale": 1}
# parameters below this size stay gathered under ZeRO-3 (norm weights); DeepSpeed's default
PARAM_PERSISTENCE_THRESHOLD = 100_000


def import_deepspeed(module: str) -> ModuleType:
    """Import a deepspeed module with whatever it prints at import time (its accelerator
    probe) sent to stderr, so that stdout stays one JSON object. Set DS_ACCELERATOR=cpu
    beforehand to skip the probe (the CLI does). Lives here, below planner.measure, so that
    both emit's validation and measure's cross-check can use it (imports run one way)."""
    with contextlib.redirect_stdout(sys.stderr):
        return importlib.import_module(module)


def data_parallel_size(lay: Layout) -> int:
    """The ranks that read different data: DeepSpeed's data-parallel world size.

    Expert-parallel ranks read different data too (layouts.py), so DeepSpeed's batch
    arithmetic runs over dp x ep; context-parallel ranks share a sequence.
    """
    return lay.data_parallel


def largest_module_params(r: PlanResult) -> int:
    """Parameters of the largest module ZeRO-3 gathers on the most loaded stage (a block
    or the tp-split word embedding), as memory.buffer_bytes counts it."""
    lay = r.best.layout  # type: ignore[union-attr]
    counts = stage_layers(r.model.n_layers, lay.pp, r.setup.pp_balance, r.setup.mtp_layers)
    return max(rank_params(r.model, r.params, lay, s, counts[s]).largest_module for s in range(lay.pp))


def _precision(r: PlanResult) -> dict[str, Any]:
    p = r.setup.precision
    if p == "bf16-mixed":
        return {"bf16": {"enabled": True}}
    if p == "bf16":
        # pure bf16: no fp32 master copy; DeepSpeed keeps master weights and gradients in
        # bf16 under ZeRO (bf16_master_weights_and_grads), optimizer states stay fp32
        bf16: dict[str, Any] = {"enabled": True, "bf16_master_weights_and_grads": True}
        if r.setup.optimizer == "adamw-bf16-states":
            # 16-bit Adam moments: deepspeed 0.19.8 runtime/precision_config.py bf16_optimizer_states
            # ("only valid when bf16_master_weights_and_grads is enabled"; ZeRO-1..3, runtime/config.py)
            bf16["bf16_optimizer_states"] = True
        return {"bf16": bf16}
    if p == "fp16-mixed":
        return {"fp16": {"enabled": True, **FP16_LOSS_SCALING}}
    return {}   # fp32: neither bf16 nor fp16


def _optimizer(r: PlanResult, opts: EmitOptions) -> dict[str, Any]:
    """The optimizer section; optimizers DeepSpeed does not build are passed by the script
    (deepspeed.initialize(optimizer=...)) and allowed with zero_allow_untested_optimizer."""
    opt = r.setup.optimizer
    if opt == "adamw":
        return {"optimizer": {"type": "AdamW", "params": {
            "lr": opts.lr, "betas": list(opts.betas), "eps": opts.eps, "weight_decay": opts.weight_decay}}}
    if opt == "sgd":    # torch.optim.SGD, which DeepSpeed builds by name
        return {"optimizer": {"type": "SGD", "params": {
            "lr": opts.lr, "momentum": opts.sgd_momentum, "weight_decay": opts.weight_decay}},
            "zero_allow_untested_optimizer": True}
    if opt == "adafactor":   # torch.optim.Adafactor (PyTorch >= 2.5)
        return {"optimizer": {"type": "Adafactor", "params": {"lr": opts.lr, "weight_decay": opts.weight_decay}},
                "zero_allow_untested_optimizer": True}
    # adam8bit: bitsandbytes' Adam8bit, built by the training script
    return {"zero_allow_untested_optimizer": True}


def _offload(device: str, opts: EmitOptions) -> dict[str, Any]:
    out: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        out["nvme_path"] = opts.nvme_path
    return out


def _zero(r: PlanResult, opts: EmitOptions) -> dict[str, Any]:
    """zero_optimization, with buffers sized as memory.buffer_bytes counts them.

    ZeRO-1/2: the memory model counts one reduce bucket of ``zero_bucket_numel``
    elements. With overlap_comm DeepSpeed double-buffers the reduce bucket
    (stage_1_and_2.py: "Use double buffers to avoid data access conflict when
    overlap_comm is enabled"), so each buffer gets half. ZeRO-3: one reduce bucket of
    ``zero_bucket_numel``, and the gathered module plus one prefetched module of the
    largest size: stage3_prefetch_bucket_size = the largest module, and
    stage3_max_live_parameters = two of them.
    """
    lay = r.best.layout  # type: ignore[union-attr]
    stage = lay.zero_stage
    bucket = r.setup.buffers.zero_bucket_numel
    z: dict[str, Any] = {"stage": stage}
    if stage == 0:
        return z
    z["contiguous_gradients"] = True
    z["overlap_comm"] = True
    if stage in (1, 2):
        half = max(1, bucket // 2)
        z["reduce_bucket_size"] = half
        z["allgather_bucket_size"] = half
        z["reduce_scatter"] = True
    else:
        largest = largest_module_params(r)
        z["reduce_bucket_size"] = max(1, bucket)
        z["stage3_prefetch_bucket_size"] = largest
        z["stage3_max_live_parameters"] = 2 * largest
        z["stage3_max_reuse_distance"] = 2 * largest
        z["stage3_param_persistence_threshold"] = PARAM_PERSISTENCE_THRESHOLD
        z["stage3_gather_16bit_weights_on_model_save"] = True
    if opts.offload_optimizer != "none":
        z["offload_optimizer"] = _offload(opts.offload_optimizer, opts)
    if opts.offload_params != "none":
        z["offload_param"] = _offload(opts.offload_params, opts)
    return z


def _activation_checkpointing(lay: Layout) -> dict[str, Any]:
    """deepspeed.checkpointing's settings (used by Megatron-DeepSpeed; Hugging Face models
    turn recomputation on with gradient_checkpointing_enable()). Under sequence
    parallelism the memory model splits each kept block input over tp, which is what
    partition_activations does."""
    return {
        "partition_activations": lay.recompute == "full" and lay.sp,
        "cpu_checkpointing": False,
        "contiguous_memory_optimization": False,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


def _scheduler(r: PlanResult, opts: EmitOptions) -> dict[str, Any]:
    """The run's schedule (planner.emit.schedule) as DeepSpeed's WarmupCosineLR
    (deepspeed/runtime/lr_schedules.py, 0.19.8): linear warmup from 0 over warmup_num_steps,
    cosine to cos_min_ratio x lr at total_num_steps. Its warmup_type defaults to "log", so
    "linear" is named. The optimizer's lr is the peak."""
    from planner.emit.schedule import training_schedule

    sch = training_schedule(r, opts)
    return {"type": "WarmupCosineLR", "params": {
        "total_num_steps": sch.steps, "warmup_num_steps": sch.warmup_steps, "warmup_min_ratio": 0.0,
        "cos_min_ratio": float(f"{sch.min_lr / sch.peak_lr:.6g}"), "warmup_type": "linear"}}


def to_deepspeed_config(r: PlanResult, opts: EmitOptions = EmitOptions()) -> dict[str, Any]:
    """ds_config.json for the chosen plan, as a dict.

    DeepSpeed checks train_batch_size = micro-batch x accumulation steps x data-parallel
    world size (runtime/config.py, _batch_assertion); the planner's global batch is that
    product with the data-parallel size dp x ep.
    """
    lay = chosen(r).layout
    cfg: dict[str, Any] = {
        "train_batch_size": lay.micro_batch * lay.grad_accum * data_parallel_size(lay),
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": lay.grad_accum,
        "gradient_clipping": opts.grad_clip,
        **_precision(r),
        **_optimizer(r, opts),
        "zero_optimization": _zero(r, opts),
    }
    from planner.stacks import runs_megatron_deepspeed
    if not runs_megatron_deepspeed("deepspeed", lay):
        # Megatron-DeepSpeed steps Megatron's own scheduler (its arguments carry the schedule); a
        # scheduler here would take its place (DeepSpeedEngine._configure_lr_scheduler: the
        # config's wins over the client's)
        cfg["scheduler"] = _scheduler(r, opts)
    if lay.recompute != "none":
        cfg["activation_checkpointing"] = _activation_checkpointing(lay)
    from planner.layouts.batch import LayoutArrays
    from planner.memory.states import fp32_accumulated_gradients
    if fp32_accumulated_gradients(r.setup, LayoutArrays.from_layouts([lay])).any():
        # Megatron-DeepSpeed under bf16: BF16_Optimizer with fp32 gradient accumulation, as
        # BLOOM trained (the memory model counts its 4-byte gradients: the same function)
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if opts.offload_optimizer == "nvme" or opts.offload_params == "nvme":
        # DeepSpeed's asynchronous I/O defaults (config docs, "Asynchronous I/O")
        cfg["aio"] = {"block_size": 1_048_576, "queue_depth": 8, "single_submit": False,
                      "overlap_events": True}
    return cfg
