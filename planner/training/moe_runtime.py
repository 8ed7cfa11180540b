"""What Megatron-Core runs around a block besides its kernels, as NVIDIA's Megatron-Bridge
recipes of 2025-2026 set it: the expert-parallel all-to-all overlap, CUDA graphs and FP8
attention. Each setting's effect on the step time is read here, once.

Sources (megatron-core 0.16.1, transformer/transformer_config.py):
- ``overlap_moe_expert_parallel_comm`` (lines 1852-1906): the combined 1F1B schedule pairs one
  micro-batch's forward with another's backward layer by layer, so that each one's
  dispatch/combine all-to-alls run under the other's attention and MLP. megatron-core refuses it
  without expert parallelism, with full recomputation (granularity, method, num_layers), with
  more than one MTP layer, and with pp > 1 unless the schedule is interleaved (vp set).
- ``cuda_graph_impl`` / ``cuda_graph_scope`` (lines 776-790, 1688-1740; transformer/enums.py
  CudaGraphScope): "transformer_engine" with scope attn, moe_router, moe_preprocess captures the
  attention and the MoE router and token-count preprocessing of each layer; "local" with scope
  full_iteration captures the whole forward-backward. A dropless MoE layer copies its per-expert
  token counts to the host and waits for them (a device-to-host sync each MoE layer and
  micro-batch) before its all-to-all and grouped GEMM can launch, whatever the TE graphs capture:
  the fixed per-block cost timing.efficiency.Efficiency.moe_block_overhead_s fits
  (host_sync_per_moe_block, sources there).
- ``fp8_dot_product_attention`` (line 477): Transformer Engine's FP8 fused attention.
Which of them each published Megatron-Bridge run set: its recipe
(scripts/performance/configs/<family>/*_workload_base_configs.py in NVIDIA-NeMo/Megatron-Bridge;
tests/data/megatron_bridge_runs.json, recipe_flags).
"""

from __future__ import annotations

from typing import Any

from planner.models.spec import ModelSpec

A2A_OVERLAPS = ("auto", "on", "off")
# megatron-core's token dispatchers the step time tells apart: "alltoall" sends each routed copy
# of a token to its expert's rank; "flex" (moe_token_dispatcher_type flex with the DeepEP or
# HybridEP backend, moe_flex_dispatcher_backend) sends a token once per remote node
DISPATCHERS = ("alltoall", "flex")
CUDA_GRAPHS = ("none", "moe", "full-iteration")


MAX_A2A_OVERLAP_MTP = 1     # megatron-core 0.16.1: "MTP layernum only supports 1 when enabling ..."


def a2a_overlap_blocked(recompute: str, mtp_layers: int) -> str:
    """Why megatron-core 0.16.1 cannot overlap the expert-parallel all-to-alls for a block
    recomputed as ``recompute`` with ``mtp_layers`` MTP modules ("" where it can). The pp/vp
    condition is the layout's (a2a_overlap_needs_vp)."""
    if recompute == "full":
        return "disable full recomputation when enabling overlap_moe_expert_parallel_comm"
    if mtp_layers > MAX_A2A_OVERLAP_MTP:
        return "MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm"
    return ""


def a2a_overlap_needs_vp(pp: Any, vp: Any) -> Any:
    """megatron-core 0.16.1: with pp > 1 the overlap runs only under the interleaved schedule
    (virtual_pipeline_model_parallel_size set). Ints or arrays (layouts.rules reads it too)."""
    return (pp > 1) & (vp <= 1)


def a2a_overlap_refused(ep: Any, pp: Any, vp: Any, mtp_layers: int) -> Any:
    """Where megatron-core refuses the overlap for a layout whatever its recomputation: no expert
    parallelism, pp without interleaving, more than one MTP layer (the rule --moe-a2a-overlap on
    is held to, layouts.rules). Ints or arrays."""
    return (ep <= 1) | a2a_overlap_needs_vp(pp, vp) | (mtp_layers > MAX_A2A_OVERLAP_MTP)


def a2a_overlapped(moe_a2a_overlap: str, recompute: str, mtp_layers: int) -> bool:
    """Whether the step-time model hides the expert-parallel all-to-alls of a block (share
    Efficiency.ep_overlap): the setting is not "off" and megatron-core can run it for the block.
    Under "auto" a pipeline without interleaving is timed as overlapped too (the block's time does
    not know vp); `plan` writes the overlap into Megatron's arguments only where it runs."""
    return moe_a2a_overlap != "off" and not a2a_overlap_blocked(recompute, mtp_layers)


def a2a_overlap_written(moe_a2a_overlap: str, recompute: str, mtp_layers: int, cuda_graphs: str,
                        ep: int, pp: int, vp: int) -> bool:
    """Whether `plan --out megatron` writes --overlap-moe-expert-parallel-comm: the block is timed
    as overlapped (a2a_overlapped), megatron-core runs it for the layout (a2a_overlap_refused), and
    no full-iteration CUDA graph is captured (megatron-core 0.16.1 refuses the two together,
    transformer_config.py lines 1898-1906; Megatron-Bridge's 26.08 recipes run both on a newer
    one, and the step time follows them, so there the plan times an overlap it does not write)."""
    return (a2a_overlapped(moe_a2a_overlap, recompute, mtp_layers)
            and not bool(a2a_overlap_refused(ep, pp, vp, mtp_layers)) and cuda_graphs != "full-iteration")


def dedup_routing(m: ModelSpec, dispatcher: str) -> tuple[int, int, int] | None:
    """(k, routing groups, group limit) where the dispatcher sends a token once per remote domain
    (hardware.placement.remote_share_deduplicated), None where it sends every routed copy."""
    if dispatcher != "flex" or not m.is_moe:
        return None
    return m.n_experts_per_token, m.routing_groups, m.routing_group_limit


def host_sync_per_moe_block(cuda_graphs: str) -> bool:
    """Whether each MoE block pays the host round trip of its token counts per micro-batch
    (Efficiency.moe_block_overhead_s): every dropless block does, unless a full-iteration CUDA graph
    runs the step (which holds no host sync: Megatron-Bridge's 26.x recipes that capture it size
    the expert buffers statically, moe_expert_rank_capacity_factor and moe_paged_stash).

    megatron-core 0.16.1, transformer/moe/token_dispatcher.py: MoEAlltoAllTokenDispatcher.preprocess
    sets the sync point "before_ep_alltoall" for a dropless layer with ep or tp > 1 ("before_finish"
    without), and _maybe_dtoh_and_synchronize waits on the copy's event there; the TE graph scope
    moe_preprocess only moves the copy itself from "before_permutation_1" to "before_ep_alltoall"
    (the cuda_dtoh_point set in __init__), so the "moe" graphs keep the sync. The flex dispatcher's
    backends wait too: fused_a2a.py hybrid_ep_dispatch ("num_permuted_tokens ... None ... causes a
    D2H synchronization"), and DeepEP's dispatch returns the received counts per expert as a host
    list. Only drop-and-pad routing (moe_pad_expert_input_to_capacity: _maybe_dtoh_and_synchronize
    returns at once) has none; the planner plans every MoE dropless."""
    return cuda_graphs != "full-iteration"
