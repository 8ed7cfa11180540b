"""The test tiers and the outside referees.

Tiers (markers registered in pyproject.toml):

- ``slow``: a test that takes seconds (a fake-tensor measurement, a search over many GPU
  counts, a bench script's check). ``python -m pytest -m "not slow"`` is the fast tier for
  development; ``python -m pytest`` (CI, the README's command) runs everything. A concern
  keeps one representative in the fast tier (fast_one: one case of a parametrization over
  families or files; a slow test names its fast stand-in where it is another test's), and a
  test of the CLI's answer runs it in process (plan_in_process) rather than in a fresh
  interpreter.
- ``referee``: a test that checks the planner against an outside package's own code
  (transformers, DeepSpeed, megatron-core, torchtitan, PEFT, accelerate, bitsandbytes, TRL).
  Marked here, at collection, for every test of a module that asks for one (require()).

A referee package that is missing skips its tests on a developer's machine, and FAILS them
under CI (the CI environment variable set, as CI services and .ci/run set it): a referee that
silently skips checks nothing.

Workers: a run of more than one test file (the README's two commands, a folder, several
files) runs on pytest-xdist's workers, one per core (``-n auto``; pytest_cmdline_main below),
with ``--dist worksteal``: each worker starts on its half of the tests in collection order (a
module's tests mostly on one worker: its imports and module fixtures paid once) and takes work
from the other when it runs out (the fast tier measured 155 s of CPU in all against 166 s with
``--dist load``, on a loaded machine). A run of one file (``python -m pytest tests/test_x.py
-k y``) or with ``-s`` stays in this process, where a worker's start would cost more than it
saves. ``-n 0`` or ``-p no:xdist`` runs serially; ``-n N`` picks the count.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# the outside packages whose own code referees the planner's numbers (pyproject's test extra)
REFEREES = ("transformers", "deepspeed", "megatron", "torchtitan", "peft", "accelerate", "bitsandbytes", "trl")
_REQUIRE = re.compile(r"""require\(\s*["']([A-Za-z0-9_.]+)["']""")


def in_ci() -> bool:
    """True under CI (CI set to anything but empty, 0 or false)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(module: str, reason: str | None = None) -> ModuleType:
    """Import ``module`` for a test: skip the test where it is missing, or fail it under CI
    (in_ci), where every package of the test extra is installed and a skip would hide a
    referee that checks nothing. Called where pytest.importorskip would be."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        why = reason or f"{module} is not installed ({e})"
        if in_ci():
            pytest.fail(f"CI: {why}; CI installs the test extra (pip install -e '.[test]'), so a missing "
                        f"package is an error there, not a skip", pytrace=False)
        pytest.skip(why, allow_module_level=True)
        raise   # unreachable: pytest.skip raises


def fast_one(cases: Iterable[Any], *fast: Any, unpack: bool = False) -> list[Any]:
    """A parametrization's cases with every case but the ``fast`` ones marked ``slow``: the fast
    tier keeps a representative of the concern, the full suite (CI) runs every case, under the
    same test ids. A case is fast when it, or its first element, equals one of ``fast``.
    ``unpack``: the cases are tuples spread over several argument names."""
    out: list[Any] = []
    for case in cases:
        head = case[0] if isinstance(case, tuple) and case else case
        if case in fast or head in fast:
            out.append(case)
        else:
            out.append(pytest.param(*case, marks=pytest.mark.slow) if unpack else
                       pytest.param(case, marks=pytest.mark.slow))
    return out


def plan_in_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m planner ARGS`` run in this process (click's CliRunner), as the subprocess
    would answer it: exit status, stdout, stderr. For a test that checks the CLI's answer, not
    the process (a fresh interpreter costs a second on a busy 2-core machine); a test about the
    process itself (what it imports, a closed stdout) keeps its subprocess. ``env`` is set on
    top of this process's environment for the call, as ``env={**os.environ, ...}`` would.
    Set COLUMNS where the test reads wrapped text: without it, a subprocess of pytest drew
    80 columns and this call 100 (tests/test_tiers.py)."""
    from click.testing import CliRunner

    from planner.cli.main import cli

    r = CliRunner().invoke(cli, list(args), prog_name="plan", env=env)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(["plan", *args], r.exit_code, r.stdout, r.stderr)


# the most workers a default run starts: each imports torch, transformers, DeepSpeed and
# megatron-core (seen on 2 cores, sampled every 2 s: the fast tier peaked at 2.1 GB of RSS for
# the controller and two workers, the whole suite at 9.2 GB with the measurement subprocesses, of 24 GiB)
MAX_WORKERS = 4


def _files_named(args: list[str]) -> int | None:
    """How many test files a run names, or None where it names a folder (a whole tier)."""
    files = set()
    for arg in args:
        path = Path(arg.split("::")[0])
        if not path.is_file():
            return None
        files.add(path.resolve())
    return len(files)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run on pytest-xdist's workers (``-n auto --dist worksteal``, at most MAX_WORKERS) unless
    the command says how (``-n``, ``--dist``, ``-p no:xdist``, ``--pdb``) or names one test
    file. Here, not in pyproject's addopts: there ``-n`` would break ``-p no:xdist`` and a run
    without the plugin installed. Runs before xdist's own pytest_cmdline_main (tryfirst, and an
    initial conftest registers after the plugin), which turns ``auto`` into a count."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    opt = config.option
    if (opt.numprocesses is not None or opt.dist != "no" or opt.tx or opt.usepdb or opt.collectonly
            or opt.capture == "no"):      # -s: a worker's output would not reach the terminal
        return
    named = _files_named([str(a) for a in config.args])
    if named is not None and named <= 1:
        return
    opt.numprocesses = "auto"
    opt.maxprocesses = opt.maxprocesses or MAX_WORKERS
    opt.dist = "worksteal"


# what a worker's environment must hold as the controller's: an xdist worker (pytest-xdist
# 3.8, execnet 2.1) starts with COLUMNS=80 and LINES=24 that the controller does not have (seen
# by a test printing os.environ), and the report's width follows COLUMNS: tests that read
# wrapped text expect the controller's (unset: 100 columns; tests/test_errors.py, test_intervals.py)
_TERMINAL_ENV = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: hand each worker the controller's terminal variables."""
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in _TERMINAL_ENV}


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker: the controller's COLUMNS and LINES, set or unset (_TERMINAL_ENV)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    for key, value in workerinput.get("terminal_env", {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _referees_of(path: str, cache: dict[str, bool]) -> bool:
    if path not in cache:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = ""
        cache[path] = (any(name.split(".")[0] in REFEREES for name in _REQUIRE.findall(text))
                       or "from saved_tensors import" in text)    # it builds transformers' models
    return cache[path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``referee`` every test of a module that requires a referee package."""
    cache: dict[str, bool] = {}
    for item in items:
        if _referees_of(str(item.path), cache):
            item.add_marker(pytest.mark.referee)
