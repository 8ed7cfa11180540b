"""Model states of one rank over a batch of layouts: weights, gradients and optimizer states,
their ZeRO/FSDP sharding, where offload puts them, and the optimizer step's temporaries.

Every function takes arrays over the batch (or (slot, batch) for the stage-dependent
parameter counts, broadcast against the per-layout fields) and returns int64 arrays of
bytes; Python's int() is astype(int64) (truncation, as int() does for these non-negative
values), and the integer and float operations run in the order a scalar formula would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import SHARDINGS, instance_shard_size, weight_shard_size
from planner.models.spec import ModelSpec
from planner.training.setup import Precision, TrainingSetup

GRAD_OP = SHARDINGS.index("fsdp-grad-op")
HYBRID = SHARDINGS.index("fsdp-hybrid")

# DeepSpeed's NVMe offload defaults (DeepSpeed configuration docs, "Parameter offloading"
# and "Optimizer offloading"; deepspeed/runtime/zero/offload_config.py): parameters swap
# through buffer_count = 5 pinned buffers of buffer_size = 1e8 elements; optimizer states
# through buffer_count = 4 pinned fp32 buffers, each one sub-group (sub_group_size = 1e9
# elements, zero_optimization) or the rank's partition when smaller.
NVME_PARAM_BUFFERS = 5
NVME_PARAM_BUFFER_NUMEL = 100_000_000
NVME_OPTIMIZER_BUFFERS = 4
ZERO_SUB_GROUP_NUMEL = 1_000_000_000


def ceil_div(n: Any, d: Any) -> Any:
    return -(-n // d)


def trunc(x: np.ndarray) -> np.ndarray:
    """int() elementwise: floats toward zero, integers unchanged."""
    x = np.asarray(x)
    return x.astype(np.int64) if x.dtype.kind == "f" else x


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one rank (arrays)."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    unsharded_weights: np.ndarray   # FSDP shard-grad-op keeps gathered weights through backward
    # FSDP under a pipeline (no-sync accumulation, no_sync_gradient_bytes): the
    # unsharded gradients held across the step's micro-batches in place of the sharded ones;
    # freed by the reduce-scatter before the optimizer step, so not in ``total`` (0 elsewhere)
    accumulated_gradients: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """What the optimizer step holds (no accumulated gradients: they are reduced by then)."""
        return self.weights + self.gradients + self.optimizer + self.unsharded_weights


@dataclass(frozen=True, slots=True)
class OffloadSplit:
    """Model states left on the GPU, and what went to CPU memory and NVMe (bytes, per rank)."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    host_bytes: np.ndarray
    nvme_bytes: np.ndarray
    step_on_host: np.ndarray      # bool: the optimizer step runs on the CPU, no GPU temporaries


def shard_degrees(a: LayoutArrays, hybrid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ranks a dense weight is sharded over, ranks an expert weight is sharded over): dp*cp*ep
    (DP*cp when ep is folded, Layout.ep_fold) and the expert data-parallel group dp*cp*tp/etp
    (megatron-core's EDP, layouts.layout's notes; dp*cp at etp = tp), or FSDP hybrid's shard
    group (at most the EDP for experts).
    Megatron's distributed optimizer shards expert parameters over the expert data-parallel
    group (megatron-core 0.16.1 distributed/distributed_data_parallel.py lines 295-301: the
    expert parameters' buffers are allocated over intra_expt_dp_group). Over several
    distributed-optimizer instances (Layout.optimizer_instances), both groups are one
    instance's: ``hybrid`` is then LayoutArrays.hybrid_shard's instance group."""
    dense_deg, expert_deg = a.dense_shard_degree, a.expert_shard_degree
    d_dense = weight_shard_size(dense_deg, hybrid)
    d_expert = np.maximum(1, np.where(hybrid > 0, np.minimum(expert_deg, hybrid), expert_deg))
    inst = a.instances
    if np.any(inst > 1):
        # several distributed-optimizer instances: one instance's expert data-parallel ranks
        # (megatron-core intra_partial_expert_data_parallel_size, layout.instance_shard_size)
        d_expert = np.where(inst > 1, np.maximum(1, instance_shard_size(expert_deg, inst)), d_expert)
    return d_dense, d_expert


def expert_padding(m: ModelSpec, a: LayoutArrays, hybrid: np.ndarray) -> np.ndarray:
    """How much larger FSDP2's expert shards and gathers are than an even split (float).

    FSDP2 shards every parameter on dim 0 and pads it to a multiple of the shard degree
    D (PyTorch FSDP2 docs, fully_shard: "dim-0 per-parameter sharding"). transformers
    stores an MoE layer's experts as one (E, ...) tensor, so with D > E each rank holds
    ceil(E/D) whole experts and an all-gather returns D x ceil(E/D) of them: a factor
    D ceil(E/D) / E. Measured with FSDPMemTracker on Mixtral-8x7B (E = 8) at D = 64:
    sharded fp32 parameters 22.6 GB per rank, one eighth of the model, not 1/64. The
    padding is in FSDP2's own buffers (shards, all-gather outputs and the unsharded
    parameters' storage, which views them, and reduce-scatter inputs); the gradients
    autograd makes have the parameters' shapes, E experts (buffers.fsdp_backward_end_bytes).
    """
    if not m.is_moe:
        return np.ones(len(a))
    _, d = shard_degrees(a, hybrid)      # the ranks an expert weight is sharded over
    e = m.n_experts
    return np.where((a.sharding > 0) & (a.ep == 1), d * ceil_div(np.int64(e), d) / e, 1.0)


def model_state_bytes(n_dense: np.ndarray, n_expert: np.ndarray, precision: Precision,
                      optimizer_bytes_per_param: float, a: LayoutArrays, hybrid: np.ndarray,
                      amp: np.ndarray | bool = False, expert_padding: np.ndarray | float = 1.0,
                      grad_sync: str = "step", instance_weight_bytes: int = 2) -> ModelStates:
    """Weights, gradients and optimizer state of one rank (ZeRO paper, Sec. 5).

    ZeRO-1 shards the optimizer states (with the fp32 master copy) over the data ranks,
    ZeRO-2 also the gradients, ZeRO-3 also the weights: with Psi parameters, K=12 and
    N_d ranks, (2+2+K)Psi, 2Psi+2Psi+K Psi/N_d, 2Psi+(2+K)Psi/N_d, (2+2+K)Psi/N_d
    (Rajbhandari et al. 2019, arXiv:1910.02054, Fig. 1). FSDP2 with a mixed-precision
    policy keeps the sharded parameters in fp32 (they are the master copy) and fp32
    gradients, and gathers 16-bit copies for compute (PyTorch FSDP2 docs,
    MixedPrecisionPolicy); shard-grad-op keeps the gathered copies from forward to
    backward. ``expert_padding`` (states.expert_padding) scales the expert shards FSDP2
    stores when it cannot split the experts' first dimension evenly. ``amp``: where
    torch.autocast runs with fp32 parameters (they are the master copy), fp32 gradients,
    and 16-bit copies of the weights made per forward (counted with the activations).
    ``grad_sync``: TrainingSetup.fsdp_pipeline_grad_sync (no_sync_gradient_bytes).
    ``instance_weight_bytes``: Megatron FSDP over distributed-optimizer instances, the bytes per
    parameter of the model weights an instance holds beside the fp32 main weights (below).
    """
    degrees = shard_degrees(a, hybrid)
    stage = a.zero_stage
    fsdp = a.sharding > 0

    def shard(nd_bytes: np.ndarray, ne_bytes: np.ndarray, sharded: np.ndarray | bool,
              over: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        return _shard(nd_bytes, ne_bytes, sharded, over or degrees)

    # FSDP: the sharded parameter keeps the dtype it was built in, fp32 under mixed precision
    stored = 4 if precision.is_mixed else precision.weight_bytes
    opt_pp = optimizer_bytes_per_param
    padded = trunc(n_expert * expert_padding)
    f_unsharded = np.where(a.sharding == GRAD_OP,
                           trunc((n_dense + n_expert * expert_padding) * precision.weight_bytes), 0)
    f_weights = shard(n_dense * stored, padded * stored, True)
    f_opt = shard(n_dense * opt_pp, padded * opt_pp, True)
    outer = fsdp & (a.instances > 1)
    if np.any(outer):
        # Megatron FSDP over several distributed-optimizer instances, with outer_dp_sharding_strategy
        # 'optim' as Megatron-Bridge's Nemotron 3 Ultra recipe sets it (megatron-core 0.16.1
        # distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py lines 1900-2095 and 2130-2150):
        # the main (fp32) weight buffer, and with it the optimizer's states, is sharded over every
        # data-parallel rank; the model-weight and gradient buffers over the instance's ranks (the
        # HSDP buffers, of which the whole group's shards are views). The instance's model weights are
        # ``instance_weight_bytes`` per parameter: the 16-bit ones, or 0 where the low-precision
        # copies hold them instead (fp8_param_gather: memory.fp8, counted by state_terms)
        over_all = (a.dense_shard_degree, a.expert_shard_degree)
        main = shard(n_dense * stored, padded * stored, True, over_all)
        model = shard(n_dense * instance_weight_bytes, padded * instance_weight_bytes, True)
        f_weights = np.where(outer, main + model, f_weights)
        f_opt = np.where(outer, shard(n_dense * opt_pp, padded * opt_pp, True, over_all), f_opt)
    # ZeRO: K = the master copy + the optimizer's states
    z_opt_pp = precision.master_bytes + opt_pp
    weights = shard(n_dense * precision.weight_bytes, n_expert * precision.weight_bytes, stage >= 3)
    opt = shard(n_dense * z_opt_pp, n_expert * z_opt_pp, stage >= 1)
    if np.any(amp):
        amp_w = (n_dense + n_expert) * 4
        weights = np.where(amp, amp_w, weights)
        opt = np.where(amp, trunc((n_dense + n_expert) * opt_pp), opt)
    gradients = gradient_bytes(n_dense, n_expert, precision, a, hybrid, amp, expert_padding, degrees)
    return ModelStates(weights=np.where(fsdp, f_weights, weights), gradients=gradients,
                       optimizer=np.where(fsdp, f_opt, opt), unsharded_weights=np.where(fsdp, f_unsharded, 0),
                       accumulated_gradients=no_sync_gradient_bytes(n_dense, n_expert, precision, a, grad_sync))


def gradient_bytes(n_dense: np.ndarray, n_expert: np.ndarray, precision: Precision, a: LayoutArrays,
                   hybrid: np.ndarray, amp: np.ndarray | bool = False, expert_padding: np.ndarray | float = 1.0,
                   degrees: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The gradients of one rank (model_state_bytes' ``gradients``, which reads them here): ZeRO-2
    and ZeRO-3 shard them over the data ranks (Rajbhandari et al. 2019, Fig. 1); FSDP2 keeps them in
    fp32 under mixed precision, sharded, its expert shards padded (expert_padding); fp32 where
    ``amp`` (torch.autocast's fp32 parameters). Alone for the FSDP moments' sharded gradients of one
    block or of the blocks done (state_terms), which read nothing else of the states (issue 32: two
    of model_state_bytes' three calls per batch). ``degrees``: shard_degrees(a, hybrid), if known."""
    d = degrees or shard_degrees(a, hybrid)
    grad = 4 if precision.is_mixed else precision.grad_bytes
    padded = trunc(n_expert * expert_padding)
    f_grads = _shard(n_dense * grad, padded * grad, True, d)
    grads = _shard(n_dense * precision.grad_bytes, n_expert * precision.grad_bytes, a.zero_stage >= 2, d)
    if np.any(amp):
        grads = np.where(amp, (n_dense + n_expert) * 4, grads)
    return np.where(a.sharding > 0, f_grads, grads)


def _shard(nd_bytes: np.ndarray, ne_bytes: np.ndarray, sharded: np.ndarray | bool,
           over: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Dense and expert bytes split over ``over``'s (dense, expert) ranks where ``sharded``, else whole."""
    d_d, d_e = over
    split = ceil_div(trunc(nd_bytes), np.maximum(d_d, 1)) + ceil_div(trunc(ne_bytes), np.maximum(d_e, 1))
    return np.where(sharded, split, trunc(nd_bytes + ne_bytes))


def fp32_accumulated_gradients(setup: TrainingSetup, a: LayoutArrays) -> np.ndarray:
    """Where the gradients are held in fp32, unsharded: Megatron-DeepSpeed (--stack deepspeed
    with tp or pp) under bf16 mixed precision and ZeRO-0/1 runs DeepSpeed's BF16_Optimizer with
    fp32 gradient accumulation, as BLOOM trained (its ds_config sets data_types.grad_accum_dtype
    fp32: planner.emit.deepspeed). deepspeed 0.19.8 runtime/engine.py _do_optimizer_sanity_check
    (lines 2305-2310: bf16 parameters, fp32 accumulation and ZeRO stage 1 -> BFLOAT16) and
    runtime/bf16_optimizer.py (line 191: ``torch.zeros_like(bf16_groups_flat, dtype=grad_acc_dtype)``,
    a flat buffer of every parameter of the group, not partitioned)."""
    if setup.stack != "deepspeed" or setup.precision != "bf16-mixed":
        return np.zeros(np.shape(a.tp), dtype=bool)
    return ((a.tp > 1) | (a.pp > 1)) & (a.zero_stage <= 1) & (a.sharding == 0)


def no_sync_gradient_bytes(n_dense: np.ndarray, n_expert: np.ndarray, precision: Precision,
                           a: LayoutArrays, grad_sync: str = "step") -> np.ndarray:
    """The unsharded gradients FSDP holds across a step's micro-batches under a pipeline:
    every trainable parameter of the rank, in the reduce dtype (0 for other layouts, and 0
    where ``grad_sync`` is "micro-batch": each micro-batch's gradients are reduce-scattered
    into the sharded ones, as Llama 3 trained; training.setup.FSDP_PIPELINE_GRAD_SYNCS).

    PyTorch's pipeline schedules (grad_sync "step", the default) run every backward of an
    FSDP2 module, shard-grad-op, full shard and hybrid alike, with
    set_requires_gradient_sync(False) and set_reshard_after_backward(False), and
    reduce-scatter once, after the last micro-batch (torch 2.13
    torch/distributed/pipelining/stage.py lines 844-847, backward_maybe_with_nosync's
    FSDPModule branch; lines 1164-1195, perform_reduce_grad), which is what
    timing.dp_overlap.dp_times assumes for shard-grad-op. Without the reduce, FSDP2 keeps
    each parameter's unsharded gradient and, when the reduce dtype differs from the
    parameter's (mixed precision: bf16 compute, fp32 reduce), upcasts it to an fp32
    ``unsharded_accumulated_grad`` that later micro-batches add into
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, to_accumulated_grad_if_needed,
    accumulate_unsharded_grad_if_needed): 4 B per parameter under mixed precision, the
    gradient's own bytes otherwise, with the parameters' own shapes (no expert padding). The
    sharded gradients exist only after the reduce-scatter (zero_grad(set_to_none=True)).
    Measured with FSDPMemTracker under fake tensors (tests/test_measure.py, a 2-block Llama,
    2,094,336 parameters, 8 ranks, shard-grad-op, one no-sync micro-batch before the synced
    one): 8,377,344 B = 4 B x every parameter, in bf16-mixed and in fp32, held through the
    second micro-batch's forward."""
    grad = 4 if precision.is_mixed else precision.grad_bytes
    held = (a.sharding > 0) & (a.pp > 1) & (grad_sync == "step")
    return np.where(held, trunc((n_dense + n_expert) * grad), 0)


def sharded_frozen_bytes(split: object, a: LayoutArrays, hybrid: np.ndarray) -> np.ndarray:
    """The frozen base's weights on one rank (``split``: shapes.SplitArrays): sharded over the
    data ranks under ZeRO-3 and FSDP (as the trainable weights are; FSDP shard-grad-op also
    keeps the gathered weights from forward to backward), replicated otherwise."""
    fd, fe = split.frozen_dense_bytes, split.frozen_expert_bytes     # type: ignore[attr-defined]
    whole = fd + fe
    fsdp = a.sharding > 0
    d_dense, d_expert = shard_degrees(a, hybrid)
    sharded = ceil_div(fd, d_dense) + ceil_div(fe, d_expert) + np.where(a.sharding == GRAD_OP, whole, 0)
    return np.where((a.zero_stage < 3) & ~fsdp, whole, sharded)


def offload_bytes(setup: TrainingSetup, a: LayoutArrays, ms: ModelStates, frozen_weight_bytes: np.ndarray,
                  split: object, prec: Precision, hybrid: np.ndarray) -> OffloadSplit:
    """Where the model states of one rank live under ``setup.offload_*``.

    ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, Sec. 4.1): the optimizer partition
    (fp32 master weights and Adam's moments) lives in CPU memory and CPU Adam updates it; the
    reduced gradients go to the CPU as fp32 (4 B per parameter of the partition). Under
    ZeRO-2 and ZeRO-3 the GPU keeps only the reduce buckets; under ZeRO-1 it still
    accumulates the 16-bit gradients. ZeRO-Infinity (Rajbhandari et al. 2021,
    arXiv:2104.07857, Sec. 5): with ZeRO-3 the 16-bit parameter shards move too, to CPU
    memory or NVMe, and the GPU holds only the gathered working set (the buffers); NVMe
    offload keeps pinned CPU buffers (NVME_* above). FSDP2's CPUOffloadPolicy: sharded
    parameters, sharded gradients and the optimizer states all live in CPU memory and the
    optimizer step runs there (PyTorch FSDP2 docs, fully_shard(offload_policy=...)).
    """
    weights = ms.weights + frozen_weight_bytes
    grads, opt = ms.gradients, ms.optimizer
    zero = np.zeros_like(weights)
    no = np.zeros(weights.shape, dtype=bool)
    fsdp = np.broadcast_to(a.sharding > 0, weights.shape)
    # FSDP2's CPU offload: parameters, gradients and the optimizer step in CPU memory
    if setup.offload_params == "cpu":
        f = (zero, zero, zero, weights + grads + opt, zero, ~no)
    else:
        f = (weights, grads, opt, zero, zero, no)
    # DeepSpeed: ZeRO-Offload's optimizer partition, ZeRO-Infinity's parameter shards
    host, nvme, step_on_host = zero, zero, no
    if setup.offload_optimizer != "none":
        d = np.where(a.zero_stage >= 1, weight_shard_size(a.dense_shard_degree, hybrid), 1)
        partition = ceil_div(split.trainable, d)                      # type: ignore[attr-defined]
        host = host + 4 * partition                     # CPU Adam's fp32 gradient partition
        if setup.offload_optimizer == "cpu":
            host = host + opt
        else:
            nvme = nvme + opt
            host = host + NVME_OPTIMIZER_BUFFERS * np.minimum(ZERO_SUB_GROUP_NUMEL, partition) * 4
        grads = np.where(a.zero_stage >= 2, 0, grads)
        opt, step_on_host = zero, ~no
    if setup.offload_params != "none":
        if setup.offload_params == "cpu":
            host = host + weights
        else:
            nvme = nvme + weights
            host = host + NVME_PARAM_BUFFERS * NVME_PARAM_BUFFER_NUMEL * prec.weight_bytes
        weights = zero
    z = (weights, grads, opt, host, nvme, step_on_host)
    w, g, o, h, nv, on_host = (np.where(fsdp, x, y) for x, y in zip(f, z))
    return OffloadSplit(weights=w, gradients=g, optimizer=o, host_bytes=h, nvme_bytes=nv, step_on_host=on_host)


def optimizer_step_transient_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, kernels: np.ndarray,
                                   rp: object, hybrid: np.ndarray, split: object) -> np.ndarray:
    """Temporaries inside optimizer.step(), beside the states.

    Only PyTorch's own optimizers (under FSDP or DDP: ``kernels`` amp) count here. PyTorch's
    multi-tensor ("foreach", the default on CUDA) Adam/AdamW builds the square root of the
    second moments for every local parameter at once: one fp32 copy of the local
    parameters (torch/optim/adamw.py, _multi_tensor_adamw: _foreach_sqrt). The
    single-tensor path needs two fp32 temporaries of the largest local tensor (the word
    embedding or LM head): measured 4.2e9 B on Llama-3-8B (2 x 525M x 4 B) with MemTracker.
    SGD and Adafactor are counted like the single-tensor path. Only trainable parameters
    (``split``) take part in the step. bitsandbytes' paged 8-bit AdamW (QLoRA) updates its
    blocks in place with fused kernels: no temporaries counted. DeepSpeed and Megatron-LM
    step with fused multi-tensor kernels that work in small chunks (DeepSpeed/apex
    FusedAdam, multi_tensor_applier): no full copy.
    """
    from planner.memory.shapes import AMP

    zero = np.zeros(np.broadcast_shapes(np.shape(split.trainable), a.dp.shape), dtype=np.int64)  # type: ignore[attr-defined]
    if setup.finetune.paged_8bit_optimizer:
        return zero
    applies = (a.sharding > 0) | (kernels == AMP)
    d = np.where(a.zero_stage >= 1, weight_shard_size(a.dense_shard_degree, hybrid), 1)
    if setup.optimizer_foreach and setup.optimizer in ("adamw", "adam8bit"):
        step = 4 * ceil_div(split.trainable, d)                       # type: ignore[attr-defined]
    else:
        step = 2 * 4 * ceil_div(split.largest_trainable, d)           # type: ignore[attr-defined]
    return np.where(applies, step, zero)
