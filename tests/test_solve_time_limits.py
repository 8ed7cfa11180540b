"""The purchase ILP's time limits are backstops whose firing is said (issue 32, b41s): a solve
stops at its node limit (a count, the same at any load), or, where a time limit ends it first,
the answer says which limit did, since that answer may depend on the machine's load or speed.
The CPU-time limit counts the process's CPU (time.process_time), which waiting for a core does
not spend; HiGHS's own time limit counts wall time and is the last resort (WALL_LIMIT_S)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from test_buy_ilp import H5_POOLS, h5

import planner.cost.solve as solve
from planner.cost.quiet import cpu_time_interrupt
from planner.cost.solve import solve_purchase
from planner.report.costs import buy_solver_lines
from planner.report.text import buy_quiet_line


def _said(sol: solve.PurchaseSolution) -> tuple[str, list[str]]:
    """What `plan buy` prints of ``sol``: its --quiet line and the solver's lines."""
    r = SimpleNamespace(feasible=True, nodes=sol.nodes, tco_usd=sol.cost_usd, capex_usd=0.0, opex_usd=0.0,
                        solver=sol.solver, lines=(), n_options=0, search_s=0.0)
    return buy_quiet_line(r), buy_solver_lines(r)


def test_the_cpu_time_interrupt_counts_cpu_not_waiting() -> None:
    """Sleeping (a process waiting for a core spends no CPU) does not reach the limit; spending
    the CPU does (the callback's fourth argument is HiGHS's HighsCallbackInput)."""
    interrupt = cpu_time_interrupt(0.05)
    data_in = SimpleNamespace(user_interrupt=False)
    time.sleep(0.2)
    interrupt(0, "", None, data_in, None)
    assert data_in.user_interrupt is False
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    interrupt(0, "", None, data_in, None)
    assert data_in.user_interrupt is True


def test_a_node_limited_stop_is_not_a_time_limited_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """H5 cut to 16 jobs stopped after 5 nodes (HiGHS proves it in about 0.6 s without a node
    limit): the node limit, as before, and no time limit said."""
    jobs, options = h5(16)
    monkeypatch.setattr(solve, "MIP_MAX_NODES", 5)
    sol = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    assert not sol.solver.optimal and sol.solver.stopped_by is None
    assert sol.solver.as_dict()["max_nodes"] == 5 and "stopped_by" not in sol.solver.as_dict()
    quiet, lines = _said(sol)
    assert "ended its search" not in quiet and not any("stopped by" in x for x in lines)


@pytest.mark.parametrize(("limit", "said"), [("WALL_LIMIT_S", "wall-clock limit"),
                                             ("TIME_LIMIT_S", "CPU-time limit")])
def test_a_time_limited_stop_is_said(monkeypatch: pytest.MonkeyPatch, limit: str, said: str) -> None:
    """The same ILP under a time limit far below its work (0.6 s of CPU to its proof): the
    solve ends at that limit, the answer is a feasible purchase (the greedy start's where the
    solver found none), and the record, the JSON and both printed forms say which limit ended
    it, not the node limit."""
    jobs, options = h5(16)
    if limit == "WALL_LIMIT_S":
        monkeypatch.setattr(solve, "WALL_LIMIT_S", 0.001)
        sol = solve_purchase(H5_POOLS, jobs, options, solver="highs")
    else:
        sol = solve_purchase(H5_POOLS, jobs, options, solver="highs", time_limit_s=0.0)
    assert sol.solver.stopped_by == said
    assert sol.cost_usd is not None and sum(sol.nodes.values()) > 0 and len(sol.choices) == 16
    out = sol.solver.as_dict()
    assert out["stopped_by"] == said and "max_nodes" not in out
    quiet, lines = _said(sol)
    assert f"the solver's {said} ended its search" in quiet
    assert any(x.startswith(f"stopped by its {said}") for x in lines)


@pytest.mark.slow
def test_a_starved_process_gets_the_node_limited_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that waits for a core (simulated: HiGHS's callback sleeps 20 ms a call, so the
    wall time passes while the CPU time does not) under a 1 s limit gets the same answer as
    alone, stopped by the node limit (H5 cut to 16 jobs, 5 nodes: 124 calls in the ILP, 14 in
    its relaxation, about 0.6 s of CPU in all); under a wall-clock limit of the same 1 s (the
    kind HiGHS had before) the wait ends its search, and the answer says so. About 5 s."""
    jobs, options = h5(16)
    monkeypatch.setattr(solve, "MIP_MAX_NODES", 5)
    alone = solve_purchase(H5_POOLS, jobs, options, solver="highs", time_limit_s=1.0)
    assert alone.solver.stopped_by is None and alone.solver.max_nodes == 5
    real = solve.cpu_time_interrupt

    def starved(limit_s: float):  # type: ignore[no-untyped-def]
        interrupt = real(limit_s)

        def call(*args):  # type: ignore[no-untyped-def]
            time.sleep(0.02)
            interrupt(*args)
        return call

    monkeypatch.setattr(solve, "cpu_time_interrupt", starved)
    t0 = time.perf_counter()
    waited = solve_purchase(H5_POOLS, jobs, options, solver="highs", time_limit_s=1.0)
    assert time.perf_counter() - t0 > 1.0       # the wall time passed the limit
    assert waited.solver.stopped_by is None
    assert (waited.cost_usd, waited.nodes, waited.choices, waited.solver.gap_found) == (
        alone.cost_usd, alone.nodes, alone.choices, alone.solver.gap_found)
    monkeypatch.setattr(solve, "WALL_LIMIT_S", 1.0)
    assert solve_purchase(H5_POOLS, jobs, options, solver="highs", time_limit_s=1.0).solver.stopped_by == \
        "wall-clock limit"
