"""--moe-imbalance (TrainingSetup.moe_imbalance): the most loaded expert-parallel rank's routed
tokens in memory (memory.moe), in its expert GEMMs and in the all-to-all (timing.kernels)."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.model import per_rank_memory
from planner.memory.moe import expert_side_bytes
from planner.models.spec import load_model
from planner.timing.layer import layer_time
from planner.timing.model import DEFAULT_EFFICIENCY, cluster_for, step_time
from planner.training.setup import TrainingSetup

BASE = TrainingSetup(seq_len=4096, global_batch=64)
EP8 = Layout(dp=1, tp=1, pp=1, ep=8, micro_batch=1, grad_accum=64, seq_len=4096, recompute="none")


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


def test_most_loaded_expert_holds_switch_capacity():
    """Switch Transformer (Fedus et al. 2021, arXiv:2101.03961, Sec. 2.1): expert capacity =
    tokens per batch / experts x capacity factor. Mixtral on 8 ep ranks (one expert each):
    under factor 1.25 the most loaded rank keeps 1.25x the balanced expert-side tensors, and
    its expert GEMM rows are capacity x k copies (top-2 routing)."""
    m = load_model("mixtral-8x7b")
    cf = 1.25
    s1 = replace(BASE, moe_imbalance=cf)
    base = per_rank_memory(m, BASE, EP8).terms.view(BASE)
    imb = per_rank_memory(m, s1, EP8).terms.view(s1)
    side = expert_side_bytes(m, BASE, EP8, base.kernels)
    assert imb.layer_act - base.layer_act == pytest.approx((cf - 1) * side, rel=1e-6)
    # time: expert GEMMs and the all-to-all of the most loaded rank
    gpu = get_gpu("h100")
    key = Layout(ep=8, micro_batch=1, seq_len=4096, recompute="none")
    lt1 = layer_time(m, BASE, key, "fused", gpu, DEFAULT_EFFICIENCY)
    lt2 = layer_time(m, s1, key, "fused", gpu, DEFAULT_EFFICIENCY)
    assert lt2.ep_bytes == pytest.approx(cf * lt1.ep_bytes)
    assert lt2.fwd_s > lt1.fwd_s and lt2.bwd_s > lt1.bwd_s


def test_no_expert_parallelism_no_change():
    """A rank holding every expert receives k copies of each token however they are routed."""
    m = load_model("mixtral-8x7b")
    lay = replace(EP8, ep=1, tp=8)
    s1 = replace(BASE, moe_imbalance=2.0)
    assert per_rank_memory(m, s1, lay).total == per_rank_memory(m, BASE, lay).total
    cl = cluster_for(get_gpu("h100"))
    assert step_time(m, s1, lay, cl).step_time_s == step_time(m, BASE, lay, cl).step_time_s


def test_cli_moe_imbalance():
    args = ["--model", "qwen3-30b-a3b", "--gpus", "h100", "--n-gpus", "8", "--ep", "8", "--json"]
    a, b = run(*args), run(*args, "--moe-imbalance", "1.25")
    assert a.exit_code == 0 and b.exit_code == 0, b.output
    pa, pb = json.loads(a.output)["plan"], json.loads(b.output)["plan"]
    assert pb["step_time_s"] > pa["step_time_s"]
    bad = run("--model", "llama3.1-8b", "--gpus", "h100", "--moe-imbalance", "1.25")
    assert bad.exit_code == 2 and "mixture-of-experts" in bad.output
    low = run(*args, "--moe-imbalance", "0.5")
    assert low.exit_code == 2
