"""The test tiers and the outside referees.

Tiers (markers registered in pyproject.toml):

- ``slow``: a test that takes seconds (a fake-tensor measurement, a search over many GPU
  counts, a bench script's check). ``python -m pytest -m "not slow"`` is the fast tier for
  development; ``python -m pytest`` (CI, the README's command) runs everything.
- ``referee``: a test that checks the planner against an outside package's own code
  (transformers, DeepSpeed, megatron-core, torchtitan, PEFT, accelerate, bitsandbytes, TRL).
  Marked here, at collection, for every test of a module that asks for one (require()).

A referee package that is missing skips its tests on a developer's machine, and FAILS them
under CI (the CI environment variable set, as CI services and .ci/run set it): a referee that
silently skips checks nothing.
"""

from __future__ import annotations

import importlib
import os
import re
from types import ModuleType

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
