"""The test tiers' referee rule (tests/conftest.py): a missing referee package skips its tests
on a developer's machine and fails them under CI."""

from __future__ import annotations

import pytest
from conftest import require

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
