"""The purchase ILP's records and the rules about them that need no solver (issue 32): when
a job's run ends in time (finishes_by) and holds its GPUs (busy_at, busy_checks), which runs
and pools no cheapest purchase needs (shorter_run_may_help, undominated, dominated_pools), the
fewest nodes that hold a set of choices (nodes_needed), the capacity rows that are not implied
by another (capacity_checks), a purchase found without the ILP (greedy_purchase), and the runs
that widen an ILP over a relaxation's (fewest_checks_runs).
planner.cost.solve builds and solves the ILP over them."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class Pool:
    """A GPU type one may buy nodes of, and what one node costs over the horizon."""

    gpu: str
    gpus_per_node: int
    capex_usd: float              # one node's purchase
    opex_usd: float               # one node's power over the horizon

    @property
    def node_usd(self) -> float:
        return self.capex_usd + self.opex_usd


@dataclass(frozen=True, kw_only=True, slots=True)
class JobWindow:
    """When a job may run: it starts at ``start_s`` and must end by ``deadline_s``."""

    name: str
    start_s: float
    deadline_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class JobOption:
    """One way to run a job: a layout on ``n_gpus`` GPUs of pool ``gpu``, taking ``duration_s``."""

    job: str
    gpu: str
    n_gpus: int
    duration_s: float
    key: str                      # ASCII, unique within the job
    memory_bytes: int = 0         # per rank; must be within capacity_bytes
    capacity_bytes: float = math.inf

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes


def finishes_by(start_s: float, duration_s: float, deadline_s: float) -> bool:
    """A run from ``start_s`` taking ``duration_s`` ends by ``deadline_s`` (the one test of a
    deadline in the purchase ILP: its options, its deadline rows and its greedy start)."""
    return start_s + duration_s <= deadline_s


def busy_at(start_s: Any, duration_s: Any, t: Any) -> Any:
    """A job started at ``start_s`` running ``duration_s`` holds its GPUs at time ``t``
    (floats, or numpy arrays that broadcast: elementwise)."""
    return (start_s <= t) & (t < start_s + duration_s)


def busy_checks(start_s: float, duration_s: float, starts_s: Sequence[float]) -> int:
    """How many of the capacity checks at ``starts_s`` (the distinct job starts, where
    solve_purchase checks the GPUs in use) a run from ``start_s`` taking ``duration_s``
    is busy at (busy_at). A shorter run of the same job is busy at a subset of them."""
    starts = sorted(starts_s)       # the checks from start_s on, before start_s + duration_s
    return bisect.bisect_left(starts, start_s + duration_s) - bisect.bisect_left(starts, start_s)


def shorter_run_may_help(start_s: float, duration_s: float, starts_s: Sequence[float]) -> bool:
    """Whether running a job (started at ``start_s``, taking ``duration_s`` on its option)
    shorter, on more GPUs of the same type, can ever lower the purchase: only when it is
    busy at another job's start (``starts_s``: the distinct job starts), so that a shorter
    run is busy at fewer capacity checks.

    solve_purchase checks the GPUs in use at the job starts only. A run of more GPUs of the
    same type busy at the same checks (busy_checks) as one of fewer, both meeting the
    deadline in memory, is dominated: every purchase that holds it holds the other, so no
    optimum needs it (issue 32: `plan buy` swept such counts for every job)."""
    starts = sorted(starts_s)       # a check after start_s, before start_s + duration_s
    return bisect.bisect_left(starts, start_s + duration_s) > bisect.bisect_right(starts, start_s)


def dominated_pools(pools: Sequence[Pool], jobs: Sequence[JobWindow],
                    by_job: dict[str, list[JobOption]]) -> set[str]:
    """The pools no cheapest purchase needs (issue 32, H5: Llama 3.1 70B runs as fast on h200
    as on h100 in the step-time model, on the same counts, and h200 nodes cost more, so the
    ILP carried a second copy of every h100 option and HiGHS branched on both).

    Pool B is dominated by pool A when both have the same GPUs per node, A's node costs no
    more (and, at an equal cost, A is listed first), and every option on B that a job can
    pick (it fits in memory and meets the deadline) has a counterpart on A that the job can
    pick, on no more GPUs and busy at no more capacity checks (busy_checks over the distinct
    job starts; both runs start at the job's start, so its checks are a subset). Moving every
    job on B to its counterpart on A then adds at most B's GPUs in use to A's at each check,
    so A needs at most its nodes plus B's (ceil(a + b) <= ceil(a) + ceil(b) per node size),
    at no more cost per node: no purchase gets dearer, and none that the budget allows is
    lost. A dominated pool is dominated by an undominated one (the relation is transitive
    and follows a strict order), and its options can be left out of the ILP (solve_purchase
    fixes them at 0, so the model and its size stay as written). None is left out where
    that would leave a job without options (the ILP then says it is infeasible, as before)."""
    starts = sorted({j.start_s for j in jobs})
    window = {j.name: j for j in jobs}

    def usable(o: JobOption) -> tuple[int, int] | None:
        j = window[o.job]
        if not o.fits or not finishes_by(j.start_s, o.duration_s, j.deadline_s):
            return None
        return o.n_gpus, busy_checks(j.start_s, o.duration_s, starts)

    runs: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for name, mine in by_job.items():
        for o in mine:
            r = usable(o)
            if r is not None:
                runs.setdefault((o.gpu, name), []).append(r)
    order = sorted(range(len(pools)), key=lambda i: (pools[i].node_usd, i))
    dropped: set[str] = set()
    for bi, b in enumerate(order):
        pb = pools[b]
        for a in order[:bi]:
            pa = pools[a]
            if pa.gpus_per_node != pb.gpus_per_node:
                continue
            if all(any(na <= nb and ca <= cb for na, ca in runs.get((pa.gpu, name), ()))
                   for name in by_job for nb, cb in runs.get((pb.gpu, name), ())):
                dropped.add(pb.gpu)
                break
    if any(all(o.gpu in dropped for o in mine) for mine in by_job.values()):
        return set()
    return dropped


def undominated(start_s: float, deadline_s: float, runs: Sequence[tuple[int, float]],
                starts_s: Sequence[float]) -> list[int]:
    """The indices of the runs (GPU count, duration), of one job on one GPU type, in
    increasing GPU count, that a cheapest purchase may need: each finishes sooner than every
    run on fewer GPUs (more GPUs for no less time is never better), and among those that
    meet the deadline each is busy at fewer capacity checks (busy_checks over ``starts_s``,
    the distinct job starts) than every one on fewer GPUs: a run on more GPUs busy at the
    same checks is dominated (shorter_run_may_help). Runs that miss the deadline can never
    be picked and are dropped, unless no run meets it (the ILP then says it is infeasible,
    its deadline row binding)."""
    kept: list[int] = []
    best_s, checks = math.inf, math.inf
    for i, (_, d) in enumerate(runs):
        if d >= best_s:
            continue
        best_s = d
        if finishes_by(start_s, d, deadline_s):
            busy = busy_checks(start_s, d, starts_s)
            if busy >= checks:
                continue
            checks = busy
        kept.append(i)
    in_time = [i for i in kept if finishes_by(start_s, runs[i][1], deadline_s)]
    return in_time or kept


def greedy_purchase(pools: Sequence[Pool], jobs: Sequence[JobWindow],
                     by_job: dict[str, list[JobOption]]) -> tuple[float, dict[str, JobOption]] | None:
    """A feasible purchase found without the ILP, or None: every job on one pool, each with
    its option of fewest GPU-seconds, or of fewest GPUs summed over the capacity checks it is
    busy at (busy_checks: what it adds to the ILP's rows), then fewest GPUs, among those that
    fit and meet the deadline, and the fewest nodes that hold them (nodes_needed); the
    cheapest of these. A heuristic (less area leaves more room at every instant on average,
    not at each), used only where the ILP was not solved to its end: its cost is an upper
    bound on the optimum. (GPU-seconds alone put 256 jobs of H5 on 256 b200s for 2.1 days,
    busy at 3 job starts each, 96 nodes; GPU-checks on 24 for 22.8 days, busy at 23, 69.)"""
    starts = sorted({j.start_s for j in jobs})

    def seconds(j: JobWindow, o: JobOption) -> tuple[float, ...]:
        return (o.n_gpus * o.duration_s, o.n_gpus)

    def checks(j: JobWindow, o: JobOption) -> tuple[float, ...]:
        return gpu_checks_key(j, o, starts)

    best: tuple[float, dict[str, JobOption]] | None = None
    for p in pools:
        for key in (seconds, checks):
            choices = {}
            for j in jobs:
                ok = [o for o in by_job[j.name]
                      if o.gpu == p.gpu and o.fits and finishes_by(j.start_s, o.duration_s, j.deadline_s)]
                if not ok:
                    break
                choices[j.name] = min(ok, key=lambda o, j=j: key(j, o))   # type: ignore[misc]
            else:
                need = nodes_needed(pools, jobs, choices)
                cost = sum(q.node_usd * need[q.gpu] for q in pools)
                if best is None or cost < best[0]:
                    best = (cost, choices)
    return best


def gpu_checks_key(job: JobWindow, option: JobOption, starts_s: Sequence[float]) -> tuple[float, float, int]:
    """The order in which the greedy start (greedy_purchase) and the ILP over a relaxation's runs
    (solve._relaxed_purchase) prefer a job's options: fewest GPUs summed over the capacity checks
    at ``starts_s`` (the distinct job starts) it is busy at (busy_checks: what it adds to the
    ILP's rows), then fewest GPU-seconds, then fewest GPUs."""
    o = option
    return (o.n_gpus * busy_checks(job.start_s, o.duration_s, starts_s), o.n_gpus * o.duration_s, o.n_gpus)


def fewest_checks_runs(jobs: Sequence[JobWindow], by_job: dict[str, list[JobOption]],
                       used: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The runs (job, option key) that widen the ILP over a relaxation's runs ``used``
    (solve._relaxed_purchase): for each job and each pool that the relaxation runs it on, its
    run of fewest GPUs over the capacity checks (gpu_checks_key) that fits and meets the
    deadline. Measured on 256 jobs of 8 models (bench/resources.py's buy256-mixed-batches): the
    relaxation's 587 runs alone gave $22.8M, with these (780 runs) $20.2M in 1.8 s of CPU, below
    the $20.7M that 20 s of the full ILP found."""
    starts = sorted({j.start_s for j in jobs})
    out = set()
    for j in jobs:
        for gpu in {o.gpu for o in by_job[j.name] if (j.name, o.key) in used}:
            ok = [o for o in by_job[j.name]
                  if o.gpu == gpu and o.fits and finishes_by(j.start_s, o.duration_s, j.deadline_s)]
            if ok:
                out.add((j.name, min(ok, key=lambda o, j=j: gpu_checks_key(j, o, starts)).key))  # type: ignore[misc]
    return out


def nodes_needed(pools: Sequence[Pool], jobs: Sequence[JobWindow], choices: dict[str, JobOption]) -> dict[str, int]:
    """The fewest nodes per pool that hold ``choices`` (the peak GPUs in use, at some job's start).
    busy_at's test, for every job start at once (busy_at over arrays; the GPU sums integers:
    the answer is the loop's; a per-start loop in Python took 0.6 s of the 16
    calls of `plan buy` of 256 jobs)."""
    out = {}
    at = np.array([t.start_s for t in jobs], dtype=np.float64)[:, None]     # one row per check
    chosen = [(j, choices[j.name]) for j in jobs]
    for p in pools:
        mine = [(j, o) for j, o in chosen if o.gpu == p.gpu]
        begin = np.array([j.start_s for j, _ in mine], dtype=np.float64)
        duration = np.array([o.duration_s for _, o in mine], dtype=np.float64)
        gpus = np.array([o.n_gpus for _, o in mine], dtype=np.int64)
        peak = int(np.where(busy_at(begin, duration, at), gpus, 0).sum(axis=1).max()) if mine else 0
        out[p.gpu] = math.ceil(peak / p.gpus_per_node)
    return out


def capacity_checks(jobs: Sequence[JobWindow], by_job: dict[str, list[JobOption]],
                     gpu: str) -> list[tuple[int, JobWindow, list[tuple[JobWindow, JobOption]]]]:
    """The GPU-capacity rows of solve_purchase for one pool: (index, job, options running at
    that job's start) for each job start whose running set is not contained in another's.
    A row over a subset of another row's options, with the same nonnegative coefficients
    and the same right-hand side, is implied by it, so dropping it leaves the feasible set
    (and the optimum) unchanged; so does dropping a repeated start. With 256 jobs this
    keeps a few dozen of the 256 rows per pool and the model builds several times faster."""
    rows = []
    runs = [(j, o) for j in jobs for o in by_job[j.name] if o.gpu == gpu]
    begin = np.array([j.start_s for j, _ in runs], dtype=np.float64)
    duration = np.array([o.duration_s for _, o in runs], dtype=np.float64)
    for ti, t in enumerate(jobs):
        at = np.flatnonzero(busy_at(begin, duration, t.start_s)).tolist()
        if at:      # the running set as indices into runs: one (job, option) each
            rows.append((ti, t, [runs[i] for i in at], frozenset(at)))
    kept: list[tuple[int, JobWindow, list[tuple[JobWindow, JobOption]], frozenset[int]]] = []
    for row in sorted(rows, key=lambda r: (-len(r[3]), r[0])):
        if not any(row[3] <= k[3] for k in kept):
            kept.append(row)
    return [(ti, t, busy) for ti, t, busy, _ in sorted(kept, key=lambda r: r[0])]
