"""--optimizer adamw-bf16-states: AdamW's two moments in bf16 beside the fp32 master, as
torchtitan 0.3.0 (implementation "fused_opt_states_bf16") and megatron-core 0.16.1
(--exp-avg-dtype/--exp-avg-sq-dtype with the precision-aware optimizer) keep them."""

from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.layouts.layout import Layout
from planner.memory.model import per_rank_memory
from planner.models.spec import count_params, load_model
from planner.training.setup import TrainingSetup, optimizer_state_bytes_per_param


def _source(package: str, rel: str) -> str:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return (Path(next(iter(spec.submodule_search_locations))) / rel).read_text()


def test_the_stacks_keep_both_moments_in_bf16():
    titan = _source("torchtitan", "components/optimizer/optimizer.py")
    assert '"fused_opt_states_bf16"' in titan
    for moment in ("exp_avg", "exp_avg_sq"):
        assert f'state["{moment}"] = torch.zeros_like(\n                            p, dtype=torch.bfloat16' in titan
    mcore = _source("megatron", "core/optimizer/optimizer_config.py")
    assert "exp_avg_dtype: torch.dtype" in mcore and "exp_avg_sq_dtype: torch.dtype" in mcore
    # two moments x 2 B (torch.bfloat16), against AdamW's two fp32 moments
    assert optimizer_state_bytes_per_param("adamw-bf16-states") == 2 * 2
    assert optimizer_state_bytes_per_param("adamw") == 2 * 4


def test_memory_saves_half_the_moments():
    m = load_model("llama3.1-8b")
    lay = Layout(dp=8, sharding="fsdp-full", zero_stage=3, micro_batch=1, seq_len=4096, recompute="full")
    base = TrainingSetup(seq_len=4096, global_batch=8)
    a = per_rank_memory(m, base, lay).breakdown
    b = per_rank_memory(m, replace(base, optimizer="adamw-bf16-states"), lay).breakdown
    n = count_params(m).total
    assert a.optimizer - b.optimizer == pytest.approx(n * 4 / 8, rel=0.01)


def test_cli_bf16_states_and_out_refusal(tmp_path):
    args = ["--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "8", "--optimizer", "adamw-bf16-states"]
    r = CliRunner().invoke(cli, args, prog_name="plan")
    assert r.exit_code == 0, r.output
    # this FSDP plan's default stack (Megatron-LM: its layout has cp or tp, fused kernels) keeps
    # 16-bit moments only under its distributed optimizer; torchtitan has them under FSDP (issue 17)
    r = CliRunner().invoke(cli, [*args, "--fsdp", "full", "--out", str(tmp_path / "o")], prog_name="plan")
    assert r.exit_code == 2 and "needs its distributed optimizer" in r.output and "--zero 1" in r.output
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(cli, [*args, "--fsdp", "full", "--stack", "torchtitan", "--out", str(tmp_path / "t")],
                           prog_name="plan")
    assert r.exit_code == 0 and "fused_opt_states_bf16" in (tmp_path / "t" / "torchtitan_job.py").read_text()
