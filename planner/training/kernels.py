"""Which kernels a transformer block runs: the one rule the memory model (what the block
saves) and the step-time model (how much HBM traffic its element-wise ops make, what selective
recomputation reruns) both read.

The stack decides (planner/stacks/catalog.toml): megatron runs Transformer Engine / fused
kernels, torchtitan its own Llama 3 block (eager PyTorch ops unless torch.compile fuses them,
and its per-op SelectiveAC). Without a stack, ``--kernels`` decides; under "auto" fused kernels
where tp, pp or cp exceeds 1 (those layouts need a Megatron-style engine) and eager ops
otherwise. Eager ops under mixed precision on replicated ranks (no sharding, ZeRO-0) run under
torch.autocast with fp32 parameters: "amp" (what DDP and the Hugging Face Trainer run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from planner.layouts.layout import Layout
    from planner.training.setup import TrainingSetup

# the codes the batched models carry per layout (memory.shapes gathers block figures by them)
KERNELS = ("fused", "eager", "amp", "torchtitan")
FUSED, EAGER, AMP, TITAN = 0, 1, 2, 3     # torchtitan: its Llama 3 block and chunked loss


def auto_fuses(tp: np.ndarray | int, pp: np.ndarray | int, cp: np.ndarray | int) -> np.ndarray:
    """Where ``--kernels auto`` runs fused kernels: tp, pp or cp above 1 (bool per layout)."""
    return (np.asarray(tp) > 1) | (np.asarray(pp) > 1) | (np.asarray(cp) > 1)


def replicated_ranks(zero_stage: np.ndarray | int, fsdp: np.ndarray | bool) -> np.ndarray:
    """Where a layout keeps whole parameters on every data-parallel rank: ZeRO-0 without FSDP
    (bool, per layout for arrays). Elsewhere the engine holds the model in 16 bits (DeepSpeed
    ZeRO >= 1's fp16/bf16 module, FSDP2's MixedPrecisionPolicy); here mixed precision is
    torch.autocast over fp32 parameters (block_kernel_codes' "amp", PEFT's adapter casts:
    memory.activations.adapters_in_16_bits)."""
    return (np.asarray(zero_stage) == 0) & np.logical_not(fsdp)


def block_kernel_codes(setup: TrainingSetup, tp: np.ndarray | int, pp: np.ndarray | int, cp: np.ndarray | int,
                       replicated: np.ndarray | bool) -> np.ndarray:
    """The kernels (a KERNELS code, int64 per layout) each layout's blocks run under ``setup``.

    ``replicated``: the layout keeps whole parameters on every data-parallel rank
    (replicated_ranks), where eager ops under mixed precision are autocast ones ("amp"). The step time
    passes False where it does not know the sharding: it times amp as eager
    (runs_fused_elementwise)."""
    shape = np.broadcast(np.asarray(tp), np.asarray(pp), np.asarray(cp), np.asarray(replicated)).shape
    if setup.stack == "torchtitan":
        return np.full(shape, TITAN, dtype=np.int64)
    kernels = "fused" if setup.stack == "megatron" else setup.kernels
    if kernels == "auto":
        kern = np.where(auto_fuses(tp, pp, cp), FUSED, EAGER).astype(np.int64)
    else:
        kern = np.full(shape, KERNELS.index(kernels), dtype=np.int64)
    if setup.precision_spec.is_mixed:
        kern = np.where((kern == EAGER) & np.asarray(replicated), AMP, kern)
    return np.broadcast_to(kern, shape).astype(np.int64)


def megatron_core_profile(setup: TrainingSetup, kernels: np.ndarray | int) -> np.ndarray:
    """Where the memory model follows Megatron-Core's engine (bool per layout): ``--stack
    megatron``, or with no stack named (``auto``) the layouts whose blocks run fused kernels,
    which planner.stacks.default_stack hands to megatron (setup.MEMORY_STACKS: "auto" follows
    the kernels' profile, fused = Megatron-LM). ``kernels``: KERNELS codes (block_kernel_codes)."""
    if setup.stack == "megatron":
        return np.ones(np.shape(kernels), dtype=bool)
    return (np.asarray(kernels) == FUSED) & (setup.stack == "auto")


def layout_kernels(setup: TrainingSetup, lay: Layout) -> str:
    """The kernels ``lay``'s blocks run under ``setup`` (block_kernel_codes for one layout)."""
    replicated = replicated_ranks(lay.zero_stage, lay.is_fsdp)
    return KERNELS[int(block_kernel_codes(setup, lay.tp, lay.pp, lay.cp, replicated))]


def runs_fused_elementwise(setup: TrainingSetup, kernels: str) -> bool:
    """Whether the block's element-wise ops (norms, activation, residuals, RoPE) run as fused
    kernels, each reading its inputs and writing its outputs once (timing.kernels.
    elementwise_bytes_per_token), rather than as eager PyTorch ops (x Efficiency.
    unfused_elementwise_factor). Fused: Megatron-LM's / Transformer Engine's kernels, and
    torchtitan's block under torch.compile (inductor fuses the pointwise ops of a block into
    generated kernels; torchtitan 0.3.0 compile.components = ["model"] compiles each block).
    torchtitan without compile runs eager ops (nn.RMSNorm, F.silu(w1 x) * w3 x,
    torchtitan/models/llama3/model.py)."""
    return kernels == "fused" or (kernels == "torchtitan" and setup.compile)


def selective_policy(kernels: str, default: str) -> str:
    """What recompute "selective" reruns for blocks of ``kernels``: torchtitan's blocks its
    per-op SelectiveAC ("torchtitan-op", Efficiency.selective_policy), the others ``default``
    (the Efficiency's, Megatron's attention core unless a calibration names another)."""
    return "torchtitan-op" if kernels == "torchtitan" else default
