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
pipeline split (TrainingSetup.pp_balance, layouts.stages.stage_layers: under "embedding-loss" the first
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
step_time() one layout's StepTime (the batch of one). The model is read in four modules, on
four levels:

- per distinct degrees (D: tp, cp, ep, dp, pp; degrees.degree_tables): each axis's bus
  bandwidth and hop latency over the topology graph on each placement order
  (placement.axis_links), the stages that can be the slowest and their ranks' parameters
  (memory.rank_params), the data-parallel collectives of every sharding and the optimizer update;
- per block shape (LayoutGroups' B: tp, cp, ep, kernels, sp, micro-batch, recomputation) and
  pipeline depth with the same tp, cp and ep links (Q; stage.slowest_stages): one block's
  compute time and collective volumes (kernels.layer_time, once per block shape), the
  tensor-, context- and expert-parallel communication and the slowest stage, which do
  not depend on dp, vp or the accumulation;
- per pipeline shape (P: D, sp, vp, micro-batch, recomputation): the time terms of one
  micro-batch (terms.MicroBatchTerms, one function per term: the slowest stage, the image
  side, the pipeline sends, the gradient accumulation pass, the bubble share), combined once
  (terms.micro_batch_s, pipeline_s); and per P and kind of sharding (dp_overlap.DpKinds: the
  branch of parts.DP_TERMS, and whether the optimizer states are sharded; within a P the
  layouts differ in nothing else) what the data-parallel collectives leave exposed under the
  slowest stage's forward or backward and the slowdown of what they hide
  (dp_overlap.dp_exposure), plus the optimizer update (terms.step_s), on each placement order;
- per layout: the sustained-rate ceiling (terms.floored_s) and the fastest of the placement
  orders, read off its kind and P (_named_parts).

The per-degree tables (links, stages, collectives, optimizer) are kept across calls, per
model, set-up, cluster, efficiencies, placement orders and distinct degrees (a
least-recently-used cache of at most 32 entries and 64 MiB; forget_tables() drops
them): a search or sweep that times the same GPU counts again skips them. With them, each
Q's slowest stage (degrees.SlowestMemo), so that only block shapes not seen before on those
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
Of the offloads only Megatron-Core's activation offload enters (layer.block_table).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import numpy as np

from planner.errors import UserError
from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import Cluster
from planner.layouts.batch import LayoutArrays, Unsupported
from planner.layouts.groups import LayoutGroups
from planner.layouts.layout import Layout
from planner.models.spec import ModelSpec, ParamCount
from planner.timing.context import LayoutContext, layout_context
from planner.timing.degrees import (
    BRANCH,
    DEGREE_CACHE,
    SLOTS,
    Degrees,
    degree_tables,
)
from planner.timing.dp_overlap import DpKinds, dp_exposure, dp_times, steady_reduce
from planner.timing.efficiency import (
    DEFAULT_EFFICIENCY,
    PLACEMENT_ORDERS,
    Efficiency,
    mfu_ceiling,
)
from planner.timing.intervals import regime_of
from planner.timing.parts import ZERO_12, StepArrays
from planner.timing.stage import slowest_stages
from planner.timing.step import StepTime
from planner.timing.terms import MicroBatchTerms, floored_s, micro_batch_s, micro_batch_terms, pipeline_s, step_s
from planner.training.setup import TrainingSetup


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
    return _fastest(per_order)


def _fastest(per_order: np.ndarray) -> np.ndarray:
    """Each layout's step time on the fastest placement order, from (orders, layouts) times."""
    fastest = per_order[0]
    for o in range(1, len(per_order)):
        fastest = np.minimum(fastest, per_order[o])
    return fastest


def step_times_picked(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster,
                      eff: Efficiency, pc: ParamCount | None, pick: Callable[[np.ndarray], Sequence[int]],
                      orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS) -> tuple[np.ndarray, list[StepTime]]:
    """(step_times_s() of every layout of ``a``, the StepTime of the layouts ``pick`` returns
    given those times, as row numbers): one evaluation, whose named parts are read for the
    picked rows only (a layout's terms do not depend on the batch, so each is the row
    step_arrays() gives it in any batch). search.sweep keeps a count's fastest few this way:
    a second batch of them worked out its own degree tables and slowest stages (issue 32: 0.7 s
    of 1,270 such batches in the 256-job `plan buy`). Raises Unsupported as step_times_s()."""
    if len(a) == 0:
        return np.zeros(0), []
    # the data-parallel cells a StepTime reads (exposed seconds, optimizer update) are the kind
    # table's own: no second table (issue 32: about 0.1 s of the 256-job `plan buy`)
    bounds = BoundedTimes(p=_pipelines(m, setup, a, cluster, eff, pc, orders, None), lower_p_s=np.zeros(0))
    return bounds.picked(None, pick)


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
    assert isinstance(out, _Evaluation)
    return out.floored


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


def _evaluate(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster, eff: Efficiency,
              pc: ParamCount | None, orders: Sequence[tuple[str, ...]], groups: LayoutGroups | None,
              parts: bool, cells: bool = False) -> _Evaluation | StepArrays:
    """The batch's _Evaluation (order_times_s() reads its floored times; with ``cells`` its kind
    table keeps the data-parallel cells a StepTime reads, for _named_parts()), or with ``parts``
    step_arrays(): the pipeline of each pipeline shape (_pipelines), the data-parallel terms of
    each kind of sharding (_kind_table), combined (terms.step_s, floored_s) on every placement
    order, and read off per layout."""
    p = _pipelines(m, setup, a, cluster, eff, pc, orders, groups)
    table = _kind_table(setup, eff, p.g, p.deg, p.kinds, p.t, p.pipeline, parts or cells, each=parts)
    step_o = np.take(table.step_s.reshape(len(p.deg.links), -1), p.kinds.at_kind, axis=1)
    floored = floored_s(step_o, p.flops[0], p.n_gpus, p.peak, p.ceiling, eff)
    ev = _Evaluation(m, setup, cluster, eff, a, p.g, p.deg, p.kinds, p.t, p.t_mb, table, step_o, floored, p.orders,
                     p.n_seq, p.flops, p.peak)
    return _named_parts(*ev) if parts else ev


class _Evaluation(NamedTuple):
    """What _evaluate() works out for a batch, _named_parts()'s arguments: ``floored`` the
    step time of each (placement order, layout)."""

    m: ModelSpec
    setup: TrainingSetup
    cluster: Cluster
    eff: Efficiency
    a: LayoutArrays
    g: LayoutGroups | _Shapes
    deg: Degrees
    kinds: DpKinds
    t: MicroBatchTerms
    t_mb: np.ndarray
    table: _KindTable
    unfloored: np.ndarray
    floored: np.ndarray
    orders: list[tuple[str, ...]]
    n_seq: np.ndarray
    flops: np.ndarray
    peak: float


class _Pipelines(NamedTuple):
    """What a batch's step times share before the data-parallel terms (_pipelines()): the
    groups, kinds, degree tables, micro-batch terms, t_mb and m t_mb + bubble (``pipeline``,
    (order, P)) of every pipeline shape, and per layout its sequences per step, (model,
    hardware) FLOPs and GPUs."""

    m: ModelSpec
    setup: TrainingSetup
    cluster: Cluster
    eff: Efficiency
    a: LayoutArrays
    g: LayoutGroups | _Shapes      # (_Shapes: _restricted)
    deg: Degrees
    kinds: DpKinds
    t: MicroBatchTerms
    t_mb: np.ndarray
    pipeline: np.ndarray
    orders: list[tuple[str, ...]]
    n_seq: np.ndarray
    flops: np.ndarray
    peak: float
    ceiling: float | None
    n_gpus: np.ndarray


def _pipelines(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster, eff: Efficiency,
               pc: ParamCount | None, orders: Sequence[tuple[str, ...]], groups: LayoutGroups | None,
               context: LayoutContext | None = None) -> _Pipelines:
    """The batch's _Pipelines (``context``: its LayoutContext, where the caller has it): the
    slowest stage of each pipeline shape (stage.slowest_stages) and its terms
    (terms.micro_batch_terms), combined (terms.micro_batch_s, pipeline_s) on every placement
    order."""
    c = context or layout_context(m, setup, a, pc, groups)
    orders = [tuple(o) for o in orders]
    g, kinds = c.g, c.kinds
    deg = degree_tables(c.m, c.pc, c.setup, cluster, eff, orders, g.degrees, g.degrees_key, kinds.any_hybrid, c.etp,
                        c.fold, c.instances)
    t = micro_batch_terms(c.m, c.setup, cluster, eff, g, deg, slowest_stages(c.m, c.setup, cluster, eff, g, deg, c.etp))
    t_mb = micro_batch_s(t, eff)
    peak = cluster.gpu.peak_flops_per_s(c.setup.precision_spec.compute_dtype)
    ceiling = mfu_ceiling(eff, cluster.gpu, c.setup.precision_spec.fp8 is not None)
    return _Pipelines(c.m, c.setup, cluster, eff, c.a, g, deg, kinds, t, t_mb, pipeline_s(t, t_mb), orders, c.n_seq,
                      c.flops, peak, ceiling, c.n_gpus)


@dataclass(frozen=True, slots=True)
class BoundedTimes:
    """A batch's step times worked out as far as the pipeline (_Pipelines), with a lower
    bound on each layout's step time, ``lower_s``, and the exact step_times_s() and StepTime of
    any layouts asked for (times_s, step_times): the same floats as the whole batch's, each
    layout's data-parallel terms worked out for the pipeline shapes of the layouts asked for
    alone. A search that needs the fastest few of many layouts times exactly only those whose
    bound is below a time some layout reaches (search.sweep: the 8-model `plan buy`, issue 32).

    The bound is the pipeline, m t_mb + (p-1)/v t_mb, floored as the step is (floored_s) on the
    fastest order: a step adds to the pipeline the data-parallel seconds exposed, the slowdown
    of those hidden and the optimizer update (terms.step_s), each a sum of non-negative
    seconds (collectives.hide splits non-negative seconds; the update is bytes over a rate),
    and adding a non-negative float never rounds below the sum's first term; the floor, a
    positive step_time_factor and the minimum over the orders keep the order. Where the
    efficiencies make a term negative (overlap_slowdown below 0, step_time_factor not above 0)
    the bound is -inf."""

    p: _Pipelines
    lower_p_s: np.ndarray       # per pipeline shape (LayoutGroups' P): its layouts' bound

    def lower_s(self, rows: np.ndarray) -> np.ndarray:
        """The lower bound of the step time of each of the layouts ``rows``."""
        return self.lower_p_s[self.p.g.p_inv[rows]]

    def times_s(self, rows: np.ndarray) -> np.ndarray:
        """step_times_s() of the layouts ``rows`` (row numbers of the batch)."""
        step_o, _, _ = self._steps(rows, False)
        return _fastest(floored_s(step_o, self.p.flops[0][rows], self.p.n_gpus[rows], self.p.peak, self.p.ceiling,
                                  self.p.eff))

    def picked(self, rows: np.ndarray | None, pick: Callable[[np.ndarray], Sequence[int]]
               ) -> tuple[np.ndarray, list[StepTime]]:
        """(times_s(rows), the StepTime of the layouts ``rows[i]`` for each i that ``pick``
        returns given those times), from one kind table; ``rows`` None: every layout."""
        step_o, table, p = self._steps(rows, True)
        if rows is None:
            floored = floored_s(step_o, p.flops[0], p.n_gpus, p.peak, p.ceiling, p.eff)
        else:
            floored = floored_s(step_o, p.flops[0][rows], p.n_gpus[rows], p.peak, p.ceiling, p.eff)
        times = _fastest(floored)
        at = np.asarray(pick(times), dtype=np.int64)
        if not len(at):
            return times, []
        if rows is not None:        # the batch's columns, of which _named_parts reads those picked
            step_o, floored, at = _columns(step_o, rows, at, len(p.a)), _columns(floored, rows, at, len(p.a)), rows[at]
        return times, _named_parts(p.m, p.setup, p.cluster, p.eff, p.a, p.g, p.deg, p.kinds, p.t, p.t_mb, table,
                                   step_o, floored, p.orders, p.n_seq, p.flops, p.peak, rows=at).rows()

    def _steps(self, rows: np.ndarray | None, cells: bool) -> tuple[np.ndarray, _KindTable, _Pipelines]:
        """The unfloored step of ``rows`` (None: every layout) on each order, from the kind
        table (_kind_table; ``cells``: with the cells a StepTime reads) of their pipeline shapes
        alone (_restricted()) where they are fewer than half the batch, else of the batch's
        (the same cells: fewer calls), the table and the _Pipelines it is of."""
        p = self.p if rows is None or 2 * len(rows) >= len(self.p.a) else _restricted(self.p, rows)
        table = _kind_table(p.setup, p.eff, p.g, p.deg, p.kinds, p.t, p.pipeline, cells, each=False)
        at_kind = p.kinds.at_kind if rows is None else p.kinds.at_kind[rows]
        return np.take(table.step_s.reshape(len(p.deg.links), -1), at_kind, axis=1), table, p


class _Shapes(NamedTuple):
    """What the kind table and the named parts read of LayoutGroups, for the pipeline shapes
    of some of a batch's layouts (_restricted): each layout's P (read at those layouts only),
    each P's D, each layout's ZeRO stage and sharding, and the batch's D."""

    p_inv: np.ndarray
    p_d: np.ndarray
    pair: np.ndarray
    d_rep: np.ndarray
    degrees: tuple[np.ndarray, ...]


def _restricted(p: _Pipelines, rows: np.ndarray) -> _Pipelines:
    """``p`` with only the pipeline shapes of the layouts ``rows``, numbered afresh (their micro-
    batch terms, t_mb and pipeline taken; their kinds, DpKinds.of those layouts'), read at those
    layouts alone: a kind table of it works out the cells they read and no others, each the
    float of the whole batch's table (its terms are elementwise per cell)."""
    g, n = p.g, len(p.a)
    number = np.zeros(len(g.p_d), dtype=np.int64)
    number[g.p_inv[rows]] = 1
    keep = np.flatnonzero(number)
    number[keep] = np.arange(len(keep))
    inv = number[g.p_inv[rows]]
    kinds = DpKinds.of(g.pair[rows], inv, len(keep))
    p_inv, at_kind = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)     # read at ``rows`` only
    p_inv[rows], at_kind[rows] = inv, kinds.at_kind
    taken: dict[str, Any] = {f.name: None if (x := getattr(p.t, f.name)) is None else x[..., keep] for f in fields(p.t)}
    t = MicroBatchTerms(**taken)
    return p._replace(g=_Shapes(p_inv, g.p_d[keep], g.pair, g.d_rep, g.degrees),
                      kinds=replace(kinds, at_kind=at_kind), t=t, t_mb=p.t_mb[:, keep], pipeline=p.pipeline[:, keep])


def step_time_bounds(c: LayoutContext, cluster: Cluster, eff: Efficiency,
                     orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS, bounded: bool = True) -> BoundedTimes:
    """The BoundedTimes of the layouts of ``c`` (not empty) on ``cluster``. The bound is worked
    out once per pipeline shape, whose layouts share their pipeline, sequences per step (the
    micro-batch, the accumulation and dp) and GPUs, so it is their bound to the bit; without
    ``bounded`` it is -inf (a caller that times every layout)."""
    p = _pipelines(c.m, c.setup, c.a, cluster, eff, c.pc, orders, None, c)
    if bounded and eff.overlap_slowdown >= 0.0 and eff.step_time_factor > 0.0:
        rep = c.g.p_rep
        lower = _fastest(floored_s(p.pipeline, p.flops[0][rep], p.n_gpus[rep], p.peak, p.ceiling, eff))
    else:
        lower = np.full(len(c.g.p_rep), -np.inf)
    return BoundedTimes(p=p, lower_p_s=lower)


def _columns(x: np.ndarray, rows: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    """An (orders, n) array whose columns ``rows[at]`` are those ``at`` of ``x`` (the others
    are never read)."""
    out = np.empty((x.shape[0], n))
    out[:, rows[at]] = x[:, at]
    return out


@dataclass(frozen=True, slots=True)
class _KindTable:
    """Per placement order, kind of data-parallel step (DpKinds) and pipeline shape: the step
    (0.0 where a P has no layout of the kind) and, for the named parts, its data-parallel
    seconds exposed, their slowdown, the optimizer update (without the parts these alias step_s)
    and each collective's (seconds, exposed, hidden) x parts.DP_TERMS' term (dp_each; None
    where not asked for)."""

    step_s: np.ndarray
    dp_exposed_s: np.ndarray
    dp_slowdown_s: np.ndarray
    optimizer_s: np.ndarray
    dp_each: np.ndarray | None


def _kind_table(setup: TrainingSetup, eff: Efficiency, g: LayoutGroups | _Shapes, deg: Degrees, kinds: DpKinds,
                t: MicroBatchTerms, pipeline: np.ndarray, parts: bool, each: bool = True) -> _KindTable:
    """The step of each (order, kind, P): the pipeline plus the data-parallel collectives of the
    kind's branch, hidden under the slowest stage's forward or backward or not
    (dp_overlap.dp_exposure), and the optimizer update of its shard (terms.step_s). Within a
    pipeline shape the layouts differ only in their kind, so each layout is read off this table.
    ``parts``: the table keeps the data-parallel cells, and with ``each`` each collective's
    seconds too (dp_each, which StepArrays.dp_collectives reads and a StepTime does not)."""
    n_o, n_p, n_d = len(deg.links), len(g.p_d), len(g.d_rep)
    ppp = g.degrees[4][g.p_d]
    sync = setup.fsdp_pipeline_grad_sync
    at = t.stage_at
    order_at = np.arange(n_o)[:, None] * (5 * SLOTS * n_d)
    shape = (n_o, len(kinds.kinds), n_p)
    if parts:       # (0.0: no layout of the kind; one allocation)
        best, dp_exposed, dp_slow, opt_kind = np.zeros((4, *shape))
    else:
        best = dp_exposed = dp_slow = opt_kind = np.zeros(shape)
    dp_each = np.zeros((3, 3, *best.shape)) if parts and each else None     # (seconds, exposed, hidden) x term
    terms: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = [] if parts and each else None
    def update(branch: int, sharded: int) -> int:
        """The optimizer update's block of Degrees.optimizer_s: ZeRO-1/2's distributed optimizer
        updates one distributed-optimizer instance's shard (the same as the whole group's at one)."""
        return 2 if sharded and branch == ZERO_12 else sharded

    opt = {update(b, sharded): deg.optimizer_s[at + update(b, sharded) * (SLOTS * n_d)]
           for (b, sharded), sel in zip(kinds.kinds, kinds.rows_of) if sel is None}
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for row, (branch, sharded) in enumerate(kinds.kinds):
            sel = kinds.rows_of[row]
            cols: slice | np.ndarray = slice(None) if sel is None else sel
            at_s = at[:, cols]
            u = update(branch, sharded)
            opt_s = opt[u] if sel is None else deg.optimizer_s[at_s + u * (SLOTS * n_d)]
            exposed, slow = dp_exposure(branch, at_s + (order_at + branch * (SLOTS * n_d)), deg.c0, deg.c1, deg.c2,
                                        t.fwd_compute_s[:, cols], t.bwd_compute_s[:, cols],
                                        dp_times(branch, ppp[cols], t.micro_batches[cols], sync), eff, terms,
                                        steady_reduce(branch, ppp[cols], sync))
            where = (slice(None), row, cols)
            best[where] = step_s(pipeline[:, cols], exposed, slow, opt_s)
            if parts:
                dp_exposed[where], opt_kind[where] = exposed, opt_s
                if slow is not None:
                    dp_slow[where] = slow
            if terms is not None:
                assert dp_each is not None
                for t_i, *per in terms:
                    for what, x in enumerate(per):
                        dp_each[what, t_i][where] = x
                terms.clear()
    return _KindTable(step_s=best, dp_exposed_s=dp_exposed, dp_slowdown_s=dp_slow, optimizer_s=opt_kind,
                      dp_each=dp_each)


def _named_parts(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, a: LayoutArrays,
                 g: LayoutGroups | _Shapes, deg: Degrees, kinds: DpKinds, t: MicroBatchTerms, t_mb: np.ndarray,
                 table: _KindTable, unfloored: np.ndarray, step_o: np.ndarray, orders: list[tuple[str, ...]],
                 n_seq: np.ndarray, flops: np.ndarray, peak: float, rows: np.ndarray | None = None
                 ) -> StepArrays:
    """Each layout on its fastest order (the first of equals, as step_time() keeps the
    earlier): the named parts of parts.StepArrays; of the layouts ``rows`` only, where given
    (the same elements: every part is read off per layout)."""
    n_o, n_p = len(deg.links), len(g.p_d)
    p_inv, pd, at_kind, pair = g.p_inv, g.p_d, kinds.at_kind, g.pair
    if rows is not None:
        a = LayoutArrays(*(a.field(f)[rows] for f in LayoutArrays.FIELDS))
        p_inv, at_kind, pair = p_inv[rows], at_kind[rows], pair[rows]
        unfloored, step_o, n_seq, flops = unfloored[:, rows], step_o[:, rows], n_seq[rows], flops[:, rows]
    idx = np.argmin(step_o, axis=0)
    cols = np.arange(len(a))

    def of_kind(x: np.ndarray) -> np.ndarray:      # each layout's cell on its order: one gather
        return x.reshape(n_o, -1)[idx, at_kind]

    def of_p(x: np.ndarray) -> np.ndarray:       # (most are (order, P) already: no broadcast view)
        return (x if x.shape == (n_o, n_p) else np.broadcast_to(x, (n_o, n_p)))[idx, p_inv]

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        n_slow = deg.per_slot[t.slot, pd]                      # the slowest stage's blocks, (order, P)
        n_slow_bwd = deg.per_slot[4 * deg.n_slots + t.slot, pd]   # those with a backward pass
        n_comm = deg.per_slot[6 * deg.n_slots + t.slot, pd]       # those communicating: its MTP layers too
        ga = t.micro_batches[p_inv]
        n_slow_l, cp_l, ep_l = of_p(n_slow), of_p(t.cp_comm_block_s), of_p(t.ep_comm_block_s)
        n_comm_l = of_p(n_comm)
        fwd_l, bwd_l, t_mb_l = of_p(t.fwd_compute_s), of_p(t.bwd_compute_s), of_p(t_mb)
        comm_tp = ga * (of_p(t.tp_cp_ep_comm_s) - n_comm_l * (cp_l + ep_l))
        comm_pp = ga * of_p(t.pp_comm_s)
        compute = ga * (fwd_l + bwd_l)
        if t.grad_accum_pass_s is not None:
            compute = compute + ga * of_p(t.grad_accum_pass_s)
        bubble = t.bubble_share[p_inv] * t_mb_l
        # the time the sustained-rate ceiling (and step_time_factor) adds counts as compute
        # (inf - inf where a link has no bandwidth: such a layout is left unpriced by the caller)
        compute = compute + (step_o[idx, cols] - unfloored[idx, cols])
    branch = BRANCH[pair]
    sync = setup.fsdp_pipeline_grad_sync
    times = dp_times(branch, a.pp, a.grad_accum, sync)
    return StepArrays(orders=tuple(orders), order=idx, step_time_s=step_o[idx, cols], compute_s=compute,
                      comm_tp_s=comm_tp, comm_cp_s=(ga * n_comm_l) * cp_l, comm_ep_s=(ga * n_comm_l) * ep_l,
                      comm_dp_s=of_kind(table.dp_exposed_s), comm_pp_s=comm_pp, bubble_s=bubble,
                      optimizer_s=of_kind(table.optimizer_s), dp_slowdown_s=of_kind(table.dp_slowdown_s),
                      micro_batch_s=t_mb_l, fwd_mb_s=fwd_l, bwd_mb_s=bwd_l, slow_stage=of_p(deg.stage[t.slot, pd]),
                      n_slow=n_slow_l.astype(np.int64), n_slow_bwd=of_p(n_slow_bwd).astype(np.int64),
                      n_comm=n_comm_l.astype(np.int64),
                      grad_accum=a.grad_accum, dp_branch=branch,
                      dp_times=times[0].astype(np.int64), dp_reduce_times=times[1].astype(np.int64),
                      dp_reduce_steady=steady_reduce(branch, a.pp, sync),
                      dp_each=None if table.dp_each is None else
                      table.dp_each.reshape(9, n_o, -1)[:, idx, at_kind].reshape(3, 3, -1),
                      efficiency=eff, tokens_per_step=n_seq * setup.seq_len, n_gpus=a.n_gpus,
                      model_flops=flops[0], hardware_flops=flops[1], peak_flops_per_s=peak,
                      fp8_peak_flops_per_s=low_precision_peak(cluster.gpu, setup),
                      regime=regime_of(m, setup, cluster.gpu),
                      mfu_ceiling=mfu_ceiling(eff, cluster.gpu, setup.precision_spec.fp8 is not None))


def low_precision_peak(gpu: GpuSpec, setup: TrainingSetup) -> float | None:
    """The dense peak of the run's low-precision GEMMs, for MFU beside the BF16 one: the FP8 peak
    (gpus.toml), times the recipe's peak ratio (NVFP4: the FP4 peak, twice FP8 on Blackwell);
    None without a low-precision recipe or without an FP8 peak on the GPU."""
    r = setup.precision_spec.fp8
    if r is None or gpu.fp8_flops_per_s is None:
        return None
    return gpu.fp8_flops_per_s * r.peak_ratio


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
