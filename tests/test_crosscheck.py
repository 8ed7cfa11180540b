"""The planner against DeepSpeed's own estimators (deepspeed/runtime/zero/stage_1_and_2.py
and stage3.py): equal to the byte under DeepSpeed's assumptions, explained where not."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")   # before deepspeed is imported (docs/facts.md)

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import require

from planner import api
from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.measure.crosscheck import (
    ADAM_BYTES_PER_PARAM,
    EstimatorInputs,
    crosscheck,
    crosscheck_json,
    deepspeed_figures,
    deepspeed_precision,
    model_largest_layer,
    planner_as_deepspeed,
)
from planner.memory.model import model_state_bytes
from planner.models.spec import count_params, load_model
from planner.training.setup import TrainingSetup

LLAMAS = ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b"]
H100 = get_gpu("h100")


def inputs(name: str, n_gpus: int, stage: int, offload_optimizer: bool = False, offload_params: bool = False,
           buffer_factor: float = 1.0) -> tuple[EstimatorInputs, object]:
    m = load_model(name)
    r_like = type("R", (), {"params": count_params(m)})()
    return EstimatorInputs(
        stage=stage, total_params=count_params(m).total, largest_layer_params=model_largest_layer(m, r_like),
        num_gpus_per_node=min(n_gpus, 8), num_nodes=max(1, n_gpus // 8), cpu_offload=offload_optimizer,
        cpu_offload_params=offload_params, additional_buffer_factor=buffer_factor), m


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMAS)
@pytest.mark.parametrize("n_gpus", [8, 64, 512])
@pytest.mark.parametrize("stage, offload_optimizer, offload_params", [
    (2, False, False), (2, True, False), (3, False, False), (3, True, False), (3, True, True)])
def test_planner_agrees_with_deepspeed_to_the_byte_under_its_assumptions(
        name, n_gpus, stage, offload_optimizer, offload_params):
    """DeepSpeed's additional_buffer_factor set to 1 (its CPU fudge factor), everything else
    as DeepSpeed assumes it: 18 B/param sharded over every GPU, 16-bit weights, 4 B x the
    largest layer at ZeRO-3. The planner side is memory.model_state_bytes and
    memory.buffer_bytes (planner_as_deepspeed), not DeepSpeed's formula retyped."""
    require("deepspeed")
    inp, m = inputs(name, n_gpus, stage, offload_optimizer, offload_params)
    ds = deepspeed_figures(inp)
    ours = planner_as_deepspeed(inp, m)
    assert ours.gpu_bytes == ds.gpu_bytes
    if stage == 2 and offload_optimizer:
        # DeepSpeed's ZeRO-2 offload host figure is max(4 x all GPUs, 16) B/param on one
        # node, not the node's share of the offloaded states: the one figure that differs
        # (a note says so in every report)
        assert ours.cpu_bytes != ds.cpu_bytes
    else:
        assert ours.cpu_bytes == ds.cpu_bytes


@pytest.mark.slow
def test_zero2_agreement_spelled_out_with_model_state_bytes():
    """Llama 3.1 8B on 64 GPUs, ZeRO-2: DeepSpeed's 2P + 18P/N is the planner's weights
    (2 B, replicated) + gradients (2 B 16-bit + 4 B fp32, sharded) + optimizer (4 B master
    + 8 B Adam, sharded) with N = 64 data-parallel ranks."""
    require("deepspeed")
    inp, _m = inputs("llama3.1-8b", 64, 2)
    ms = model_state_bytes(8_030_261_248, 0, deepspeed_precision(2), ADAM_BYTES_PER_PARAM,
                           Layout(dp=64, zero_stage=2))
    assert ms.weights == 2 * 8_030_261_248
    assert ms.total == deepspeed_figures(inp).gpu_bytes == 16_060_522_496 + 2_258_510_976


@pytest.mark.parametrize("stage", [2, 3])
def test_default_buffer_factor_agrees_too(stage):
    require("deepspeed")
    inp, m = inputs("llama3.1-70b", 64, stage, buffer_factor=1.5)
    assert planner_as_deepspeed(inp, m) == deepspeed_figures(inp)


def plan(name: str, lay: Layout, **setup):
    return api.evaluate_layout(load_model(name), H100, TrainingSetup(seq_len=lay.seq_len, **setup), lay)


def test_crosscheck_of_a_zero3_plan_explains_each_difference():
    require("deepspeed")
    r = plan("llama3.1-8b", Layout(dp=16, zero_stage=3, micro_batch=1, grad_accum=64, recompute="full"))
    c = crosscheck(r)
    d = c.deepspeed
    assert d is not None and d.estimator == "estimate_zero3_model_states_mem_needs"
    assert d.inputs.total_params == 8_030_261_248 and (d.inputs.num_nodes, d.inputs.num_gpus_per_node) == (2, 8)
    assert d.planner_as_deepspeed.gpu_bytes == d.deepspeed.gpu_bytes
    # 16 B/param over 16 ranks (ZeRO paper) vs DeepSpeed's 18 B/param + 4 B x largest layer
    assert d.planner_model_state_bytes == 16 * 8_030_261_248 // 16
    # the gathered and the prefetched embedding (2 x 2 B x 525,336,576) and the reduce bucket
    assert d.planner_buffer_bytes == 2 * 2 * 525_336_576 + 2 * 200_000_000
    assert d.planner_total_bytes == r.best.memory.total
    text = " ".join(d.notes)
    assert "gradients: DeepSpeed counts 4 B" in text and "the planner counts 2 B" in text
    assert "4 B x the largest layer" in text and "activations" in text
    assert "sharding:" not in text and "model parallelism" not in text   # pure dp: N is the same


def test_crosscheck_notes_tensor_parallelism_and_offload():
    require("deepspeed")
    r = plan("llama3.1-70b", Layout(dp=8, tp=4, sp=True, zero_stage=2, micro_batch=1, grad_accum=128,
                                    recompute="full"))
    c = crosscheck(r, offload_optimizer="nvme")
    text = " ".join(c.deepspeed.notes)
    assert "DeepSpeed divides by all 32 GPUs; the planner shards over the 8 data-parallel ranks" in text
    assert "ignores tp, pp and ep" in text
    assert "do not subtract them yet" in text and "NVMe" in text
    assert c.deepspeed.inputs.cpu_offload is True


@pytest.mark.parametrize("lay, reason", [
    (Layout(dp=16, zero_stage=1, micro_batch=1, grad_accum=64, recompute="full"), "ZeRO-1"),
    (Layout(dp=16, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=64, recompute="full"), "FSDP"),
])
def test_layouts_deepspeed_does_not_describe_say_why(lay, reason):
    c = crosscheck(plan("llama3.1-8b", lay))
    assert c.deepspeed is None and reason in c.reason
    assert crosscheck_json(c) == {"deepspeed": None, "reason": c.reason}


@pytest.mark.slow
def test_without_deepspeed_the_plan_runs_and_says_skipped():
    # a fresh interpreter in which `import deepspeed` fails, as when it is not installed
    code = ("import sys; sys.modules['deepspeed'] = None\n"
            "from planner.cli.main import main\n"
            "sys.argv = ['plan', '--model', '8b', '--gpus', 'h100', '--dp', '16', '--tp', '1', '--pp', '1',"
            " '--cp', '1', '--zero', '3', '--micro-batch', '1', '--recompute', 'full', '--json', '--crosscheck']\n"
            "main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["plan"]["fits"] and d["crosscheck"]["deepspeed"] is None
    assert "deepspeed is not installed" in d["crosscheck"]["reason"] and "skipped" in d["crosscheck"]["reason"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


FIXED = ("--model", "8b", "--gpus", "h100", "--dp", "16", "--tp", "1", "--pp", "1", "--cp", "1",
         "--zero", "3", "--micro-batch", "1", "--recompute", "full")


def test_cli_json_crosscheck():
    require("deepspeed")
    r = run(*FIXED, "--json", "--crosscheck")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["crosscheck"]["deepspeed"]
    assert set(d) >= {"gpu_bytes", "cpu_bytes", "planner_model_state_bytes", "notes"}
    assert d["planner_as_deepspeed"]["agrees"] is True and d["notes"]
    r = run(*FIXED, "--crosscheck")
    assert "Cross-check with DeepSpeed's estimate_zero3_model_states_mem_needs" in r.output
    assert "agrees to the byte" in r.output and "why they differ" in r.output


def test_cli_json_says_why_no_crosscheck_ran():
    d = json.loads(run(*FIXED, "--json").stdout)
    assert d["crosscheck"] == {"deepspeed": None, "reason": "not requested (pass --crosscheck)"}
