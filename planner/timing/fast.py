"""The step time of many layouts at once, as numpy arrays: the one step-time model.

A step of a layout on one placement order is (Narayanan et al. 2021, arXiv:2104.04473,
Sec. 2.2)

    m t_mb + (p-1)/v t_mb + dp exposed + overlap slowdown x dp hidden + optimizer

with m the micro-batches, p the stages, v the virtual stages and t_mb one micro-batch on the
slowest of the first, the last and the fullest stage: its blocks' forward and backward
(kernels.layer_time), the LM head and loss on the last stage, the exposed tensor-parallel
all-reduces (two per pipeline edge besides the blocks'), context-parallel K/V ring sends
(what the attention time does not hide) and expert-parallel all-to-alls, 2 v pipeline sends,
and overlap slowdown x whatever of those is hidden. The stages' layers follow the set-up's
pipeline split (TrainingSetup.pp_balance, memory.stage_layers: under "embedding-loss" the first
and the last stage hold one block fewer, megatron-core's account_for_embedding/loss_in_pipeline_split).
Under interleaving the bubble (p-1)/v t_mb is p-1 of the slowest stage's chunks (Narayanan et
al. 2021, Sec. 2.2.2); with that split the slowest stage is a middle one, all of whose chunks
are equal, and the two lighter chunks (the embedding alone on the first rank, the output
projection and loss on the last) are counted at its chunk's time: an upper bound on the fill
and drain by at most two chunks of p-1. The data-parallel collectives are those
of the sharding (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 5; FSDP, Zhao et al.
2023, arXiv:2304.11277, Sec. 3; parts.DP_TERMS), each hidden under the slowest stage's
forward or backward up to its overlap share; the optimizer update moves
dp.optimizer_update_bytes_per_param() per trainable parameter of the rank's shard at the HBM rate.
Each layout takes the fastest of the placement orders (the first of equals).
step_arrays() returns every term (parts.StepArrays), step_times_s() the step time alone,
step_time() one layout's StepTime (the batch of one). The work runs on four levels:

- per distinct degrees (D: tp, cp, ep, dp, pp): each axis's bus bandwidth and hop
  latency over the topology graph on each placement order (placement.axis_links), the
  stages that can be the slowest and their ranks' parameters (memory.rank_params), the
  data-parallel collectives of every sharding and the optimizer update;
- per block shape (LayoutGroups' B: tp, cp, ep, kernels, sp, micro-batch,
  recomputation) and pipeline depth with the same tp, cp and ep links (Q): one block's
  compute time and collective volumes (kernels.layer_time, once per block shape), the
  tensor-, context- and expert-parallel communication and the slowest stage, which do
  not depend on dp, vp or the accumulation;
- per pipeline shape (P: D, sp, vp, micro-batch, recomputation): the pipeline sends and
  the bubble; and per P and kind of sharding (the branch of parts.DP_TERMS, and whether the
  optimizer states are sharded; within a P the layouts differ in nothing else) what the
  data-parallel collectives leave exposed under the slowest stage's forward or backward,
  the slowdown of what they hide, and the optimizer update, on each placement order;
- per layout: the fastest of the placement orders, read off its kind and P.

The per-degree tables (links, stages, collectives, optimizer) are kept across calls, per
model, set-up, cluster, efficiencies, placement orders and distinct degrees (a
least-recently-used cache of at most 32 entries and 64 MiB; forget_tables() drops
them): a search or sweep that times the same GPU counts again skips them. With them, each
Q's slowest stage (_SlowestMemo), so that only block shapes not seen before on those
degrees are worked out. Where the second placement order gives the tensor-, context- and
expert-parallel groups the same links as the first, the slowest stage is not worked out
again, only for the Q rows whose links change. None of this changes a float: a layout's
terms do not depend on what else is in the batch (tests/test_fasttime.py: a batch of one
is a row of the batch, in any order). Integers enter the float arithmetic as float64
arrays, which hold them exactly (Unsupported beyond 2**53). What trains (full, LoRA,
QLoRA, freeze) enters through the per-shape functions: layer_time (frozen base GEMMs,
adapters, dequantization), backward_layers (freeze's blocks without backward),
trained_split (the trainable parameters the gradient reductions and the optimizer cover,
the frozen bytes ZeRO-3/FSDP gathers: QLoRA's NF4 base at its stored bytes, before the
forward and again before the backward), optimizer_update_bytes_per_param and head_backward_gemms.
Of the offloads only Megatron-Core's activation offload enters (degrees.block_row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from planner.errors import UserError
from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import Cluster
from planner.layouts.batch import RECOMPUTES, LayoutArrays, Unsupported
from planner.layouts.groups import LayoutGroups
from planner.layouts.groups import rows as _rows
from planner.layouts.layout import SHARDINGS, Layout
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.timing.collectives import Ring, hide, send_s
from planner.timing.degrees import (
    A2A_BW,
    A2A_LAT,
    BRANCH,
    DEGREE_CACHE,
    EXACT_INT,
    INNER_ROWS,
    N_VALS,
    SLOTS,
    Degrees,
    SlowestMemo,
    block_row,
    degree_tables,
    distinct_rows,
)
from planner.timing.dp import optimizer_update_bytes_per_param
from planner.timing.efficiency import (
    DEFAULT_EFFICIENCY,
    PLACEMENT_ORDERS,
    Efficiency,
    ceiling_floor_s,
    mfu_ceiling,
)
from planner.timing.flops import flops_per_step
from planner.timing.intervals import regime_of
from planner.timing.kernels import image_time_s
from planner.timing.parts import (
    DP_TERMS,
    FSDP_GRAD_OP,
    StepArrays,
)
from planner.timing.step import StepTime
from planner.training.images import image_flops_per_sequence
from planner.training.kernels import KERNELS, block_kernel_codes
from planner.training.setup import TrainingSetup


def dp_times(branch: np.ndarray | int, pp: np.ndarray, grad_accum: np.ndarray,
             grad_sync: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """How often the per-micro-batch data-parallel collectives run in a step: (the parameter
    all-gather under the forward, parts.DP_TERMS' term 1; the term under the backward, term 2).

    Once per micro-batch, except FSDP under a pipeline (the rules refuse ZeRO-2/3 with one, so
    these branches are FSDP's there). PyTorch's pipeline schedules (``grad_sync`` "step") run
    every backward but the last with set_requires_gradient_sync(False) and
    set_reshard_after_backward(False) on an FSDP2 module and reduce-scatter once, after the
    last micro-batch (torch 2.13 torch/distributed/pipelining/stage.py lines 844-847,
    backward_maybe_with_nosync; perform_reduce_grad). Shard-grad-op then gathers once and
    reduces once (it does not reshard after forward: the Llama 3 paper, arXiv:2407.21783,
    Sec. 3.3.2, to avoid the backward's all-gather). Full shard and hybrid still reshard after
    each forward, so each micro-batch's backward gathers again while the forward after a
    backward finds the parameters gathered: the first forward's gather and one per backward,
    with one reduce-scatter: term 1 (the gather) x micro-batches plus term 2 (gather and
    reduce) once. Under "micro-batch" (Llama 3's sharded gradients;
    training.setup.FSDP_PIPELINE_GRAD_SYNCS) term 2 runs every micro-batch."""
    b = np.asarray(branch)
    piped = (b >= FSDP_GRAD_OP) & (pp > 1)
    gather = np.where((b == FSDP_GRAD_OP) & piped, 1.0, grad_accum)
    if grad_sync == "micro-batch":
        return gather, np.asarray(grad_accum, dtype=np.float64)
    return gather, np.where(piped, 1.0, grad_accum)


def steady_reduce(branch: np.ndarray | int, pp: np.ndarray, grad_sync: str) -> np.ndarray:
    """Where a micro-batch's reduce-scatter may hide under the next micro-batch's forward and
    backward as well as its own backward: FSDP shard-grad-op under a pipeline reduce-scattering
    every micro-batch (grad_sync "micro-batch"; term 2 of parts.DP_TERMS is then its
    reduce-scatter alone). In 1F1B's steady state each stage alternates one forward and one
    backward (Narayanan et al. 2021, SC21, Sec. 2.2.1, Fig. 4; torch 2.13
    torch/distributed/pipelining/schedules.py Schedule1F1B, its steady phase of one forward
    and one backward per micro-batch), so between two backward passes of a stage lies one
    forward and one backward. FSDP2 runs each group's reduce-scatter on its own stream as that
    group's backward ends, and the compute stream waits for the ones in flight only at the
    first group's post-backward of the next backward pass (torch 2.13
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py: reduce_scatter_stream;
    post_backward waits on reduce_scatter_states beyond reduce_scatter_max_input_buffers,
    default 1, when _param_group_index is the last group's): a micro-batch's reduce-scatters
    run from early in its backward to early in the next one, a backward and a forward of
    compute. Full shard and hybrid keep their backward window: their term 2 holds the
    backward's all-gather, which that backward needs. Warm-up and cool-down are not credited
    (their idle time stays in the bubble)."""
    b = np.asarray(branch)
    if grad_sync != "micro-batch":
        return np.zeros(np.broadcast(b, pp).shape, dtype=bool)
    return (b == FSDP_GRAD_OP) & (pp > 1)


def _dp_step(branch: int, at: np.ndarray, c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, fwd: np.ndarray,
             bwd: np.ndarray, ga: tuple[np.ndarray, np.ndarray], eff: Efficiency, pipeline: np.ndarray,
             opt: np.ndarray,
             terms: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = None,
             steady: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step for one branch of the data-parallel collectives (parts.DP_TERMS): pipeline +
    exposed + overlap_slowdown x hidden + optimizer, with the collectives' rows ``at`` of
    c0, c1, c2. The terms the branch lacks are 0.0 and add nothing: e + 0.0 is e and
    0.0 + e is e for the non-negative times here, so only the branch's own are summed,
    in timing's order (c0, c1 x per micro-batch, c2 x accumulation). Returns (step, the
    exposed data-parallel seconds, overlap_slowdown x the hidden ones); ``terms``, where
    given, gets each collective's (term, seconds, exposed, hidden) once per occurrence.
    ``steady``: where term 2 hides under a forward and a backward (steady_reduce)."""
    per_mb = branch >= FSDP_GRAD_OP
    reduce_window = bwd if steady is None or not steady.any() else np.where(steady, fwd + bwd, bwd)
    exposed = hidden = None
    for term in DP_TERMS[branch]:
        c, window, overlap = ((c0, bwd, eff.dp_overlap), (c1, fwd, eff.zero3_overlap if per_mb else
                                                          eff.param_gather_overlap),
                              (c2, reduce_window, eff.zero3_overlap))[term]
        if overlap == 0.0:             # nothing hidden: min(c, 0.0 x window) is 0.0
            e, h = c[at], None
        else:
            e, h = hide(c[at], window, overlap)
        if terms is not None:
            terms.append((term, c[at], e, np.zeros_like(e) if h is None else h))
        if term == 2 or term == 1 and per_mb:      # (x 1.0 otherwise: x itself)
            times = ga[term - 1]
            e, h = e * times, None if h is None else h * times
        exposed = e if exposed is None else exposed + e
        hidden = h if hidden is None else hidden if h is None else hidden + h
    assert exposed is not None
    step = pipeline + exposed
    slow = np.zeros_like(step)
    if hidden is not None:             # (+ overlap_slowdown x 0.0 otherwise: nothing)
        slow = eff.overlap_slowdown * hidden
        step = step + slow
    return step + opt, exposed, slow


def _fill_slowest(memo: SlowestMemo, at_miss: np.ndarray, qd: np.ndarray, q_blocks: np.ndarray, deg: Degrees,
                  tp: np.ndarray, cp: np.ndarray, ep: np.ndarray, bus: float, eff: Efficiency) -> None:
    """Work out the slowest stage of the Q rows not worked out before (their places
    ``at_miss`` in ``memo``; ``qd``: a D standing for each, ``q_blocks``: its block's
    row of the block table) on each set of tp, cp and ep links, into ``memo``."""
    links, n_slots = deg.links, deg.n_slots
    (lt_fwd, lt_bwd, lt_attn, lt_tp_bytes, lt_tp_coll, lt_cp_bytes, lt_cp_passes, lt_ep_bytes, lt_ep_a2a,
     lt_ep_hidden, head_fwd_add, head_bwd_add, edge_bytes, _) = q_blocks
    qcp = cp[qd]
    per_slot = np.take(deg.per_slot, qd, axis=1)
    layers_p, edges_p, last_p, absent_p, bwd_layers_p = (per_slot[i * n_slots:(i + 1) * n_slots] for i in range(5))
    use_cp, use_ep = bool((cp > 1).any()), bool((ep > 1).any())
    # the stages' compute does not depend on the links
    stage_fwd = layers_p * lt_fwd + last_p * head_fwd_add       # + 0.0 where not the last stage: exact
    stage_bwd = bwd_layers_p * lt_bwd + last_p * head_bwd_add

    def slowest(lk: np.ndarray, sel: np.ndarray | slice) -> tuple[np.ndarray, ...]:
        """(t, fwd, bwd, hidden, slot) of the slowest stage of the Q rows ``sel`` (all of
        them first, then a subset), before the pipeline sends, as the max()
        over (time, fwd, bwd, comm, hidden, stage) picks it."""
        d = qd[sel]
        ring_tp = Ring.of(tp, lk[0], lk[1], bus, 2).take(d)
        tp_all = lt_tp_coll[sel] * ring_tp.time_s(lt_tp_bytes[sel])
        comm_b, hidden_b = tp_all * (1 - eff.tp_overlap), tp_all * eff.tp_overlap
        width = len(comm_b)
        cp_b = ep_b = np.zeros(width)
        if use_cp:
            passes = lt_cp_passes[sel]
            cp_all = passes * (qcp[sel] - 1) * send_s(lt_cp_bytes[sel], lk[2][d], lk[3][d], bus)
            cp_block, cp_hidden = hide(cp_all, lt_attn[sel] * passes, eff.cp_overlap)
            comm_b, hidden_b = comm_b + cp_block, hidden_b + cp_hidden
            cp_b = cp_block
        if use_ep:
            ep_all = lt_ep_a2a[sel] * Ring.of(ep, lk[A2A_BW], lk[A2A_LAT], bus, 1).take(d).time_s(lt_ep_bytes[sel])
            ep_share = lt_ep_hidden[sel]        # Efficiency.ep_overlap where the block overlaps them
            ep_b = ep_all * (1 - ep_share)
            comm_b, hidden_b = comm_b + ep_b, hidden_b + ep_all * ep_share
        edge_all = ring_tp.time_s(edge_bytes[sel])
        layers, edges = layers_p[:, sel], edges_p[:, sel]
        fwd, bwd = stage_fwd[:, sel], stage_bwd[:, sel]
        if eff.tp_overlap == 0.0:       # x * 1.0 is x; with finite times, x * 0.0 is 0.0 throughout
            comm = layers * comm_b + edges * edge_all
            hidden = None if not (use_cp or use_ep) and np.isfinite(tp_all).all() and np.isfinite(edge_all).all() \
                else layers * hidden_b + edges * edge_all * eff.tp_overlap
        else:
            comm = layers * comm_b + edges * (edge_all * (1 - eff.tp_overlap))
            hidden = layers * hidden_b + edges * edge_all * eff.tp_overlap
        t = fwd + bwd + comm + absent_p[:, sel]
        slot = t.argmax(axis=0)
        at = slot * width + np.arange(width)                # (slot, column) in the flattened tables
        t_max = np.take(t, at)
        if (t == t_max).sum(axis=0).max() > 1:          # tied times: the next fields decide,
            if hidden is None:
                hidden = np.zeros_like(t)
            cols = np.arange(width)
            slot = np.zeros(width, dtype=np.int64)       # equal in all, the later stage wins
            for j in range(1, n_slots):
                b = slot, cols
                win = (t[j] > t[b]) | (t[j] == t[b]) & ((fwd[j] > fwd[b]) | (fwd[j] == fwd[b]) & (
                    (bwd[j] > bwd[b]) | (bwd[j] == bwd[b]) & ((comm[j] > comm[b]) | (comm[j] == comm[b])
                                                              & (hidden[j] >= hidden[b]))))
                slot = np.where(win, j, slot)
            at = slot * width + np.arange(width)
            t_max = np.take(t, at)
        return (t_max, np.take(fwd, at), np.take(bwd, at),
                np.zeros(width) if hidden is None else np.take(hidden, at), np.take(comm, at), cp_b, ep_b, slot)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        first = slowest(links[0], slice(None))
        for j in sorted(set(deg.inner_of)):     # each set of tp, cp, ep links: redo the Q rows whose links change
            q_stage = tuple(x.copy() for x in first)
            if j:
                sel = np.flatnonzero((links[0][INNER_ROWS] != links[j][INNER_ROWS]).any(axis=0)[qd])
                for x, y in zip(q_stage, slowest(links[j], sel)):
                    x[sel] = y
            for k in range(N_VALS):
                memo.vals[j, k, at_miss] = q_stage[k]
            memo.slot[j, at_miss] = q_stage[N_VALS]
        memo.known[at_miss] = True


def step_times_s(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster,
                 eff: Efficiency = DEFAULT_EFFICIENCY, pc: ParamCount | None = None,
                 orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS, groups: LayoutGroups | None = None
                 ) -> np.ndarray:
    """timing.step_time(m, setup, layout, cluster, eff, pc, orders).step_time_s for every
    layout of ``a`` (sequence length setup.seq_len), in seconds, as float64. ``groups``:
    LayoutGroups.of(a), when the caller has it. Raises Unsupported for parameter counts
    too large to convert to floats exactly."""
    per_order = order_times_s(m, setup, a, cluster, eff, pc, orders, groups)
    if per_order.shape[1] == 0:
        return np.zeros(0)
    fastest = per_order[0]
    for o in range(1, len(per_order)):
        fastest = np.minimum(fastest, per_order[o])
    return fastest


def order_times_s(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster,
                  eff: Efficiency = DEFAULT_EFFICIENCY, pc: ParamCount | None = None,
                  orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS, groups: LayoutGroups | None = None
                  ) -> np.ndarray:
    """The step time of every layout of ``a`` on each placement order, as an (orders, layouts)
    float64 array (step_times_s() is its minimum over the orders). Orders that differ only in
    a layout's axes of size 1 place its groups alike and have the same time."""
    if len(a) == 0:
        return np.zeros((len(orders), 0))
    out = _evaluate(m, setup, a, cluster, eff, pc, orders, groups, False)
    assert isinstance(out, np.ndarray)
    return out


def step_arrays(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster,
                eff: Efficiency = DEFAULT_EFFICIENCY, pc: ParamCount | None = None,
                orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS, groups: LayoutGroups | None = None
                ) -> StepArrays:
    """The named parts of every layout's step (StepArrays), each on its fastest placement
    order; StepArrays.row(i) is timing.step_time() of layout i. Raises Unsupported as
    step_times_s() does."""
    if len(a) == 0:
        raise Unsupported("no layouts")
    out = _evaluate(m, setup, a, cluster, eff, pc, orders, groups, True)
    assert isinstance(out, StepArrays)
    return out


def batch_etp(a: LayoutArrays) -> int:
    """The expert tensor-parallel setting the batch shares (Layout.etp: 0, equal to tp, or a
    size the search holds fixed, SearchSpace.etp); the block and degree tables are built per
    setting. Raises Unsupported for a batch that mixes settings."""
    if a.etp is None or not len(a) or not a.etp.any():
        return 0
    first = int(a.etp[0])
    if (a.etp != first).any():
        raise Unsupported("layouts with different expert tensor-parallel sizes in one batch")
    return first


def batch_instances(a: LayoutArrays) -> int:
    """The distributed-optimizer instances the batch shares (Layout.optimizer_instances, fixed by
    the search: SearchSpace.optimizer_instances). Raises Unsupported for a batch that mixes them."""
    inst = a.instances
    if not len(inst):
        return 1
    if (inst != inst[0]).any():
        raise Unsupported("layouts with different distributed-optimizer instances in one batch")
    return int(inst[0])


def batch_fold(a: LayoutArrays) -> int:
    """Whether the batch's ep is folded over tp x cp x dp (Layout.ep_fold): 0 or 1 for every
    layout alike (a folded layout is evaluated as given, never searched beside others).
    Raises Unsupported for a batch that mixes them."""
    if a.ep_fold is None or not len(a) or not a.ep_fold.any():
        return 0
    if not a.ep_fold.all():
        raise Unsupported("folded and unfolded expert parallelism in one batch")
    return 1


def _evaluate(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster, eff: Efficiency,
              pc: ParamCount | None, orders: Sequence[tuple[str, ...]], groups: LayoutGroups | None,
              parts: bool) -> np.ndarray | StepArrays:
    """order_times_s(), or with ``parts`` step_arrays()."""
    n = len(a)
    pc = pc or count_params(m)
    if pc.total * 8 >= EXACT_INT:
        raise Unsupported("parameter bytes too large for exact float conversion")
    bus, slowdown = eff.bus_fraction, eff.overlap_slowdown
    sync = setup.fsdp_pipeline_grad_sync
    orders = [tuple(o) for o in orders]

    g = groups or LayoutGroups.of(a)
    d_rep, p_inv = g.d_rep, g.p_inv
    tp, cp, ep, _, pp = g.degrees
    n_d = len(d_rep)

    pair = g.pair
    pairs = np.flatnonzero(np.bincount(pair, minlength=4 * len(SHARDINGS)))   # the (ZeRO stage, sharding)s present
    any_hybrid = any(k % len(SHARDINGS) == SHARDINGS.index("fsdp-hybrid") for k in pairs.tolist())
    etp = batch_etp(a)
    deg = degree_tables(m, pc, setup, cluster, eff, orders, g.degrees, g.degrees_key, any_hybrid, etp,
                        batch_fold(a), batch_instances(a))
    links, optimizer_s, c0, c1, c2 = deg.links, deg.optimizer_s, deg.c0, deg.c1, deg.c2

    # ---- per P: a block (timing.layer_time) and the head, per distinct block shape
    pd = g.p_d
    ppp = pp[pd]
    sp_p, pvp, mb_p, rc_p, pga = g.p_cols
    # the block shape (tp, sp, cp, ep, micro-batch, recomputation, kernels): LayoutGroups' B
    # (training.kernels, the rule the memory model reads; the sharding is not known per D,
    # so amp is timed as the eager ops it runs)
    kernel_names = KERNELS
    kern_d = block_kernel_codes(setup, tp, pp, cp, False)
    b_inv, b_first = g.b_inv, g.b_rep
    b_d = pd[b_first]
    block_rows = _rows(14, np.float64, "block", m, setup, cluster, eff, etp)
    b_row, blocks_t = block_rows.columns_of(
        (tp[b_d], sp_p[b_first], cp[b_d], ep[b_d], mb_p[b_first], rc_p[b_first], kern_d[b_d]),
        lambda tp_, sp_, cp_, ep_, mb_, rc_, k_: block_row(m, setup, cluster, eff, kernel_names[k_], tp_, sp_, cp_,
                                                          ep_, mb_, rc_, etp))
    p2p_bytes = blocks_t[13][b_inv]
    p2p_positive = bool((blocks_t[13] > 0).all() and np.isfinite(blocks_t[13]).all())
    # ---- per Q: the P rows with the same block shape, pipeline depth and tp, cp and ep
    # links on every order (Degrees.q_d) have the same slowest stage, whatever their dp,
    # vp and accumulation: it is worked out once per Q, when first asked for, and kept
    # (SlowestMemo); each P reads its Q's
    memo = deg.slowest
    at_p = memo.places(block_rows, b_row[b_inv], deg.q_d[pd])     # each P's Q in the memo
    known = memo.known[at_p]
    if not known.all():
        miss = np.flatnonzero(~known)
        at_miss, first = np.unique(at_p[miss], return_index=True)      # the Q rows not worked out before
        p_of = miss[first]                                            # a P standing for each of them
        _fill_slowest(memo, at_miss, pd[p_of], np.take(blocks_t, b_inv[p_of], axis=1), deg, tp, cp, ep, bus, eff)

    # ---- per pipeline shape and kind of sharding: the data-parallel collectives of the
    # sharding's branch, hidden under the slowest stage's forward or backward or not, and the
    # optimizer update. Within a pipeline shape the layouts differ only in
    # their sharding and ZeRO stage, and those enter only through the branch of
    # parts.DP_TERMS and whether the optimizer's states are sharded: a (kind, P) table,
    # each layout read off it at the end.
    n_p = len(pd)
    kinds = [(int(BRANCH[k]), int(k >= len(SHARDINGS))) for k in pairs]
    kind_list = sorted(set(kinds))
    kind_of = np.zeros(4 * len(SHARDINGS), dtype=np.int64)
    for k, kind in zip(pairs, kinds):
        kind_of[k] = kind_list.index(kind)
    at_kind = kind_of[pair] * n_p + p_inv              # each layout's place in the (kind, P) table
    # the P rows that have layouts of each kind: a kind in few of them (ZeRO-3 runs without
    # a pipeline only, for one) is summed on those alone
    has = np.zeros(len(kind_list) * n_p, dtype=bool)
    has[at_kind] = True
    rows_of = [None if 2 * int(np.count_nonzero(h)) > n_p else np.flatnonzero(h) for h in has.reshape(-1, n_p)]
    p2p_sends = 2 * pvp.astype(np.float64)
    bubble_share = (ppp - 1) / pvp.astype(np.float64)
    pga_f = pga.astype(np.float64)
    # every placement order at once: (order, P) arrays, each order reading its set of tp,
    # cp, ep links' slowest stages; the same operations as one order at a time, element by
    # element, so the same floats
    n_o = len(links)
    sets = list(deg.inner_of)
    vals, slot_p = np.take(memo.vals, at_p, axis=2), np.take(memo.slot, at_p, axis=1)   # (set, 4, P), (set, P)
    if sets != list(range(len(sets))):
        vals, slot_p = vals[sets], slot_p[sets]
    t_p, fwd_p, bwd_p, hidden_p, comm_p, cp_block_p, ep_block_p = (vals[:, k] for k in range(N_VALS))
    img_fwd_s, img_bwd_s = image_time_s(m, setup, cluster.gpu, eff)
    if img_fwd_s:
        # the image side, on the first stage's micro-batches (kernels.image_time_s); added to the
        # slowest stage's: exact without a pipeline, an upper bound by it with one
        fwd_p, bwd_p = fwd_p + mb_p * img_fwd_s, bwd_p + mb_p * img_bwd_s
        t_p = t_p + mb_p * (img_fwd_s + img_bwd_s)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if p2p_positive:    # a D that sends nothing: latency 0.0 and bandwidth inf give 0.0 + x / inf = 0.0
            lat, bw = np.take(deg.pp_send, pd, axis=2)
            p2p_all = p2p_sends * (lat + p2p_bytes / bw)
        else:
            lat, bw = np.take(deg.pp_link, pd, axis=2)
            p2p_all = p2p_sends * np.where(np.take(deg.pp_on, pd, axis=1) & (p2p_bytes > 0), lat + p2p_bytes / bw,
                                           0.0)
        t_mb = t_p + p2p_all * (1 - eff.pp_overlap)            # + 0.0 without a pipeline: exact
        t_mb = t_mb + slowdown * (hidden_p + p2p_all * eff.pp_overlap)
        at = slot_p * n_d + pd                                 # (slot, D) of each P's slowest stage
        accum: np.ndarray | float = 0.0
        if eff.grad_accum_bytes_per_param:
            # the gradient accumulation pass after each micro-batch's backward
            # (Efficiency.grad_accum_bytes_per_param): the stage's trainable parameters, unsharded,
            # at the optimizer update's HBM rate (degrees.optimizer_s, per byte)
            accum = optimizer_s[at] * (eff.grad_accum_bytes_per_param / optimizer_update_bytes_per_param(m, setup))
            t_mb = t_mb + accum
        pipeline = pga_f * t_mb + bubble_share * t_mb
        order_at = np.arange(n_o)[:, None] * (5 * SLOTS * n_d)
        best = np.zeros((n_o, len(kind_list), n_p))    # (0.0 where a P has no layout of the kind)
        dp_exposed, dp_slow, opt_kind = (np.zeros_like(best) for _ in range(3)) if parts else (best, best, best)
        dp_each = np.zeros((3, 3, *best.shape)) if parts else best     # (seconds, exposed, hidden) x term
        terms: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = [] if parts else None
        opt = {sharded: optimizer_s[at + sharded * (SLOTS * n_d)]
               for (_, sharded), sel in zip(kind_list, rows_of) if sel is None}
        for row, (branch, sharded) in enumerate(kind_list):
            sel = rows_of[row]
            if sel is None:
                opt_s = opt[sharded]
                step, exposed, slow = _dp_step(branch, at + (order_at + branch * (SLOTS * n_d)), c0, c1, c2, fwd_p,
                                               bwd_p, dp_times(branch, ppp, pga_f, sync), eff, pipeline, opt_s, terms,
                                               steady_reduce(branch, ppp, sync))
                where: tuple = (slice(None), row)
            else:
                at_s = at[:, sel]
                opt_s = optimizer_s[at_s + sharded * (SLOTS * n_d)]
                step, exposed, slow = _dp_step(branch, at_s + (order_at + branch * (SLOTS * n_d)), c0, c1, c2,
                                               fwd_p[:, sel], bwd_p[:, sel],
                                               dp_times(branch, ppp[sel], pga_f[sel], sync), eff,
                                               pipeline[:, sel], opt_s, terms, steady_reduce(branch, ppp[sel], sync))
                where = (slice(None), row, sel)
            best[where] = step
            if terms is not None:
                dp_exposed[where], dp_slow[where], opt_kind[where] = exposed, slow, opt_s
                for t_i, *each in terms:
                    for what, x in enumerate(each):
                        dp_each[what, t_i][where] = x
                terms.clear()
    step_o = np.take(best.reshape(n_o, -1), at_kind, axis=1)
    n_seq = a.micro_batch * a.grad_accum * a.data_parallel
    flops = distinct_rows([n_seq, a.recompute], _rows(2, np.float64, "flops", m, setup.seq_len, setup.finetune,
                                                           setup.recomputed_share, setup.mtp_layers,
                                                           setup.images_per_sample),
                           lambda n_, rc_: _flops_row(m, setup.seq_len, n_, rc_, setup))
    peak = cluster.gpu.peak_flops_per_s(setup.precision_spec.compute_dtype)
    n_gpus = a.n_gpus
    ceiling = mfu_ceiling(eff, cluster.gpu, setup.precision_spec.fp8 is not None)
    unfloored = step_o
    if ceiling is not None:
        # no step faster than its model FLOPs at the GPU's sustained training rate
        step_o = np.maximum(step_o, ceiling_floor_s(flops[0], n_gpus, peak, ceiling))
    if eff.step_time_factor != 1.0:
        step_o = step_o * eff.step_time_factor
    if not parts:
        return step_o
    # ---- each layout on its fastest order (the first of equals, as step_time() keeps the
    # earlier): the named parts of parts.StepArrays
    idx = np.argmin(step_o, axis=0)
    cols = np.arange(n)

    def of_kind(x: np.ndarray) -> np.ndarray:
        return np.take(x.reshape(n_o, -1), at_kind, axis=1)[idx, cols]

    def of_p(x: np.ndarray) -> np.ndarray:
        return np.broadcast_to(x, (n_o, n_p))[:, p_inv][idx, cols]

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        n_slow = deg.per_slot[slot_p, pd]                      # the slowest stage's blocks, (order, P)
        n_slow_bwd = deg.per_slot[4 * deg.n_slots + slot_p, pd]   # those with a backward pass
        ga = pga_f[p_inv]
        n_slow_l, cp_l, ep_l = of_p(n_slow), of_p(cp_block_p), of_p(ep_block_p)
        fwd_l, bwd_l, t_mb_l = of_p(fwd_p), of_p(bwd_p), of_p(t_mb)
        comm_tp = ga * (of_p(comm_p) - n_slow_l * (cp_l + ep_l))
        comm_pp = ga * of_p(p2p_all * (1 - eff.pp_overlap))
        compute = ga * (fwd_l + bwd_l)
        if eff.grad_accum_bytes_per_param:
            compute = compute + ga * of_p(np.asarray(accum))
        bubble = bubble_share[p_inv] * t_mb_l
        # the time the sustained-rate ceiling (and step_time_factor) adds counts as compute
        # (inf - inf where a link has no bandwidth: such a layout is left unpriced by the caller)
        compute = compute + (step_o[idx, cols] - unfloored[idx, cols])
    times = dp_times(BRANCH[pair], a.pp, a.grad_accum, sync)
    return StepArrays(orders=tuple(orders), order=idx, step_time_s=step_o[idx, cols], compute_s=compute,
                      comm_tp_s=comm_tp, comm_cp_s=(ga * n_slow_l) * cp_l, comm_ep_s=(ga * n_slow_l) * ep_l,
                      comm_dp_s=of_kind(dp_exposed), comm_pp_s=comm_pp, bubble_s=bubble,
                      optimizer_s=of_kind(opt_kind), dp_slowdown_s=of_kind(dp_slow), micro_batch_s=t_mb_l,
                      fwd_mb_s=fwd_l, bwd_mb_s=bwd_l, slow_stage=of_p(deg.stage[slot_p, pd]),
                      n_slow=n_slow_l.astype(np.int64), n_slow_bwd=of_p(n_slow_bwd).astype(np.int64),
                      grad_accum=a.grad_accum, dp_branch=BRANCH[pair],
                      dp_times=times[0].astype(np.int64), dp_reduce_times=times[1].astype(np.int64),
                      dp_reduce_steady=steady_reduce(BRANCH[pair], a.pp, sync),
                      dp_each=np.stack([np.stack([of_kind(dp_each[k, t]) for t in range(3)]) for k in range(3)]),
                      efficiency=eff, tokens_per_step=n_seq * setup.seq_len,
                       n_gpus=n_gpus, model_flops=flops[0], hardware_flops=flops[1],
                       peak_flops_per_s=peak,
                       fp8_peak_flops_per_s=low_precision_peak(cluster.gpu, setup),
                       regime=regime_of(m, setup, cluster.gpu))


def low_precision_peak(gpu: GpuSpec, setup: TrainingSetup) -> float | None:
    """The dense peak of the run's low-precision GEMMs, for MFU beside the BF16 one: the FP8 peak
    (gpus.toml), times the recipe's peak ratio (NVFP4: the FP4 peak, twice FP8 on Blackwell);
    None without a low-precision recipe or without an FP8 peak on the GPU."""
    r = setup.precision_spec.fp8
    if r is None or gpu.fp8_flops_per_s is None:
        return None
    return gpu.fp8_flops_per_s * r.peak_ratio


def _flops_row(m: ModelSpec, seq_len: int, n_sequences: int, recompute: int, setup: TrainingSetup
               ) -> tuple[float, float]:
    f = flops_per_step(m, seq_len, n_sequences, RECOMPUTES[recompute], setup.finetune, setup.recomputed_share,
                       setup.mtp_layers)
    image = n_sequences * sum(image_flops_per_sequence(m, setup.finetune, setup.images_per_sample))
    return f.model_flops + image, f.hardware_flops + image


def forget_tables() -> None:
    """Drop the degree tables kept across calls, so that the next call builds them again;
    the per-shape tables and the topology's links stay. For benchmarks."""
    DEGREE_CACHE.clear()


def step_times(m: ModelSpec, setup: TrainingSetup, layouts: Sequence[Layout], cluster: Cluster,
               eff: Efficiency = DEFAULT_EFFICIENCY, pc: ParamCount | None = None,
               orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS) -> list[StepTime]:
    """The StepTime of every layout of ``layouts``, from one batched call per sequence length
    (the layouts' own, which the search makes setup.seq_len) and folding (batch_fold): the rows
    of step_arrays(), each on the fastest of the placement ``orders``."""
    out: list[StepTime | None] = [None] * len(layouts)
    for seq_len, fold in sorted({(lay.seq_len, lay.ep_fold) for lay in layouts}):
        at = [i for i, lay in enumerate(layouts) if lay.seq_len == seq_len and lay.ep_fold == fold]
        s = setup if seq_len == setup.seq_len else replace(setup, seq_len=seq_len)
        try:
            rows = step_arrays(m, s, LayoutArrays.from_layouts([layouts[i] for i in at]), cluster, eff, pc,
                               orders).rows()
        except Unsupported as e:
            raise UserError(f"model {m.name}: {e}; the step-time model covers models below about 10^15 "
                            "parameters") from None
        for i, row in zip(at, rows):
            out[i] = row
    return [x for x in out if x is not None]


def step_time(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster,
              eff: Efficiency = DEFAULT_EFFICIENCY, pc: ParamCount | None = None,
              orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS) -> StepTime:
    """The step time of ``lay`` on the fastest of the placement ``orders``: the batch of one."""
    (st,) = step_times(m, setup, [lay], cluster, eff, pc, orders)
    return st
