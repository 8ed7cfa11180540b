"""The fastest few fitting layouts at every GPU count, for the cost and time objectives.

search() stops at the smallest GPU count that fits. A plan that minimises cost or time
needs every count, and on one count it needs only the fastest layouts: on the same GPU
type and count, a slower layout costs more (GPU-hours = GPUs x time) and finishes later,
so it can never be the cheapest nor the fastest plan under any deadline, budget or cap.
sweep() keeps the ``keep`` fastest per count and proves that the rest are slower without
timing them: it visits layout shapes in order of a lower bound on their step time
(timing.step_time_floor_s, from one block's compute) and stops when the bound reaches
the ``keep``-th fastest step time found. Shapes are (tp, cp, ep, pp, vp, sp,
micro-batch, recompute); the bound does not depend on the sharding, so the shardings of a
shape are only built, checked (layouts.reject_reason) and sized (memory) when its bound
is low enough.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from planner.hardware.placement import AxisLink, link_ceilings
from planner.layouts.layout import (
    Layout,
    SearchSpace,
    degree_shapes,
    grad_accum_for,
    reject_reason,
    shardings_of,
)
from planner.memory.model import (
    StateFloor,
    held_activation_floor_bytes,
    min_model_state_bytes_per_param,
    model_state_floors,
    overhead_floor_bytes,
)
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.search.search import Candidate, evaluate, rank_key
from planner.timing.model import (
    PLACEMENT_ORDERS,
    Cluster,
    DpFloorTerm,
    Efficiency,
    LayerTime,
    _kernels,
    _layer_key,
    axis_links,
    dp_floor_s,
    dp_floor_terms,
    layer_time,
    micro_batch_floor_s,
    micro_batch_max_s,
    step_time_floor_s,
    step_times,
)
from planner.training.setup import TrainingSetup


@dataclass(frozen=True, kw_only=True, slots=True)
class CountBest:
    """The fastest fitting layouts on one GPU count (fastest first; empty: none fits)."""

    n_gpus: int
    fastest: tuple[Candidate, ...]
    n_shapes: int = 0        # layout shapes (every sharding left out) whose batch divides
    n_timed: int = 0         # layouts timed
    n_sized: int = 0         # layouts whose memory was computed (fast enough to be kept)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Shape:
    floor_s: float       # the pipeline part of the step-time floor, on the link ceilings
    lay: Layout          # zero_stage 0, sharding "zero": a stand-in for every sharding
    block: LayerTime


class _Group:
    """What the shapes with the same degrees (tp, cp, ep, dp, pp) share: their shardings,
    their link ceilings and placements, and the data-parallel floor terms on each. The
    costly parts are worked out on the first visit of one of its shapes."""

    def __init__(self, m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster,
                 shardings: list[tuple[str, int]], gpus_per_node: int) -> None:
        self.lay = lay
        self.shardings = _group_shardings(m, setup, lay, shardings, gpus_per_node)
        sizes = (lay.tp, lay.cp, lay.ep, lay.dp, lay.pp)
        self.ceilings = [link_ceilings(cluster, sizes, tuple(o)) for o in PLACEMENT_ORDERS]
        self.prepared = False
        self.state_floors: dict[tuple[str, int], StateFloor] = {}
        self.dp_ceiling: list[DpFloorTerm] = []
        self.pareto: list[tuple[float, float]] = []
        self.placements: list[dict[str, AxisLink]] | None = None
        self.dp_exact: list[DpFloorTerm] = []

    def prepare(self, m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, pc: ParamCount,
                capacity_bytes: int) -> None:
        """Drop the shardings whose model states alone exceed the GPU (for every shape of
        the group), and bound the data-parallel part of the step on the link ceilings.
        With every collective hidden a bound is a + ga b (per step, per micro-batch), so
        only the (a, b) on the lower-left frontier can be the least."""
        if self.prepared:
            return
        self.prepared = True
        gpn = cluster.gpu.gpus_per_node
        floors = dict(zip(self.shardings, model_state_floors(
            m, setup, [replace(self.lay, sharding=sh, zero_stage=st) for sh, st in self.shardings], pc, gpn)))
        self.shardings = [k for k in self.shardings if overhead_floor_bytes(setup, self.lay, floors[k].at_step)
                          <= capacity_bytes]
        self.state_floors = {k: floors[k] for k in self.shardings}
        self.dp_ceiling = dp_floor_terms(m, setup, self.lay, self.ceilings, cluster.gpu, eff, pc, self.shardings)
        k = eff.overlap_slowdown if eff.overlap_slowdown <= 1 else 1.0
        pairs = sorted((t.optimizer_s + k * sum(c for c, _, _, per_mb in t.comms if not per_mb),
                        k * sum(c for c, _, _, per_mb in t.comms if per_mb)) for t in self.dp_ceiling)
        for a, b in pairs:
            if not self.pareto or b < self.pareto[-1][1]:
                self.pareto.append((a, b))

    def dp_loose_s(self, grad_accum: int) -> float:
        return min((a + grad_accum * b for a, b in self.pareto), default=0.0)

    def exact(self, m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, pc: ParamCount) -> None:
        if self.placements is None:
            lay = self.lay
            sizes = (lay.tp, lay.cp, lay.ep, lay.dp, lay.pp)
            self.placements = [axis_links(cluster, sizes, tuple(o)) for o in PLACEMENT_ORDERS]
            self.dp_exact = dp_floor_terms(m, setup, lay, self.placements, cluster.gpu, eff, pc, self.shardings)


def _pipeline_floor_s(m: ModelSpec, setup: TrainingSetup, lay: Layout, lt: LayerTime,
                      placements: list[dict[str, AxisLink]], eff: Efficiency) -> float:
    return step_time_floor_s(lay, micro_batch_floor_s(m, setup, lay, lt, placements, eff))


def _shapes(m: ModelSpec, setup: TrainingSetup, n: int, gpus_per_node: int, space: SearchSpace,
            cluster: Cluster, eff: Efficiency, blocks: dict[tuple, LayerTime]) -> list[tuple[_Shape, _Group]]:
    """The shapes enumerate_layouts() visits on ``n`` GPUs (same loops, same degree caps)
    with the pipeline part of their step-time floor on the link ceilings, lowest first.
    Left out: shapes whose micro-batch does not divide the batch, and shapes whose degrees
    no sharding can run with (layouts.reject_reason rejects every layout of theirs)."""
    out = []
    shardings = shardings_of(space)
    for tp, cp, ep, pp, dp in degree_shapes(m, n, gpus_per_node, space):
        group: _Group | None = None
        sps = [space.sp] if space.sp is not None else [tp > 1]
        vps = [space.vp] if space.vp is not None else ([1, 2] if pp > 1 else [1])
        for vp in vps:
            for sp in sps:
                for mb in space.micro_batches:
                    ga = grad_accum_for(setup, mb, dp, ep)
                    if ga is None:
                        continue
                    for rc in space.recomputes:
                        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sp=sp, vp=vp, micro_batch=mb,
                                     grad_accum=ga, seq_len=setup.seq_len, recompute=rc)
                        if group is None:
                            group = _Group(m, setup, lay, cluster, shardings, gpus_per_node)
                        if not group.shardings:
                            continue
                        key = (tp, sp, cp, ep, mb, rc, pp > 1)
                        lt = blocks.get(key)
                        if lt is None:
                            lt = blocks[key] = layer_time(m, setup, _layer_key(lay), _kernels(setup, lay),
                                                          cluster.gpu, eff)
                        floor = _pipeline_floor_s(m, setup, lay, lt, group.ceilings, eff)
                        out.append((_Shape(floor_s=floor, lay=lay, block=lt), group))
    out.sort(key=lambda t: t[0].floor_s)
    return out


def _group_shardings(m: ModelSpec, setup: TrainingSetup, lay: Layout, shardings: list[tuple[str, int]],
                     gpus_per_node: int) -> list[tuple[str, int]]:
    """The shardings that can run with ``lay``'s degrees (``lay`` has a micro-batch that
    divides the batch). Apart from the interleaved schedule's rule on the micro-batch
    count, the rules of layouts.reject_reason read only the degrees, the sharding and the
    set-up, so with vp = 1 what ``lay`` rules out, every shape with its degrees rules out;
    with vp > 1 a sharding is only ruled out when another one runs."""
    ok = [(sh, st) for sh, st in shardings
          if reject_reason(m, setup, replace(lay, sharding=sh, zero_stage=st), gpus_per_node) is None]
    return ok if ok or lay.vp == 1 else shardings


def sweep(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, counts: Iterable[int], capacity_bytes: int,
          space: SearchSpace = SearchSpace(), eff: Efficiency = Efficiency(), keep: int = 3,
          host_capacity_bytes: int | None = None, nvme_capacity_bytes: int | None = None) -> list[CountBest]:
    """For each GPU count, the ``keep`` fastest layouts that fit (step times on ``cluster``).

    Exact: every layout left out is proved slower than the ``keep``-th one kept (by a
    floor on its step time, or its step time) or proved not to fit (by a floor on its
    memory, or its memory). Counts on which the model states alone cannot fit are
    skipped, as in search()."""
    pc = count_params(m)
    gpn = cluster.gpu.gpus_per_node
    floor_per_param = min_model_state_bytes_per_param(setup)
    blocks: dict[tuple, LayerTime] = {}
    acts: dict[tuple, int] = {}
    out = []
    for n in counts:
        if floor_per_param * pc.total / n > capacity_bytes:
            out.append(CountBest(n_gpus=n, fastest=()))
            continue
        shapes = _shapes(m, setup, n, gpn, space, cluster, eff, blocks)
        best: list[Candidate] = []
        sized = timed = 0

        def bar() -> float:
            return best[keep - 1].time.step_time_s if len(best) >= keep else math.inf  # type: ignore[union-attr]

        for sh, group in shapes:
            if sh.floor_s > bar():
                break
            lay, lt = sh.lay, sh.block
            act_key = (lay.tp, lay.sp, lay.cp, lay.micro_batch, lay.recompute, lay.pp, lay.vp,
                       min(lay.grad_accum, lay.pp))
            held = acts.get(act_key)
            if held is None:
                held = acts[act_key] = held_activation_floor_bytes(m, setup, lay)
            if overhead_floor_bytes(setup, lay, held) > capacity_bytes:
                continue
            group.prepare(m, setup, cluster, eff, pc, capacity_bytes)
            if not group.shardings or sh.floor_s + group.dp_loose_s(lay.grad_accum) > bar():
                continue
            windows = micro_batch_max_s(m, setup, lay, lt, eff, cluster.gpu)
            if group.placements is None:
                if sh.floor_s + dp_floor_s(group.dp_ceiling, lay.grad_accum, *windows, eff) > bar():
                    continue
                group.exact(m, setup, cluster, eff, pc)
            exact_floor = (_pipeline_floor_s(m, setup, lay, lt, group.placements, eff)  # type: ignore[arg-type]
                           + dp_floor_s(group.dp_exact, lay.grad_accum, *windows, eff))
            if exact_floor > bar():
                continue
            lays = [replace(lay, zero_stage=st, sharding=sh_) for sh_, st in group.shardings
                    if overhead_floor_bytes(setup, lay, group.state_floors[sh_, st].tracked_floor_bytes(lay, held))
                    <= capacity_bytes]
            lays = [one for one in lays if reject_reason(m, setup, one, gpn) is None]
            times = step_times(m, setup, lays, cluster, eff, pc)
            timed += len(lays)
            fast = [(one, t) for one, t in zip(lays, times) if t.step_time_s <= bar()]
            sized += len(fast)
            cands = evaluate(m, setup, [one for one, _ in fast], capacity_bytes, pc, gpn,
                             host_capacity_bytes, nvme_capacity_bytes)
            for c, (_, t) in zip(cands, fast):
                if c.fits:
                    c = replace(c, time=t)
                    keys = [rank_key(b) for b in best]
                    best.insert(bisect.bisect(keys, rank_key(c)), c)
                    del best[keep:]
        out.append(CountBest(n_gpus=n, fastest=tuple(best), n_shapes=len(shapes), n_sized=sized, n_timed=timed))
    return out
