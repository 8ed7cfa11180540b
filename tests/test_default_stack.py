"""With no --stack, the plan names the stack it modelled and why, and --out writes for the same
stack (issue 16): the default follows the kernels the memory model used."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli.main import cli

BASE = ("--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "8", "--seq-len", "2048", "--micro-batch", "1",
        "--global-batch", "64", "--recompute", "full")


@pytest.mark.parametrize("layout, stack, kernels", [
    (("--dp", "4", "--tp", "2", "--fsdp", "full"), "megatron", "fused"),    # was hf for --out, fused memory
    (("--dp", "8", "--fsdp", "full"), "hf", "eager"),
    (("--dp", "8", "--zero", "2"), "deepspeed", "eager"),
])
def test_memory_profile_and_out_name_one_stack(tmp_path, layout, stack, kernels):
    text = CliRunner().invoke(cli, [*BASE, *layout])
    assert text.exit_code == 0, text.output
    lines = [ln for ln in text.output.splitlines() if ln.strip().startswith("stack:")]
    assert len(lines) == 1 and f"stack: {stack} by default (" in lines[0], lines
    js_run = CliRunner().invoke(cli, [*BASE, *layout, "--json"])
    out = CliRunner().invoke(cli, [*BASE, *layout, "--out", str(tmp_path / "o")])
    assert js_run.exit_code == 0 and out.exit_code == 0, out.output
    js = json.loads(js_run.output)
    assert js["plan"]["peak"]["kernels"] == kernels
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["stack"]["name"] == js["stack"]["name"] == stack
