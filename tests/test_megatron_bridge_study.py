"""The Megatron-Bridge study (bench/megatron_bridge.py, docs/megatron-bridge.md) and the terms it
rests on: the doc is current, every latest configuration is counted, Transformer Engine's FP8
recipes cast no weights per micro-batch, and Blackwell's exponential unit bounds attention by head
dim."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.load import load_model
from planner.timing.efficiency import MEGATRON_BRIDGE, Efficiency
from planner.timing.kernels import attention_rate, fp8_cast_bytes, rates
from planner.training.fp8 import recipe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def test_doc_is_current():
    """Predicting every row with the stored fits reproduces docs/megatron-bridge.md (about 10 s)."""
    import megatron_bridge

    assert megatron_bridge.main(["--check"]) == 0


def test_every_latest_configuration_is_counted():
    import megatron_bridge_rows as mbr

    data = json.loads((ROOT / "docs" / "megatron-bridge.json").read_text())
    latest = [r for r in mbr.load_rows() if r.latest]
    assert data["n_latest"] == len(latest)
    assert data["n_predicted"] + len(data["left_out"]) == len(latest)
    assert {r["id"] for r in data["rows"]} | {r["id"] for r in data["left_out"]} == {r.id for r in latest}
    for r in data["left_out"]:
        assert r["reason"], r["id"]


def test_shipped_fit_is_the_in_sample_fit():
    """--stack megatron plans with the values the study fitted on every row."""
    data = json.loads((ROOT / "docs" / "megatron-bridge.json").read_text())
    for name, value in data["fit"]["in_sample"].items():
        assert getattr(MEGATRON_BRIDGE, name) == pytest.approx(value)


def test_transformer_engine_fp8_casts_no_weights_per_micro_batch():
    """TE caches each fp8 weight over the micro-batches of a step (is_first_microbatch; the
    recipe's fp8_weight_copy_bytes), torchao's float8 casts every weight on every call
    (float8_linear.py): with no tokens, only torchao's casts move bytes."""
    m = load_model("llama3.1-8b")
    key = Layout(micro_batch=1, seq_len=4096)
    assert fp8_cast_bytes(m, key, recipe("tensorwise", "megatron"), 0.0) == (0.0, 0.0)
    assert fp8_cast_bytes(m, key, recipe("mxfp8", "megatron"), 0.0) == (0.0, 0.0)
    assert min(fp8_cast_bytes(m, key, recipe("tensorwise", "torchtitan"), 0.0)) > 0


@pytest.mark.parametrize("gpu,head_dim,share", [("b200", 64, 0.5), ("b200", 128, 1.0), ("gb200", 64, 0.5),
                                                ("h100", 64, 1.0), ("a100", 64, 1.0)])
def test_exponential_unit_bounds_attention(gpu, head_dim, share):
    """One exp per score: Blackwell issues 16 exp2 per SM per clock against 8,192 dense BF16 FLOPs
    (Zadouri et al. 2026, FlashAttention-4, Sec. 2), so a forward with 4 x 64 FLOPs per score runs
    at half the rate of its tensor cores; Hopper's 4,096 FLOPs per clock leave head dim 64 unbound."""
    g = get_gpu(gpu)
    r = rates(g, "bf16", Efficiency())
    assert attention_rate(g, r, head_dim, head_dim) == pytest.approx(share * r.flash_flops_per_s)


def test_megatron_plans_read_their_regime_interval():
    """A --stack megatron plan's 80% step-time interval is its regime's, measured leaving one model
    family out on the Megatron-Bridge runs (planner/timing/megatron_bridge_intervals.json); other
    plans keep the published-runs study's."""
    from dataclasses import replace

    from planner.timing.intervals import regime_data, regime_of, time_band
    from planner.training.setup import TrainingSetup

    m, gpu = load_model("llama3.1-70b"), get_gpu("gb200")
    setup = TrainingSetup(stack="megatron", precision="fp8", fp8_recipe="mxfp8")
    regime = regime_of(m, setup, gpu)
    assert regime == "low-precision/dense/blackwell"
    row = regime_data()["regimes"][regime]
    assert time_band(0.80, regime).time_high_factor == pytest.approx(math.exp(row["log_error_high"]))
    assert regime_of(m, replace(setup, stack="auto"), gpu) == ""
    assert time_band(0.80, "") == time_band(0.80)
    # a regime with too few rows of its own says whose residuals its interval is read from
    from planner.timing.intervals import provenance

    pooled = {g: r for g, r in regime_data()["regimes"].items() if r["pool"] != g}
    assert pooled
    for g, r in pooled.items():
        assert f"pooled over the {r['pool_rows']} runs of {r['pool']}" in provenance(g)


def test_an_interval_rests_on_at_least_the_stated_count_of_residuals():
    """bench/megatron_bridge.interval: a regime with fewer than MIN_REGIME_ROWS residuals takes
    its precision x dense/MoE class's, a class with fewer every residual (made-up residuals: the
    rule, not a number of the model)."""
    import megatron_bridge as mb

    n = mb.MIN_REGIME_ROWS
    hopper, blackwell = ("low-precision", "moe", "hopper"), ("low-precision", "moe", "blackwell")
    dense = ("bf16", "dense", "hopper")
    regimes = [hopper] * (n - 1) + [blackwell] * (n - 1) + [dense] * 2
    residuals = [0.0] * (n - 1) + [1.0] * (n - 1) + [5.0] * 2
    assert mb.interval(regimes, residuals, hopper)[2:] == ("low-precision/moe", 2 * n - 2)
    assert mb.interval(regimes, residuals, dense)[2:] == ("all", 2 * n)
    lo, hi, pool, count = mb.interval(regimes + [hopper], residuals + [0.0], hopper)
    assert (lo, hi, pool, count) == (0.0, 0.0, "low-precision/moe/hopper", n)


def test_the_share_an_interval_is_read_at_is_calibrated_on_other_folds():
    """calibrated_share: the smallest central share at which each fold's rows fall inside the
    interval read from the other folds' residuals for at least COVERAGE of the rows (made-up
    residuals: the rule, not a number of the model)."""
    import megatron_bridge as mb

    regime = ("low-precision", "dense", "hopper")
    same = ([regime] * 10, [float(x) for x in range(10)])
    # two other copies of 0..9: the 10th-90th percentiles (0.1, 8.9) hold 1..8, 80% of the rows
    assert mb.calibrated_share([same, same, same]) == 0.80
    far = ([regime] * 10, [100.0 + x for x in range(10)])
    # rows no share of the others' residuals reaches: the widest share
    assert mb.calibrated_share([same, far]) == mb.SHARES[-1]


def test_held_out_intervals_are_nested_and_every_pair_of_folds_was_fitted():
    """The coverage the study reports is of nested intervals: each held-out fold's interval rests
    on the other folds' residuals predicted by fits that saw neither fold, one stored fit per pair
    of folds (docs/megatron-bridge.json), so none falls back to a fit that saw the held-out rows'
    neighbours of the other fold; the shipped intervals name the pool they rest on and it is at
    least MIN_REGIME_ROWS rows."""
    import megatron_bridge as mb

    data = json.loads((ROOT / "docs" / "megatron-bridge.json").read_text())
    for key, fit in (("family", "family_pairs"), ("gpu", "gpu_pairs")):
        names = sorted({r[key] for r in data["rows"]})
        want = {mb.pair_name(a, b) for a in names for b in names if a < b}
        assert set(data["fit"][fit]) == want, key
    for key in ("family", "gpu"):
        assert set(data["interval_share"][key]) == {r[key] for r in data["rows"]}
        assert set(data["interval_share"][key].values()) <= set(mb.SHARES)
    shipped = json.loads((ROOT / "planner" / "timing" / "megatron_bridge_intervals.json").read_text())
    assert shipped["quantile_share"] in mb.SHARES
    for regime, row in shipped["regimes"].items():
        assert row["pool"] == "all" or regime.startswith(row["pool"]), regime
        assert row["pool_rows"] >= mb.MIN_REGIME_ROWS, regime
        assert row["log_error_low"] < 0 < row["log_error_high"], regime


def _same_layout_pairs(system_a: str, system_b: str, max_gpus: int) -> list[float]:
    """Published tokens/s per GPU on system_b over system_a where one release trained the same
    model, precision and layout on both, on at most max_gpus GPUs (NVIDIA's Megatron-Bridge
    performance summary, tests/data/megatron_bridge_runs.json)."""
    rows = json.loads((ROOT / "tests" / "data" / "megatron_bridge_runs.json").read_text())["rows"]
    keys = ("model", "precision", "task", "gpus", "gbs", "mbs", "seq", "tp", "pp", "cp", "vp", "ep")
    by: dict[tuple, dict[str, float]] = {}
    for r in rows:
        s = r["settings"]
        if s["gpus"] <= max_gpus:
            key = (r["source"]["release"], *(str(s[k]) for k in keys))
            by.setdefault(key, {})[s["system"]] = r["published"]["tokens_per_s_per_gpu"]
    return [v[system_b] / v[system_a] for v in by.values() if system_a in v and system_b in v]


def test_gb200_runs_at_b200s_sustained_rate():
    """GB200's data-sheet peaks are 10/9 of B200's (gpus.toml); the same release and layout on 8
    GPUs (one NVLink domain on either) ran 0.96-1.05 times as fast per GPU, median 1.01 over 8
    pairs, so the planner times GB200's tensor cores at B200's measured rate
    (timing.efficiency.SUSTAINED_CLOCK_SHARE)."""
    ratios = sorted(_same_layout_pairs("DGX-B200", "DGX-GB200", 8))
    assert len(ratios) == 8
    median = (ratios[3] + ratios[4]) / 2
    assert 0.95 < median < 1.05 and abs(median - 1) < abs(median - 2500 / 2250)
    from planner.timing.kernels import fp8_fraction_of, fp8_matmul
    from planner.training.setup import Precision

    gb200, b200 = get_gpu("gb200"), get_gpu("b200")
    r_gb200, r_b200 = rates(gb200, "bf16", MEGATRON_BRIDGE), rates(b200, "bf16", MEGATRON_BRIDGE)
    assert r_gb200.matmul_flops_per_s == pytest.approx(r_b200.matmul_flops_per_s)
    assert r_gb200.flash_flops_per_s == pytest.approx(r_b200.flash_flops_per_s)
    prec = Precision.named("fp8", "mxfp8", "megatron")
    fp8 = [fp8_matmul(g, prec, 0.0, 2, fp8_fraction_of(g, MEGATRON_BRIDGE, prec.fp8))[0] for g in (gb200, b200)]
    assert fp8[0] == pytest.approx(fp8[1]) and fp8[0] > r_b200.matmul_flops_per_s
