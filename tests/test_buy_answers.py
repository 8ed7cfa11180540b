"""`plan buy` answers stay the same when the sweep behind them is pruned (issue 32).

The expected answers under tests/data/buy_answers/ were written by `plan buy ... --json` on
the tree before the pruning of dominated GPU counts (commit a307b5b), on jobs files whose
purchase ILP is proved optimal: the nodes, costs, each job's GPU type, count, layout, times
and the solver's status must stay as they were. What the pruning may change is left out of
the comparison and named: the solver's time and model size (variables, constraints and the
count of job options, `n_candidates`) and the search's time.

Regenerate (only for a named change of answers): python tests/test_buy_answers.py --write
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def answer(args: list[str]) -> dict:
    """`plan buy ARGS --json` without what may change with the model's size or the machine."""
    r = subprocess.run([sys.executable, "-m", "planner", "buy", *args, "--json"], capture_output=True, text=True,
                       cwd=ROOT, env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert r.returncode in (0, 2), r.stderr
    d = json.loads(r.stdout)
    d.pop("search_s", None)
    d.pop("stale_prices", None)     # reads today's date
    for k in VOLATILE_SOLVER:
        d["solver"].pop(k, None)
    return d


@pytest.mark.parametrize("name", sorted(CASES))
def test_buy_answer_unchanged(name: str) -> None:
    expected = json.loads((DATA / f"{name}.json").read_text())
    assert answer(CASES[name]) == expected


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for name, args in CASES.items():
        (DATA / f"{name}.json").write_text(json.dumps(answer(args), indent=1, sort_keys=True) + "\n")
