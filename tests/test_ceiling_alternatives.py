"""Alternatives to the one-number-per-GPU MFU ceiling (bench/ceiling_alternatives.py).

These check the measurement's bookkeeping: that the shape constant reproduces the published trend it
cites, that every rule sets a fold's ceilings from that fold's training runs only, that the study's
default is the planner's rule, and that the committed doc is what the bench writes."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.hardware.gpus import get_gpu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import ceiling_alternatives as alt  # noqa: E402  (bench/ is not a package)
import out_of_sample as oos  # noqa: E402


def test_shape_constant_reproduces_sc21_table1_trend():
    # Narayanan et al. 2021 (SC21), Table 1: 137 TFLOP/s per A100 at hidden 2304 (1.7B), 163 at 25600 (1T)
    c = alt.sc21_half_dim()
    assert (2304 / (2304 + c)) / (25600 / (25600 + c)) == pytest.approx(137 / 163, rel=1e-9)
    assert 300 < c < 700


def test_ridge_point_is_the_data_sheet_ratio():
    # H100 SXM data sheet: 989 TFLOP/s dense BF16 over 3.35 TB/s HBM3: about 295 FLOPs per byte
    assert alt.ridge_dim(get_gpu("h100")) == pytest.approx(989e12 / 3.35e12, rel=0.01)


@pytest.fixture(scope="module")
def grid():
    return oos.build_grid(oos.load_all())


@pytest.mark.slow
@pytest.mark.parametrize("name,rule", [r for r in alt.RULES if r[1] is not None])
def test_rule_reads_only_the_folds_training_runs(grid, name, rule):
    # corrupt every run of one source: the ceilings a fit without that source gives must not move
    fitted = [p for p in grid.cases if p.case["fit"]]
    families = sorted({p.family for p in grid.cases})
    source = "mcore-r0.8"
    train = [p.case["id"] for p in fitted if p.source != source]
    table = {i: (np.full_like(a, 5.0) if grid.by_id(i).source == source else a) for i, a in grid.log_ratio.items()}
    corrupted = dataclasses.replace(grid, log_ratio=table)
    f, g = oos.fit(grid, train, families, rule=rule), oos.fit(corrupted, train, families, rule=rule)
    assert [f.case_ceiling(p) for p in grid.cases] == [g.case_ceiling(p) for p in grid.cases], name


@pytest.mark.slow
def test_default_rule_is_the_planners_highest_mfu(grid):
    default, explicit = oos.run_study(grid=grid), oos.run_study(grid=grid, rule=oos.highest_mfu)
    for p in default.fitted:
        assert default.out_of_sample_error(p.case["id"]) == explicit.out_of_sample_error(p.case["id"])


@pytest.mark.slow
def test_doc_is_current(grid):
    text = alt.report([alt.measure(grid, name, rule) for name, rule in alt.RULES])
    assert (ROOT / "docs" / "mfu-ceiling-alternatives.md").read_text() == text, \
        "docs/mfu-ceiling-alternatives.md is stale: run python bench/ceiling_alternatives.py"
