"""A plan that sits on the GPU's sustained MFU ceiling says so (StepTime.at_mfu_ceiling): `plan`
marks those GPU counts and the step line, and --json carries the flag. The ceiling itself is the
catalog's (presets/gpus.toml: H100 0.465, one published Megatron-Core run); what these check is
that a marked plan is one the ceiling sets, whatever its layout, and an unmarked one is not."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu, sustained_rate
from planner.hardware.topology import load_topology
from planner.layouts.layout import Layout
from planner.models.spec import count_params, load_preset
from planner.timing.efficiency import Efficiency
from planner.timing.model import Cluster, step_time
from planner.training.setup import TrainingSetup

ARGS = ("--model", "70b", "--gpus", "h100", "--tokens", "15T", "--deadline", "90d")


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_the_counts_on_the_ceiling_cost_the_same_and_are_marked() -> None:
    js, text = run(*ARGS, "--json"), run(*ARGS)
    assert js.exit_code == 0 and text.exit_code == 0, (js.output, text.output)
    rows = json.loads(js.output)["by_gpu_count"]
    ceiling = sustained_rate(get_gpu("h100")).mfu
    on = [r for r in rows if r["at_mfu_ceiling"]]
    off = [r for r in rows if not r["at_mfu_ceiling"]]
    assert on and off, rows                 # 16 GPUs need full recomputation and sit below it
    assert all(abs(r["mfu"] - ceiling) < 1e-9 for r in on)
    assert all(r["mfu"] < ceiling - 1e-6 for r in off)
    # on the ceiling the step is the model's FLOPs at that rate: the GPU-hours are one number
    assert max(r["gpu_hours"] for r in on) - min(r["gpu_hours"] for r in on) < 1e-6 * on[0]["gpu_hours"]
    marked = [ln for ln in text.output.splitlines() if "%^" in ln]
    assert len(marked) == len(on)
    assert "at the GPU's sustained MFU ceiling" in text.output
    assert "(the sustained ceiling)" in text.output     # the chosen plan's step line


def test_a_margin_on_the_step_keeps_the_mark_and_no_ceiling_gives_none() -> None:
    gpu = get_gpu("h100")
    cluster = Cluster(gpu=gpu, topology=load_topology(gpu.default_topology or ""))
    m = load_preset("llama3.1-8b")
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=1, grad_accum=16, seq_len=4096, zero_stage=1, recompute="none")
    setup = TrainingSetup(seq_len=4096, global_batch=128)
    capped = step_time(m, setup, lay, cluster, Efficiency(), count_params(m))
    assert capped.at_mfu_ceiling
    # a --time-confidence margin lengthens the step after the ceiling: still the ceiling's step
    wider = step_time(m, setup, lay, cluster, dataclasses.replace(Efficiency(), step_time_factor=1.25), count_params(m))
    assert wider.at_mfu_ceiling and wider.mfu < capped.mfu
    # without the ceiling the same layout runs faster than it, and is not marked
    free = step_time(m, setup, lay, cluster, Efficiency(mfu_ceiling=100.0), count_params(m))
    assert not free.at_mfu_ceiling and free.mfu > capped.mfu
    # an FP8 step has no ceiling (efficiency.mfu_ceiling)
    fp8 = step_time(m, dataclasses.replace(setup, precision="fp8"), lay, cluster, Efficiency(), count_params(m))
    assert fp8.mfu_ceiling is None and not fp8.at_mfu_ceiling
