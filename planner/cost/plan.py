"""What to rent for one job and what to buy for many: the candidates, their prices, the
integer programs (planner.cost.solve), and, when nothing satisfies the constraints, which one
binds and what would satisfy it.

One job (`plan --tokens`): for each GPU type and GPU count, the fastest layouts that fit
(planner.search.sweep: a slower layout on the same GPUs costs more and ends later, so it can
never be chosen) are priced at the catalog's rental rate, and the ILP picks the one that
minimises cost (or time) under the deadline, budget and GPU cap.

Cluster purchase (`plan buy`): for each job and GPU type, the fastest layout at each GPU
count (again, the others are dominated), keeping only counts that shorten the job; the
ILP sizes the nodes to buy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from planner.api import MAX_SEARCH_GPUS, PlanResult, capacity_bytes, host_capacities
from planner.cost.prices import Prices, gpu_hours, rental_cost_usd
from planner.cost.solve import (
    Limits,
    Option,
    SolverInfo,
    solve_one_job,
)
from planner.errors import UserError
from planner.fmt import days_or_hours as days
from planner.fmt import usd
from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import SearchSpace
from planner.models.spec import ModelSpec, count_params
from planner.search.search import Candidate, SearchResult, gpu_counts
from planner.search.sweep import Ask, CountBest, sweep, sweep_shared_counts
from planner.timing.degrees import table_setup
from planner.timing.model import (
    DEFAULT_EFFICIENCY,
    Cluster,
    Efficiency,
    cluster_for,
    scale_up_domain_gpus,
)
from planner.training.checks import precision_refusal
from planner.training.setup import TrainingSetup

DEFAULT_SPACE, DEFAULT_SETUP, NO_LIMITS = SearchSpace(), TrainingSetup(), Limits()
KEEP = 3          # fastest layouts kept per GPU type and count (the ILP needs only the first)


COARSE_NODES = 16   # above this many nodes the cost search tries powers of two only


def cost_counts(gpus_per_node: int, max_gpus: int) -> list[int]:
    """GPU counts the cost search tries: 1, 2 and 4 GPUs below a node, then 1, 2, 3, 4, 6,
    8, 12 and 16 nodes, then powers of two (32, 64, ... nodes), up to ``max_gpus``, and
    ``max_gpus`` itself when the plain search would try it (a whole number of nodes).

    Fewer counts than the plain search walks (every node count to 16, then 1.5x and 2x):
    the cost curve is flat to a few percent between neighbouring counts, and on large
    topologies a count with a factor of 3 (pp = 3 puts data-parallel rings at a stride of 3
    GPUs, which no smaller graph reproduces) costs minutes of max-flow for its bandwidths.
    --n-gpus tries any one count."""
    def coarse(c: int) -> bool:
        if c < gpus_per_node:
            return True
        nodes = c // gpus_per_node
        odd = nodes // 3 if nodes % 3 == 0 and nodes <= COARSE_NODES else nodes
        return odd & (odd - 1) == 0
    counts = gpu_counts(gpus_per_node, max_gpus)
    return [c for c in counts if coarse(c) or c == max_gpus]


@dataclass(frozen=True, kw_only=True, slots=True)
class PricedPlan:
    """A layout that fits, on one GPU type and count, with what training on the job's
    tokens takes: time, GPU-hours and rental cost (None without a price)."""

    gpu: GpuSpec
    candidate: Candidate
    train_time_s: float
    gpu_hours: float
    cost_usd: float | None

    @property
    def n_gpus(self) -> int:
        return self.candidate.n_gpus

    @property
    def key(self) -> str:
        return f"{self.gpu.name}_n{self.n_gpus}_{self.candidate.layout.key}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Diagnosis:
    """Why no plan satisfies the constraints: what each one asks for, and the way out."""

    binding: tuple[str, ...]                 # memory, max_gpus, deadline, budget
    fits_from_gpus: int | None = None
    deadline_needs_gpus: int | None = None
    budget_allows_gpus: int | None = None
    lines: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class CostPlanResult:
    """`plan --tokens`: the chosen plan (``result.best``), the fastest plan at every GPU
    type and count (``by_count``, one per pair, as the table shows them), the solver's
    report, and a diagnosis when nothing satisfies the constraints."""

    result: PlanResult                       # for the chosen GPU type (the first one when none)
    chosen: PricedPlan | None
    by_count: tuple[PricedPlan, ...]
    n_options: int
    objective: str
    tokens: float
    limits: Limits
    solver: SolverInfo
    prices: Prices
    gpus: tuple[GpuSpec, ...]
    diagnosis: Diagnosis | None = None
    search_s: float = 0.0
    left_out: tuple[tuple[str, str], ...] = ()    # (GPU, why) of --gpus left out of the cost answer
    cost_tolerance_rel: float = 0.0         # plans within this of the lowest cost count as cheapest
    lowest_cost: PricedPlan | None = None    # with a tolerance: the plan of lowest cost (fewest GPUs on a tie)
    global_batch_basis: str = ""             # where a global batch the user did not give came from
    topology_caps: tuple[tuple[str, str, int], ...] = ()   # (GPU, topology, GPUs) where a topology caps the count


def price_plan(gpu: GpuSpec, c: Candidate, tokens: float, prices: Prices) -> PricedPlan:
    assert c.time is not None
    t = c.time.train_time_s(tokens)
    rate = prices.for_gpu(gpu.name).rent_usd_per_gpu_hour
    return PricedPlan(gpu=gpu, candidate=c, train_time_s=t, gpu_hours=gpu_hours(c.n_gpus, t),
                      cost_usd=rental_cost_usd(c.n_gpus, t, rate) if rate is not None else None)


def _space_for(space: SearchSpace, gpu: GpuSpec, cluster: Cluster) -> SearchSpace:
    if space.max_tp is None:
        space = replace(space, max_tp=max(gpu.gpus_per_node, scale_up_domain_gpus(cluster)))
    return space


@dataclass
class SearchPool:
    """One GPU type's search for one model and set-up: its cluster, its space, and the
    fastest layouts per count found so far (swept on demand)."""

    m: ModelSpec
    gpu: GpuSpec
    setup: TrainingSetup
    space: SearchSpace
    cluster: Cluster
    eff: Efficiency
    keep: int
    found: dict[int, CountBest] = field(default_factory=dict)

    def at(self, counts: Sequence[int]) -> list[CountBest]:
        todo = [n for n in counts if n not in self.found]
        if todo:
            ask = self.ask()
            for cb in sweep(self.m, self.setup, self.cluster, todo, ask.capacity_bytes, self.space, self.eff,
                            keep=self.keep, host_capacity_bytes=ask.host_capacity_bytes,
                            nvme_capacity_bytes=ask.nvme_capacity_bytes):
                self.found[cb.n_gpus] = without_terms(cb)
        return [self.found[n] for n in counts]

    def ask(self) -> Ask:
        """What a sweep of this pool asks of a count (search.sweep.Ask)."""
        host, nvme = host_capacities(self.cluster)
        return Ask(setup=self.setup, cluster=self.cluster, capacity_bytes=capacity_bytes(self.gpu, self.setup),
                   eff=self.eff, keep=self.keep, host_capacity_bytes=host, nvme_capacity_bytes=nvme)


def sweep_together(pools: Sequence[SearchPool], n: int, ahead: Sequence[int] = ()) -> None:
    """Sweep count ``n`` of each of ``pools`` that has not swept it, keeping what they find:
    pools of one model, space and node size whose set-ups differ only in the global batch
    share one sizing and, per GPU type, one timing of the count (search.sweep.sweep_shared:
    `plan buy` of 256 jobs of Llama 3.1 8B, each its own global batch, swept 7,405 counts one
    pool at a time, issue 32). Objects other than SearchPools (tests' stand-ins) are left to
    their own ``at``. ``ahead``: counts such a group sweeps with ``n`` (in the same sizing and
    timing, search.sweep.sweep_shared_counts) where none of its pools has swept them."""
    groups: dict[tuple, list[SearchPool]] = {}
    for p in pools:
        if isinstance(p, SearchPool) and n not in p.found:
            groups.setdefault(_shared_key(p), []).append(p)
    for group in groups.values():
        if len(group) == 1:
            continue        # SearchPool.at keeps the sizing for another GPU type of its set-up
        group = list({id(p): p for p in group}.values())
        p0 = group[0]
        ns = [n] + [c for c in ahead if all(c not in p.found for p in group)]
        for c, cbs in zip(ns, sweep_shared_counts(p0.m, p0.space, ns, p0.gpu.gpus_per_node,
                                                  [p.ask() for p in group])):
            for p, cb in zip(group, cbs):
                p.found[c] = without_terms(cb)


def without_terms(cb: CountBest) -> CountBest:
    """``cb`` with each candidate's memory terms dropped: a term row holds the whole batch
    its count was sized in (memory.model.MemoryTerms), so keeping it kept every sweep's
    arrays alive (issue 32, H1: 16 jobs took 3.6 GB, 256 were killed at 22.5 GB). The ILP and
    the report read the breakdown; `plan explain` recomputes terms where they are absent
    (report.explain_memory)."""
    return replace(cb, fastest=tuple(replace(c, memory=replace(c.memory, terms=None)) for c in cb.fastest))


def sweep_all(tasks: list[tuple[SearchPool, list[int], float, float]]) -> None:
    """Sweep each task's counts (pool, counts, tokens, window) in order, keeping what they
    find in their pools, and stop a task after the first count whose fastest layout trains
    ``tokens`` within ``window_s`` (math.inf: no stop); sweep_counts_until's turns, so that
    GPU types of one node size share each count's sizing. (Worker processes, one per GPU
    type, were slower once the sweep timed each count's layouts as one batch: on the 2-core
    machine forking and sending the candidates back cost more than the sweeps;
    docs/performance.md.)"""
    sweep_counts_until([(pool, counts, in_time(tokens, window_s)) for pool, counts, tokens, window_s in tasks])


def in_time(tokens: float, window_s: float) -> Callable[[CountBest], bool]:
    """Whether a count's fastest layout trains ``tokens`` within ``window_s`` (math.inf: never
    done): sweep_all's stop."""
    return lambda cb: (window_s < math.inf and bool(cb.fastest)
                       and cb.fastest[0].time.train_time_s(tokens) <= window_s)  # type: ignore[union-attr]


def _sizing_key(pool: SearchPool) -> tuple:
    """What a count's sizing reads of a pool (search.sweep.sized_layouts)."""
    return (pool.m, pool.setup, pool.space, pool.gpu.gpus_per_node)


def _shared_key(pool: SearchPool) -> tuple:
    """What pools that sweep a count together share (search.sweep.sweep_shared): _sizing_key
    but for the global batch."""
    return (pool.m, table_setup(pool.setup), pool.space, pool.gpu.gpus_per_node)


Task = tuple[SearchPool, Sequence[int], Callable[[CountBest], bool]]


def sweep_counts_until(tasks: Sequence[Task], more: Sequence[Callable[[CountBest], bool]] | None = None) -> None:
    """Sweep each task's counts of its pool in increasing order, handing each count's
    CountBest to the task's ``done`` and stopping the task once it returns True. The tasks
    of pools of one model and set-up on one node size take turns count by count, so that
    GPU types of one node size share each count's sizing; a count no live task asks for is
    not swept. Such groups whose set-ups differ only in the global batch walk their counts
    side by side, each count swept for all of them at once (sweep_together), each group
    asking for the counts it would ask for alone.

    ``more`` (one per task): where a stopped task's pool will be asked for larger counts
    later (the last count's CountBest tells), it goes on with the counts its group sizes
    anyway for other live tasks, timing them on its GPU type while their sizing is at hand,
    for that later sweep to find (plan buy's second sweep: 71 of 391 sizings of the 256-job
    file were repeated for it, issue 32). Only what pools keep changes, not what a task sees."""
    shared: dict[tuple, dict[tuple, list[list]]] = {}
    for i, (pool, ns, done) in enumerate(tasks):
        shared.setdefault(_shared_key(pool), {}).setdefault(_sizing_key(pool), []).append(
            [pool, set(ns), done, True, more[i] if more else None])
    for groups in shared.values():
        walks = [_Walk(group) for group in groups.values()]
        order = sorted(set().union(*(w.asking for w in walks)))
        for at, n in enumerate(order):
            pools = [p for w in walks for p in w.pools_at(n)]
            if not pools:
                if not any(w.live for w in walks):
                    break
                continue
            sweep_together(pools, n, _ahead(walks, order[at + 1:], pools))
            for w in walks:
                w.step(n)


AHEAD_NODES = 2     # counts up to this many nodes are swept ahead together (_ahead says what it saved)


def _ahead(walks: Sequence[_Walk], later: Sequence[int], pools: list) -> list[int]:
    """The counts of up to AHEAD_NODES nodes after the one ``pools`` sweep now that the walks would
    sweep next with the same pools if no task stopped: swept with it (sweep_together's
    ``ahead``). A count swept ahead that a stopped task never asks for is kept and not used;
    what a task sees is the same. On so few GPUs a count's layouts are few and the models'
    fixed cost per call most of its cost (`plan buy` of 256 jobs: 281 of its 465 calls were
    at 1 to 16 GPUs, 2.9 to 11 ms each, issue 32); up to one node gave 0.2 s less of it, up
    to two 0.4 s."""
    gpus_per_node = next((p.gpu.gpus_per_node for p in pools if isinstance(p, SearchPool)), 0)
    out = []
    for c in later:
        if c > AHEAD_NODES * gpus_per_node or [p for w in walks for p in w.pools_at(c)] != pools:
            break
        out.append(c)
    return out


class _Walk:
    """One group's walk of sweep_counts_until (tasks of one model, set-up and node size):
    which pools it sweeps at each count, and its tasks' answers."""

    def __init__(self, group: list[list]) -> None:
        self.asking: dict[int, list[list]] = {}     # per count, the group's tasks that list it, in group order
        for t in group:
            for n in t[1]:
                self.asking.setdefault(n, []).append(t)
        # the tasks not stopped: once none is, no count is swept (a "more" task goes on only
        # beside a live one), and the larger counts are not walked
        self.live = len(group)

    def pools_at(self, n: int) -> list:
        """The pools the group sweeps at count ``n``: none when no task listing it is live."""
        ts = self.asking.get(n, ())
        if not self.live or not any(t[3] is True for t in ts):
            return []
        return [t[0] for t in ts if t[3] is True or t[3] == "more"]

    def step(self, n: int) -> None:
        """Count ``n`` for each of the group's tasks, in group order (its pools have swept it)."""
        ts = self.asking.get(n, ())
        if not self.live or not any(t[3] is True for t in ts):
            return
        for t in ts:
            if t[3] is True:
                (cb,) = t[0].at([n])
                if t[2](cb):
                    t[3] = "more" if t[4] is not None and t[4](cb) else False
                    self.live -= 1
            elif t[3] == "more":
                t[0].at([n])


def search_pools(m: ModelSpec, gpus: Sequence[GpuSpec], setup: TrainingSetup, space: SearchSpace,
           topology: str | None, eff: Efficiency, keep: int) -> list[SearchPool]:
    if topology is not None and len(gpus) > 1:
        raise UserError("--topology describes one cluster; with several --gpus types each runs on its own "
                        "default topology (drop --topology, or give one GPU type)")
    out = []
    for gpu in gpus:
        refusal = precision_refusal(gpu, setup.precision)      # the CLI's one rule (training.checks)
        if refusal is not None:
            raise UserError(f"{refusal}, or drop {gpu.name} from --gpus")
        cluster = cluster_for(gpu, topology)
        out.append(SearchPool(m=m, gpu=gpu, setup=setup, space=_space_for(space, gpu, cluster), cluster=cluster,
                         eff=eff, keep=keep))
    return out


def covered_gpus(cluster: Cluster, max_gpus: int) -> int:
    """The largest GPU count a sweep on ``cluster`` tries: ``max_gpus``, or fewer where the
    cluster's topology describes fewer GPUs (a plan never runs past its topology, issue 19)."""
    if cluster.topology is None:
        return max_gpus
    from planner.hardware.topology import max_covered_gpus
    return min(max_gpus, max_covered_gpus(cluster.topology))


def plan_cost(m: ModelSpec, gpus: Sequence[GpuSpec], setup: TrainingSetup, tokens: float, prices: Prices,
              space: SearchSpace = DEFAULT_SPACE, objective: str = "cost", limits: Limits = NO_LIMITS,
              n_gpus: int | None = None, topology: str | None = None, efficiency: Efficiency = DEFAULT_EFFICIENCY,
              solver: str = "auto") -> CostPlanResult:
    """The plan that minimises the cost (or time) of training ``m`` on ``tokens`` tokens, over
    GPU types ``gpus`` and the GPU counts of cost_counts() up to limits.max_gpus (or
    ``n_gpus`` alone), under the deadline and budget of ``limits``."""
    from planner.training.checks import tokens_refusal

    t0 = time.perf_counter()
    why = tokens_refusal(setup, tokens)
    if why is not None:
        raise UserError(why)
    left_out: list[tuple[str, str]] = []
    if objective == "cost" or limits.budget_usd is not None:
        # a GPU without a rental rate has no cost: left out of the answer, and said so; with
        # none priced, a UserError naming the missing price, before any search
        priced = [g for g in gpus if prices.for_gpu(g.name).rent_usd_per_gpu_hour is not None]
        if not priced:
            prices.rent(gpus[0].name)
        left_out = [(g.name, "no rental price (give rent_usd_per_gpu_hour in --prices FILE, or --objective time)")
                    for g in gpus if g not in priced]
        gpus = priced
    max_gpus = limits.max_gpus or MAX_SEARCH_GPUS
    if n_gpus is not None and n_gpus > max_gpus:
        raise UserError(f"--n-gpus {n_gpus} exceeds --max-gpus {max_gpus}")
    pools = search_pools(m, gpus, setup, space, topology, efficiency, KEEP)
    plans: list[PricedPlan] = []
    counts = {pool.gpu.name: [n_gpus] if n_gpus is not None
              else cost_counts(pool.gpu.gpus_per_node, covered_gpus(pool.cluster, max_gpus))
              for pool in pools}
    sweep_all([(pool, counts[pool.gpu.name], tokens, math.inf) for pool in pools])
    for pool in pools:
        for cb in pool.at(counts[pool.gpu.name]):
            # a layout with a link of no bandwidth (a GPU whose PCIe switch has no NIC and no
            # NVLink peer in its ring: rings.py) never finishes a step: it cannot be priced
            plans += [price_plan(pool.gpu, c, tokens, prices) for c in cb.fastest
                      if c.time is not None and c.time.tokens_per_s > 0]
    options = [Option(key=p.key, gpu=p.gpu.name, n_gpus=p.n_gpus, cost_usd=p.cost_usd or 0.0,
                      time_s=p.train_time_s, memory_bytes=p.candidate.memory.total,
                      capacity_bytes=p.candidate.capacity_bytes) for p in plans]
    tolerance = cost_tolerance(objective, limits)
    sol = solve_one_job(options, objective, replace(limits, max_gpus=max_gpus), solver,
                        cost_tolerance_rel=tolerance)
    search_s = time.perf_counter() - t0
    chosen = next((p for p in plans if sol.choice is not None and p.key == sol.choice.key), None)
    by_count = _fastest_per_count(plans, chosen)
    diagnosis = None
    if chosen is None:
        diagnosis = _diagnose(plans, pools, limits, max_gpus, n_gpus, tokens, prices)
    gpu = chosen.gpu if chosen is not None else gpus[0]
    result = _plan_result(m, gpu, setup, chosen, plans, pools, efficiency, tokens, diagnosis)
    return CostPlanResult(result=result, chosen=chosen, by_count=by_count, n_options=len(options),
                          objective=objective, tokens=tokens, limits=replace(limits, max_gpus=max_gpus),
                          solver=sol.solver, prices=prices, gpus=tuple(gpus), diagnosis=diagnosis,
                          search_s=search_s, left_out=tuple(left_out), cost_tolerance_rel=tolerance,
                          topology_caps=tuple((p.gpu.name, p.cluster.topology.name, covered_gpus(p.cluster, max_gpus))
                                              for p in pools if n_gpus is None and p.cluster.topology is not None
                                              and covered_gpus(p.cluster, max_gpus) < max_gpus),
                          lowest_cost=_lowest_cost(plans, max_gpus) if tolerance and chosen is not None else None)


def _lowest_cost(plans: Sequence[PricedPlan], max_gpus: int) -> PricedPlan | None:
    """The plan of lowest cost within the GPU cap, the fewest GPUs and then the shortest time
    on a tie (what the answer would be without the cost tolerance)."""
    within = [p for p in plans if p.n_gpus <= max_gpus and p.cost_usd is not None]
    return min(within, key=lambda p: (p.cost_usd, p.n_gpus, p.train_time_s), default=None)


def cost_tolerance(objective: str, limits: Limits) -> float:
    """How far above the lowest cost a plan still counts as cheapest: the model's noise
    (timing.intervals.cost_noise_rel) for a cost plan without a deadline, so that of plans
    the model cannot tell apart on cost the fastest is taken (issue 33: costs along the GPU
    count are flat within a few percent, and the fewest GPUs took 471 days); 0 otherwise
    (with a deadline, the cheapest plan that meets it, at equal cost the fewest GPUs)."""
    if objective != "cost" or limits.deadline_s is not None:
        return 0.0
    from planner.timing.intervals import cost_noise_rel

    return cost_noise_rel()


def _fastest_per_count(plans: Sequence[PricedPlan], chosen: PricedPlan | None = None) -> tuple[PricedPlan, ...]:
    """The fastest plan per GPU type and count; on a tie in time, the chosen one, so that
    the table of counts always shows the plan the ILP picked."""
    best: dict[tuple[str, int], PricedPlan] = {}
    for p in plans:
        k = (p.gpu.name, p.n_gpus)
        if k not in best or p.train_time_s < best[k].train_time_s or (
                p is chosen and p.train_time_s <= best[k].train_time_s):
            best[k] = p
    return tuple(sorted(best.values(), key=lambda p: (p.gpu.name, p.n_gpus)))


def _plan_result(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, chosen: PricedPlan | None,
                 plans: Sequence[PricedPlan], pools: Sequence[SearchPool], eff: Efficiency, tokens: float,
                 diagnosis: Diagnosis | None) -> PlanResult:
    """A PlanResult (what the plain plan reports and --out writes) for the chosen plan: the
    other fastest layouts on its GPU type and count are its alternatives."""
    pool = next(p for p in pools if p.gpu.name == gpu.name)
    cap = capacity_bytes(gpu, setup)
    host, nvme = host_capacities(pool.cluster)
    if chosen is None:
        res = SearchResult(n_gpus=None, fitting=(), smallest=None, rejected=(), counts_tried=tuple(sorted(pool.found)))
        return PlanResult(model=m, params=count_params(m), gpu=gpu, setup=setup, best=None, alternatives=(),
                          result=res, capacity_bytes=cap, cluster=pool.cluster, efficiency=eff, tokens=tokens,
                          fits_from_gpus=diagnosis.fits_from_gpus if diagnosis else None,
                          host_capacity_bytes=host, nvme_capacity_bytes=nvme)
    same = [p.candidate for p in plans if p.gpu.name == gpu.name and p.n_gpus == chosen.n_gpus]
    alts = tuple(c for c in same if c is not chosen.candidate)
    res = SearchResult(n_gpus=chosen.n_gpus, fitting=tuple(same), smallest=None, rejected=(),
                       counts_tried=tuple(sorted(pool.found)))
    return PlanResult(model=m, params=count_params(m), gpu=gpu, setup=setup, best=chosen.candidate,
                      alternatives=alts, result=res, capacity_bytes=cap, cluster=pool.cluster, efficiency=eff,
                      tokens=tokens, host_capacity_bytes=host, nvme_capacity_bytes=nvme)


# ---------------------------------------------------------------------- diagnosis

def _diagnose(plans: list[PricedPlan], pools: Sequence[SearchPool], limits: Limits, max_gpus: int,
              n_gpus: int | None, tokens: float, prices: Prices) -> Diagnosis:
    """What each constraint asks for on its own, searching past --max-gpus when needed."""
    deadline, budget = limits.deadline_s, limits.budget_usd
    reach = max(max_gpus, MAX_SEARCH_GPUS)     # the largest count searched: --max-gpus past the default

    def beyond(wanted: Callable[[PricedPlan], bool]) -> list[PricedPlan]:
        """Per GPU type, the fastest plan at the smallest count above the cap (up to
        MAX_SEARCH_GPUS) that is ``wanted``, counts swept in increasing order."""
        out = []
        for pool in pools:
            start = n_gpus if n_gpus is not None else max_gpus
            for n in (c for c in cost_counts(pool.gpu.gpus_per_node, MAX_SEARCH_GPUS) if c > start):
                (cb,) = pool.at([n])
                found = [price_plan(pool.gpu, c, tokens, prices) for c in cb.fastest[:1]]
                if found and wanted(found[0]):
                    out += found
                    break
        return out

    cap_name = f"--n-gpus {n_gpus}" if n_gpus is not None else f"--max-gpus {max_gpus}"
    lines: list[str] = []
    binding: list[str] = []
    if not plans:
        more = beyond(lambda p: True)
        fits_from = min((p.n_gpus for p in more), default=None)
        binding = ["memory"] + (["max_gpus"] if fits_from is not None else [])
        if fits_from is None:
            lines.append(f"No layout fits in memory on any GPU count up to {reach} "
                         f"({', '.join(p.gpu.name for p in pools)}): try a GPU with more memory, a shorter "
                         f"sequence or a smaller model.")
        else:
            lines.append(f"No layout fits in memory within {cap_name}; it fits from {fits_from} GPUs: "
                         f"raise {cap_name.split()[0]}.")
        return Diagnosis(binding=tuple(binding), fits_from_gpus=fits_from, lines=tuple(lines))

    fits_from = min(p.n_gpus for p in plans)
    facts = [f"it fits from {fits_from} GPUs"]
    in_time = [p for p in plans if deadline is None or p.train_time_s <= deadline]
    in_budget = [p for p in plans if budget is None or (p.cost_usd or 0.0) <= budget]
    needs = allows = None
    if deadline is not None:
        if in_time:
            needs = min(p.n_gpus for p in in_time)
            facts.append(f"the deadline ({days(deadline)}) needs {needs}")
        else:
            more = beyond(lambda p: p.train_time_s <= deadline)
            if more:
                needs = min(p.n_gpus for p in more)
                binding += ["deadline", "max_gpus"]
                facts.append(f"the deadline ({days(deadline)}) needs {needs}, more than {cap_name}")
            else:
                fastest = min(plans, key=lambda p: p.train_time_s)
                binding.append("deadline")
                facts.append(f"the deadline ({days(deadline)}) cannot be met on up to "
                             f"{reach} GPUs (the fastest plan within {cap_name} takes "
                             f"{days(fastest.train_time_s)} on {fastest.n_gpus} x {fastest.gpu.name})")
    if budget is not None:
        if in_budget:
            allows = max(p.n_gpus for p in in_budget)
            facts.append(f"the budget ({usd(budget)}) allows up to {allows}")
        else:
            cheapest = min(plans, key=lambda p: p.cost_usd or 0.0)
            binding.append("budget")
            facts.append(f"the budget ({usd(budget)}) is below the cheapest plan "
                         f"({usd(cheapest.cost_usd or 0.0)}, {cheapest.n_gpus} x {cheapest.gpu.name})")
    lines.append("No plan meets every constraint: " + "; ".join(facts) + ".")
    advice = []
    if deadline is not None and budget is not None and in_time and in_budget:
        binding += ["deadline", "budget"]
        cheapest_in_time = min(in_time, key=lambda p: p.cost_usd or 0.0)
        fastest_in_budget = min(in_budget, key=lambda p: p.train_time_s)
        advice.append(f"raise --budget to {usd(cheapest_in_time.cost_usd or 0.0)} (the cheapest plan that meets the "
                      f"deadline: {cheapest_in_time.n_gpus} x {cheapest_in_time.gpu.name}), or move the deadline to "
                      f"{days(fastest_in_budget.train_time_s)} (the fastest plan within budget: "
                      f"{fastest_in_budget.n_gpus} x {fastest_in_budget.gpu.name})")
    if "max_gpus" in binding and needs is not None:
        advice.append(f"raise {cap_name.split()[0]} to {needs} or move the deadline")
    elif "deadline" in binding and not in_time:
        advice.append("move the deadline, train on fewer tokens, or add a faster GPU type to --gpus")
    if "budget" in binding and not in_budget:
        cheapest = min(plans, key=lambda p: p.cost_usd or 0.0)
        advice.append(f"raise --budget to at least {usd(cheapest.cost_usd or 0.0)}, train on fewer tokens, "
                      f"or add a cheaper GPU type to --gpus")
    if advice:
        lines.append("To satisfy them: " + "; ".join(advice) + ".")
    return Diagnosis(binding=tuple(dict.fromkeys(binding)), fits_from_gpus=fits_from, deadline_needs_gpus=needs,
                     budget_allows_gpus=allows, lines=tuple(lines))
