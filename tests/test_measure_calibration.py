"""plan measure --real --calibration-out: the calibration file plan calibrate writes, from a
measured step (issue 18). No GPU here: the writing path runs on a fake measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.cli.measure import write_measured_calibration
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.timing.calibrate import load_calibration, to_toml
from planner.timing.model import Efficiency, cluster_for, step_time
from planner.training.setup import TrainingSetup

LAY = Layout(dp=8, tp=1, pp=1, zero_stage=3, micro_batch=1, grad_accum=1, seq_len=2048, recompute="none")


def _write(tmp_path: Path, step_s: float) -> Path:
    m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
    setup = TrainingSetup(seq_len=2048, global_batch=8)
    measured = {"step_times_s": [step_s * 0.99, step_s, step_s * 1.01], "max_reserved_bytes": 60 * 2**30,
                "max_allocated_bytes": 50 * 2**30}
    out = tmp_path / "cal.toml"
    write_measured_calibration(m, setup, LAY, cluster_for(gpu), measured, "fake measurement", "hf", out)
    return out


def test_measured_calibration_reproduces_the_measured_step(tmp_path: Path):
    m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
    setup = TrainingSetup(seq_len=2048, global_batch=8)
    shipped = step_time(m, setup, LAY, cluster_for(gpu)).step_time_s
    measured_s = 1.3 * shipped             # a cluster 30% slower than the planner ships
    out = _write(tmp_path, measured_s)
    c = load_calibration(str(out))
    assert c.gpu == "h100" and c.logs[0].stack == "hf"
    assert to_toml(c) == out.read_text()       # the file plan calibrate writes, read back unchanged
    after = step_time(m, setup, LAY, cluster_for(gpu), c.efficiency(Efficiency())).step_time_s
    assert abs(after / measured_s - 1) < 0.01
    assert c.fragmentation is not None and c.fragmentation > 0


def test_plan_uses_the_measured_calibration(tmp_path: Path):
    """The plan of the measured layout under --calibration takes the measured step time and the
    fragmentation the measured reserved/allocated bytes give (60 / 50 GiB: more than the 10%
    default), where the plan without it keeps the shipped figures."""
    m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
    shipped = step_time(m, TrainingSetup(seq_len=2048, global_batch=8), LAY, cluster_for(gpu)).step_time_s
    measured_s = 1.3 * shipped
    out = _write(tmp_path, measured_s)
    args = ["--model", "llama3.1-8b", "--gpus", "h100", "--dp", "8", "--zero", "3", "--micro-batch", "1",
            "--seq-len", "2048", "--global-batch", "8", "--recompute", "none", "--tp", "1", "--pp", "1", "--cp", "1",
            "--json"]
    plans = {}
    for extra in ((), ("--calibration", str(out))):
        r = CliRunner().invoke(cli, [*args, *extra], prog_name="plan")
        assert r.exit_code == 0, r.output
        plans[bool(extra)] = json.loads(r.output)["plan"]
    assert plans[False]["step_time_s"] == pytest.approx(shipped, rel=1e-9)
    assert plans[True]["step_time_s"] == pytest.approx(measured_s, rel=0.01)
    assert plans[True]["memory_bytes"]["overhead"] > plans[False]["memory_bytes"]["overhead"]
    assert plans[True]["memory_bytes"]["activations"] == plans[False]["memory_bytes"]["activations"]


def test_calibration_out_needs_real():
    r = CliRunner().invoke(cli, ["measure", "--model", "llama3.1-8b", "--gpus", "h100", "--dp", "8",
                                 "--calibration-out", "x.toml"], prog_name="plan")
    assert r.exit_code == 2 and "--real" in r.output
