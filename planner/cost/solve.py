"""The integer programs, in PuLP (the only module that imports it): which plan to rent for
one job, and which nodes to buy for a set of jobs.

Both are solved by HiGHS when highspy is installed, else by the CBC that ships with PuLP,
always under a time limit and a relative gap. What a solver says is reported as it is:
``status`` (PuLP's LpStatus, or "Solution Found" where a solver stopped at its limit with an
answer it did not prove: LpStatus then still reads "Optimal") and ``optimal``, true only when
the solver proved the optimum within the gap (PuLP's sol_status).

Inputs and outputs are small frozen records, so tests can build random instances and
check the optimum against brute force (tests/test_solve.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import pulp

from planner.cost.purchase import JobOption as JobOption
from planner.cost.purchase import JobWindow as JobWindow
from planner.cost.purchase import Pool as Pool
from planner.cost.purchase import busy_at as busy_at
from planner.cost.purchase import busy_checks as busy_checks
from planner.cost.purchase import capacity_checks, dominated_pools, fewest_checks_runs, finishes_by, greedy_purchase
from planner.cost.purchase import nodes_needed as nodes_needed
from planner.cost.purchase import shorter_run_may_help as shorter_run_may_help
from planner.cost.purchase import undominated as undominated
from planner.cost.quiet import STOPPED_BY, cpu_time_interrupt, solver_output_silenced
from planner.errors import UserError

SOLVERS = ("auto", "highs", "cbc")
# Backstops only: HiGHS stops at its node limit (purchase_node_limit) first on bench/resources.py's
# files, so the answer does not depend on the load (issue 32, H5: 32 70B jobs stopped at a 20 s
# wall-clock limit, and their answer moved with the load). TIME_LIMIT_S: seconds of the process's
# CPU (quiet.cpu_time_interrupt; CBC: its timeMode cpu); the costliest full ILP measured takes ~6 s.
# WALL_LIMIT_S (HiGHS's time_limit; at least 6 x TIME_LIMIT_S) fires first only where the process
# gets under a sixth of a core. Either firing is said (SolverInfo.stopped_by).
TIME_LIMIT_S = 20.0
WALL_LIMIT_S = 120.0
GAP_REL = 1e-6
# HiGHS's branch-and-bound stops after this many nodes (mip_max_nodes: counted, so deterministic),
# on one thread (threads=1: another count of workers takes another path). Measured on the purchase
# ILPs of bench/resources.py (docs/performance.md, "The purchase ILP (H5)"): the 256-job file is
# proved optimal after 70 nodes (0.6 s of CPU); H5 (32 Llama 3.1 70B jobs a day apart) answers
# 54 x b200 with its bound at 95.3% of it after 1,000 nodes (3.6 s), as 20 s of search did (96.0%);
# 24 such jobs: the optimum (48 x b200), 2.7% gap, 2.8 s; their proof needs ~2,200 nodes (5.2 s).
MIP_MAX_NODES = 1000
# HiGHS's options for the purchase ILP beside its defaults (HiGHS 1.16; solve_purchase): no RENS
# sub-MIP (its neighbourhood fixes the columns the LP relaxation leaves integral, and this LP
# splits most jobs over several options, so each RENS sub-MIP is nearly the whole problem again,
# and it rarely pays: on the 256-job file three sub-MIPs took 0.5 s of the 1.8 s) and no restart
# of the root after reduced-cost fixing (the 256-job file's restart fixed 1.7% of the columns
# and then separated its cuts a second time: 4,776 LP iterations of cuts, 2,001 without it).
# Both only change the search's path: a proved optimum is the optimum, and the node limit and
# one thread keep one answer per input. Measured on 15 purchases captured from `plan buy`, on
# solve_purchase's model, against HiGHS's defaults (CPU in HiGHS): none slower (the 256-job file
# 2.1 -> 0.65 s, H5 5.4 -> 3.9 s), the same purchases, and H5's bound after its 1,000 nodes at
# 95.3% of the answer against 95.4% (the finish-time deadline rows with the defaults: 95.2%).
PURCHASE_HIGHS_OPTIONS: dict[str, object] = {"mip_heuristic_run_rens": False, "mip_allow_restart": False}
# The relaxation with integer nodes (_node_integral_relaxation): no RINS (with three integers its
# sub-MIPs are nearly the whole LP: 256 jobs of 8 models 1.44 -> 1.20 s of CPU, the same bound and
# runs used); PURCHASE_HIGHS_OPTIONS slow it (256 8B jobs: 1.56 s against 0.91 s).
RELAXATION_HIGHS_OPTIONS: dict[str, object] = {"mip_heuristic_run_rins": False}
# A purchase ILP with more nonzeros than H5's (5,086: 32 jobs, 521 options) gets fewer nodes than
# MIP_MAX_NODES: nodes x nonzeros**2 stays at H5's, to no fewer than MIN_PURCHASE_NODES
# (purchase_node_limit; a simplex iteration costs about the nonzeros, and a node's iterations grow
# with the model too). Measured (HiGHS 1.16, one thread, 2 cores; the first k jobs of the files of
# bench/resources.py): H5's 1,000 nodes take 3.9 s of CPU; with nodes x nonzeros held instead,
# 64 and 96 jobs of the 8-model file (9,770 and 15,113 nonzeros) took 5.8 s (520 nodes) and 13.3 s
# (336 nodes; 28 s of wall time at a load of 8); with nonzeros**2, 4.7 s (270) and 7.5 s (113).
# The floor: the sparse ILPs of the 16-model file and of its 256 distinct searches need up to 134
# nodes to prove their optimum (the latter cut to 248 jobs, 16,934 nonzeros: 0.8 s in all), and a
# dense one (25-30 nonzeros a row) under FULL_ILP_WORK has under 10,000 nonzeros: 260 nodes or more.
REFERENCE_NONZEROS = 5086
MIN_PURCHASE_NODES = 200
# A purchase ILP above LARGE_VARIABLES variables is not branched on as a whole (full_ilp_first,
# _relaxed_purchase): its root node alone (cuts, sub-MIPs) ran past the 20 s time limit (256 8B
# jobs of distinct batches, 4,516 variables; 256 jobs of 8 models, 4,666), and HiGHS has no option
# that counts the root's work (highs.dev, "Options"). Nor one whose nonzeros x their mean per row
# (nonzeros**2 / rows) pass FULL_ILP_WORK: ILPs of equal size differ tenfold in a node's LP work,
# and dense rows (many jobs' runs in each capacity check) make the costly ones. Measured (as above;
# nonzeros / rows, that measure, the full ILP's CPU): H5 5,086 / 156, 166k, 3.9 s; the 16-model
# file 16,714 / 1,280, 218k, proved in 0.7 s; its distinct searches 17,274 / 1,280, 233k, proved
# in 0.9 s; 64 8B jobs 8,268 / 318, 215k, 5.3 s; 48 of the 8-model file 7,100 / 240, 210k, 4.3 s.
# Past it: 96 8B jobs 338k, 5.5 s; 64, 96, 128 of the 8-model file 298k, 476k, 654k: 4.7, 7.5,
# 5.9 s (50-60 ms a node; the 128 reached the 20 s time limit before).
LARGE_VARIABLES = 4000
FULL_ILP_WORK = 260_000


@dataclass(frozen=True, kw_only=True, slots=True)
class SolverInfo:
    """What the solver did: its name, PuLP's status, and whether optimality was proved."""

    name: str
    status: str
    optimal: bool
    solve_s: float
    n_variables: int
    n_constraints: int
    time_limit_s: float
    gap_rel: float
    constraint_names: tuple[str, ...] = ()
    max_nodes: int | None = None    # HiGHS's work limit (branch-and-bound nodes); None: none (CBC)
    # unproved: (answer - the solver's best lower bound) / answer, HiGHS's relative MIP gap (the
    # optimum costs at least 1 - gap_found of the answer); None when unknown or proved
    gap_found: float | None = None
    # a time limit that ended a solve (quiet.STOPPED_BY): the answer may depend on the machine
    stopped_by: str | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name, "status": self.status, "optimal": self.optimal, "solve_s": self.solve_s,
            "n_variables": self.n_variables, "n_constraints": self.n_constraints,
            "time_limit_s": self.time_limit_s, "gap_rel": self.gap_rel}
        if self.gap_found is not None:
            out["gap_found"] = self.gap_found
        if self.stopped_by is not None:
            out["stopped_by"] = self.stopped_by
        elif self.gap_found is not None and self.max_nodes is not None:     # stopped at it with an answer
            out["max_nodes"] = self.max_nodes
        return out


class _HiGHS(pulp.HiGHS):
    """PuLP's HiGHS, reading a stop at the node or CPU-time limit as one at its time limit (PuLP
    3.3 raises KeyError on kSolutionLimit, and reads kInterrupt as a solution found even where
    there is none): the best solution found, if any, without a proof of optimality."""

    def findSolutionValues(self, lp: pulp.LpProblem) -> tuple[int, int]:
        model = lp.solverModel
        if model.getModelStatus().name not in ("kSolutionLimit", "kInterrupt"):
            return super().findSolutionValues(lp)
        lp.solverModel = _StoppedByLimit(model)
        try:
            return super().findSolutionValues(lp)
        finally:
            lp.solverModel = model


class _StoppedByLimit:
    """A highspy model that reports its stop at a node or CPU-time limit as one at an
    iteration limit (_HiGHS)."""

    def __init__(self, model: object) -> None:
        self._model = model

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)

    def getModelStatus(self) -> object:
        status = self._model.getModelStatus()  # type: ignore[attr-defined]
        return type(status).kIterationLimit


def _solver(name: str, time_limit_s: float, gap_rel: float, max_nodes: int | None = None,
            mip: bool = True, highs_options: dict[str, object] | None = None) -> tuple[str, pulp.LpSolver]:
    """The solver and its name: HiGHS on one thread with a node limit (``max_nodes``, None:
    MIP_MAX_NODES), one answer per input at any load, with ``time_limit_s`` of CPU from now
    (quiet.cpu_time_interrupt) and WALL_LIMIT_S of wall time as backstops; CBC (PuLP's, one
    thread) under its CPU-time limit. ``mip`` False: the LP relaxation; ``highs_options``: HiGHS's
    beside those."""
    if name not in SOLVERS:
        raise UserError(f"--solver {name!r}: choose one of {', '.join(SOLVERS)}")
    if name in ("auto", "highs"):
        highs = _HiGHS(mip=mip, msg=False, timeLimit=WALL_LIMIT_S, gapRel=gap_rel, threads=1,
                       callbackTuple=(cpu_time_interrupt(time_limit_s), None),
                       callbacksToActivate=[pulp.HiGHS.hscb.HighsCallbackType.kCallbackMipInterrupt],
                       mip_max_nodes=MIP_MAX_NODES if max_nodes is None else max_nodes, **(highs_options or {}))
        if highs.available():
            return "HiGHS", highs
        if name == "highs":
            raise UserError("--solver highs needs highspy: pip install highspy (or use --solver cbc)")
    with warnings.catch_warnings():     # PuLP 3.3 deprecates its bundled CBC for 4.0; it still ships
        warnings.simplefilter("ignore", DeprecationWarning)
        return "CBC", pulp.PULP_CBC_CMD(mip=mip, msg=False, timeLimit=time_limit_s, gapRel=gap_rel, timeMode="cpu")


def _run(prob: pulp.LpProblem, solver: str, time_limit_s: float, gap_rel: float,
         max_nodes: int | None = None, mip: bool = True, highs_options: dict[str, object] | None = None) -> SolverInfo:
    name, s = _solver(solver, time_limit_s, gap_rel, max_nodes, mip, highs_options)
    t0 = time.perf_counter()
    with solver_output_silenced():
        prob.solve(s)
    names = _constraint_names(prob)
    stop = getattr(getattr(prob, "solverModel", None), "getModelStatus", None) if name == "HiGHS" else None
    return SolverInfo(name=name, status=_status(prob),
                      optimal=prob.sol_status == pulp.LpSolutionOptimal, solve_s=time.perf_counter() - t0,
                      n_variables=len(prob.variables()), n_constraints=len(names),
                      time_limit_s=time_limit_s, gap_rel=gap_rel, constraint_names=names,
                      max_nodes=(MIP_MAX_NODES if max_nodes is None else max_nodes) if name == "HiGHS" else None,
                      stopped_by=STOPPED_BY.get(stop().name) if stop is not None else None)


def _status(prob: pulp.LpProblem) -> str:
    """What the solver says of its answer: PuLP's LpStatus, except where a solver stopped at a
    time or node limit with a solution it did not prove optimal, for which LpStatus still reads
    "Optimal": then PuLP's own name of the solution's status (LpSolution, "Solution Found")."""
    if prob.status == pulp.LpStatusOptimal and prob.sol_status != pulp.LpSolutionOptimal:
        return str(pulp.LpSolution[prob.sol_status])
    return str(pulp.LpStatus[prob.status])


def _dual_bound(prob: pulp.LpProblem) -> float | None:
    """The solver's best lower bound on a minimisation after it stopped (HiGHS's mip_dual_bound,
    from the highspy model PuLP keeps as prob.solverModel); None where not exposed (CBC)."""
    model = getattr(prob, "solverModel", None)
    try:
        bound = float(model.getInfo().mip_dual_bound)  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        return None
    return bound if math.isfinite(bound) else None


def _constraint_names(prob: pulp.LpProblem) -> tuple[str, ...]:
    """PuLP 3.3 returns the constraints from prob.constraints() (a mapping before, deprecated)."""
    cons = prob.constraints
    if callable(cons):
        return tuple(c.name for c in cons())
    return tuple(cons)


def _nonzeros(prob: pulp.LpProblem) -> int:
    """The terms in the constraints of ``prob`` (PuLP 3.3 returns them from prob.constraints())."""
    cons = prob.constraints
    return sum(len(c) for c in (cons() if callable(cons) else cons.values()))


def _variable(prob: pulp.LpProblem, name: str, cat: str, low: float | None = None) -> pulp.LpVariable:
    """A variable of ``prob``: PuLP 3.3 creates them through the problem (LpVariable(...)
    is deprecated for 4.0); older PuLP only has LpVariable."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, lowBound=low, cat=cat)
    return pulp.LpVariable(name, lowBound=low, cat=cat)


def _no_model(solver: str, time_limit_s: float, gap_rel: float) -> SolverInfo:
    """For an instance infeasible before any model: a job with no candidate at all."""
    name, _ = _solver(solver, time_limit_s, gap_rel)
    return SolverInfo(name=name, status="Infeasible", optimal=False, solve_s=0.0, n_variables=0, n_constraints=0,
                      time_limit_s=time_limit_s, gap_rel=gap_rel)


def _found(prob: pulp.LpProblem) -> bool:
    """A solution is there to read (optimal, or feasible when a limit stopped the search)."""
    return prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)


@functools.lru_cache(maxsize=4096)     # a purchase names each job and option key in several rows
def ascii_name(text: str) -> str:
    """A name PuLP and the LP file format accept: letters, digits and underscores."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)[:60] or "_"


# ---------------------------------------------------------------------- one job

@dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    """One candidate plan of one job: a layout on ``n_gpus`` GPUs of type ``gpu`` that fits
    in memory, with its cost and its time to train."""

    key: str                  # ASCII, unique among the options
    gpu: str
    n_gpus: int
    cost_usd: float
    time_s: float
    memory_bytes: int = 0     # per rank; with capacity_bytes, the model's memory constraint
    capacity_bytes: float = math.inf

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """The user's constraints; None: no such constraint."""

    deadline_s: float | None = None
    budget_usd: float | None = None
    max_gpus: int | None = None


# What breaks a tie on the objective, in order (solve_one_job). Options within TIE_REL of the
# optimum tie: under the sustained-rate ceiling costs differ by float rounding only (~1e-15).
# "listed": the option given first (plan_cost lists each count's layouts in the search's rank
# order, search.rank_key), so that a full tie has one answer whatever the solver.
TIE_BREAKS: dict[str, tuple[str, ...]] = {"cost": ("n_gpus", "time", "listed"),
                                          "time": ("cost", "n_gpus", "listed")}
TIE_REL = 1e-9
# Costs within half a cent tie too: the answer prints dollars to the cent, so a plan that is
# cheaper only below that is not cheaper to the user (issue 32, W10: 4 GPUs were picked over 2 at
# "$0" each)
COST_TIE_USD = 0.005

# With a cost tolerance (solve_one_job's cost_tolerance_rel > 0: a cost plan without a
# deadline), every option within it of the lowest cost is as cheap as the model can tell,
# and the fastest of them is taken, then the fewest GPUs.
NEAR_COST_TIE_BREAKS = ("time", "n_gpus", "listed")


@dataclass(frozen=True, kw_only=True, slots=True)
class OneJobSolution:
    choice: Option | None           # None: no option satisfies the constraints (or none was found)
    solver: SolverInfo


def solve_one_job(options: Sequence[Option], objective: str = "cost", limits: Limits = Limits(),
                  solver: str = "auto", time_limit_s: float = TIME_LIMIT_S,
                  gap_rel: float = GAP_REL, cost_tolerance_rel: float = 0.0) -> OneJobSolution:
    """The cheapest (``objective`` "cost") or fastest ("time") option within the limits.

    One binary per option; exactly one is picked; the deadline, budget and GPU cap are each
    a named constraint on the picked option's time, cost and GPUs, and so is memory: no
    option whose rank memory exceeds its GPU's capacity (``fits_memory_<gpu>``; the
    planner passes only options that fit, so there it constrains nothing). Ties are broken
    lexicographically, each later solve fixing the earlier measures at their optimum: a cost
    plan at equal cost takes the fewest GPUs, then the shortest time (once every count runs at
    the GPU's sustained-rate ceiling, cost no longer depends on the count, and the smallest
    count that meets the deadline asks the least of a cluster); a time plan at equal time the
    lowest cost, then the fewest GPUs; a full tie the option listed first. With
    ``cost_tolerance_rel`` > 0 (a cost plan), every option within that fraction of the lowest
    cost counts as cheapest, and the fastest of them is taken (NEAR_COST_TIE_BREAKS).
    """
    if objective not in ("cost", "time"):
        raise UserError(f"--objective {objective!r}: choose cost or time")

    near = objective == "cost" and cost_tolerance_rel > 0
    order = (objective, *(NEAR_COST_TIE_BREAKS if near else TIE_BREAKS[objective]))

    listed = {o.key: float(i) for i, o in enumerate(options)}

    def value(o: Option, what: str) -> float:
        return {"cost": o.cost_usd, "time": o.time_s, "n_gpus": float(o.n_gpus), "listed": listed[o.key]}[what]

    def build(fixed: Sequence[float]) -> tuple[pulp.LpProblem, dict[str, pulp.LpVariable]]:
        """The problem minimising order[len(fixed)], with order[i] held at fixed[i] before it."""
        prob = pulp.LpProblem("one_job_" + objective, pulp.LpMinimize)
        pick = {o.key: _variable(prob, f"pick_{ascii_name(o.key)}", pulp.LpBinary) for o in options}
        goal = order[len(fixed)]
        prob += pulp.lpSum(value(o, goal) * pick[o.key] for o in options), f"total_{goal}"
        prob += pulp.lpSum(pick.values()) == 1, "exactly_one_plan"
        if limits.deadline_s is not None:
            prob += pulp.lpSum(o.time_s * pick[o.key] for o in options) <= limits.deadline_s, "deadline_s"
        if limits.budget_usd is not None:
            prob += pulp.lpSum(o.cost_usd * pick[o.key] for o in options) <= limits.budget_usd, "budget_usd"
        if limits.max_gpus is not None:
            prob += pulp.lpSum(o.n_gpus * pick[o.key] for o in options) <= limits.max_gpus, "max_gpus"
        for gpu in sorted({o.gpu for o in options if not o.fits}):
            prob += pulp.lpSum(pick[o.key] for o in options if o.gpu == gpu and not o.fits) == 0, \
                f"fits_memory_{ascii_name(gpu)}"
        for i, (what, best) in enumerate(zip(order, fixed)):
            slack = (abs(best) * (cost_tolerance_rel if near and i == 0 else TIE_REL)
                     + (COST_TIE_USD if what == "cost" else 1e-9))
            prob += (pulp.lpSum(value(o, what) * pick[o.key] for o in options) <= best + slack,
                     f"{what}_at_optimum")
        return prob, pick

    if len({o.key for o in options}) != len(options):
        raise ValueError("option keys must be unique")
    if not options:
        return OneJobSolution(choice=None, solver=_no_model(solver, time_limit_s, gap_rel))
    prob, pick = build(())
    info = _run(prob, solver, time_limit_s, gap_rel)
    if not _found(prob):
        return OneJobSolution(choice=None, solver=info)
    chosen = next(o for o in options if (pick[o.key].value() or 0) > 0.5)
    fixed: list[float] = []
    while info.optimal and len(fixed) < len(order) - 1:
        fixed.append(value(chosen, order[len(fixed)]))
        prob2, pick2 = build(fixed)
        info2 = _run(prob2, solver, time_limit_s, gap_rel)
        if not _found(prob2):
            break
        chosen = next(o for o in options if (pick2[o.key].value() or 0) > 0.5)
        info = SolverInfo(name=info.name, status=info.status, optimal=info.optimal and info2.optimal,
                          solve_s=info.solve_s + info2.solve_s, n_variables=info.n_variables,
                          n_constraints=info.n_constraints, time_limit_s=time_limit_s, gap_rel=gap_rel,
                          constraint_names=info.constraint_names, stopped_by=info.stopped_by or info2.stopped_by)
    return OneJobSolution(choice=chosen, solver=info)


# ------------------------------------------------------------------ cluster purchase

@dataclass(frozen=True, kw_only=True, slots=True)
class PurchaseSolution:
    nodes: dict[str, int]         # nodes to buy per GPU type (every pool, 0 included)
    choices: dict[str, JobOption] # per job; empty when infeasible
    cost_usd: float | None        # total cost of ownership; None when infeasible
    solver: SolverInfo


def solve_purchase(pools: Sequence[Pool], jobs: Sequence[JobWindow], options: Sequence[JobOption],
                   budget_usd: float | None = None, solver: str = "auto", time_limit_s: float = TIME_LIMIT_S,
                   gap_rel: float = GAP_REL) -> PurchaseSolution:
    """The cheapest nodes to buy so that every job runs, each on one pool with one of its
    options, by its deadline.

    Variables: nodes[g] (integer >= 0) per pool; run[j, o] (binary) per job option.
    Constraints, each named: every job picks exactly one option (``one_option_<job>``) that
    fits in memory (``fits_memory_<job>``); it finishes by its deadline (``deadline_<job>``:
    the options whose start + duration passes the deadline sum to 0; no term where every
    option is in time); at the start of every job, on every pool, the GPUs of
    the jobs running then fit in what is bought (``gpus_<pool>_at_<job>``: a job runs from
    its start for its option's duration, and the GPUs in use only rise when a job starts,
    so checking at the starts suffices);
    the budget, when given (``budget_usd``). Objective: the nodes' purchase plus their power
    over the horizon.

    The deadline row names the options that miss the deadline rather than summing every
    option's finish time (sum (start + duration) x <= deadline, as before): with one binary
    picked both admit the same purchases, the sum over late options is tight in the LP
    relaxation too, and where every option is in time (purchase.undominated leaves out late
    runs) it is empty, kept so that the rows stay as named. The finish-time form put
    coefficients of up to 2e7 s in HiGHS's LP ("badly scaled"). Measured on purchases captured
    from `plan buy` (CPU in HiGHS, one thread): the 128 8B jobs of distinct batches 0.40 ->
    0.18 s, H5's bound after its 1,000 nodes 95.2% -> 95.4% of the answer.
    """
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError("job names must be unique")
    pool_of = {p.gpu: p for p in pools}
    by_job: dict[str, list[JobOption]] = {j.name: [] for j in jobs}    # one pass, in the options' order
    for o in options:
        if o.job in by_job and o.gpu in pool_of:
            by_job[o.job].append(o)
    if not jobs or any(not by_job[j.name] for j in jobs):
        return PurchaseSolution(nodes={p.gpu: 0 for p in pools}, choices={}, cost_usd=None if jobs else 0.0,
                                solver=_no_model(solver, time_limit_s, gap_rel))
    prob = pulp.LpProblem("cluster_purchase", pulp.LpMinimize)
    nodes = {p.gpu: _variable(prob, f"nodes_{ascii_name(p.gpu)}", pulp.LpInteger, low=0) for p in pools}
    run = {(o.job, o.key): _variable(prob, f"run_{i}_{ascii_name(o.job)}_{ascii_name(o.key)}", pulp.LpBinary)
           for i, o in enumerate(o for j in jobs for o in by_job[j.name])}
    dropped = dominated_pools(pools, jobs, by_job)   # their options fixed at 0: HiGHS's presolve removes them
    for o in (o for mine in by_job.values() for o in mine if o.gpu in dropped):
        run[o.job, o.key].upBound = 0
    total = pulp.lpSum(p.node_usd * nodes[p.gpu] for p in pools)
    prob += total, "total_cost_of_ownership_usd"
    for ji, j in enumerate(jobs):     # each row's terms listed at once (lpSum builds one expression a term)
        tag = f"{ji}_{ascii_name(j.name)}"
        mine = [(o, run[j.name, o.key]) for o in by_job[j.name]]
        prob += pulp.LpAffineExpression([(x, 1) for _, x in mine]) == 1, f"one_option_{tag}"
        if any(not o.fits for o, _ in mine):
            prob += pulp.LpAffineExpression([(x, 1) for o, x in mine if not o.fits]) == 0, f"fits_memory_{tag}"
        prob += (pulp.LpAffineExpression([(x, 1) for o, x in mine
                                          if not finishes_by(j.start_s, o.duration_s, j.deadline_s)]) <= 0,
                 f"deadline_{tag}")       # why this form: the docstring
    for p in pools:
        for ti, t, busy in capacity_checks(jobs, by_job, p.gpu):
            use = [(run[j.name, o.key], o.n_gpus) for j, o in busy]     # GPUs in use - GPUs bought <= 0
            prob += (pulp.LpAffineExpression([*use, (nodes[p.gpu], -p.gpus_per_node)]) <= 0,
                     f"gpus_{ascii_name(p.gpu)}_at_{ti}_{ascii_name(t.name)}")
    if budget_usd is not None:
        prob += total <= budget_usd, "budget_usd"
    nonzeros = _nonzeros(prob)
    if not full_ilp_first(len(run) + len(pools), nonzeros, len(_constraint_names(prob))):
        return _relaxed_purchase(prob, run, pools, jobs, by_job, budget_usd, solver, time_limit_s, gap_rel)
    info = _run(prob, solver, time_limit_s, gap_rel, purchase_node_limit(nonzeros),
                highs_options=PURCHASE_HIGHS_OPTIONS)
    found: list[dict[str, JobOption]] = []
    if _found(prob):
        choices = _choices(run, jobs, by_job)
        bought = {p.gpu: int(round(nodes[p.gpu].value() or 0)) for p in pools}
        if info.optimal:
            cost = sum(pool_of[g].node_usd * n for g, n in bought.items())
            return PurchaseSolution(nodes=bought, choices=choices, cost_usd=cost, solver=info)
        found.append(choices)
    dual = _dual_bound(prob)    # stopped by its node limit: read before the relaxation re-solves it
    bound, relaxed, _ = _node_integral_relaxation(prob, list(run.values()), solver, time_limit_s, gap_rel)
    info = dataclasses.replace(info, solve_s=info.solve_s + relaxed.solve_s,
                               stopped_by=info.stopped_by or relaxed.stopped_by)
    bounds = [b for b in (dual, bound) if b is not None]
    return _best_found(pools, jobs, by_job, found, budget_usd, info, max(bounds, default=None), gap_rel)


def full_ilp_first(n_variables: int, nonzeros: int, rows: int) -> bool:
    """Whether solve_purchase branches on the whole purchase ILP (under purchase_node_limit),
    rather than answering from the relaxation with integer nodes and an ILP over its runs
    (_relaxed_purchase): at most LARGE_VARIABLES variables, and nonzeros x their mean per row
    at most FULL_ILP_WORK (their measured reasons: at the constants)."""
    return n_variables <= LARGE_VARIABLES and nonzeros * nonzeros <= FULL_ILP_WORK * max(rows, 1)


def purchase_node_limit(nonzeros: int) -> int:
    """HiGHS's node limit for a purchase ILP of ``nonzeros`` in its rows: MIP_MAX_NODES, scaled
    down past REFERENCE_NONZEROS so that nodes x nonzeros**2 stays within H5's, to no fewer than
    MIN_PURCHASE_NODES (nor more than MIP_MAX_NODES, where that is fewer)."""
    scaled = MIP_MAX_NODES * REFERENCE_NONZEROS**2 // max(nonzeros, 1) ** 2
    return min(MIP_MAX_NODES, max(MIN_PURCHASE_NODES, scaled))


def _relaxed_purchase(prob: pulp.LpProblem, run: dict[tuple[str, str], pulp.LpVariable], pools: Sequence[Pool],
                      jobs: Sequence[JobWindow], by_job: dict[str, list[JobOption]], budget_usd: float | None,
                      solver: str, time_limit_s: float, gap_rel: float) -> PurchaseSolution:
    """A purchase ILP not branched on as a whole (full_ilp_first: its root node alone takes
    seconds to minutes, or its nodes tens of milliseconds each).

    1. The bound: the relaxation with the nodes bought integer and the runs fractional
       (_node_integral_relaxation), at least the LP relaxation's, in about a second. Where the
       greedy start costs what it says, that is the optimum, proved without branching (256 8B
       jobs of distinct batches cut to 160: 0.5 s of CPU; the ILP's root reached the time limit).
    2. Else an ILP over the runs that relaxation uses, widened by purchase.fewest_checks_runs
       (every other run fixed at 0), and the greedy start: the cheaper, on the fewest nodes that
       hold it (_best_found), proved optimal where it costs no more than the bound (within
       ``gap_rel``), else the gap is said. Every step stops at a count. Measured
       (buy256-mixed-batches of bench/resources.py): $20.2M, at least 93.3%, 3.5 s of CPU."""
    runs = list(run.values())
    bound, info, used = _node_integral_relaxation(prob, runs, solver, time_limit_s, gap_rel)
    first = _best_found(pools, jobs, by_job, [], budget_usd, _unproved(info, info.solve_s, used), bound, gap_rel)
    if first.solver.optimal:
        return first
    found: list[dict[str, JobOption]] = []
    solve_s = info.solve_s
    if used is not None:
        names = {key: v.name for key, v in run.items()}
        used |= {names[k] for k in fewest_checks_runs(jobs, by_job, {k for k, n in names.items() if n in used})}
        upper = {v.name: v.upBound for v in runs}
        for v in runs:
            if v.name not in used:
                v.upBound = 0
        sub = _run(prob, solver, time_limit_s, gap_rel, highs_options=PURCHASE_HIGHS_OPTIONS)
        solve_s += sub.solve_s
        info = dataclasses.replace(info, stopped_by=info.stopped_by or sub.stopped_by)
        if _found(prob):
            found.append(_choices(run, jobs, by_job))
        for v in runs:
            v.upBound = upper[v.name]
    return _best_found(pools, jobs, by_job, found, budget_usd, _unproved(info, solve_s, used), bound, gap_rel)


def _unproved(info: SolverInfo, solve_s: float, used: set[str] | None) -> SolverInfo:
    """The record of a purchase answered from the relaxation with integer nodes (``info``), not
    proved until _best_found finds an answer at its bound; "Solution Found": PuLP's name of an
    answer without a proof; max_nodes 0: the ILP was not branched on as a whole."""
    return dataclasses.replace(info, solve_s=solve_s, optimal=False, max_nodes=0 if info.name == "HiGHS" else None,
                               status=str(pulp.LpSolution[pulp.LpSolutionIntegerFeasible]) if used is not None
                               else info.status)


def _node_integral_relaxation(prob: pulp.LpProblem, runs: Sequence[pulp.LpVariable], solver: str,
                              time_limit_s: float, gap_rel: float
                              ) -> tuple[float | None, SolverInfo, set[str] | None]:
    """The purchase ILP ``prob`` with its run binaries relaxed to [0, 1] and its node counts
    kept integer: (a lower bound on the ILP's optimum, or None; the solver's record; the runs
    its solution uses, or None when it found none). The bound is HiGHS's dual bound (valid
    where a limit stopped it too), else the proved optimum. ``runs`` are binary again on return."""
    for v in runs:
        v.cat = pulp.LpContinuous
    try:
        info = _run(prob, solver, time_limit_s, gap_rel, highs_options=RELAXATION_HIGHS_OPTIONS)
    finally:
        for v in runs:
            v.cat = pulp.LpInteger
    bound = _dual_bound(prob)
    if bound is None and prob.sol_status == pulp.LpSolutionOptimal:
        bound = pulp.value(prob.objective)
    if not _found(prob):
        return bound, info, None
    return bound, info, {v.name for v in runs if (v.value() or 0) > 1e-6}


def _choices(run: dict[tuple[str, str], pulp.LpVariable], jobs: Sequence[JobWindow],
             by_job: dict[str, list[JobOption]]) -> dict[str, JobOption]:
    """Each job's option in the solution of solve_purchase's ILP (``run``: its binaries)."""
    return {j.name: next(o for o in by_job[j.name] if (run[j.name, o.key].value() or 0) > 0.5) for j in jobs}


def _best_found(pools: Sequence[Pool], jobs: Sequence[JobWindow], by_job: dict[str, list[JobOption]],
                found: list[dict[str, JobOption]], budget_usd: float | None, info: SolverInfo,
                bound: float | None, gap_rel: float) -> PurchaseSolution:
    """Where the solver did not prove the optimum: the cheapest of its choices (``found``) and
    the greedy start, each on the fewest nodes that hold it, within the budget, with the gap
    to the lower bound (``bound``) said; proved optimal (status "Optimal", no gap) where it
    costs no more than the bound, within ``gap_rel`` of it (the solver's own test, HiGHS's
    mip_rel_gap: (answer - bound) / answer)."""
    greedy = greedy_purchase(pools, jobs, by_job)
    if greedy is not None:
        found = [*found, greedy[1]]
    pool_of = {p.gpu: p for p in pools}
    priced = []
    for choices in found:      # the fewest nodes that hold the choices (no more than the ILP bought)
        need = nodes_needed(pools, jobs, choices)
        priced.append((sum(pool_of[g].node_usd * n for g, n in need.items()), need, choices))
    priced = [f for f in priced if budget_usd is None or f[0] <= budget_usd]
    if not priced:
        return PurchaseSolution(nodes={p.gpu: 0 for p in pools}, choices={}, cost_usd=None, solver=info)
    cost, bought, choices = min(priced, key=lambda f: f[0])      # the ILP's answer on a tie (listed first)
    if bound is not None and cost > 0:
        gap = max(0.0, (cost - bound) / cost)
        info = (dataclasses.replace(info, status="Optimal", optimal=True, gap_found=None) if gap <= gap_rel
                else dataclasses.replace(info, gap_found=gap))
    return PurchaseSolution(nodes=bought, choices=choices, cost_usd=cost, solver=info)
