"""The purchase ILP of `plan buy` as issue 32's H5 left it: pools whose every option has a
cheaper counterpart are fixed out of it (purchase.dominated_pools) without changing the
cheapest purchase, and its solve stops at a node limit on one thread, so that one input
gets one answer however loaded the machine is, with the gap to the solver's bound said.

The referee is brute force over every combination of options (tests/test_solve.py's
brute_purchase: the fewest nodes that hold each combination, solve.nodes_needed, priced),
not the ILP's own formula."""

from __future__ import annotations

import math
import multiprocessing
import time

import pulp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solve import brute_purchase, check_stopped_purchase, purchase_instances

import planner.cost.solve as solve
from planner.cost.solve import JobOption, JobWindow, Pool, busy_checks, dominated_pools, solve_purchase, undominated

DAY_S = 86400.0
# H5's runs of one Llama 3.1 70B job of 100B tokens per GPU type (GPUs, days), from `plan buy`
# on bench/resources.py's staggered70b.yaml (32 jobs a day apart, 30-day deadlines), and the
# prices of its three pools (presets/prices.json over a 400-day horizon): the instance's shape,
# not a figure under test. In the step-time model h200 runs as fast as h100 on the same counts.
H5_RUNS = {"h100": ((48, 23.54), (64, 17.66), (96, 11.77), (128, 8.83), (256, 4.41), (512, 2.21), (1024, 1.1)),
           "h200": ((48, 23.54), (64, 17.66), (96, 11.77), (128, 8.83), (256, 4.41), (512, 2.21)),
           "b200": ((24, 22.76), (32, 17.07), (48, 11.38), (64, 8.54), (96, 5.69), (128, 4.27), (256, 2.13),
                    (512, 1.07))}
H5_POOLS = [Pool(gpu="h100", gpus_per_node=8, capex_usd=270_000, opex_usd=12_525.9264),
            Pool(gpu="h200", gpus_per_node=8, capex_usd=315_000, opex_usd=12_525.9264),
            Pool(gpu="b200", gpus_per_node=8, capex_usd=515_000, opex_usd=17_560.8576)]


def h5(n_jobs: int) -> tuple[list[JobWindow], list[JobOption]]:
    """H5's jobs (a day apart, 30 days each) and their options as plan_purchase keeps them
    (solve.undominated per job and GPU type)."""
    jobs = [JobWindow(name=f"j{i}", start_s=i * DAY_S, deadline_s=(i + 30) * DAY_S) for i in range(n_jobs)]
    starts = [j.start_s for j in jobs]
    options = []
    for j in jobs:
        for gpu, runs in H5_RUNS.items():
            rs = [(n, d * DAY_S) for n, d in runs]
            options += [JobOption(job=j.name, gpu=gpu, n_gpus=rs[i][0], duration_s=rs[i][1], key=f"{gpu}_n{rs[i][0]}")
                        for i in undominated(j.start_s, j.deadline_s, rs, starts)]
    return jobs, options


# ------------------------------------------------------------- dominated pools, exactly

@st.composite
def instances_with_copies(draw):
    """Pools, jobs and options where some pools repeat another's options on as many GPUs or
    more, for as long or longer, at a node price drawn freely (so that pools are dominated,
    tie, or are cheaper and dominate nothing), plus options of their own; some options miss
    the deadline or do not fit."""
    node = draw(st.sampled_from([1, 2, 4, 8]))
    n_pools = draw(st.integers(2, 3))
    pools = [Pool(gpu=f"g{i}", gpus_per_node=node if i < 2 else draw(st.sampled_from([node, 2 * node])),
                  capex_usd=draw(st.integers(1, 20)) * 1000.0, opex_usd=draw(st.integers(0, 2)) * 500.0)
             for i in range(n_pools)]
    jobs, options = [], []
    for j in range(draw(st.integers(1, 4))):
        start = float(draw(st.integers(0, 12)))
        jobs.append(JobWindow(name=f"j{j}", start_s=start, deadline_s=start + draw(st.integers(2, 20))))
        base = [(draw(st.integers(1, 12)), float(draw(st.integers(1, 22)))) for _ in range(draw(st.integers(1, 3)))]
        for p in pools:
            extra_n, extra_s = draw(st.integers(0, 4)), float(draw(st.integers(0, 6)))
            runs = [(n + extra_n, d + extra_s) for n, d in base] if p.gpu != "g0" else base
            if draw(st.booleans()):
                runs = runs + [(draw(st.integers(1, 12)), float(draw(st.integers(1, 22))))]
            for k, (n, d) in enumerate(runs):
                options.append(JobOption(job=f"j{j}", gpu=p.gpu, n_gpus=n, duration_s=d, key=f"{p.gpu}_{k}",
                                         memory_bytes=draw(st.integers(0, 9)), capacity_bytes=8))
    budget = draw(st.none() | st.integers(1, 200).map(lambda b: b * 1000.0))
    return pools, jobs, options, budget


def _by_job(jobs, options):
    by_job = {j.name: [] for j in jobs}
    for o in options:
        by_job[o.job].append(o)
    return by_job


@pytest.mark.slow   # 400 examples; the fast tier keeps the brute-force equality
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances_with_copies())
def test_leaving_out_dominated_pools_keeps_the_cheapest_purchase(instance):
    pools, jobs, options, budget = instance
    dropped = dominated_pools(pools, jobs, _by_job(jobs, options))
    kept = [o for o in options if o.gpu not in dropped]
    assert brute_purchase(pools, jobs, kept, budget) == brute_purchase(pools, jobs, options, budget)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances_with_copies())
def test_purchase_ilp_with_dominated_pools_equals_brute_force(instance):
    """solve_purchase (dominated pools fixed out, node limit, one thread) against brute
    force over every option: the same cost, proved, and a purchase that holds its choices."""
    pools, jobs, options, budget = instance
    sol = solve_purchase(pools, jobs, options, budget, solver="highs")
    best = brute_purchase(pools, jobs, options, budget)
    if best is None:
        assert sol.cost_usd is None and not sol.choices
        return
    assert sol.solver.optimal and math.isclose(sol.cost_usd, best, rel_tol=1e-9, abs_tol=1e-6)
    need = solve.nodes_needed(pools, jobs, sol.choices)
    assert all(sol.nodes[g] >= need[g] for g in need)


def test_h5_h200_is_dominated_by_h100():
    """H5's h200 options repeat h100's on the same counts for as long, and h200 nodes cost
    more: h200 is left out; b200 runs faster per GPU and is kept, and so is h100."""
    jobs, options = h5(32)
    assert dominated_pools(H5_POOLS, jobs, _by_job(jobs, options)) == {"h200"}
    # at an equal node price the pool listed first is kept
    twin = [H5_POOLS[0], Pool(gpu="h200", gpus_per_node=8, capex_usd=270_000, opex_usd=12_525.9264)]
    assert dominated_pools(twin, jobs, _by_job(jobs, options)) == {"h200"}
    # the other way round nothing is: h100 has a run on 1,024 GPUs that h200 lacks
    assert dominated_pools(twin[::-1], jobs, _by_job(jobs, options)) == set()
    # a counterpart must be busy at no more job starts: h200 one day slower is not dominated
    slower = [JobOption(job=o.job, gpu="h100", n_gpus=o.n_gpus, duration_s=o.duration_s + DAY_S, key=o.key)
              if o.gpu == "h100" else o for o in options]
    j0 = jobs[0]
    assert busy_checks(j0.start_s, 2.21 * DAY_S + DAY_S, [j.start_s for j in jobs]) > \
        busy_checks(j0.start_s, 2.21 * DAY_S, [j.start_s for j in jobs])
    assert "h200" not in dominated_pools(H5_POOLS, jobs, _by_job(jobs, slower))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(purchase_instances())
def test_a_large_ilp_answers_from_its_node_integral_bound_and_a_restricted_ilp(instance):
    """Above LARGE_VARIABLES (here every instance) the ILP is not branched on as a whole: the
    answer, when there is one, is feasible, no cheaper than brute force's optimum and within
    the gap it states of it (the bound of the relaxation with integer nodes); where it claims
    a proof (it costs what that bound says), it is brute force's optimum."""
    import unittest.mock

    with unittest.mock.patch.object(solve, "LARGE_VARIABLES", 0):
        check_stopped_purchase(*instance)
        sol = solve_purchase(*instance, solver="highs")
    if sol.cost_usd:
        assert sol.solver.max_nodes == 0
        if sol.solver.optimal:
            best = brute_purchase(*instance)
            assert sol.solver.gap_found is None and sol.solver.status == "Optimal"
            assert best is not None and sol.cost_usd <= best * (1 + 1e-6)
        else:
            assert sol.solver.gap_found is not None


@pytest.mark.slow   # 2 s; fast: test_a_large_ilp_answers_from_its_node_integral_bound_and_a_restricted_ilp
def test_h5_at_256_jobs_is_answered_from_the_lp_bound():
    """256 of H5's jobs (5,228 variables, past LARGE_VARIABLES): the greedy start's 69 x b200
    nodes (each job on 24 GPUs; 23 of them overlap) within 2% of the LP relaxation's bound,
    in well under a second of solving (HiGHS's root node alone took 14 s of CPU)."""
    jobs, options = h5(256)
    t0 = time.process_time()
    sol = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    assert time.process_time() - t0 < 5.0
    assert sol.nodes == {"h100": 0, "h200": 0, "b200": 69} and not sol.solver.optimal
    assert 0 < sol.solver.gap_found < 0.02


@pytest.mark.slow   # 6 s; fast: test_a_large_ilp_answers_from_its_node_integral_bound_and_a_restricted_ilp
def test_a_dense_ilp_under_large_variables_is_not_branched_on_as_a_whole():
    """48 of H5's jobs: 860 variables, under LARGE_VARIABLES, but 9,022 nonzeros in 236 rows
    (nonzeros**2 / rows 344,900, past FULL_ILP_WORK: the 8-model file of bench/resources.py cut to
    64-128 jobs is as dense, and its full ILP took 5-13 s of CPU, the 128 into the 20 s time
    limit). Answered from the relaxation with integer nodes and an ILP over its runs (max_nodes
    0), in about 2 s of CPU, the same answer twice (every step stops at a count), on nodes that
    hold its choices, with its gap said (5.8% with HiGHS 1.16: 60 x b200); 40 jobs (253,872)
    still get the full ILP under its node limit."""
    jobs, options = h5(48)
    t0 = time.process_time()
    sol = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    assert time.process_time() - t0 < 8.0
    assert sol.solver.max_nodes == 0 and not sol.solver.optimal and 0 < sol.solver.gap_found < 0.1
    assert all(sol.nodes[g] >= n for g, n in solve.nodes_needed(H5_POOLS, jobs, sol.choices).items())
    assert _answer(solve_purchase(H5_POOLS, jobs, options, solver="highs")) == _answer(sol)
    assert solve.full_ilp_first(692, 7054, 196)     # h5(40)'s variables, nonzeros and rows


# ------------------------------------------------------------- a deterministic stop

def _burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _answer(sol):
    return (sol.cost_usd, sol.nodes, {j: o.key for j, o in sol.choices.items()}, sol.solver.optimal,
            sol.solver.gap_found)


@pytest.mark.slow
def test_a_stopped_solve_gives_one_answer_at_any_load(monkeypatch):
    """H5 cut to 16 jobs, stopped after 5 branch-and-bound nodes (HiGHS proves this one
    in about 0.6 s without a limit): the same purchase, choices and bound alone and while two processes
    keep both cores busy; not proved, with its gap said, and no cheaper than the optimum
    HiGHS proves without a limit."""
    jobs, options = h5(16)
    monkeypatch.setattr(solve, "MIP_MAX_NODES", 5)
    alone = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    assert not alone.solver.optimal and alone.solver.max_nodes == 5
    # PuLP's LpStatus reads "Optimal" after a stop at the limit; the status says what PuLP's
    # sol_status says (LpSolutionIntegerFeasible: "Solution Found")
    assert alone.solver.status == "Solution Found"
    assert alone.solver.gap_found is not None and 0 < alone.solver.gap_found < 0.1
    ctx = multiprocessing.get_context("fork")
    burners = [ctx.Process(target=_burn, args=(30.0,)) for _ in range(2)]
    for b in burners:
        b.start()
    try:
        loaded = [solve_purchase(H5_POOLS, jobs, options, solver="highs") for _ in range(2)]
    finally:
        for b in burners:
            b.terminate()
            b.join()
    assert all(_answer(s) == _answer(alone) for s in loaded)
    monkeypatch.setattr(solve, "MIP_MAX_NODES", 10**9)
    proved = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    assert proved.solver.optimal
    assert proved.cost_usd <= alone.cost_usd
    assert alone.cost_usd * (1 - alone.solver.gap_found) <= proved.cost_usd * (1 + 1e-9)


@pytest.mark.slow
def test_h5_answer_and_bound():
    """H5 itself (32 jobs, 521 options): 54 x b200 nodes, not proved at the node limit, with
    the optimum at least 94% of it (95.3% measured); the same twice. (54 b200 nodes is the
    optimum on b200 alone, proved by HiGHS in about 30 s without a node limit;
    docs/performance.md.)"""
    jobs, options = h5(32)
    first = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    assert first.nodes == {"h100": 0, "h200": 0, "b200": 54}
    assert not first.solver.optimal and first.solver.gap_found < 0.06     # 4.7% with HiGHS 1.16
    assert _answer(solve_purchase(H5_POOLS, jobs, options, solver="highs")) == _answer(first)


def _problems_solved(monkeypatch: pytest.MonkeyPatch) -> list:
    """The PuLP problems solve._run is given from now on, in order, each solved as before."""
    seen = []
    real_run = solve._run

    def run(prob, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(prob)
        return real_run(prob, *args, **kwargs)

    monkeypatch.setattr(solve, "_run", run)
    return seen


def test_the_model_handed_to_the_solver_is_the_documented_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The purchase ILP of a two-job instance, row by row, against its formulation written out by
    hand from solve_purchase's docstring (docs/performance.md, eighth pass: the rows are built in
    bulk; this pins what the solver is given, names, coefficients and right-hand sides).

    Pools a (8 GPUs a node, $12) and b (4, $8); job j1 from t=0 to 100 on a_n8 (60), b_n4 (90) or
    b_n2 (150, past its deadline: the only term of its deadline row, which is empty for j2);
    j2 from t=50 to 200 on a_n8 (100, does not fit in memory) or a_n16 (40). Pool a's check at
    j1's start holds a subset of the runs of its check at j2's start, and pool b's check at j2's
    start the same runs as at j1's: each is implied and left out (purchase.capacity_checks). Optimum by
    hand: j1 on 1 b node, j2 on 2 a nodes, $32 (j1 on a instead needs 3 a nodes, $36; b_n2
    would need only 2 b GPUs but ends late)."""
    pools = [Pool(gpu="a", gpus_per_node=8, capex_usd=10.0, opex_usd=2.0),
             Pool(gpu="b", gpus_per_node=4, capex_usd=7.0, opex_usd=1.0)]
    jobs = [JobWindow(name="j1", start_s=0.0, deadline_s=100.0), JobWindow(name="j2", start_s=50.0, deadline_s=200.0)]
    options = [JobOption(job="j1", gpu="a", n_gpus=8, duration_s=60.0, key="a_n8"),
               JobOption(job="j1", gpu="b", n_gpus=4, duration_s=90.0, key="b_n4"),
               JobOption(job="j1", gpu="b", n_gpus=2, duration_s=150.0, key="b_n2"),
               JobOption(job="j2", gpu="a", n_gpus=8, duration_s=100.0, key="a_n8", memory_bytes=2, capacity_bytes=1),
               JobOption(job="j2", gpu="a", n_gpus=16, duration_s=40.0, key="a_n16")]
    seen = _problems_solved(monkeypatch)
    sol = solve_purchase(pools, jobs, options)
    # one problem, solved once as the ILP: small (solve.full_ilp_first) and proved optimal, so
    # the relaxation with integer nodes, which only bounds an unproved answer, is not solved
    (prob,) = seen
    cons = prob.constraints
    rows = {c.name: ({v.name: x for v, x in c.items()}, c.sense, -c.constant)
            for c in (cons() if callable(cons) else cons.values())}
    le, eq = -1, 0      # PuLP's senses (LpConstraintLE, LpConstraintEQ)
    r0, r1, late, r2, r3 = "run_0_j1_a_n8", "run_1_j1_b_n4", "run_2_j1_b_n2", "run_3_j2_a_n8", "run_4_j2_a_n16"
    assert rows == {
        "one_option_0_j1": ({r0: 1, r1: 1, late: 1}, eq, 1),
        "deadline_0_j1": ({late: 1}, le, 0),
        "one_option_1_j2": ({r2: 1, r3: 1}, eq, 1),
        "fits_memory_1_j2": ({r2: 1}, eq, 0),
        "deadline_1_j2": ({}, le, 0),
        "gpus_a_at_1_j2": ({r0: 8, r2: 8, r3: 16, "nodes_a": -8}, le, 0),
        "gpus_b_at_0_j1": ({r1: 4, late: 2, "nodes_b": -4}, le, 0),
    }
    assert {v.name: x for v, x in prob.objective.items()} == {"nodes_a": 12.0, "nodes_b": 8.0}
    assert [v.name for v in prob.variables()] == ["nodes_a", "nodes_b", r0, r1, late, r2, r3]
    assert sol.solver.optimal and sol.cost_usd == 32.0 and sol.nodes == {"a": 2, "b": 1}
    assert {j: o.key for j, o in sol.choices.items()} == {"j1": "b_n4", "j2": "a_n16"}


# ------------------------------------------------------------- the deadline rows and HiGHS's options

def test_the_deadline_row_leaves_the_lp_relaxation_no_late_share(monkeypatch):
    """One job due at t=100 on pool a (8 GPUs a node, $1 each): a_n8 ends at 50, a_n1 at 200,
    late. A row over every option's finish time (200 x_late + 50 x_in_time <= 100, the form
    before) let the LP relaxation run a third of the job late on one GPU, for (8 x 2/3 + 1/3) / 8
    = 17/24 of a node (by hand); the row over the late options holds x_late at 0 in the LP too,
    so the LP's bound is the integer optimum, 1 node, and the answer of an ILP past
    LARGE_VARIABLES (here 0) is proved optimal."""
    pools = [Pool(gpu="a", gpus_per_node=8, capex_usd=1.0, opex_usd=0.0)]
    jobs = [JobWindow(name="j", start_s=0.0, deadline_s=100.0)]
    options = [JobOption(job="j", gpu="a", n_gpus=8, duration_s=50.0, key="a_n8"),
               JobOption(job="j", gpu="a", n_gpus=1, duration_s=200.0, key="a_n1")]
    monkeypatch.setattr(solve, "LARGE_VARIABLES", 0)
    sol = solve_purchase(pools, jobs, options, solver="highs")
    assert sol.nodes == {"a": 1} and sol.choices["j"].key == "a_n8"
    # past LARGE_VARIABLES the bound is the relaxation with integer nodes, which rounds 17/24
    # of a node up as well: the answer is proved optimal (no gap said)
    assert sol.solver.optimal and sol.solver.gap_found is None


def _solved_models(monkeypatch, read):  # type: ignore[no-untyped-def]
    """A list that each solve PuLP runs through cost.solve._run appends to, from then on: the
    highspy model it solved and ``read(problem)`` beside it."""
    models = []
    real_run = solve._run

    def run(prob, *args, **kwargs):  # type: ignore[no-untyped-def]
        info = real_run(prob, *args, **kwargs)
        models.append((prob.solverModel, read(prob)))
        return info

    monkeypatch.setattr(solve, "_run", run)
    return models


def _highs_option(model, name):  # type: ignore[no-untyped-def]
    """A HiGHS option's value as the highspy model holds it (highspy 1.16: (status, value))."""
    value = model.getOptionValue(name)
    return value[1] if isinstance(value, tuple) else value


def test_the_purchase_ilp_runs_highs_without_rens_and_restart(monkeypatch):
    """HiGHS solves the purchase ILP with PURCHASE_HIGHS_OPTIONS (no RENS sub-MIP, no root
    restart: docs/performance.md, the purchase ILP) beside one thread and the node limit, read
    back from the highspy model PuLP solved; the one-job ILP keeps HiGHS's defaults."""
    # (highspy model, whether it solved an ILP: every variable integer)
    models = _solved_models(monkeypatch, lambda prob: all(v.cat == pulp.LpInteger for v in prob.variables()))
    jobs, options = h5(8)       # the greedy start does not meet the relaxation's bound: the ILP runs
    assert solve_purchase(H5_POOLS, jobs, options, solver="highs").solver.optimal
    purchase = next(m for m, ilp in models if ilp)      # after its relaxation with integer nodes
    solve.solve_one_job([solve.Option(key="x", gpu="a", n_gpus=1, cost_usd=1.0, time_s=1.0)], solver="highs")
    one_job = models[-1][0]     # one_job: its last of several solves
    assert _highs_option(purchase, "mip_heuristic_run_rens") is False
    assert _highs_option(purchase, "mip_allow_restart") is False
    assert _highs_option(purchase, "threads") == 1 and _highs_option(purchase, "mip_max_nodes") == solve.MIP_MAX_NODES
    assert _highs_option(one_job, "mip_heuristic_run_rens") is True
    assert _highs_option(one_job, "mip_allow_restart") is True


def test_past_large_variables_integer_nodes_prove_what_the_lp_bound_cannot(monkeypatch):
    """Two jobs at once, each on 5 GPUs of one pool of 8-GPU nodes at $1 a node (by hand: 10
    GPUs in use need 2 nodes, $2). The LP relaxation buys 10/8 of a node ($1.25, a gap of 37.5%
    that it said before); the relaxation with integer nodes buys 2, what the greedy start costs,
    so the answer past LARGE_VARIABLES (here 0) is proved optimal, and brute force agrees."""
    pools = [Pool(gpu="a", gpus_per_node=8, capex_usd=1.0, opex_usd=0.0)]
    jobs = [JobWindow(name=n, start_s=0.0, deadline_s=100.0) for n in ("x", "y")]
    options = [JobOption(job=n, gpu="a", n_gpus=5, duration_s=50.0, key="a_n5") for n in ("x", "y")]
    assert brute_purchase(pools, jobs, options, None) == pytest.approx(2.0)
    monkeypatch.setattr(solve, "LARGE_VARIABLES", 0)
    sol = solve_purchase(pools, jobs, options, solver="highs")
    assert sol.nodes == {"a": 2} and sol.solver.optimal and sol.solver.gap_found is None
    assert sol.solver.status == "Optimal" and sol.solver.max_nodes == 0


@pytest.mark.slow
def test_the_relaxation_without_rins_gives_what_highs_defaults_give(monkeypatch):
    """The relaxation with integer nodes runs without HiGHS's RINS sub-MIPs
    (RELAXATION_HIGHS_OPTIONS, read back from the highspy model PuLP solved), and the answer
    it leads to (its bound, the runs it uses, the ILP over them) is the one HiGHS's defaults
    give: 48 of H5's jobs (the relaxation path) and 256 of them, both ways. An option changes
    HiGHS's path, so this holds where checked (these and bench/resources.py's nine purchases,
    b41s), not for every input: another of several equally cheap answers may come out."""
    models = _solved_models(monkeypatch, lambda prob: sum(v.cat == pulp.LpInteger for v in prob.variables()))
    for n_jobs in (48, 256):
        jobs, options = h5(n_jobs)
        without = _answer(solve_purchase(H5_POOLS, jobs, options, solver="highs"))
        relaxation = next(m for m, n_int in models if n_int == len(H5_POOLS))
        assert _highs_option(relaxation, "mip_heuristic_run_rins") is False
        monkeypatch.setattr(solve, "RELAXATION_HIGHS_OPTIONS", {})
        assert _answer(solve_purchase(H5_POOLS, jobs, options, solver="highs")) == without
        monkeypatch.setattr(solve, "RELAXATION_HIGHS_OPTIONS", {"mip_heuristic_run_rins": False})
        models.clear()
