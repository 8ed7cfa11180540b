"""The data-parallel part of a step: the parameters a rank trains, the gradient reductions and
parameter gathers of its sharding (ZeRO, FSDP), and the optimizer update."""

from __future__ import annotations

from functools import lru_cache

from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import (
    FALLBACK_INTRA_LATENCY_S,
    AxisLink,
)
from planner.layouts.layout import Layout
from planner.memory.model import rank_params, stage_layers
from planner.models.spec import ModelSpec, ParamCount
from planner.timing.collectives import all_reduce_s, gather_s, hide
from planner.timing.efficiency import Efficiency
from planner.timing.kernels import Rates, backward_layers
from planner.training.finetune import (
    FinetuneSpec,
    RankSplit,
    rank_split,
)
from planner.training.setup import (
    Precision,
    TrainingSetup,
    optimizer_state_bytes_per_param,
)


@lru_cache(maxsize=4096)
def _rank_split(m: ModelSpec, pc: ParamCount, ft: FinetuneSpec, tp: int, ep: int, pp: int, stage: int,
                n_layers: int, weight_bytes: int) -> RankSplit:
    rp = rank_params(m, pc, Layout(tp=tp, ep=ep, pp=pp), stage, n_layers)
    first = sum(stage_layers(m.n_layers, pp)[:stage])
    return rank_split(m, pc, ft, Layout(tp=tp, ep=ep, pp=pp), rp.dense, rp.expert, rp.root_unit, n_layers,
                      backward_layers(ft, m.n_layers, first, n_layers), stage == pp - 1, weight_bytes, 0)


def trained_split(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, lay: Layout, stage: int,
                  n_layers: int) -> RankSplit:
    """The parameters of one rank of ``stage`` split into those that train and the frozen
    base (finetune.rank_split, as memory.per_rank_memory splits them): the data-parallel
    gradient reductions and the optimizer update cover the trainable ones; ZeRO-3/FSDP
    gathers the frozen base too, at its stored bytes (4-bit under QLoRA). Full training:
    every parameter trains, nothing is frozen."""
    return _rank_split(m, pc, setup.finetune, lay.tp, lay.ep, lay.pp, stage, n_layers,
                       setup.precision_spec.weight_bytes)


def dp_parts(lay: Layout, rp: RankSplit, links: dict[str, AxisLink], eff: Efficiency, gpu: GpuSpec,
              prec: Precision, fwd_mb: float, bwd_mb: float) -> list[tuple[float, float, bool]]:
    """The data-parallel communication of a step as (exposed, hidden, once per micro-batch
    rather than once per step) parts, for the rank's parameters ``rp``."""
    return [(*hide(comm, fwd_mb if window == "fwd" else bwd_mb, overlap), per_mb)
            for comm, window, overlap, per_mb in dp_collectives(lay, rp, links, eff, gpu, prec)]


def dp_collectives(lay: Layout, rp: RankSplit, links: dict[str, AxisLink], eff: Efficiency, gpu: GpuSpec,
              prec: Precision) -> list[tuple[float, str, float, bool]]:
    """The data-parallel collectives of a step as (seconds, the compute they may hide
    under: "fwd" or "bwd" of a micro-batch, the overlap fraction, once per micro-batch).

    ``rp`` splits the rank's parameters into trainable and frozen (trained_split):
    gradients are reduced, and ZeRO-1/2 gathers updated weights, for the trainable ones
    only; ZeRO-3/FSDP also gathers the frozen base, at its stored bytes (QLoRA: NF4 with
    its constants, finetune.linear_weight_bytes), before the forward and again before the
    backward (frozen weights still give the input gradient). Under freeze the frozen
    blocks that run no backward are counted in the backward gather too (an overestimate).
    Full training: every parameter trains, so weights and gradients cover them all."""
    n_dense, n_expert = lay.dense_shard_degree, lay.expert_shard_degree
    link = links["dp"] if lay.dp > 1 else (links["cp"] if lay.cp > 1 else links["ep"])
    g_b, w_b = eff.grad_reduce_bytes or prec.grad_bytes, prec.weight_bytes
    grads = (rp.trainable_dense * g_b, rp.trainable_expert * g_b)
    trained = (rp.trainable_dense * w_b, rp.trainable_expert * w_b)
    weights = (rp.frozen_dense_bytes + rp.trainable_dense * w_b, rp.frozen_expert_bytes + rp.trainable_expert * w_b)

    def over_dp(fn, n_bytes: tuple[int, int]) -> float:
        return fn(n_bytes[0], n_dense, link, eff) + fn(n_bytes[1], n_expert, link, eff)

    comms: list[tuple[float, str, float, bool]] = []
    if lay.zero_stage == 3:
        if lay.sharding == "fsdp-hybrid":
            inside = hybrid_shard(lay, gpu.gpus_per_node)
            intra = AxisLink(bus_bytes_per_s=gpu.intra_node_bytes_per_s, latency_s=FALLBACK_INTRA_LATENCY_S)
            ag = gather_s(rp.frozen_bytes + rp.trainable * w_b, inside, intra, eff)
            rs = gather_s(rp.trainable * g_b, inside, intra, eff)
            across = all_reduce_s(rp.trainable * g_b / inside, max(1, n_dense // inside), link, eff)
            comms.append((across, "bwd", eff.dp_overlap, False))
        else:
            ag, rs = over_dp(gather_s, weights), over_dp(gather_s, grads)
        comms += [(ag, "fwd", eff.zero3_overlap, True), (ag + rs, "bwd", eff.zero3_overlap, True)]
    elif lay.zero_stage == 2 and lay.is_fsdp:
        ag, rs = over_dp(gather_s, weights), over_dp(gather_s, grads)
        comms += [(ag, "fwd", eff.zero3_overlap, True), (rs, "bwd", eff.zero3_overlap, True)]
    elif lay.zero_stage in (1, 2):
        rs, ag = over_dp(gather_s, grads), over_dp(gather_s, trained)
        comms += [(rs, "bwd", eff.dp_overlap, False), (ag, "fwd", eff.param_gather_overlap, False)]
    else:
        comms.append((over_dp(all_reduce_s, grads), "bwd", eff.dp_overlap, False))
    return comms


def optimizer_bytes_per_param(setup: TrainingSetup) -> float:
    """HBM bytes the optimizer update moves per trainable parameter: it reads and writes
    the fp32 master copy and the optimizer states, reads the gradient and writes the
    16-bit weight (AdamW mixed precision: 2 x (4 + 8) + 2 + 2 = 28 bytes). QLoRA's 16-bit
    adapters keep no master copy and its paged 8-bit AdamW two int8 states (Dettmers et al.
    2023, arXiv:2305.14314, Sec. 3), as memory.per_rank_memory counts them:
    2 x (2 + 8/2048) + 2 + 2 = 8.0 bytes."""
    ft = setup.finetune
    prec = setup.precision_spec
    if ft.is_lora and ft.adapter_bits == 16:
        prec = Precision.named("bf16")
    optimizer = "adam8bit" if ft.paged_8bit_optimizer else setup.optimizer
    state = prec.master_bytes + optimizer_state_bytes_per_param(optimizer)
    return 2 * state + prec.grad_bytes + prec.weight_bytes


def optimizer_time_s(n_dense: int, n_expert: int, lay: Layout, setup: TrainingSetup, r: Rates) -> float:
    """The optimizer update is memory bound: optimizer_bytes_per_param() per trainable
    parameter (``n_dense``, ``n_expert``: trained_split's, all of them in full training;
    LoRA's adapters, freeze's trainable blocks) on the rank's shard, at the HBM rate."""
    per_param = optimizer_bytes_per_param(setup)
    shard_dense = lay.dense_shard_degree if lay.zero_stage >= 1 else 1
    shard_expert = lay.expert_shard_degree if lay.zero_stage >= 1 else 1
    params = n_dense / shard_dense + n_expert / shard_expert
    return params * per_param / r.hbm_bytes_per_s


def hybrid_shard(lay: Layout, gpus_per_node: int) -> int:
    inside = max(1, gpus_per_node // lay.tp)
    d = lay.dense_shard_degree
    while d > inside or lay.dense_shard_degree % d:
        d -= 1
    return max(d, 1)
