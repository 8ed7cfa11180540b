"""The fastest few fitting layouts at every GPU count, for the cost and time objectives.

search() stops at the smallest GPU count that fits. A plan that minimises cost or time
needs every count, and on one count it needs only the fastest layouts: on the same GPU
type and count, a slower layout costs more (GPU-hours = GPUs x time) and finishes later,
so it can never be the cheapest nor the fastest plan under any deadline, budget or cap.
sweep() keeps the ``keep`` fastest per count. On each count it enumerates the valid
layouts as one batch (planner.layouts.batch), sizes them as one batch where the memory
model can (_batch_totals) and times every one of them as one batch
(planner.timing.fast.step_times_picked); it then walks the layouts that fit in order of step
time, builds memory breakdowns only for the few it keeps and reads their StepTime off the
same batch (a layout's StepTime does not depend on the batch: each is the one its count was
ranked by).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner.hardware.placement import Cluster
from planner.layouts.batch import RECOMPUTES, LayoutArrays, Unsupported, valid_layouts_of_batches
from planner.layouts.groups import group
from planner.layouts.layout import SearchSpace, enumerate_folded
from planner.memory.model import min_model_state_bytes_per_param, rank_memories
from planner.memory.peak import MemoryBatch, memory_batch
from planner.memory.shapes import memory_grad_accum
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.search.search import RECOMPUTE_COST, Candidate, rank_columns
from planner.timing.context import LayoutContext, layout_context
from planner.timing.degrees import table_setup
from planner.timing.fast import BoundedTimes, step_time_bounds
from planner.timing.model import DEFAULT_EFFICIENCY, Efficiency
from planner.training.setup import TrainingSetup

DEFAULT_SPACE = SearchSpace()


@dataclass(frozen=True, kw_only=True, slots=True)
class CountBest:
    """The fastest fitting layouts on one GPU count (fastest first; empty: none fits)."""

    n_gpus: int
    fastest: tuple[Candidate, ...]
    n_shapes: int = 0        # valid layouts on the count
    n_timed: int = 0         # layouts timed (as one batch)
    n_sized: int = 0         # layouts whose full memory breakdown was built


def count_layouts(m: ModelSpec, setup: TrainingSetup, n: int, gpus_per_node: int,
                 space: SearchSpace) -> LayoutArrays:
    """The valid layouts on ``n`` GPUs, in enumerate_layouts' order, as arrays (the rules
    table, planner.layouts.rules, over a grid; every set-up), then the valid folded ones where
    the space folds ep on ``n`` (layouts.layout.enumerate_folded, as search.size_count adds them)."""
    arrays, _ = count_layouts_of(m, [setup], n, gpus_per_node, space)
    return arrays


def count_layouts_of(m: ModelSpec, setups: Sequence[TrainingSetup], n: int, gpus_per_node: int,
                     space: SearchSpace) -> tuple[LayoutArrays, list[int]]:
    """count_layouts() of each of ``setups`` (set-ups that differ only in the global batch), one
    after another as one LayoutArrays, and where each set-up's layouts start (and the last
    end): one grid of the rules over their batches (layouts.batch.valid_layouts_of_batches)."""
    arrays, starts = valid_layouts_of_batches(m, setups[0], [s.global_batch for s in setups], n, gpus_per_node,
                                              space)
    folded = [[lay for lay, why in enumerate_folded(m, setup, n, gpus_per_node, space) if why is None]
              for setup in setups]
    if not any(folded):
        return arrays, starts
    parts = []
    for lo, hi, lays in zip(starts, starts[1:], folded):
        parts += [arrays.take(slice(lo, hi))] + ([LayoutArrays.from_layouts(lays)] if lays else [])
    return LayoutArrays.concat(parts), np.cumsum([0] + [hi - lo + len(lays) for lo, hi, lays
                                                        in zip(starts, starts[1:], folded)]).tolist()


_LAST_SIZED: dict[tuple, tuple[LayoutArrays, MemoryBatch | None]] = {}


def sized_layouts(m: ModelSpec, setup: TrainingSetup, n: int, gpus_per_node: int, space: SearchSpace,
                  pc: ParamCount) -> tuple[LayoutArrays, MemoryBatch | None]:
    """The valid layouts on ``n`` GPUs and their memory batch (None where there are none).
    Neither reads the GPU beyond its node size, so GPU types of one node size share them:
    the last count's pair is kept (one entry: a batch holds every layout's terms), and a
    caller that sweeps one count on several GPU types in turn sizes it once (cost.plan's
    purchase sweep: three GPU types took three sizings of each count, issue 32)."""
    key = (m, setup, n, gpus_per_node, space)
    hit = _LAST_SIZED.get(key)
    if hit is None:
        _LAST_SIZED.clear()
        arrays = count_layouts(m, setup, n, gpus_per_node, space)
        hit = _LAST_SIZED[key] = (arrays, memory_batch(m, setup, arrays, pc, gpus_per_node) if len(arrays) else None)
    return hit


@dataclass(frozen=True, kw_only=True, slots=True)
class Sized:
    """Layouts' memory: a MemoryBatch, the row of it each layout reads (None: its own row)
    and each layout's total bytes."""

    batch: MemoryBatch
    row: np.ndarray | None
    total: np.ndarray

    def rows(self, layouts: np.ndarray) -> list[int]:
        """The batch's rows of ``layouts`` (layout numbers)."""
        return (layouts if self.row is None else self.row[layouts]).tolist()


def sized_once(m: ModelSpec, setup: TrainingSetup, arrays: LayoutArrays, pc: ParamCount,
               gpus_per_node: int, n_batches: int) -> Sized | None:
    """The memory of ``arrays`` (valid layouts of ``setup``), each distinct layout as the memory
    model reads it sized once: layouts that differ only in an accumulation count the model
    does not tell apart (memory.shapes.memory_grad_accum) share a row. Set-ups that differ
    only in the global batch give the same layouts but for the accumulation (1,024 + 8 i
    sequences at dp 8: 128 + i micro-batches), whose memory saturates at pp micro-batches in
    flight. ``n_batches``: how many global batches the layouts are of; of one, no two share a
    row (the accumulation follows from the micro-batch and the degrees): none is looked for.
    None where there are no layouts."""
    if not len(arrays):
        return None
    if n_batches == 1:
        batch = memory_batch(m, setup, arrays, pc, gpus_per_node)
        return Sized(batch=batch, row=None, total=batch.total)
    key = replace(arrays, grad_accum=memory_grad_accum(arrays, setup))
    try:
        row, first = group([key.field(f) for f in LayoutArrays.FIELDS])
    except Unsupported:         # columns too wide to pack: each layout its own row
        row, first = np.arange(len(arrays)), np.arange(len(arrays))
    if len(first) == len(arrays):
        batch = memory_batch(m, setup, arrays, pc, gpus_per_node)
        return Sized(batch=batch, row=None, total=batch.total)
    batch = memory_batch(m, setup, key.take(first), pc, gpus_per_node)
    return Sized(batch=batch, row=row, total=batch.total[row])


@dataclass(frozen=True, kw_only=True, slots=True)
class Ask:
    """One search's request for a count's fastest layouts (sweep's arguments beside the model,
    the space and the count): its set-up, the GPUs it times on and what fits on them."""

    setup: TrainingSetup
    cluster: Cluster
    capacity_bytes: int
    eff: Efficiency = DEFAULT_EFFICIENCY
    keep: int = 3
    host_capacity_bytes: int | None = None
    nvme_capacity_bytes: int | None = None


def _fastest_on_count(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, n: int, capacity_bytes: int,
                      space: SearchSpace, eff: Efficiency, keep: int, pc: ParamCount,
                      host_capacity_bytes: int | None, nvme_capacity_bytes: int | None) -> CountBest:
    arrays, batch = sized_layouts(m, setup, n, cluster.gpu.gpus_per_node, space, pc)
    ask = Ask(setup=setup, cluster=cluster, capacity_bytes=capacity_bytes, eff=eff, keep=keep,
              host_capacity_bytes=host_capacity_bytes, nvme_capacity_bytes=nvme_capacity_bytes)
    sized = None if batch is None else Sized(batch=batch, row=None, total=batch.total)
    (cb,) = _fastest_of(m, pc, [n], arrays, sized, [(ask, 0, len(arrays))], keep_terms=True)
    return cb


def _fastest_of(m: ModelSpec, pc: ParamCount, ns: Sequence[int], arrays: LayoutArrays, batch: Sized | None,
                segments: Sequence[tuple[Ask, int, int]], keep_terms: bool, split: bool = False) -> list[CountBest]:
    """Per segment (ask, first row, end row) of ``arrays`` (valid layouts on ``ns[j]`` GPUs, sized
    as ``batch``): the ask's fastest layouts that fit among its rows. The segments that time
    on one cluster with one set of efficiencies are timed as one batch, whose rows
    step_times_picked() reads apart (a layout's time does not depend on what else is in the
    batch); each segment's rows are ranked on their own (_rank_order). ``keep_terms``: each
    candidate keeps its memory terms (they hold the whole ``batch``). ``split``: the segments
    hold folded or unfolded layouts only (_fastest_by_fold), though ``arrays`` may hold both."""
    mixed = arrays.ep_fold is not None and bool(arrays.ep_fold.any()) and not bool(arrays.ep_fold.all())
    if mixed and not split:
        return _fastest_by_fold(m, pc, ns, arrays, batch, segments, keep_terms)
    out: list[CountBest | None] = [None] * len(segments)
    timed: dict[tuple, list[int]] = {}          # (cluster, eff) -> segments timed together
    fits: list[np.ndarray] = []                 # per segment: its rows that may fit
    for k, ((ask, lo, hi), n) in enumerate(zip(segments, ns)):
        fits.append(np.zeros(0, dtype=np.int64))
        if batch is None or hi == lo:
            out[k] = CountBest(n_gpus=n, fastest=())
            continue
        fits[k] = lo + np.flatnonzero(batch.total[lo:hi] <= ask.capacity_bytes)
        if not len(fits[k]):
            out[k] = CountBest(n_gpus=n, fastest=(), n_shapes=hi - lo)
            continue
        timed.setdefault((ask.cluster, ask.eff), []).append(k)
    if timed:
        assert batch is not None
        setup = segments[next(iter(timed.values()))[0]][0].setup
        fitting = {key: sum(len(fits[k]) for k in ks) for key, ks in timed.items()}
        # of at most SHARE_TYPES clusters, those that fit half the layouts or more, two or more
        # of them, or one that fits three quarters: timed from one context of every layout, not
        # a copy (their groups, FLOPs and GPUs are every cluster's, timing.context.LayoutContext;
        # the rows a cluster does not fit add pipeline shapes and degrees it works out for
        # nothing); any other from one of the rows it may fit
        share = [key for key, f in fitting.items() if 2 * f >= len(arrays)] if len(timed) <= SHARE_TYPES else []
        share = [] if mixed else share      # a context of every layout would mix foldings
        if len(share) < 2:
            share = [key for key in share if 4 * fitting[key] >= 3 * len(arrays)]
        whole = layout_context(m, setup, arrays, pc) if share else None
        every = np.arange(len(arrays))
        for key, ks in timed.items():
            if whole is not None and key in share:
                context, union, local = whole, every, [fits[k] for k in ks]
            else:
                place = np.zeros(len(arrays), dtype=np.int64)      # 1 for its rows, then their places
                for k in ks:
                    place[fits[k]] = 1
                union = np.flatnonzero(place)
                place[union] = np.arange(len(union))
                context = layout_context(m, setup, arrays if len(union) == len(arrays) else arrays.take(union), pc)
                local = [place[fits[k]] for k in ks]
            cluster, eff = key
            for k, cb in zip(ks, _timed_together([ns[k] for k in ks], context, union, batch, [segments[k] for k in ks],
                                                 local, cluster, eff, keep_terms)):
                out[k] = cb
    assert all(cb is not None for cb in out)
    return out  # type: ignore[return-value]


def _fastest_by_fold(m: ModelSpec, pc: ParamCount, ns: Sequence[int], arrays: LayoutArrays, batch: Sized | None,
                     segments: Sequence[tuple[Ask, int, int]], keep_terms: bool) -> list[CountBest]:
    """_fastest_of where ``arrays`` hold folded layouts (Layout.ep_fold) beside unfolded ones: one
    batch's step times take one folding (timing.context.batch_fold raised Unsupported, exit 1 of
    `plan --model deepseek-v3 --ep 64 --etp 1 --gpus h100 --tokens 1T`, issue 32), so each
    segment's unfolded rows and its folded ones (count_layouts_of puts them after) are timed apart
    and their fastest merged in rank_key's order (stable: on a full tie the unfolded first, the
    enumeration order search.size_count ranks them in)."""
    from planner.search.search import rank_key

    folds = arrays.ep_fold
    assert folds is not None
    halves = []
    for ask, lo, hi in segments:
        mid = lo + int((folds[lo:hi] == 0).sum())
        assert not folds[lo:mid].any() and folds[mid:hi].all(), "folded layouts follow a segment's unfolded ones"
        halves.append(((ask, lo, mid), (ask, mid, hi)))
    plain = _fastest_of(m, pc, ns, arrays, batch, [h for h, _ in halves], keep_terms, split=True)
    folded = _fastest_of(m, pc, ns, arrays, batch, [h for _, h in halves], keep_terms, split=True)
    return [CountBest(n_gpus=a.n_gpus, fastest=tuple(sorted(a.fastest + b.fastest, key=rank_key)[:ask.keep]),
                      n_shapes=a.n_shapes + b.n_shapes, n_timed=a.n_timed + b.n_timed, n_sized=a.n_sized + b.n_sized)
            for (ask, _, _), a, b in zip(segments, plain, folded)]


# the most GPU types a count times on for them to share one context of its layouts: the 8-model
# `plan buy` (3 types) spent 0.45 s less of CPU with it, the 16 jobs of the largest models over
# 23 types 0.4-0.8 s more (each type works out the shapes and degrees of every layout)
SHARE_TYPES = 4
# the fewest layouts that may fit, over the segments one GPU type times together (_timed_together), for the
# sweep to prune by the bound: fewer are timed whole, where the bound's limit and a second walk would spare
# little (a chosen figure, not a measured optimum; raising it was tried and dropped: docs/performance.md)
PRUNE_ROWS = 4096


def _timed_together(ns: Sequence[int], context: LayoutContext, union: np.ndarray, batch: Sized,
                    segments: Sequence[tuple[Ask, int, int]], fits: Sequence[np.ndarray], cluster: Cluster,
                    eff: Efficiency, keep_terms: bool, prune: bool = True) -> list[CountBest]:
    """_fastest_of for segments that time on one cluster with one set of efficiencies, each
    with its rows that may fit (``fits``, rows of the layouts of ``context``, which are the rows
    ``union`` of the batch's layouts): every such row timed as one batch
    (timing.fast.BoundedTimes), and each segment's fastest that fit walked in its own rank order.

    With ``prune`` and at least PRUNE_ROWS rows, only the rows whose lower bound
    (BoundedTimes.lower_s) is at most their segment's limit (_limits: a time ``keep`` of its
    layouts reach) are timed exactly and walked: every row faster than the limit is among them,
    and the walk takes rows in order of step time, so while it keeps ``keep`` rows no slower
    than the limit it walks what it walks over every row. A segment whose walk keeps fewer, or
    one slower than the limit (a fast layout that overflows the host's memory), is walked again
    over all its rows. The 8-model `plan buy` timed 14.7 million rows of which 1.6 million had
    a bound below their segment's fastest (issue 32)."""
    may_fit = np.concatenate(fits) if len(fits) > 1 else fits[0]
    headroom = np.concatenate([ask.capacity_bytes - batch.total[union[f]] for (ask, _, _), f in zip(segments, fits)])
    starts: list[int] = np.cumsum([0] + [len(f) for f in fits]).tolist()
    pruned = prune and len(may_fit) >= PRUNE_ROWS
    bounds = step_time_bounds(context, cluster, eff, bounded=pruned)
    limit_s = None
    if pruned:
        limit_s = _limits(bounds, may_fit, starts, [ask.keep for ask, _, _ in segments])
        seg = np.repeat(np.arange(len(segments)), np.diff(starts))
        within = np.flatnonzero(~(bounds.lower_s(may_fit) > limit_s[seg]))       # (a NaN bound is kept)
        if len(within) < len(may_fit):
            may_fit, headroom = may_fit[within], headroom[within]
            starts = np.searchsorted(within, starts).tolist()
        else:
            limit_s = None
    whole = len(may_fit) == len(context.a) and np.array_equal(may_fit, np.arange(len(context.a)))
    walked = context.a if whole else context.a.take(may_fit)
    at_batch = union[may_fit]           # the rows' memory in the batch
    best: list[list[Candidate]] = [[] for _ in segments]
    best_s: list[list[float]] = [[] for _ in segments]
    sized = [0] * len(segments)

    def keep_fastest(times_s: np.ndarray) -> list[int]:
        """Per segment, the rows of its ``keep`` fastest layouts that fit, in rank order: each
        segment's fastest first, their memory read off the batch in one call."""
        heads = _heads(walked, times_s, headroom, starts)
        at = [lo + i for lo, i in zip(starts, heads) if i is not None]
        mems = iter(rank_memories(batch.batch, batch.rows(at_batch[at]), keep_terms))    # sized once
        out: list[int] = []
        for j, ((ask, _, _), lo, hi, head) in enumerate(zip(segments, starts, starts[1:], heads)):
            i, walk = head, None
            while i is not None:
                mem = next(mems) if walk is None else \
                    rank_memories(batch.batch, batch.rows(at_batch[lo + i:lo + i + 1]), keep_terms)[0]
                c = Candidate(layout=walked.layout(lo + i, ask.setup.seq_len), memory=mem,
                              capacity_bytes=ask.capacity_bytes, host_capacity_bytes=ask.host_capacity_bytes,
                              nvme_capacity_bytes=ask.nvme_capacity_bytes)
                sized[j] += 1
                if c.fits:          # (the host's and NVMe's capacity: the GPU's is in may_fit)
                    best[j].append(c)
                    best_s[j].append(float(times_s[lo + i]))
                    out.append(lo + i)
                    if len(best[j]) == ask.keep:
                        break
                if walk is None:    # past the head: the segment's own walk, from its second row
                    walk = _rank_order(walked, times_s[lo:hi], headroom[lo:hi], ask.keep, lo)
                    if next(walk) != head:      # (not an assert: `python -O` would skip the head)
                        raise AssertionError("a segment's walk does not start at its head (search.sweep._heads)")
                i = next(walk, None)
        return out

    # every fitting layout timed as one batch (or those within their limit), and the StepTime
    # of the kept ones read off it
    times_s, kept_times_s = bounds.picked(None if whole else may_fit, keep_fastest)
    if limit_s is not None:
        _check_bound(times_s, bounds.lower_s(may_fit))
    out, at = [], 0
    for (_, lo, hi), n, f, kept, n_sized in zip(segments, ns, fits, best, sized):
        ts = kept_times_s[at:at + len(kept)]
        at += len(kept)
        out.append(CountBest(n_gpus=n, fastest=tuple(replace(c, time=t) for c, t in zip(kept, ts)),
                             n_shapes=hi - lo, n_timed=len(f), n_sized=n_sized))
    if limit_s is not None:       # segments whose walk went past their limit: walked over all their rows
        again = [j for j, (ask, _, _) in enumerate(segments) if limit_s[j] < np.inf and
                 (len(best[j]) < ask.keep or not max(best_s[j]) <= limit_s[j])]
        if again:
            for j, cb in zip(again, _timed_together([ns[j] for j in again], context, union, batch,
                                                    [segments[j] for j in again],
                                                    [fits[j] for j in again], cluster, eff, keep_terms, False)):
                out[j] = cb
    return out


def _limits(bounds: BoundedTimes, rows: np.ndarray, starts: list[int], keeps: Sequence[int]) -> np.ndarray:
    """Per segment (the layouts ``rows[starts[j]:starts[j + 1]]`` of the batch of ``bounds``), a
    step time that ``keeps[j]`` of its layouts reach: the slowest of the ``keeps[j]`` layouts of
    least lower bound (each segment's first of equals), timed exactly; inf where fewer have a
    finite bound or one's time is NaN."""
    lo = np.array(starts[:-1], dtype=np.int64)
    counts = np.diff(starts)
    full = np.flatnonzero(counts > 0)
    seg = np.repeat(np.arange(len(full)), counts[full])       # each row's place among the full segments
    work = bounds.lower_s(rows)
    work[np.isnan(work)] = np.inf
    want = np.asarray(keeps, dtype=np.int64)[full]
    picked: list[np.ndarray] = []
    n_seeds = np.zeros(len(full), dtype=np.int64)
    for r in range(int(want.max(initial=0))):
        least = np.minimum.reduceat(work, lo[full])
        at = np.flatnonzero(work <= least[seg])
        if not len(at):
            break
        s = seg[at]
        first = at[np.r_[True, s[1:] != s[:-1]]]
        first = first[(want[seg[first]] > r) & (work[first] < np.inf)]
        picked.append(first)
        n_seeds[seg[first]] += 1
        work[first] = np.inf
    limit = np.full(len(keeps), np.inf)
    if not picked:
        return limit
    seeds = np.sort(np.concatenate(picked))
    t = bounds.times_s(rows[seeds])
    _check_bound(t, bounds.lower_s(rows[seeds]))     # (past it, a segment's rows could all be pruned)
    t[np.isnan(t)] = np.inf
    slowest = np.full(len(full), -np.inf)
    np.maximum.at(slowest, seg[seeds], t)
    limit[full] = np.where(n_seeds == want, slowest, np.inf)
    return limit


def _check_bound(times_s: np.ndarray, lower_s: np.ndarray) -> None:
    """Raise where a step time is below its lower bound (timing.fast.BoundedTimes): pruning by such
    a bound could pass over layouts that win. An internal error (`plan` exits 1), never an answer;
    an explicit raise, kept under `python -O`."""
    if bool((times_s < lower_s).any()):
        raise AssertionError("a step time below its lower bound (timing.fast.BoundedTimes)")


_RECOMPUTE_COST = np.array([RECOMPUTE_COST[r] for r in RECOMPUTES])     # per RECOMPUTES index


def _heads(a: LayoutArrays, times: np.ndarray, headroom: np.ndarray, starts: list[int]) -> list[int | None]:
    """The first row of each segment (rows ``starts[j]`` to ``starts[j + 1]`` of ``a``, numbered
    from the segment's start; None for an empty one) in _rank_order's order, whatever its
    ``keep``: the least in rank_columns' order, NaN times last, the first of full ties. Taken
    for every segment at once among the rows at their segment's least time (the sweep of a
    count for 256 set-ups walked 7,149 segments one by one, issue 32); a segment whose times
    are all NaN is walked on its own."""
    lo, hi = np.array(starts[:-1], dtype=np.int64), np.array(starts[1:], dtype=np.int64)
    full = np.flatnonzero(hi > lo)
    seg = np.repeat(np.arange(len(lo)), hi - lo)
    least = np.full(len(lo), np.nan)
    if len(full):
        least[full] = np.fmin.reduceat(times, lo[full])    # the segments cover the rows: no gaps
    rows = np.flatnonzero(times <= least[seg])             # False where the least is NaN
    cols = rank_columns(times[rows], _RECOMPUTE_COST[a.recompute[rows]], a.pp[rows], a.cp[rows], a.tp[rows],
                        a.zero_stage[rows], a.sharding[rows] > 0, a.micro_batch[rows], a.vp[rows], headroom[rows])
    order = rows[np.lexsort((*cols[::-1], seg[rows]))]    # the segment first, then rank_columns
    first = order[np.r_[True, seg[order][1:] != seg[order][:-1]]] if len(order) else order
    out: list[int | None] = [None] * len(lo)
    for r in first.tolist():
        j = int(seg[r])
        out[j] = r - starts[j]
    for j in full.tolist():
        if out[j] is None:
            out[j] = next(_rank_order(a, times[starts[j]:starts[j + 1]], headroom[starts[j]:starts[j + 1]], 1,
                                      starts[j]))
    return out


def _rank_order(a: LayoutArrays, times: np.ndarray, headroom: np.ndarray, keep: int, lo: int = 0) -> Iterator[int]:
    """The rows of ``a`` from ``lo`` on, as many as ``times`` and ``headroom`` have, numbered
    from 0, in rank_key's order (np.lexsort: the last key first; stable, so full ties keep
    enumeration order; many layouts tie on step time where the GPU's sustained-rate
    floor binds, so the other fields are sorted as arrays rather than walked one by one).
    Step time is the first key, so the rows no slower than the ``keep``-th fastest come first
    in that order: they are sorted and given first, and the others only if the walk asks for
    more (a fast layout that overflows the host's memory). Sorting all of a count's layouts
    took 0.46 of 5 s of CPU of `--tokens` over the catalog with DeepSeek-V3 (issue 32)."""
    first = np.zeros(len(times), dtype=bool)
    if keep < len(times):
        first = times <= np.partition(times, keep - 1)[keep - 1]     # False throughout for a NaN
    for part in (first, ~first) if first.any() else (~first,):
        rows = np.flatnonzero(part)
        at = rows + lo
        order = np.lexsort(rank_columns(times[rows], _RECOMPUTE_COST[a.recompute[at]], a.pp[at], a.cp[at], a.tp[at],
                                        a.zero_stage[at], a.sharding[at] > 0, a.micro_batch[at], a.vp[at],
                                        headroom[rows])[::-1])
        yield from rows[order].tolist()


def sweep(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, counts: Iterable[int], capacity_bytes: int,
          space: SearchSpace = DEFAULT_SPACE, eff: Efficiency = DEFAULT_EFFICIENCY, keep: int = 3,
          host_capacity_bytes: int | None = None, nvme_capacity_bytes: int | None = None) -> list[CountBest]:
    """For each GPU count, the ``keep`` fastest layouts that fit (step times on ``cluster``).

    Exact: every valid layout of a count is timed; those that fit are taken in order of
    step time, and the walk stops at the first layout slower than the ``keep``-th kept
    (rank_key orders by step time first). Counts on which the model states alone cannot
    fit are skipped, as in search()."""
    pc = count_params(m)
    ask = Ask(setup=setup, cluster=cluster, capacity_bytes=capacity_bytes, eff=eff, keep=keep,
              host_capacity_bytes=host_capacity_bytes, nvme_capacity_bytes=nvme_capacity_bytes)
    out = []
    for n in counts:
        if not _may_fit(ask, pc, n):
            out.append(CountBest(n_gpus=n, fastest=()))
            continue
        out.append(_fastest_on_count(m, setup, cluster, n, capacity_bytes, space, eff, keep, pc,
                                     host_capacity_bytes, nvme_capacity_bytes))
    return out


def _may_fit(ask: Ask, pc: ParamCount, n: int) -> bool:
    """Whether the model states alone can fit on ``n`` GPUs of the ask's capacity (sweep skips
    the counts where they cannot, as search() does)."""
    return not min_model_state_bytes_per_param(ask.setup) * pc.total / n > ask.capacity_bytes


SHARED_ROWS = 1 << 17       # the most valid layouts sweep_shared() sizes and times in one batch


def sweep_shared(m: ModelSpec, space: SearchSpace, n: int, gpus_per_node: int, asks: Sequence[Ask]
                 ) -> list[CountBest]:
    """sweep(m, ask.setup, ask.cluster, [n], ...)[0] for each ask, without memory terms
    (rank_memories' keep_terms=False), the asks' set-ups differing in nothing but the global
    batch (training.setup.block_table_setup) and their GPUs sharing ``gpus_per_node``.

    Each distinct set-up's valid layouts on ``n`` (count_layouts: the global batch decides
    which are valid and their accumulation) are sized as one batch with the others' (no
    memory model reads the global batch: a layout carries its micro-batch and accumulation,
    tests/test_block_tables.py), at most SHARED_ROWS layouts at a time, and the asks that time
    on one cluster are timed as one batch (_fastest_of). `plan buy` of 256 jobs of one model,
    each its own global batch, swept 7,405 counts one set-up at a time (issue 32)."""
    return sweep_shared_counts(m, space, [n], gpus_per_node, asks)[0]


def sweep_shared_counts(m: ModelSpec, space: SearchSpace, ns: Sequence[int], gpus_per_node: int,
                        asks: Sequence[Ask]) -> list[list[CountBest]]:
    """sweep_shared() on each count of ``ns`` (per count, per ask), the counts' layouts sized
    and timed together as sweep_shared() sizes and times several set-ups' (a layout's memory and
    time do not depend on the batch it is in): the models' fixed cost per call is most of a
    small count's (`plan buy` of 256 jobs swept 176 counts below a node one at a time, 2.9 to
    5.7 ms each, issue 32)."""
    if not asks:
        return [[] for _ in ns]
    base = table_setup(asks[0].setup)
    if any(table_setup(a.setup) != base for a in asks):
        raise ValueError("sweep_shared: set-ups that differ in more than the global batch")
    pc = count_params(m)
    out: list[list[CountBest | None]] = [[None if _may_fit(a, pc, n) else CountBest(n_gpus=n, fastest=())
                                          for a in asks] for n in ns]
    blocks: list[tuple[int, list[int]]] = []      # (count, the asks left of one distinct set-up)
    parts, starts = [], [0]                         # each count's layouts, and where each block's start
    for i, n in enumerate(ns):
        by_setup: dict[TrainingSetup, list[int]] = {}
        for k, a in enumerate(asks):
            if out[i][k] is None:
                by_setup.setdefault(a.setup, []).append(k)
        if by_setup:
            arrays_n, starts_n = count_layouts_of(m, list(by_setup), n, gpus_per_node, space)
            parts.append(arrays_n)
            starts += [starts[-1] + x for x in starts_n[1:]]
            blocks += [(i, ks) for ks in by_setup.values()]
    if not blocks:
        return out  # type: ignore[return-value]
    arrays = parts[0] if len(parts) == 1 else LayoutArrays.concat(parts)
    first = 0       # the first block of the next chunk: chunks of at most SHARED_ROWS layouts
    while first < len(blocks):
        last = first + 1
        while last < len(blocks) and starts[last + 1] - starts[first] <= SHARED_ROWS:
            last += 1
        lo, hi = starts[first], starts[last]
        part = arrays if (lo, hi) == (0, len(arrays)) else arrays.take(slice(lo, hi))
        segments = [(asks[k], starts[j] - lo, starts[j + 1] - lo) for j in range(first, last) for k in blocks[j][1]]
        at = [(blocks[j][0], k) for j in range(first, last) for k in blocks[j][1]]
        # set-ups of one count share memory rows (sized_once); layouts of two counts never do
        n_batches = max(Counter(blocks[j][0] for j in range(first, last)).values())
        sized = sized_once(m, asks[blocks[first][1][0]].setup, part, pc, gpus_per_node, n_batches)
        for (i, k), cb in zip(at, _fastest_of(m, pc, [ns[i] for i, _ in at], part, sized, segments,
                                              keep_terms=False)):
            out[i][k] = cb
        first = last
    return out  # type: ignore[return-value]
