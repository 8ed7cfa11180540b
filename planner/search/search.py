"""The search: GPU counts and layouts; layouts that fit are ranked by predicted step time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.layouts.layout import Layout, SearchSpace, enumerate_folded
from planner.memory.floors import min_model_state_bytes_per_param
from planner.memory.model import RankMemory
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.timing.model import StepTime
from planner.training.setup import TrainingSetup

RECOMPUTE_COST = {"none": 0, "selective": 1, "full": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A valid layout on a GPU count, with its memory, whether it fits, and (for layouts
    that fit) its predicted step time."""

    layout: Layout
    memory: RankMemory
    capacity_bytes: int
    time: StepTime | None = None
    host_capacity_bytes: int | None = None   # a node's CPU memory, when the topology gives it
    nvme_capacity_bytes: int | None = None   # a node's local NVMe, when the topology gives it

    @property
    def n_gpus(self) -> int:
        return self.layout.n_gpus

    @property
    def host_fits(self) -> bool:
        """What offload puts in CPU memory fits a node's (unchecked without a figure)."""
        host = self.host_capacity_bytes is None or self.memory.host_bytes_per_node <= self.host_capacity_bytes
        nvme = self.nvme_capacity_bytes is None or self.memory.nvme_bytes_per_node <= self.nvme_capacity_bytes
        return host and nvme

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes and self.host_fits

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.memory.total


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejected:
    layout: Layout
    reason: str


def gpu_counts(gpus_per_node: int, max_gpus: int) -> list[int]:
    """GPU counts the search tries: 1, 2, 4 ... below one node, then whole nodes
    (every count up to 16 nodes, then 1.5x and 2x steps: 24, 32, 48, 64 ... nodes)."""
    counts = [n for n in (1, 2, 4) if n < gpus_per_node]
    nodes = list(range(1, 17))
    step = 16
    while step * gpus_per_node < max_gpus:
        nodes += [step + step // 2, step * 2]
        step *= 2
    counts += [n * gpus_per_node for n in nodes]
    return sorted(c for c in set(counts) if c <= max_gpus)


def rank_columns(step_s: Any, recompute_cost: Any, pp: Any, cp: Any, tp: Any, zero_stage: Any, fsdp: Any,
                 micro_batch: Any, vp: Any, headroom_bytes: Any) -> tuple:
    """The order among fitting layouts on the same GPU count, most significant first: the
    shortest predicted step (planner.timing.model). Ties, and layouts without a step time (no
    timer given), go to the one that recomputes less (RECOMPUTE_COST), keeps pp, cp, tp and
    sharding small, takes larger micro-batches and fewer virtual stages and leaves more memory
    free. One layout's values give rank_key's sort key; arrays give the sweep's np.lexsort
    keys (reversed: lexsort sorts by the last key first)."""
    return (step_s, recompute_cost, pp, cp, tp, zero_stage, fsdp, -micro_batch, vp, -headroom_bytes)


def rank_key(c: Candidate) -> tuple:
    """rank_columns of one candidate: its sort key."""
    lay = c.layout
    step = c.time.step_time_s if c.time is not None else float("inf")
    return rank_columns(step, RECOMPUTE_COST[lay.recompute], lay.pp, lay.cp, lay.tp, lay.zero_stage, lay.is_fsdp,
                        lay.micro_batch, lay.vp, c.headroom_bytes)


def evaluate(m: ModelSpec, setup: TrainingSetup, layouts: Iterable[Layout], capacity_bytes: int,
             pc: ParamCount | None = None, gpus_per_node: int = 8,
             host_capacity_bytes: int | None = None, nvme_capacity_bytes: int | None = None) -> list[Candidate]:
    """Candidates for ``layouts`` (valid ones), sized together by the batched memory model
    (one batch per sequence length)."""
    from planner.layouts.batch import LayoutArrays
    from planner.memory.model import rank_memories
    from planner.memory.peak import memory_batch

    pc = pc or count_params(m)
    lays = list(layouts)
    mems: list[RankMemory | None] = [None] * len(lays)
    for seq in sorted({lay.seq_len for lay in lays}):
        idx = [i for i, lay in enumerate(lays) if lay.seq_len == seq]
        batch = memory_batch(m, setup, LayoutArrays.from_layouts([lays[i] for i in idx]), pc, gpus_per_node, seq)
        for i, mem in zip(idx, rank_memories(batch)):
            mems[i] = mem
    return [Candidate(layout=lay, memory=mem, capacity_bytes=capacity_bytes, host_capacity_bytes=host_capacity_bytes,
                      nvme_capacity_bytes=nvme_capacity_bytes)
            for lay, mem in zip(lays, mems) if mem is not None]


MAX_REJECTED = 10_000   # rejected layouts kept, with their reasons


def size_count(m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int, space: SearchSpace,
               capacity_bytes: int, pc: ParamCount, host_capacity_bytes: int | None = None,
               nvme_capacity_bytes: int | None = None,
               rejected: list[Rejected] | None = None) -> tuple[list[Candidate], Candidate | None]:
    """The valid layouts on ``n_gpus`` that fit (every one, in enumeration order) as
    candidates, and the one needing the least memory (the first of equals), or None when no
    layout is valid.

    The valid layouts are enumerated as arrays (planner.layouts.batch.valid_layouts, the
    rules table) and sized at once by the batched memory model (planner.memory.peak), for
    every set-up; RankMemory views are built only for the layouts that fit and the least.
    Up to MAX_REJECTED rejected layouts, with their reasons, are appended to ``rejected``."""
    from planner.layouts import batch as layout_batch
    from planner.memory.model import rank_memories
    from planner.memory.peak import memory_batch

    if rejected is not None and len(rejected) < MAX_REJECTED:
        rejected += [Rejected(layout=lay, reason=reason) for lay, reason in
                     layout_batch.rejected_layouts(m, setup, n_gpus, gpus_per_node, space,
                                                   MAX_REJECTED - len(rejected))]
    arrays = layout_batch.valid_layouts(m, setup, n_gpus, gpus_per_node, space)
    folded = list(enumerate_folded(m, setup, n_gpus, gpus_per_node, space))
    if folded:      # ep folded over tp x cp x dp where the options fix it so (layouts.layout.folded_shape)
        if rejected is not None:
            rejected += [Rejected(layout=lay, reason=why) for lay, why in folded if why is not None]
        arrays = layout_batch.LayoutArrays.concat([arrays, layout_batch.LayoutArrays.from_layouts(
            [lay for lay, why in folded if why is None])])
    if not len(arrays):
        return [], None
    batch = memory_batch(m, setup, arrays, pc, gpus_per_node)
    totals = batch.total
    least_i = int(totals.argmin())
    picked = sorted({least_i, *(int(i) for i in (totals <= capacity_bytes).nonzero()[0])})
    cands = [Candidate(layout=arrays.layout(i, setup.seq_len), memory=mem, capacity_bytes=capacity_bytes,
                       host_capacity_bytes=host_capacity_bytes, nvme_capacity_bytes=nvme_capacity_bytes)
             for i, mem in zip(picked, rank_memories(batch, picked))]
    return cands, cands[picked.index(least_i)]


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """The fitting candidates on the smallest GPU count that has one (best first), the
    least-memory candidate seen when none fits, and the rejected layouts with reasons."""

    n_gpus: int | None
    fitting: tuple[Candidate, ...]
    smallest: Candidate | None        # the least memory of any valid layout tried
    rejected: tuple[Rejected, ...]
    counts_tried: tuple[int, ...]


def search(m: ModelSpec, setup: TrainingSetup, capacity_bytes: int, gpus_per_node: int,
           counts: Iterable[int], space: SearchSpace = SearchSpace(),  # noqa: B008 (frozen: never mutated)
           timer: Callable[[Layout], StepTime] | None = None,
           host_capacity_bytes: int | None = None, nvme_capacity_bytes: int | None = None,
           progress: Callable[[int, int, int], None] | None = None,
           batch_timer: Callable[[Sequence[Layout]], Sequence[StepTime]] | None = None) -> SearchResult:
    """Walk the GPU counts in order and stop at the first that has a fitting layout.

    ``timer`` predicts the step time of a layout; it runs on the fitting layouts only,
    which are then ranked by it (rank_key). ``batch_timer``, where given, is used instead:
    it predicts the step times of all the fitting layouts of a count in one call (in their
    order; planner.timing.fast.step_times). ``host_capacity_bytes`` is a node's CPU
    memory (``nvme_capacity_bytes`` its NVMe): a layout whose offloaded states need more
    per node does not fit. ``progress(n_gpus, i, n_counts)`` is called before the i-th
    count (from 0) is searched, for a progress bar."""
    counts = list(counts)
    pc = count_params(m)
    smallest: Candidate | None = None
    rejected: list[Rejected] = []
    tried: list[int] = []
    floor_per_param = min_model_state_bytes_per_param(setup)
    for n in counts:
        if progress is not None:
            progress(n, len(tried), len(counts))
        tried.append(n)
        # Each parameter's states exist at least once across the n GPUs, so some rank
        # holds at least this much: counts below it need no enumeration.
        if floor_per_param * pc.total / n > capacity_bytes:
            continue
        cands, least = size_count(m, setup, n, gpus_per_node, space, capacity_bytes, pc,
                                  host_capacity_bytes, nvme_capacity_bytes, rejected)
        if least is not None and (smallest is None or least.memory.total < smallest.memory.total):
            smallest = least
        fitting = [c for c in cands if c.fits]
        if batch_timer is not None and fitting:
            times = batch_timer([c.layout for c in fitting])
            fitting = [replace(c, time=t) for c, t in zip(fitting, times, strict=True)]
        elif timer is not None:
            fitting = [replace(c, time=timer(c.layout)) for c in fitting]
        fitting.sort(key=rank_key)
        if fitting:
            return SearchResult(n_gpus=n, fitting=tuple(fitting), smallest=smallest,
                                rejected=tuple(rejected), counts_tried=tuple(tried))
    return SearchResult(n_gpus=None, fitting=(), smallest=smallest, rejected=tuple(rejected),
                        counts_tried=tuple(tried))
