"""The test tiers (tests/conftest.py): a missing referee package skips its tests on a
developer's machine and fails them under CI; fast_one keeps one case of a parametrization in
the fast tier and the rest in the full suite, under the same ids; plan_in_process answers as
``python -m planner`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import fast_one, plan_in_process, require

MISSING = "planner_no_such_referee_package"


def test_a_missing_package_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI: "):
        require(MISSING)


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_a_missing_package_skips_outside_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception):
        require(MISSING)


def test_a_present_package_is_returned() -> None:
    assert require("json").dumps([1]) == "[1]"


def test_no_test_skips_a_missing_package_silently() -> None:
    """Every test asks for an optional package through require(), which fails under CI; a
    pytest.importorskip would skip there too."""
    from pathlib import Path

    here = Path(__file__).parent
    calls = "pytest.importorskip" + "("
    offenders = [p.name for p in sorted(here.glob("*.py")) if p.name != "conftest.py" and calls in p.read_text()]
    assert offenders == []


def test_fast_one_marks_every_other_case_slow_and_keeps_the_values() -> None:
    cases = fast_one(["a", "b", "c"], "b")
    assert cases[1] == "b"
    for case, value in ((cases[0], "a"), (cases[2], "c")):
        assert case.values == (value,) and [m.name for m in case.marks] == ["slow"]
    spread = fast_one([("x", 1), ("y", 2)], "y", unpack=True)     # matched by the first element
    assert spread[1] == ("y", 2) and spread[0].values == ("x", 1)
    assert fast_one([("x", 1), ("y", 2)], ("x", 1), unpack=True)[0] == ("x", 1)


@pytest.mark.parametrize("args", [
    ["--model", "8bb", "--gpus", "h100"],                               # a user error: exit 2, one line
    ["--model", "gpt2", "--gpus", "h100", "--dp", "3", "--tp", "2"],    # does not fit: exit 2, the report
    ["--model", "gpt2", "--gpus", "h100", "--n-gpus", "1", "-q"],       # an answer: exit 0
])
def test_plan_in_process_answers_as_the_subprocess_does(args: list[str]) -> None:
    """The in-process CLI that the post-training, RL and vision tests call gives the exit
    status, stdout and stderr of ``python -m planner`` (a fresh interpreter, planner/__main__.py)."""
    width = {"COLUMNS": "100"}   # unset, a child of pytest drew 80 columns and the in-process call 100
    got = plan_in_process(*args, env=width)
    ran = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True,
                         env={**os.environ, **width})
    assert (got.returncode, got.stdout, got.stderr) == (ran.returncode, ran.stdout, ran.stderr)


def test_one_file_runs_in_process_and_a_folder_or_files_on_workers(tmp_path: Path) -> None:
    """conftest.pytest_cmdline_main's rule: a run naming one test file (node ids inside it
    included) stays in process; a folder (the README's commands name none: testpaths is
    tests/) or several files start pytest-xdist's workers."""
    from conftest import _files_named

    one, two = tmp_path / "test_a.py", tmp_path / "test_b.py"
    one.write_text("")
    two.write_text("")
    assert _files_named([str(tmp_path)]) is None
    assert _files_named([str(one), f"{one}::test_x", f"{one}::test_y[1]"]) == 1
    assert _files_named([str(one), str(two)]) == 2
