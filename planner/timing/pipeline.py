"""One micro-batch on the slowest pipeline stage: the blocks' compute, their tensor-, context-
and expert-parallel communication, the pipeline sends, and the bubble (Narayanan et al. 2021,
arXiv:2104.04473, Sec. 2.2)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.hardware.placement import (
    AxisLink,
    Cluster,
    axis_links,
)
from planner.hardware.topology import AXES
from planner.layouts.layout import Layout
from planner.memory.model import stage_layers
from planner.models.spec import ModelSpec
from planner.timing.collectives import all_reduce_s, gather_s, hide, send_s
from planner.timing.efficiency import (
    CROSS_ENTROPY_BYTES_PER_LOGIT,
    CROSS_ENTROPY_FORWARD_SHARE,
    Efficiency,
)
from planner.timing.kernels import (
    LayerTime,
    Rates,
    backward_layers,
    gemm_time_s,
    head_backward_gemms,
    layer_time,
    rates,
)
from planner.training.setup import (
    Precision,
    TrainingSetup,
)


def layer_key(lay: Layout) -> Layout:
    """The fields of ``lay`` a block's time depends on (layer_time's cache key)."""
    return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, ep=lay.ep, micro_batch=lay.micro_batch,
                  seq_len=lay.seq_len, recompute=lay.recompute)


def block_kernels(setup: TrainingSetup, lay: Layout) -> str:
    """The kernels a block runs: the set-up's, or under "auto" fused kernels (Megatron-LM,
    Transformer Engine) where tp, pp or cp exceeds 1 and eager PyTorch otherwise."""
    if setup.kernels != "auto":
        return setup.kernels
    return "fused" if (lay.tp > 1 or lay.pp > 1 or lay.cp > 1) else "eager"


def _block_comm(lt: LayerTime, lay: Layout, links: dict[str, AxisLink], eff: Efficiency) -> tuple[float, ...]:
    """The tp, cp and ep communication of one block for one micro-batch: (tp exposed, tp
    hidden, cp exposed, cp hidden, ep exposed, ep hidden) seconds.
    (With sp each all-reduce is an all-gather plus a reduce-scatter: the same bytes.)"""
    tp_all = lt.tp_collectives * all_reduce_s(lt.tp_bytes, lay.tp, links["tp"], eff)
    cp_all = lt.cp_passes * (lay.cp - 1) * send_s(lt.cp_bytes, links["cp"], eff)
    cp_block, cp_hidden = hide(cp_all, lt.attention_fwd_s * lt.cp_passes, eff.cp_overlap)
    ep_all = lt.ep_all_to_alls * gather_s(lt.ep_bytes, lay.ep, links["ep"], eff)
    return (tp_all * (1 - eff.tp_overlap), tp_all * eff.tp_overlap, cp_block, cp_hidden,
            ep_all * (1 - eff.ep_overlap), ep_all * eff.ep_overlap)


def _p2p_s(m: ModelSpec, setup: TrainingSetup, lay: Layout, links: dict[str, AxisLink],
           eff: Efficiency) -> tuple[float, float]:
    """(exposed, hidden) seconds of one micro-batch's pipeline sends on a rank."""
    if lay.pp == 1:
        return 0.0, 0.0
    tokens = lay.micro_batch * lay.seq_len / lay.cp
    p2p_bytes = tokens * m.d_model * setup.precision_spec.activation_bytes / lay.tp   # sp, or Megatron's scatter-gather
    p2p_all = 2 * lay.vp * send_s(p2p_bytes, links["pp"], eff)
    return p2p_all * (1 - eff.pp_overlap), p2p_all * eff.pp_overlap


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelinePart:
    """What a step's time on one placement owes to everything but the sharding: one
    micro-batch on the slowest stage, the bubble, and the tp/cp/ep/pp communication."""

    links: dict[str, AxisLink]
    rates: Rates
    t_mb: float
    fwd_mb: float
    bwd_mb: float
    bubble_s: float
    comm_s: dict[str, float]
    slow_stage: int
    n_slow: int
    n_slow_bwd: int = -1      # blocks of the slowest stage with a backward pass (backward_layers)


def pipeline_part(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency,
              order: tuple[str, ...]) -> PipelinePart:
    gpu = cluster.gpu
    prec: Precision = setup.precision_spec
    kernels = block_kernels(setup, lay)
    links = axis_links(cluster, (lay.tp, lay.cp, lay.ep, lay.dp, lay.pp), order)
    lt = layer_time(m, setup, layer_key(lay), kernels, gpu, eff)
    r = rates(gpu, prec.compute_dtype, eff)
    a = prec.activation_bytes
    tokens = lay.micro_batch * lay.seq_len / lay.cp

    # tp / cp / ep communication of one block, exposed and hidden
    tp_block, tp_hidden, cp_block, cp_hidden, ep_block, ep_hidden = _block_comm(lt, lay, links, eff)

    # per stage: blocks, embedding (first), LM head and loss (last)
    counts = stage_layers(m.n_layers, lay.pp)
    head_fwd = gemm_time_s(tokens, m.vocab_size / lay.tp, m.d_model, r.matmul_flops_per_s,
                           r.hbm_bytes_per_s, prec.weight_bytes)
    loss_s = tokens * m.vocab_size / lay.tp * CROSS_ENTROPY_BYTES_PER_LOGIT / r.hbm_bytes_per_s
    edge_all = all_reduce_s(tokens * m.d_model * a, lay.tp, links["tp"], eff)
    edge_tp = edge_all * (1 - eff.tp_overlap)
    ft = setup.finetune
    head_bwd = head_backward_gemms(ft)
    stage_times = []
    for stage in sorted({0, len(counts) - 1, counts.index(max(counts))}):
        n = counts[stage]
        n_bwd = backward_layers(ft, m.n_layers, sum(counts[:stage]), n)
        fwd, bwd = n * lt.fwd_s, n_bwd * lt.bwd_s
        stage_comm = n * (tp_block + cp_block + ep_block)
        hidden = n * (tp_hidden + cp_hidden + ep_hidden)
        edges = (stage == 0) + (stage == lay.pp - 1)
        stage_comm += edges * edge_tp
        hidden += edges * edge_all * eff.tp_overlap
        if stage == lay.pp - 1:
            fwd += head_fwd + loss_s * CROSS_ENTROPY_FORWARD_SHARE
            bwd += head_bwd * head_fwd + loss_s * (1 - CROSS_ENTROPY_FORWARD_SHARE)
        stage_times.append((fwd + bwd + stage_comm, fwd, bwd, stage_comm, hidden, stage))
    t_mb, fwd_mb, bwd_mb, comm_mb, hidden_mb, slow_stage = max(stage_times)
    n_slow = counts[slow_stage]
    n_slow_bwd = backward_layers(ft, m.n_layers, sum(counts[:slow_stage]), n_slow)

    comm: dict[str, float] = {ax: 0.0 for ax in AXES}
    n_mb = lay.grad_accum
    comm["tp"] = n_mb * (comm_mb - n_slow * (cp_block + ep_block))
    comm["cp"] = n_mb * n_slow * cp_block
    comm["ep"] = n_mb * n_slow * ep_block
    if lay.pp > 1:
        p2p, p2p_hidden = _p2p_s(m, setup, lay, links, eff)
        hidden_mb += p2p_hidden
        t_mb += p2p
        comm["pp"] = n_mb * p2p
    # hidden communication still takes the SMs and HBM bandwidth its kernels use
    t_mb += eff.overlap_slowdown * hidden_mb
    bubble = (lay.pp - 1) / lay.vp * t_mb if lay.pp > 1 else 0.0
    return PipelinePart(links=links, rates=r, t_mb=t_mb, fwd_mb=fwd_mb, bwd_mb=bwd_mb, bubble_s=bubble,
                        comm_s=comm, slow_stage=slow_stage, n_slow=n_slow, n_slow_bwd=n_slow_bwd)
