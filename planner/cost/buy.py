"""What to buy for many jobs (`plan buy`): for each job and GPU type, the fastest layout at
each GPU count (the others are dominated), keeping only counts that shorten the job past
another job's start (solve.undominated); the ILP
(planner.cost.solve) sizes the nodes to buy, and when nothing satisfies the constraints says
which one binds. The candidates come from the one-job search of planner.cost.plan."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.api import MAX_SEARCH_GPUS
from planner.cost.jobs import job_setup
from planner.cost.plan import (
    DEFAULT_SETUP,
    SearchPool,
    cost_counts,
    covered_gpus,
    in_time,
    search_pools,
    sweep_counts_until,
)
from planner.cost.prices import Prices, node_cost
from planner.cost.solve import (
    JobOption,
    JobWindow,
    Pool,
    PurchaseSolution,
    SolverInfo,
    nodes_needed,
    shorter_run_may_help,
    solve_purchase,
    undominated,
)
from planner.errors import UserError
from planner.fmt import days_or_hours as days
from planner.fmt import usd
from planner.hardware.gpus import GpuSpec, get_gpu
from planner.layouts.layout import SearchSpace
from planner.models.spec import ModelSpec, load_model
from planner.search.search import Candidate
from planner.search.sweep import CountBest
from planner.timing.model import DEFAULT_EFFICIENCY, Efficiency, cluster_for
from planner.training.checks import precision_refusal
from planner.training.setup import TrainingSetup


@dataclass(frozen=True, kw_only=True, slots=True)
class JobPlan:
    """How one job runs on the cluster bought."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    candidate: Candidate
    start_s: float
    finish_s: float
    deadline_s: float
    tokens: float
    batch_given: bool = True        # False: the jobs file gave no global_batch (training.batch chose it)

    @property
    def n_gpus(self) -> int:
        return self.candidate.n_gpus


@dataclass(frozen=True, kw_only=True, slots=True)
class BuyResult:
    """`plan buy`: nodes to buy per GPU type, what they cost, how each job runs."""

    path: str
    start_date: str
    horizon_s: float
    pools: tuple[Pool, ...]
    nodes: dict[str, int]
    capex_usd: float
    opex_usd: float
    plans: tuple[JobPlan, ...]
    solver: SolverInfo
    n_options: int
    budget_usd: float | None
    prices: Prices
    lines: tuple[str, ...] = ()              # why nothing satisfies the constraints, when so
    search_s: float = 0.0
    left_out: tuple[tuple[str, str], ...] = ()    # (GPU, why) of --gpus left out of the purchase

    @property
    def feasible(self) -> bool:
        return bool(self.plans)

    @property
    def tco_usd(self) -> float:
        return self.capex_usd + self.opex_usd


def plan_purchase(jobs_file, gpu_names: Sequence[str], prices: Prices, horizon_s: float,
                  budget_usd: float | None = None, max_gpus: int = MAX_SEARCH_GPUS,
                  base_setup: TrainingSetup = DEFAULT_SETUP, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                  solver: str = "auto") -> BuyResult:
    """The cheapest nodes to buy (purchase plus power over ``horizon_s``) on which every job
    of ``jobs_file`` (planner.cost.jobs) finishes by its deadline.

    Candidates per job and GPU type, on cost_counts() in increasing order: first up to the
    smallest count that meets the deadline; then, with C0 the cost of giving every job its
    own nodes at that count on its cheapest type (a purchase that always works), on to every
    count whose nodes alone cost no more than C0 (or the budget): no optimal purchase holds
    a job on more; that sweep stops once the job's fastest run has no other job's start
    inside it (solve.shorter_run_may_help). Of those, a count is kept as an option when
    solve.undominated keeps it: it finishes sooner than every smaller one (fewer GPUs for
    less time is never worse), it is busy at fewer job starts than every smaller one that
    meets the deadline, and it meets the deadline where some count does (issue 32)."""
    t0 = time.perf_counter()
    jobs = jobs_file.jobs
    gpus = [get_gpu(g) for g in gpu_names]
    if len({g.name for g in gpus}) != len(gpus):
        raise UserError("--gpus names a GPU type twice")
    late = [j for j in jobs if j.deadline_s > horizon_s]
    if late:
        raise UserError(f"job {late[0].name!r} ends after the horizon ({days(horizon_s)} from "
                        f"{jobs_file.start.date().isoformat()}); lengthen --horizon to at least "
                        f"{math.ceil(late[0].deadline_s / 86400)}d")
    # a GPU type without a node price or power cannot be bought: left out, and said so; with
    # none priced, the UserError naming the missing figures
    priced = [g for g in gpus if prices.for_gpu(g.name).node_purchase_usd is not None
              and prices.for_gpu(g.name).node_power_kw is not None]
    if not priced:
        prices.node(gpus[0].name)
    left_out = tuple((g.name, "no node price or power (give node_purchase_usd, node_power_kw in --prices FILE)")
                     for g in gpus if g not in priced)
    no_bf16 = [g for g in gpus if precision_refusal(g, base_setup.precision) is not None]
    left_out += tuple((g.name, "no bf16 support (plan buy trains in bf16 mixed precision)") for g in no_bf16)
    gpus = [g for g in priced if g not in no_bf16]
    if not gpus:       # issue 32, U2: the advice named --precision, which plan buy does not have
        raise UserError(f"no GPU of --gpus can train the jobs: {'; '.join(f'{n}: {why}' for n, why in left_out)}")
    pools = []
    for g in gpus:
        nc = node_cost(g.name, horizon_s, prices)
        pools.append(Pool(gpu=g.name, gpus_per_node=g.gpus_per_node, capex_usd=nc.capex_usd, opex_usd=nc.opex_usd))
    pool_of = {p.gpu: p for p in pools}
    by_name = {name: load_model(name) for name in dict.fromkeys(j.model for j in jobs)}    # each model once
    models = {j.name: by_name[j.model] for j in jobs}
    setups = {j.name: job_setup(j, base_setup, models[j.name]) for j in jobs}    # once: search() asks ~15x a job
    searches: dict[tuple, SearchPool] = {}

    def search(job, gpu: GpuSpec) -> SearchPool:
        setup = setups[job.name]
        key = (models[job.name], setup, gpu.name)
        if key not in searches:
            m = models[job.name]
            space = SearchSpace() if m.is_moe else SearchSpace(ep=1)
            searches[key] = search_pools(m, [gpu], setup, space, None, efficiency, 1)[0]
        return searches[key]

    counts = {g.name: cost_counts(g.gpus_per_node, covered_gpus(cluster_for(g), max_gpus)) for g in gpus}
    seen: dict[tuple[str, str], list[tuple[int, Candidate]]] = {}
    first_ok: dict[tuple[str, str], int] = {}
    starts = sorted({j.start_s for j in jobs})     # where solve_purchase checks the GPUs in use

    def continued(job: Any) -> Callable[[CountBest], bool]:
        """Whether the second sweep goes on past this first count in time (_until_dominated)."""
        return lambda cb: shorter_run_may_help(job.start_s, cb.fastest[0].time.train_time_s(job.tokens),  # type: ignore[union-attr]
                                               starts)
    pairs = [(job, g) for job in jobs for g in gpus]
    sweep_counts_until([(search(job, g), counts[g.name], in_time(job.tokens, job.deadline_s - job.start_s))
                        for job, g in pairs], [continued(job) for job, _ in pairs])
    for job in jobs:                                        # phase 1: up to the first count in time
        window = job.deadline_s - job.start_s
        for g in gpus:
            rows = seen.setdefault((job.name, g.name), [])
            for n in counts[g.name]:
                (cb,) = search(job, g).at([n])
                if cb.fastest:
                    rows.append((n, cb.fastest[0]))
                    if cb.fastest[0].time.train_time_s(job.tokens) <= window:  # type: ignore[union-attr]
                        first_ok[job.name, g.name] = n
                        break
    lines: list[str] = []
    for job in jobs:
        if not any((job.name, g.name) in first_ok for g in gpus):
            slowest = [(g, n, c) for g in gpus for n, c in seen[job.name, g.name]]
            if not slowest:
                # memory or the layout rules (a global batch no data-parallel size divides): the
                # sweep does not tell them apart (a count its memory bound rules out is never laid out)
                lines.append(f"job {job.name!r}: no layout fits in memory or can run on up to {max_gpus} GPUs of "
                             f"{', '.join(g.name for g in gpus)}; `{_job_plan_command(job, gpus[0].name)}` "
                             "says why")
            else:
                g, n, c = min(slowest, key=lambda r: r[2].time.train_time_s(job.tokens))  # type: ignore[union-attr]
                # every count was swept (none in time): where the largest counts of every GPU type ran no
                # layout, more GPUs would not either (a global batch 250 of a QLoRA job splits over 2 GPUs)
                top = max(n for n, _ in seen[job.name, g.name])
                stuck = all(max((k for k, _ in seen[job.name, t.name]), default=0) < counts[t.name][-1] for t in gpus)
                way = (f"no plan exists on more than {top} x {g.name} (the global batch {c.layout.global_batch} "
                       "and the model's degrees split no further): move the deadline or give a larger global_batch"
                       if stuck else "move the deadline, raise --max-gpus or add a faster GPU type")
                lines.append(f"job {job.name!r} cannot meet its deadline: it has {days(job.deadline_s - job.start_s)}, "
                             f"the fastest plan on up to {max_gpus} GPUs takes "
                             f"{days(c.time.train_time_s(job.tokens))} ({n} x {g.name}); {way}")  # type: ignore[union-attr]
    if not lines:
        c0 = sum(min(math.ceil(first_ok[j.name, g.name] / g.gpus_per_node) * pool_of[g.name].node_usd
                     for g in gpus if (j.name, g.name) in first_ok) for j in jobs)
        # the nodes the first counts in time need at their peak over the horizon: a purchase
        # that works too, often far below c0 when jobs follow one another (issue 32, H1/H5:
        # with c0, 256 staggered jobs swept every count of every search)
        c0 = min(c0, _first_counts_usd(jobs, gpus, first_ok, seen, pools, pool_of))
        limit = min(c0, budget_usd) if budget_usd is not None else c0
        # phase 2: the counts an optimum may use, each (job, GPU type) swept from its first
        # count in time until a shorter run can no longer help (solve.shorter_run_may_help)
        tasks = []
        for job in jobs:
            for g in gpus:
                if (job.name, g.name) in first_ok:
                    ns = [n for n in counts[g.name] if n > first_ok[job.name, g.name]
                          and math.ceil(n / g.gpus_per_node) * pool_of[g.name].node_usd <= limit]
                    rows = seen[job.name, g.name]
                    done = _until_dominated(job, rows, first_ok[job.name, g.name], starts)
                    if ns and not done(None):
                        tasks.append((search(job, g), ns, done))
        sweep_counts_until(tasks)
    options: list[JobOption] = []
    by_key: dict[tuple[str, str], tuple[GpuSpec, Candidate]] = {}
    for job in jobs:
        for g in gpus:
            runs = sorted(((n, c, c.time.train_time_s(job.tokens))  # type: ignore[union-attr]
                           for n, c in seen.get((job.name, g.name), [])), key=lambda r: r[0])
            for i in undominated(job.start_s, job.deadline_s, [(n, d) for n, _, d in runs], starts):
                n, c, d = runs[i]
                key = f"{g.name}_n{n}"
                options.append(JobOption(job=job.name, gpu=g.name, n_gpus=n, duration_s=d, key=key,
                                         memory_bytes=c.memory.total, capacity_bytes=c.capacity_bytes))
                by_key[job.name, key] = (g, c)
    windows = [JobWindow(name=j.name, start_s=j.start_s, deadline_s=j.deadline_s) for j in jobs]
    sol: PurchaseSolution = solve_purchase(pools, windows, options, budget_usd, solver)
    plans = []
    if sol.choices:
        for job in jobs:
            o = sol.choices[job.name]
            g, c = by_key[job.name, o.key]
            plans.append(JobPlan(name=job.name, model=models[job.name], gpu=g, candidate=c, start_s=job.start_s,
                                 finish_s=job.start_s + o.duration_s, deadline_s=job.deadline_s, tokens=job.tokens,
                                 batch_given=job.global_batch is not None))
    elif not lines:
        lines.append(_buy_diagnosis(pools, windows, options, budget_usd, solver))
    capex = sum(pool_of[g].capex_usd * n for g, n in sol.nodes.items())
    opex = sum(pool_of[g].opex_usd * n for g, n in sol.nodes.items())
    return BuyResult(path=jobs_file.path, start_date=jobs_file.start.date().isoformat(), horizon_s=horizon_s,
                     pools=tuple(pools), nodes=sol.nodes, capex_usd=capex, opex_usd=opex, plans=tuple(plans),
                     solver=sol.solver, n_options=len(options), budget_usd=budget_usd, prices=prices,
                     lines=tuple(lines), search_s=time.perf_counter() - t0, left_out=left_out)


def _job_plan_command(job: Any, gpu_name: str) -> str:
    """The `plan` command that plans ``job`` alone on ``gpu_name`` (its model, method, sequence
    length and global batch, the options a jobs file sets), shell-quoted."""
    import shlex

    words = ["plan", "--model", job.model, "--gpus", gpu_name, "--method", job.method, "--seq-len", str(job.seq_len)]
    if job.global_batch is not None:
        words += ["--global-batch", str(job.global_batch)]
    if job.lora_targets:
        words += ["--lora-targets", ",".join(job.lora_targets)]
    return shlex.join(words)


def _until_dominated(job: Any, rows: list[tuple[int, Candidate]], first_ok: int,
                     starts_s: Sequence[float]) -> Callable[[CountBest | None], bool]:
    """The stop of a job's phase-2 sweep on one GPU type: ``done(cb)`` records the count's
    fastest layout in ``rows`` and says whether larger counts are all dominated, i.e. the
    fastest run so far (from the first count in time, ``first_ok``, on) leaves no other
    job's start inside it (solve.shorter_run_may_help). ``done(None)`` asks before any count."""
    best_s = [next(c for n, c in rows if n == first_ok).time.train_time_s(job.tokens)]  # type: ignore[union-attr]

    def done(cb: CountBest | None) -> bool:
        if cb is not None and cb.fastest:
            rows.append((cb.n_gpus, cb.fastest[0]))
            best_s[0] = min(best_s[0], cb.fastest[0].time.train_time_s(job.tokens))  # type: ignore[union-attr]
        return not shorter_run_may_help(job.start_s, best_s[0], starts_s)
    return done


def _first_counts_usd(jobs: Sequence[Any], gpus: Sequence[GpuSpec], first_ok: dict[tuple[str, str], int],
                      seen: dict[tuple[str, str], list[tuple[int, Candidate]]], pools: Sequence[Pool],
                      pool_of: dict[str, Pool]) -> float:
    """The cost of a purchase on which every job runs from its start on its first count in
    time, on the GPU type where those nodes cost least: the peak nodes per type in use at
    some job's start (solve.nodes_needed). Every job meets its deadline on it, so it bounds
    the optimum from above, and no optimal purchase holds a job on nodes that alone cost more."""
    choices = {}
    for job in jobs:
        g = min((g for g in gpus if (job.name, g.name) in first_ok),
                key=lambda g: math.ceil(first_ok[job.name, g.name] / g.gpus_per_node) * pool_of[g.name].node_usd)
        n = first_ok[job.name, g.name]
        c = next(c for m, c in seen[job.name, g.name] if m == n)
        choices[job.name] = JobOption(job=job.name, gpu=g.name, n_gpus=n, key=f"{g.name}_n{n}",
                                      duration_s=c.time.train_time_s(job.tokens))  # type: ignore[union-attr]
    windows = [JobWindow(name=j.name, start_s=j.start_s, deadline_s=j.deadline_s) for j in jobs]
    need = nodes_needed(pools, windows, choices)
    return sum(p.node_usd * need[p.gpu] for p in pools)


def _buy_diagnosis(pools: Sequence[Pool], windows: Sequence[JobWindow], options: Sequence[JobOption],
                   budget_usd: float | None, solver: str) -> str:
    """Every job can meet its deadline, so the purchase is infeasible only by the budget:
    say what the cheapest purchase costs."""
    if budget_usd is None:
        return "no purchase lets every job meet its deadline"
    free = solve_purchase(pools, windows, options, None, solver)
    if free.cost_usd is None:
        return "no purchase lets every job meet its deadline"
    return (f"the budget ({usd(budget_usd)}) is below the cheapest purchase that meets every deadline "
            f"({usd(free.cost_usd)}): raise --budget to {usd(free.cost_usd)} or move deadlines")
