"""Error bars on every plan (issue 18): the step-time interval from the out-of-sample
residuals (planner/timing/step_intervals.json), the memory interval from the measured ones
(planner/report/memory_intervals.json), --fit-confidence and --time-confidence."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from click.testing import CliRunner

from planner.cli.main import cli
from planner.report.intervals import memory_band
from planner.timing.intervals import time_band, upper_factor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import memory_intervals  # noqa: E402


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


def _plan(*extra: str) -> dict:
    r = run("--model", "qwen2.5-1.5b", "--gpus", "a100", "--n-gpus", "8", "--json", *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_plan_json_carries_intervals_beside_the_point_values():
    p = _plan("--tokens", "1B")["plan"]
    iv = p["interval"]
    assert iv["level"] == 0.8 and "out of sample" in iv["source"]
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "train_time_s"):
        lo, hi = iv[key]
        assert lo <= p[key] <= hi, key
    lo, hi = p["cost_interval"]["cost_usd"]
    assert lo <= p["cost_usd"] <= hi
    m = p["memory_interval"]
    assert m["bytes"][0] <= p["memory_bytes"]["total"] <= m["bytes"][1] and m["fits_at_high_end"] in (True, False)


def test_report_prints_the_interval_line():
    r = run("--model", "qwen2.5-1.5b", "--gpus", "a100", "--n-gpus", "8")
    assert r.exit_code == 0 and "80% interval" in r.output


def test_time_confidence_plans_at_the_one_sided_upper_quantile():
    base, sure = _plan()["plan"], _plan("--time-confidence", "0.8")["plan"]
    assert upper_factor(0.8) > 1.0
    assert math.isclose(sure["step_time_s"], base["step_time_s"] * upper_factor(0.8), rel_tol=1e-9)
    # the one-sided 80% quantile lies inside the central 80% interval's upper end
    assert 1.0 <= upper_factor(0.8) <= time_band(0.8).time_high_factor


def test_time_confidence_margin_is_applied_once_in_the_printed_range():
    """The residuals are of the model's own prediction, so under --time-confidence the range
    (JSON and text) is the plain plan's, not the band around the already-margined step time."""
    base, sure = _plan("--tokens", "1B"), _plan("--tokens", "1B", "--time-confidence", "0.8")
    b, s = base["plan"], sure["plan"]
    for key in ("step_time_s", "tokens_per_s", "mfu", "train_time_s"):
        assert all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(b["interval"][key], s["interval"][key])), key
    assert all(math.isclose(x, y, rel_tol=1e-9)
               for x, y in zip(b["cost_interval"]["cost_usd"], s["cost_interval"]["cost_usd"]))
    assert math.isclose(s["interval"]["step_time_factor"], upper_factor(0.8))
    assert "step_time_factor" not in b["interval"]
    # the margined point lies inside the interval: the one-sided quantile is below its upper end
    lo, hi = s["interval"]["step_time_s"]
    assert lo < b["step_time_s"] < s["step_time_s"] < hi
    args = ("--model", "qwen2.5-1.5b", "--gpus", "a100", "--n-gpus", "8", "--tokens", "1B")
    plain, margined = run(*args), run(*args, "--time-confidence", "0.8")
    assert plain.exit_code == 0 and margined.exit_code == 0

    def ranges(out: str) -> list[str]:
        return [ln.split("interval", 1)[1][:40] for ln in out.splitlines() if "80% interval" in ln]
    assert ranges(plain.output) == ranges(margined.output) and ranges(plain.output)


def test_text_report_prints_the_cost_interval_beside_the_cost():
    r = run("--model", "qwen2.5-1.5b", "--gpus", "a100", "--n-gpus", "8", "--tokens", "1B")
    assert r.exit_code == 0
    lines = r.output.splitlines()
    at = next(i for i, ln in enumerate(lines) if "│ cost" in ln)
    p = _plan("--tokens", "1B")["plan"]
    lo, hi = p["cost_interval"]["cost_usd"]
    from planner.fmt import usd
    assert f"80% interval {usd(lo)}-{usd(hi)}" in lines[at + 1]


def test_fit_confidence_shrinks_the_usable_memory_by_the_interval():
    base, sure = _plan()["plan"], _plan("--fit-confidence", "0.95")["plan"]
    assert math.isclose(sure["capacity_bytes"] * memory_band(0.95).high_factor, base["capacity_bytes"], rel_tol=1e-6)
    assert sure["memory_interval"]["bytes"][1] <= base["capacity_bytes"] * (1 + 1e-9)


def test_bad_confidence_is_a_usage_error():
    r = run("--model", "qwen2.5-1.5b", "--gpus", "a100", "--time-confidence", "0.7")
    assert r.exit_code == 2 and "--time-confidence" in r.output


def test_memory_interval_file_is_what_the_bench_writes():
    assert json.loads((ROOT / "planner" / "report" / "memory_intervals.json").read_text()) == \
        memory_intervals.intervals()
