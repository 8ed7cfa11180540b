"""`plan buy` answers stay the same when the sweep behind them is pruned (issue 32).

Two checks. (1) The pruning rule itself (solve.undominated: a run of a job on more GPUs of
one type that is busy at the same capacity checks as a run on fewer is dropped) leaves the
cheapest purchase unchanged: brute force over every combination of options, with and
without the dropped ones, on random instances. (2) The command's answers on five jobs
files whose purchase ILP is proved optimal, against `plan buy ... --json` written by the
tree before the pruning (commit a307b5b, tests/data/buy_answers/*.json): the same nodes,
capex, opex and total, feasibility and diagnosis, the same jobs, each meeting its deadline
on GPUs the nodes bought hold. Which of several purchases of equal cost a job runs on
is the solver's pick among ties, and fewer options change it (examples/jobs.yaml:
continued-8b on 8 x b200 rather than 24 x h100, both within the same nodes and cost); so
are the solver's model size and time and the search's time, which are not compared.

Regenerate the expected answers (only for a named change of answers):
    python tests/test_buy_answers.py --write
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fast_one
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.solve import JobOption, JobWindow, Pool, busy_at, nodes_needed, undominated

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "buy_answers"
CASES = {
    "example": ["examples/jobs.yaml"],
    "example-h100-b200-budget": ["examples/jobs.yaml", "--gpus", "h100,b200", "--budget", "8M"],
    "staggered": ["tests/data/buy_answers/staggered.yaml"],
    "staggered-over-budget": ["tests/data/buy_answers/staggered.yaml", "--budget", "1M"],
    "back-to-back": ["tests/data/buy_answers/back_to_back.yaml"],
}
VOLATILE_SOLVER = ("solve_s", "n_variables", "n_constraints", "n_candidates", "constraint_names", "gap_found")
CHOICE = ("gpu", "n_gpus", "layout", "finish_s", "train_time_s", "gpu_hours", "step_time_s", "mfu")


def answer(args: list[str]) -> dict:
    """`plan buy ARGS --json` without what reads the clock or the machine."""
    r = subprocess.run([sys.executable, "-m", "planner", "buy", *args, "--json"], capture_output=True, text=True,
                       cwd=ROOT, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert r.returncode in (0, 2), r.stderr
    d = json.loads(r.stdout)
    d.pop("search_s", None)
    d.pop("stale_prices", None)     # reads today's date
    for k in VOLATILE_SOLVER:
        d["solver"].pop(k, None)
    return d


def without_choices(d: dict) -> dict:
    return {**d, "jobs": [{k: v for k, v in j.items() if k not in CHOICE} for j in d["jobs"]]}


@pytest.mark.parametrize("name", fast_one(sorted(CASES), "example"))   # the fast tier: one jobs file
def test_buy_answer_unchanged(name: str) -> None:
    expected = json.loads((DATA / f"{name}.json").read_text())
    got = answer(CASES[name])
    assert without_choices(got) == without_choices(expected)
    # each job within its window, and at every job's start the GPUs in use fit in the nodes bought
    for j in got["jobs"]:
        assert j["finish_s"] <= j["deadline_s"]
    for gpu, bought in got["nodes"].items():
        for t in got["jobs"]:
            used = sum(j["n_gpus"] for j in got["jobs"] if j["gpu"] == gpu
                       and busy_at(j["start_s"], j["finish_s"] - j["start_s"], t["start_s"]))
            assert used <= bought["gpus"], (gpu, t["name"])


# ------------------------------------------------------------- the pruning rule, exactly

@st.composite
def instances(draw):
    """Pools, jobs, and per job and pool runs on rising GPU counts (all fitting in memory)."""
    pools = [Pool(gpu=f"g{i}", gpus_per_node=draw(st.sampled_from([1, 2, 4])),
                  capex_usd=draw(st.integers(1, 20)) * 1000.0, opex_usd=draw(st.integers(0, 5)) * 100.0)
             for i in range(draw(st.integers(1, 2)))]
    jobs, runs = [], {}
    for j in range(draw(st.integers(1, 3))):
        start = float(draw(st.integers(0, 12)))
        jobs.append(JobWindow(name=f"j{j}", start_s=start, deadline_s=start + draw(st.integers(2, 20))))
        for p in pools:
            counts = sorted(set(draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))))
            runs[f"j{j}", p.gpu] = [(n, float(draw(st.integers(1, 24)))) for n in counts]
    return pools, jobs, runs


def cheapest(pools, jobs, options):
    """The least cost over every combination of options that meet their deadlines (brute force)."""
    per_job = [[o for o in options if o.job == j.name and j.start_s + o.duration_s <= j.deadline_s] for j in jobs]
    usd = {p.gpu: p.node_usd for p in pools}
    best = math.inf
    for combo in itertools.product(*per_job):
        need = nodes_needed(pools, jobs, {j.name: o for j, o in zip(jobs, combo)})
        best = min(best, sum(usd[g] * n for g, n in need.items()))
    return best


@pytest.mark.slow   # 300 examples; the fast tier keeps test_buy_ilp's brute-force equality
@settings(max_examples=300, deadline=None)
@given(instances())
def test_dropping_dominated_runs_keeps_the_cheapest_purchase(instance):
    pools, jobs, runs = instance
    starts = sorted({j.start_s for j in jobs})
    every, kept = [], []
    for j in jobs:
        for p in pools:
            rs = runs[j.name, p.gpu]
            opts = [JobOption(job=j.name, gpu=p.gpu, n_gpus=n, duration_s=d, key=f"{p.gpu}_n{n}") for n, d in rs]
            every += opts
            kept += [opts[i] for i in undominated(j.start_s, j.deadline_s, rs, starts)]
    assert cheapest(pools, jobs, kept) == cheapest(pools, jobs, every)


@pytest.mark.slow
def test_the_sweeps_stop_keeps_every_option_the_filter_keeps(monkeypatch):
    """plan_purchase stops a job's sweep once its fastest run leaves no other job's start
    inside it (solve.shorter_run_may_help); sweeping every count instead and filtering
    (solve.undominated) gives the same options and purchase."""
    import planner.cost.buy as buy
    from planner.cost.jobs import load_jobs
    from planner.cost.prices import load_prices

    jobs = load_jobs(DATA / "staggered.yaml")

    def run():
        r = buy.plan_purchase(jobs, list(jobs.gpus), load_prices(None), jobs.horizon_s)
        return r.n_options, r.tco_usd, r.nodes

    stopped = run()
    monkeypatch.setattr(buy, "shorter_run_may_help", lambda *a: True)
    assert run() == stopped



@pytest.mark.slow
def test_timing_stopped_searches_ahead_changes_no_answer(monkeypatch):
    """The first sweep times a stopped job's GPU type on the counts its node size is sized on
    anyway, where the second sweep will go on (cost.plan.sweep_counts_until's ``more``): the
    same options, purchase and choices as without it, and no more sizings (issue 32: 391
    sizings of the 256-job file became 334)."""
    import planner.cost.buy as buy
    import planner.search.sweep as sweep
    from planner.cost.jobs import load_jobs
    from planner.cost.prices import load_prices

    jobs = load_jobs(DATA / "staggered.yaml")
    sized = []
    batch = sweep.memory_batch
    monkeypatch.setattr(sweep, "memory_batch", lambda *a: sized.append(1) or batch(*a))

    def run():
        sized.clear()
        sweep._LAST_SIZED.clear()
        r = buy.plan_purchase(jobs, list(jobs.gpus), load_prices(None), jobs.horizon_s)
        return (r.n_options, r.tco_usd, r.nodes, [(p.name, p.gpu.name, p.candidate.layout) for p in r.plans]), \
            len(sized)

    ahead, n_ahead = run()
    until = buy.sweep_counts_until
    monkeypatch.setattr(buy, "sweep_counts_until", lambda tasks, more=None: until(tasks))
    plain, n_plain = run()
    assert ahead == plain and n_ahead < n_plain        # 33 against 38 sizings

if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for name, args in CASES.items():
        (DATA / f"{name}.json").write_text(json.dumps(answer(args), indent=1, sort_keys=True) + "\n")
