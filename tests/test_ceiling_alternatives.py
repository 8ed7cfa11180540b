"""Alternatives to the one-number-per-GPU MFU ceiling (bench/ceiling_alternatives.py).

These check the measurement's bookkeeping: that the shape constant reproduces the published trend it
cites, that every rule sets a fold's ceilings, and every term its fitted value, from that fold's
training runs only, what the time terms count, that the study's default is the planner's rule, and
that the committed doc is what the bench writes."""

from __future__ import annotations

import dataclasses
import json
import math
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


def _corrupted(grid, source):
    """The grid with every run of ``source`` predicted 150x too fast."""
    table = {i: (np.full_like(a, 5.0) if grid.by_id(i).source == source else a) for i, a in grid.log_ratio.items()}
    return dataclasses.replace(grid, log_ratio=table)


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in alt.ROWS if r.rule is not None], ids=lambda r: r.name)
def test_rule_reads_only_the_folds_training_runs(grid, row):
    # corrupt every run of one source: the ceilings a fit without that source gives must not move
    fitted = [p for p in grid.cases if p.case["fit"]]
    families = sorted({p.family for p in grid.cases})
    source = "mcore-r0.8"
    train = [p.case["id"] for p in fitted if p.source != source]
    f = oos.fit(grid, train, families, rule=row.rule)
    g = oos.fit(_corrupted(grid, source), train, families, rule=row.rule)
    assert [f.case_ceiling(p) for p in grid.cases] == [g.case_ceiling(p) for p in grid.cases], row.name


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in alt.ROWS if r.terms and not r.tiles], ids=lambda r: r.name)
def test_term_values_of_a_fold_read_only_its_training_runs(grid, row):
    # the held-out source's runs, corrupted, must not move the value its fold picks for a term
    source = "llm-foundry"
    clean, dirty = alt.pick_terms(grid, row), alt.pick_terms(_corrupted(grid, source), row)
    assert clean.combos[clean.by_source[source]] == dirty.combos[dirty.by_source[source]], row.name


def test_launch_term_counts_the_critical_paths_micro_batch_layers():
    # interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2): each stage runs grad-accum micro-batches
    # through its layers and idles (pp - 1) / vp micro-batch slots; 96 layers on pp 8, vp 2, ga 64
    from types import SimpleNamespace

    from planner.layouts.layout import Layout
    probe = SimpleNamespace(model=SimpleNamespace(n_layers=96))
    lay = Layout(dp=1, tp=8, pp=8, vp=2, micro_batch=1, grad_accum=64, seq_len=4096)
    assert alt.launch_s(probe, lay, 1.0) == pytest.approx((64 + 7 / 2) * 12)


def test_straggler_term_is_the_expected_maximum_of_normal_draws():
    # the largest of n standard normal draws exceeds their mean by about sqrt(2 ln n), the leading
    # term of extreme value theory's expectation: 1,024 ranks, 3.72 standard deviations of the step;
    # no wait for one rank
    from types import SimpleNamespace
    lay = SimpleNamespace(data_parallel=1024)
    assert alt.STRAGGLE_DP.feature(None, lay, 10.0) == pytest.approx(10.0 * 3.723, rel=1e-3)
    assert alt.STRAGGLE_DP.feature(None, SimpleNamespace(data_parallel=1), 10.0) == 0.0


@pytest.mark.slow
def test_default_rule_is_the_planners_highest_mfu(grid):
    default, explicit = oos.run_study(grid=grid), oos.run_study(grid=grid, rule=oos.highest_mfu)
    for p in default.fitted:
        assert default.out_of_sample_error(p.case["id"]) == explicit.out_of_sample_error(p.case["id"])


@pytest.mark.slow
def test_doc_is_current(grid):
    # the costly rows (a grid rebuilt with a tile model, or two terms fitted per fold) and the tile
    # models' Megatron-Bridge refits (about 4 minutes each) as the bench last stored them
    # (docs/mfu-ceiling-alternatives.json; `python bench/ceiling_alternatives.py --check` remeasures
    # them); every other row is measured here
    outs = alt.outcomes({"": grid}, stored=True)
    stored = json.loads(alt.STORED.read_text())["outcomes"]
    assert set(stored) == {r.name for r in alt.ROWS if alt.costly(r)}
    text = alt.report(outs, alt.bridge_checks(outs, stored=True))
    assert (ROOT / "docs" / "mfu-ceiling-alternatives.md").read_text() == text, \
        "docs/mfu-ceiling-alternatives.md is stale: run python bench/ceiling_alternatives.py"


@pytest.mark.slow
def test_a_ceiling_on_compute_alone_still_charges_what_the_step_exposes(grid):
    # (5): the compute-bound seconds are part of the step, so a run's compute MFU is at least its
    # MFU; at one ceiling value a step capped on its compute alone is never faster than one capped
    # as a whole, and where the whole step's cap binds it is longer by exactly the seconds the
    # step exposes besides compute (its floor is the same model FLOPs at the same rate)
    cg = alt.compute_bound(grid)
    for p in grid.cases:
        cid = p.case["id"]
        step, busy, mfu = grid.step_s[cid], grid.busy_s[cid], grid.mfu[cid]
        assert (busy <= step * (1 + 1e-12)).all(), cid
        assert cg.reported_mfu(cid) >= grid.reported_mfu(cid) * (1 - 1e-12), cid
        for ceiling in (0.3, 0.465, 0.6):
            assert (cg.capped(cid, ceiling) <= grid.capped(cid, ceiling) + 1e-12).all(), cid
            binds = mfu * step / busy > ceiling
            floor = step * mfu / ceiling
            expected = np.log(step / (floor + step - busy))
            got = cg.capped(cid, ceiling) - grid.log_ratio[cid]
            assert np.allclose(got[binds], expected[binds], rtol=0, atol=1e-12), cid
        assert (cg.capped(cid, math.inf) == grid.log_ratio[cid]).all(), cid
