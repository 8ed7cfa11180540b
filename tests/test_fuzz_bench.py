"""bench/fuzz.py in CI (issue 32): a short fixed-seed run over every kind of input the fuzzer
makes (options; config.json, GPU, topology, jobs, prices and calibration files; training logs
for `plan calibrate`; names holding control characters) keeps the README's contract: exit 0,
or 2 with one line, never exit 1 or a traceback, and no temporary file left behind.
`python bench/fuzz.py -n 5000 --seed 7` is the long hunt."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import fuzz  # noqa: E402 (bench/ is no package)


@pytest.mark.slow
def test_a_short_fixed_seed_fuzz_keeps_the_contract():
    t0 = time.process_time()            # CPU time (in process): holds beside other test workers
    counts, ran, bad = fuzz.fuzz(160, seed=11)
    assert bad == [], "\n".join(bad)
    assert set(ran) == {"options", *fuzz.KINDS}, ran           # every input kind was tried
    assert counts["exit 0"] and counts["exit 2"], counts
    assert time.process_time() - t0 < 60


def test_the_fuzzer_reports_a_broken_call(monkeypatch):
    """The verdict itself: an internal error (exit 1) is reported, not counted as a pass."""
    from planner import api

    def broken(*a, **k):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(api, "plan", broken)
    counts, _, bad = fuzz.fuzz(6, seed=11, kinds=("config",))
    assert counts["broken"] and any("planted" in b for b in bad), counts


@pytest.mark.slow
def test_names_with_control_characters_are_refused_in_one_line():
    counts, ran, bad = fuzz.fuzz(24, seed=3, kinds=("name",))
    assert bad == [] and ran["name"] == 12 and counts["exit 2"] >= 12, (counts, bad)
