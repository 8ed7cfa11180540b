"""The ILPs of planner.cost.solve against brute force on random small instances (hypothesis),
feasible and infeasible, on both solvers; and explicit cases with their named constraints."""

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cost.solve import JobOption, JobWindow, Limits, Option, Pool, nodes_needed, solve_one_job, solve_purchase
from planner.errors import UserError

SOLVERS = ["highs", "cbc"]
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


# ------------------------------------------------------------------------ one job

@st.composite
def one_job_instances(draw):
    n = draw(st.integers(1, 12))
    gpus = ["h100", "a100", "l40s"]
    options = []
    for i in range(n):
        gpu = draw(st.sampled_from(gpus))
        options.append(Option(
            key=f"o{i}_{gpu}", gpu=gpu, n_gpus=draw(st.sampled_from([1, 2, 4, 8, 16, 24, 64])),
            cost_usd=draw(st.integers(1, 1000)) * 100.0, time_s=draw(st.integers(1, 1000)) * 3600.0,
            memory_bytes=draw(st.integers(10, 100)), capacity_bytes={"h100": 80, "a100": 80, "l40s": 45}[gpu]))
    limits = Limits(
        deadline_s=draw(st.none() | st.integers(1, 1000).map(lambda h: h * 3600.0)),
        budget_usd=draw(st.none() | st.integers(1, 1000).map(lambda c: c * 100.0)),
        max_gpus=draw(st.none() | st.sampled_from([1, 4, 8, 16, 32, 64])))
    return options, limits, draw(st.sampled_from(["cost", "time"]))


def brute_one_job(options, limits, objective):
    ok = [o for o in options if o.fits
          and (limits.deadline_s is None or o.time_s <= limits.deadline_s)
          and (limits.budget_usd is None or o.cost_usd <= limits.budget_usd)
          and (limits.max_gpus is None or o.n_gpus <= limits.max_gpus)]
    if not ok:
        return None
    return min(o.cost_usd if objective == "cost" else o.time_s for o in ok)


def check_one_job(options, limits, objective, solver):
    sol = solve_one_job(options, objective, limits, solver=solver)
    best = brute_one_job(options, limits, objective)
    if best is None:
        assert sol.choice is None and sol.solver.status == "Infeasible"
        return
    c = sol.choice
    assert c is not None and sol.solver.optimal and sol.solver.status == "Optimal"
    assert close(c.cost_usd if objective == "cost" else c.time_s, best)
    assert c.fits
    assert limits.deadline_s is None or c.time_s <= limits.deadline_s
    assert limits.budget_usd is None or c.cost_usd <= limits.budget_usd
    assert limits.max_gpus is None or c.n_gpus <= limits.max_gpus
    # ties on the objective are broken lexicographically: a cost plan by the fewest GPUs, then
    # the shortest time; a time plan by the lowest cost, then the fewest GPUs
    def measures(o):
        return (o.n_gpus, o.time_s) if objective == "cost" else (o.cost_usd, o.n_gpus)

    tied = [o for o in options if brute_one_job([o], limits, objective) is not None
            and close(o.cost_usd if objective == "cost" else o.time_s, best)]
    first = min(measures(o)[0] for o in tied)
    second = min(measures(o)[1] for o in tied if close(measures(o)[0], first))
    assert close(measures(c)[0], first) and close(measures(c)[1], second)


def test_equal_cost_goes_to_fewer_gpus_then_shorter_time():
    """Under the sustained-rate ceiling every count costs the same (example 01): the plan takes
    the fewest GPUs that meet the deadline, and of those the shortest time; the deadline still
    binds (512 GPUs at 30.9 days is over 30)."""
    day = 86400.0
    opts = [Option(key="n512", gpu="h100", n_gpus=512, cost_usd=2.61e6, time_s=30.9 * day),
            Option(key="n1024", gpu="h100", n_gpus=1024, cost_usd=2.61e6, time_s=15.5 * day),
            Option(key="n1024b", gpu="h100", n_gpus=1024, cost_usd=2.61e6, time_s=15.0 * day),
            Option(key="n2048", gpu="h100", n_gpus=2048, cost_usd=2.61e6, time_s=7.7 * day),
            Option(key="n4096", gpu="h100", n_gpus=4096, cost_usd=3.14e6, time_s=4.6 * day)]
    for solver in SOLVERS:
        sol = solve_one_job(opts, "cost", Limits(deadline_s=30 * day), solver=solver)
        assert sol.choice is not None and sol.choice.key == "n1024b" and sol.solver.optimal
        fast = solve_one_job(opts, "time", Limits(deadline_s=30 * day), solver=solver)
        assert fast.choice is not None and fast.choice.key == "n4096"


@pytest.mark.slow
@FAST
@given(one_job_instances())
def test_one_job_ilp_equals_brute_force_highs(instance):
    check_one_job(*instance, "highs")


@pytest.mark.slow
@SLOW
@given(one_job_instances())
def test_one_job_ilp_equals_brute_force_cbc(instance):
    check_one_job(*instance, "cbc")


@pytest.mark.parametrize("solver", SOLVERS)
def test_one_job_explicit(solver):
    opts = [Option(key="h8", gpu="h100", n_gpus=8, cost_usd=1000, time_s=100),
            Option(key="h16", gpu="h100", n_gpus=16, cost_usd=1200, time_s=50),
            Option(key="a16", gpu="a100", n_gpus=16, cost_usd=900, time_s=120),
            Option(key="a32", gpu="a100", n_gpus=32, cost_usd=950, time_s=60, memory_bytes=90, capacity_bytes=80)]
    assert solve_one_job(opts, solver=solver).choice.key == "a16"                    # cheapest
    assert solve_one_job(opts, "time", solver=solver).choice.key == "h16"            # fastest (a32 does not fit)
    sol = solve_one_job(opts, limits=Limits(deadline_s=110, max_gpus=8), solver=solver)
    assert sol.choice.key == "h8"
    assert set(sol.solver.constraint_names) == {"exactly_one_plan", "deadline_s", "max_gpus", "fits_memory_a100"}
    sol = solve_one_job(opts, limits=Limits(deadline_s=60, budget_usd=1100), solver=solver)
    assert sol.choice is None and sol.solver.status == "Infeasible" and not sol.solver.optimal
    assert solve_one_job([], solver=solver).choice is None


def test_one_job_rejects_bad_input():
    with pytest.raises(UserError, match="objective"):
        solve_one_job([], "speed")
    with pytest.raises(UserError, match="solver"):
        solve_one_job([], solver="gurobi")


# ------------------------------------------------------------------ cluster purchase

@st.composite
def purchase_instances(draw):
    n_pools = draw(st.integers(1, 3))
    pools = [Pool(gpu=f"g{i}", gpus_per_node=draw(st.sampled_from([1, 2, 4, 8])),
                  capex_usd=draw(st.integers(1, 50)) * 1000.0, opex_usd=draw(st.integers(0, 10)) * 100.0)
             for i in range(n_pools)]
    jobs, options = [], []
    for j in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, 20)) * 1.0
        jobs.append(JobWindow(name=f"job {j}", start_s=start, deadline_s=start + draw(st.integers(1, 30))))
        for k in range(draw(st.integers(0, 4))):
            pool = draw(st.sampled_from(pools))
            options.append(JobOption(job=f"job {j}", gpu=pool.gpu, n_gpus=draw(st.integers(1, 16)),
                                     duration_s=float(draw(st.integers(1, 30))), key=f"o{k}",
                                     memory_bytes=draw(st.integers(0, 10)), capacity_bytes=8))
    budget = draw(st.none() | st.integers(1, 300).map(lambda b: b * 1000.0))
    return pools, jobs, options, budget


def brute_purchase(pools, jobs, options, budget):
    per_job = [[o for o in options if o.job == j.name and o.fits and j.start_s + o.duration_s <= j.deadline_s]
               for j in jobs]
    by_gpu = {p.gpu: p for p in pools}
    best = None
    for combo in itertools.product(*per_job):
        choices = {j.name: o for j, o in zip(jobs, combo)}
        nodes = nodes_needed(pools, jobs, choices)
        cost = sum(by_gpu[g].node_usd * n for g, n in nodes.items())
        if budget is not None and cost > budget:
            continue
        best = cost if best is None else min(best, cost)
    return best


def check_purchase(pools, jobs, options, budget, solver):
    sol = solve_purchase(pools, jobs, options, budget, solver=solver)
    best = brute_purchase(pools, jobs, options, budget)
    if best is None:
        assert sol.cost_usd is None and not sol.choices and sol.solver.status == "Infeasible"
        return
    assert sol.solver.optimal and close(sol.cost_usd, best)
    # the solution is what it claims: every job in its window, the nodes hold the GPUs in use
    for j in jobs:
        o = sol.choices[j.name]
        assert o.job == j.name and o.fits and j.start_s + o.duration_s <= j.deadline_s
    need = nodes_needed(pools, jobs, sol.choices)
    assert all(sol.nodes[g] >= need[g] for g in need)


@pytest.mark.slow
@FAST
@given(purchase_instances())
def test_purchase_ilp_equals_brute_force_highs(instance):
    check_purchase(*instance, "highs")


@SLOW
@given(purchase_instances())
def test_purchase_ilp_equals_brute_force_cbc(instance):
    check_purchase(*instance, "cbc")


@pytest.mark.parametrize("solver", SOLVERS)
def test_purchase_explicit(solver):
    pools = [Pool(gpu="h100", gpus_per_node=8, capex_usd=100, opex_usd=10),
             Pool(gpu="a100", gpus_per_node=8, capex_usd=60, opex_usd=5)]
    jobs = [JobWindow(name="x", start_s=0, deadline_s=100), JobWindow(name="y", start_s=50, deadline_s=200)]
    opts = [JobOption(job="x", gpu="h100", n_gpus=8, duration_s=80, key="h8"),
            JobOption(job="x", gpu="a100", n_gpus=16, duration_s=60, key="a16"),
            JobOption(job="y", gpu="a100", n_gpus=8, duration_s=100, key="a8"),
            JobOption(job="y", gpu="h100", n_gpus=8, duration_s=70, key="h8")]
    # x on h100 (0-80) and y on a100 (50-150): one node of each, 110 + 65; both on h100
    # overlap at t=50 and need two nodes (220); both on a100 need three at t=50 (195)
    sol = solve_purchase(pools, jobs, opts, solver=solver)
    assert sol.cost_usd == 175 and sol.nodes == {"h100": 1, "a100": 1}
    assert sol.choices["x"].key == "h8" and sol.choices["y"].key == "a8"
    names = set(sol.solver.constraint_names)
    assert {"one_option_0_x", "deadline_0_x", "one_option_1_y", "deadline_1_y"} <= names
    assert any(n.startswith("gpus_h100_at_") for n in names)
    # a later start frees the nodes: y from t=90 shares x's h100 node
    late = [jobs[0], JobWindow(name="y", start_s=90, deadline_s=300)]
    sol = solve_purchase(pools, late, opts, solver=solver)
    assert sol.cost_usd == 110 and sol.nodes == {"h100": 1, "a100": 0}
    # the budget binds
    sol = solve_purchase(pools, jobs, opts, budget_usd=150, solver=solver)
    assert sol.cost_usd is None and sol.solver.status == "Infeasible"
    assert "budget_usd" in sol.solver.constraint_names
    # a job with no option at all
    sol = solve_purchase(pools, jobs + [JobWindow(name="z", start_s=0, deadline_s=10)], opts, solver=solver)
    assert sol.cost_usd is None and not sol.choices



def stop_early(monkeypatch, mode):
    """Make the purchase ILP stop as a time limit stops it (HiGHS solves these small
    instances in presolve even under a limit of 1e-9 s): "incumbent", solved but not proved;
    "nothing", not run at all (no solution, no bound)."""
    import dataclasses

    import planner.cost.solve as solve_module

    real = solve_module._run

    def run(prob, solver, time_limit_s, gap_rel, *limits, **how):
        if mode == "nothing":
            return solve_module.SolverInfo(name="HiGHS", status="Not Solved", optimal=False, solve_s=0.0,
                                           n_variables=0, n_constraints=0, time_limit_s=time_limit_s,
                                           gap_rel=gap_rel)
        return dataclasses.replace(real(prob, solver, time_limit_s, gap_rel, *limits, **how), optimal=False)

    monkeypatch.setattr(solve_module, "_run", run)


def check_stopped_purchase(pools, jobs, options, budget):
    """A solver stopped by its limit before proving the optimum (issue 20: the 256-job
    purchase): the answer, when there is one, is feasible, no cheaper than brute force's
    optimum, and within the gap it reports of it."""
    sol = solve_purchase(pools, jobs, options, budget, solver="highs")
    best = brute_purchase(pools, jobs, options, budget)
    if sol.cost_usd is None:
        return                      # nothing found in time: no answer, never a wrong one
    assert best is not None and sol.cost_usd >= best * (1 - 1e-9)
    if sol.solver.gap_found is not None:
        assert sol.cost_usd * (1 - sol.solver.gap_found) <= best * (1 + 1e-9) + 1e-6
    for j in jobs:
        o = sol.choices[j.name]
        assert o.job == j.name and o.fits and j.start_s + o.duration_s <= j.deadline_s
    need = nodes_needed(pools, jobs, sol.choices)
    assert all(sol.nodes[g] >= need[g] for g in need)
    by_gpu = {p.gpu: p for p in pools}
    assert close(sol.cost_usd, sum(by_gpu[g].node_usd * n for g, n in sol.nodes.items()))
    assert budget is None or sol.cost_usd <= budget


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["incumbent", "nothing"])
def test_stopped_purchase_is_feasible_and_within_its_gap(monkeypatch, mode):
    stop_early(monkeypatch, mode)

    @FAST
    @given(purchase_instances())
    def check(instance):
        check_stopped_purchase(*instance)

    check()


def test_stopped_purchase_takes_the_greedy_start(monkeypatch):
    """Two jobs, one pool: the greedy start (fewest GPU-seconds each) is the optimum here
    (brute force: 2 nodes of 8 GPUs, $220), and a solver stopped before any solution still
    answers with it; with its incumbent at its bound (a gap of 0), the answer is proved
    optimal, as the solver's own gap test (mip_rel_gap) proves it."""
    pools = [Pool(gpu="h100", gpus_per_node=8, capex_usd=100, opex_usd=10)]
    jobs = [JobWindow(name="x", start_s=0, deadline_s=100), JobWindow(name="y", start_s=0, deadline_s=100)]
    opts = [JobOption(job=n, gpu="h100", n_gpus=g, duration_s=d, key=f"n{g}")
            for n in ("x", "y") for g, d in ((8, 90), (16, 50))]
    assert brute_purchase(pools, jobs, opts, None) == 220
    stop_early(monkeypatch, "nothing")
    sol = solve_purchase(pools, jobs, opts, solver="highs")
    assert (sol.cost_usd, sol.nodes, sol.solver.gap_found) == (220, {"h100": 2}, None)
    monkeypatch.undo()
    stop_early(monkeypatch, "incumbent")
    sol = solve_purchase(pools, jobs, opts, solver="highs")
    assert (sol.cost_usd, sol.nodes, sol.solver.gap_found, sol.solver.optimal) == (220, {"h100": 2}, None, True)


def test_start_counts_by_bisection_are_the_busy_at_definition():
    # issue 32: busy_checks and shorter_run_may_help count the job starts inside a run by
    # bisection; the referee is busy_at's definition (start <= t < start + duration), check by
    # check, on random starts with repeats and runs ending exactly at a start
    import random

    from planner.cost.solve import busy_at, busy_checks, shorter_run_may_help

    rng = random.Random(32)
    for _ in range(2000):
        starts = [float(rng.randrange(0, 20)) for _ in range(rng.randrange(0, 12))]
        start, duration = float(rng.randrange(0, 20)), rng.choice([0.0, 0.5, 1.0, 3.0, float(rng.randrange(0, 25))])
        assert busy_checks(start, duration, starts) == sum(busy_at(start, duration, t) for t in starts)
        assert shorter_run_may_help(start, duration, starts) == any(start < t and busy_at(start, duration, t)
                                                                    for t in starts)


def test_capacity_rows_are_the_options_busy_at_each_start():
    # capacity_checks finds each start's running options as one array comparison; the
    # referee: every (job, option) of the pool tested with busy_at, start by start
    import random

    from planner.cost.purchase import busy_at, capacity_checks

    rng = random.Random(7)
    for _ in range(50):
        jobs = [JobWindow(name=f"j{i}", start_s=float(rng.randrange(0, 10)), deadline_s=100.0) for i in range(6)]
        by_job = {j.name: [JobOption(job=j.name, gpu=rng.choice(["a", "b"]), n_gpus=8, key=f"k{k}",
                                     duration_s=float(rng.randrange(0, 8))) for k in range(3)] for j in jobs}
        for gpu in ("a", "b"):
            rows = {ti: busy for ti, _, busy in capacity_checks(jobs, by_job, gpu)}
            for ti, t in enumerate(jobs):
                want = [(j, o) for j in jobs for o in by_job[j.name]
                        if o.gpu == gpu and busy_at(j.start_s, o.duration_s, t.start_s)]
                if ti in rows:
                    assert rows[ti] == want
                else:       # left out: empty, or its running set within a kept row's
                    assert not want or any({(j.name, o.key) for j, o in want} <= {(j.name, o.key) for j, o in r}
                                           for r in rows.values())


def test_nodes_needed_is_the_peak_of_busy_at_over_the_job_starts():
    """nodes_needed against busy_at's definition read job start by job start (the loop it was
    before issue 32's b40m pass): runs that end exactly at another job's start (not busy then),
    fractional seconds, a pool nobody runs on, and random instances."""
    import random

    from planner.cost.purchase import busy_at
    pools = [Pool(gpu="a", gpus_per_node=8, capex_usd=1.0, opex_usd=0.0),
             Pool(gpu="b", gpus_per_node=4, capex_usd=2.0, opex_usd=0.0),
             Pool(gpu="c", gpus_per_node=8, capex_usd=3.0, opex_usd=0.0)]
    rng = random.Random(7)
    for case in range(200):
        jobs = [JobWindow(name=f"j{i}", start_s=float(rng.choice([0, 10, 10.5, 20, 30]) + (i % 3) * 0.1),
                          deadline_s=1e9) for i in range(rng.randint(1, 12))]
        choices = {j.name: JobOption(job=j.name, gpu=rng.choice("ab"), n_gpus=rng.choice([1, 3, 8, 16]),
                                     duration_s=rng.choice([0.1, 9.9, 10.0, 10.5, 25.0]), key="k")
                   for j in jobs}
        expected = {p.gpu: math.ceil(max(sum(o.n_gpus for j in jobs if (o := choices[j.name]).gpu == p.gpu
                                             and busy_at(j.start_s, o.duration_s, t.start_s)) for t in jobs)
                                     / p.gpus_per_node) for p in pools}
        assert nodes_needed(pools, jobs, choices) == expected, case
