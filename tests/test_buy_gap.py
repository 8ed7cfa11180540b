"""What `plan buy` says when its purchase ILP is not proved optimal, and identical jobs
(a symmetric ILP) proved optimal without aggregating them (issue 32, H5)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.cost.solve import JobOption, JobWindow, Pool, SolverInfo, solve_purchase
from planner.report.text import buy_quiet_line

DAY_S = 86400.0
# H5's options of one Llama 3.1 70B job on b200 (GPUs, days), from `plan buy` on 32 jobs of
# 100B tokens, 30-day deadlines (bench/resources.py's buy32-70b): the instance's shape, not
# a figure under test
B200_RUNS = ((24, 22.76), (32, 17.07), (48, 11.38), (64, 8.54), (96, 5.69), (128, 4.27), (256, 2.13), (512, 1.07))


def _solver(optimal: bool, gap_found: float | None) -> SolverInfo:
    return SolverInfo(name="HiGHS", status="Optimal", optimal=optimal, solve_s=20.0, n_variables=524,
                      n_constraints=156, time_limit_s=20.0, gap_rel=1e-6, gap_found=gap_found)


def _result(solver: SolverInfo) -> SimpleNamespace:
    return SimpleNamespace(feasible=True, nodes={"h100": 0, "b200": 54}, tco_usd=28.758e6, capex_usd=27.81e6,
                           opex_usd=0.948e6, solver=solver, lines=())


@pytest.mark.parametrize(("optimal", "gap", "tail"), [
    (True, None, "opex $948k)"),
    (False, 0.046, "opex $948k); not proved optimal: the optimum costs at least 95.4% of it"),
    (False, None, "opex $948k); not proved optimal"),       # CBC, or stopped before any solution
])
def test_quiet_line_says_an_unproved_purchase(optimal: bool, gap: float | None, tail: str) -> None:
    # the full output and --json said it already (report.costs.buy_solver_lines, gap_found);
    # the one line claimed the purchase without it
    line = buy_quiet_line(_result(_solver(optimal, gap)))
    assert line.startswith("buy 54 x b200 nodes: total $28.8M")
    assert line.endswith(tail)


def test_identical_jobs_are_proved_optimal_without_aggregation() -> None:
    """32 identical jobs (H5's options, all starting on day 0) and a pricier second pool: every
    job runs at the first check, so the optimum is each on its fewest GPUs that meet the
    deadline, 32 x 24 = 768 b200 GPUs, 96 nodes (the h200 pool's cheapest run, 48 GPUs,
    costs more per job: 6 nodes x $327.5k against 3 x $532.6k). HiGHS's symmetry handling
    proves it well inside a 5 s limit (0.06 s here at load 7 on 2 cores), so identical jobs
    need no aggregation into one variable with a count."""
    pools = [Pool(gpu="b200", gpus_per_node=8, capex_usd=515_000, opex_usd=17_560.8576),
             Pool(gpu="h200", gpus_per_node=8, capex_usd=315_000, opex_usd=12_525.9264)]
    jobs = [JobWindow(name=f"j{i}", start_s=0.0, deadline_s=30 * DAY_S) for i in range(32)]
    opts = [JobOption(job=j.name, gpu="b200", n_gpus=n, duration_s=d * DAY_S, key=f"b200_n{n}")
            for j in jobs for n, d in B200_RUNS]
    opts += [JobOption(job=j.name, gpu="h200", n_gpus=n, duration_s=d * DAY_S, key=f"h200_n{n}")
             for j in jobs for n, d in ((48, 23.54), (96, 11.77), (512, 2.21))]
    sol = solve_purchase(pools, jobs, opts, solver="highs", time_limit_s=5.0)
    assert sol.solver.optimal
    assert sol.nodes == {"b200": 96, "h200": 0}
    assert all(c.n_gpus == 24 for c in sol.choices.values())
