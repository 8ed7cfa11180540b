"""--stack constrains the search to layouts the stack runs (layouts/rules.py "stack-runs"):
the text plan and --json agree, and --out writes what the stack accepts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.layouts.layout import Layout, reject_reason
from planner.models.spec import load_model
from planner.stacks import stack_refusal
from planner.training.setup import TrainingSetup


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.slow
def test_torchtitan_plan_is_one_torchtitan_runs_and_json_agrees() -> None:
    args = ("--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "8", "--stack", "torchtitan")
    text, js = run(*args), run(*args, "--json")
    assert text.exit_code == 0 and js.exit_code == 0, (text.output, js.output)
    lay = json.loads(js.output)["plan"]["layout"]
    assert lay["sharding"].startswith("fsdp") or lay["zero_stage"] == 0
    assert "ZeRO-1" not in text.output and "ZeRO-2" not in text.output


def test_the_rule_says_what_planner_stacks_says() -> None:
    """The layouts the search's rule refuses for a stack are exactly those planner.stacks.
    stack_refusal refuses (the --out check), and each stack refuses some of them and runs others."""
    m = load_model("llama3.1-8b")
    seen = {}
    for stack in ("torchtitan", "deepspeed", "hf"):
        setup = TrainingSetup(stack=stack, global_batch=64)
        for lay in (Layout(dp=8, zero_stage=2), Layout(dp=4, tp=2, sharding="fsdp-full", zero_stage=3),
                    Layout(dp=2, pp=4, grad_accum=8, sharding="fsdp-full", zero_stage=3),
                    Layout(dp=8, sharding="fsdp-full", zero_stage=3)):
            lay = Layout(**{**{f: getattr(lay, f) for f in lay.__dataclass_fields__}, "seq_len": setup.seq_len,
                            "grad_accum": 64 // (lay.dp * lay.micro_batch)})
            refused = reject_reason(m, setup, lay, 8)
            by_rule = refused is not None and refused.startswith("--stack")
            assert by_rule == (stack_refusal(stack, m, lay) is not None), (stack, lay, refused)
            seen.setdefault(stack, set()).add(by_rule)
    # torchtitan 0.3.0 refuses ZeRO-2 (FSDP2 only) and runs FSDP; DeepSpeed refuses FSDP and
    # tp and runs ZeRO-2; hf (accelerate FSDP2) refuses ZeRO-2 and pp and runs FSDP
    assert seen == {"torchtitan": {True, False}, "deepspeed": {True, False}, "hf": {True, False}}


def test_a_fixed_zero_stage_torchtitan_cannot_run_names_the_stack() -> None:
    r = run("--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "8", "--stack", "torchtitan", "--zero", "2")
    assert r.exit_code == 2
    assert "--stack torchtitan shards with FSDP2" in r.output
