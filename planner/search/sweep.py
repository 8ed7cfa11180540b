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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from planner.hardware.placement import Cluster
from planner.layouts.batch import RECOMPUTES, LayoutArrays, valid_layouts
from planner.layouts.layout import SearchSpace, enumerate_folded
from planner.memory.model import min_model_state_bytes_per_param, rank_memories
from planner.memory.peak import MemoryBatch, memory_batch
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.search.search import RECOMPUTE_COST, Candidate, rank_columns
from planner.timing.fast import step_times_picked
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
    arrays = valid_layouts(m, setup, n, gpus_per_node, space)
    folded = [lay for lay, why in enumerate_folded(m, setup, n, gpus_per_node, space) if why is None]
    return LayoutArrays.concat([arrays, LayoutArrays.from_layouts(folded)]) if folded else arrays


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


def _fastest_on_count(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, n: int, capacity_bytes: int,
                      space: SearchSpace, eff: Efficiency, keep: int, pc: ParamCount,
                      host_capacity_bytes: int | None, nvme_capacity_bytes: int | None) -> CountBest:
    arrays, batch = sized_layouts(m, setup, n, cluster.gpu.gpus_per_node, space, pc)
    if batch is None:
        return CountBest(n_gpus=n, fastest=())
    totals = batch.total
    may_fit = np.flatnonzero(totals <= capacity_bytes)
    if not len(may_fit):
        return CountBest(n_gpus=n, fastest=(), n_shapes=len(arrays))
    arrays_fit = LayoutArrays(*(arrays.field(f)[may_fit] for f in LayoutArrays.FIELDS))
    headroom = capacity_bytes - totals[may_fit]
    best: list[Candidate] = []
    rows: list[int] = []
    sized = 0

    def keep_fastest(times: np.ndarray) -> list[int]:
        """The rows of the ``keep`` fastest layouts that fit, in rank order."""
        nonlocal sized
        for i in _rank_order(arrays_fit, times, headroom, keep):
            lay = arrays_fit.layout(i, setup.seq_len)
            (mem,) = rank_memories(batch, [int(may_fit[i])])      # the batch's row: sized once
            c = Candidate(layout=lay, memory=mem, capacity_bytes=capacity_bytes,
                          host_capacity_bytes=host_capacity_bytes, nvme_capacity_bytes=nvme_capacity_bytes)
            sized += 1
            if c.fits:          # (the host's and NVMe's capacity: the GPU's is in may_fit)
                best.append(c)
                rows.append(i)
                if len(best) == keep:
                    break
        return rows

    # every fitting layout timed as one batch, and the StepTime of the kept ones read off it
    _, kept_times = step_times_picked(m, setup, arrays_fit, cluster, eff, pc, keep_fastest)
    return CountBest(n_gpus=n, fastest=tuple(replace(c, time=t) for c, t in zip(best, kept_times)),
                     n_shapes=len(arrays), n_timed=len(arrays_fit), n_sized=sized)


def _rank_order(a: LayoutArrays, times: np.ndarray, headroom: np.ndarray, keep: int) -> Iterator[int]:
    """The rows of ``a`` in rank_key's order (np.lexsort: the last key first; stable, so full
    ties keep enumeration order; many layouts tie on step time where the GPU's sustained-rate
    floor binds, so the other fields are sorted as arrays rather than walked one by one).
    Step time is the first key, so the rows no slower than the ``keep``-th fastest come first
    in that order: they are sorted and given first, and the others only if the walk asks for
    more (a fast layout that overflows the host's memory). Sorting all of a count's layouts
    took 0.46 of 5 s of CPU of `--tokens` over the catalog with DeepSeek-V3 (issue 32)."""
    rc_cost = np.array([RECOMPUTE_COST[r] for r in RECOMPUTES])
    first = np.zeros(len(times), dtype=bool)
    if keep < len(times):
        first = times <= np.partition(times, keep - 1)[keep - 1]     # False throughout for a NaN
    for part in (first, ~first) if first.any() else (~first,):
        rows = np.flatnonzero(part)
        order = np.lexsort(rank_columns(times[rows], rc_cost[a.recompute[rows]], a.pp[rows], a.cp[rows], a.tp[rows],
                                        a.zero_stage[rows], a.sharding[rows] > 0, a.micro_batch[rows], a.vp[rows],
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
    floor_per_param = min_model_state_bytes_per_param(setup)
    out = []
    for n in counts:
        if floor_per_param * pc.total / n > capacity_bytes:
            out.append(CountBest(n_gpus=n, fastest=()))
            continue
        out.append(_fastest_on_count(m, setup, cluster, n, capacity_bytes, space, eff, keep, pc,
                                     host_capacity_bytes, nvme_capacity_bytes))
    return out
