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
