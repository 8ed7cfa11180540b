"""Expert tensor parallelism (--etp, Layout.etp; issue 17), refereed by megatron-core 0.16.1.

1. parallel_state.initialize_model_parallel, run on CPU with torch.distributed's group calls
   stubbed (it only needs world sizes and rank lists to build its groups): its data-parallel,
   expert data-parallel and expert tensor-parallel sizes equal the planner's dp x ep,
   Layout.expert_shard_degree and Layout.expert_tp, and it refuses what the planner refuses.
2. megatron-core's own SequentialMLP (the experts of one MoE layer) built on CPU on an expert
   tensor-parallel group of size etp: its parameters per rank equal the planner's expert
   parameters per rank (memory.params.rank_params).
Both run in one subprocess (the stubs must not leak into other tests), about 8 s.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_groups import GROUP_STUBS

from planner.cli.main import cli
from planner.emit.megatron import to_megatron_args
from planner.layouts.layout import Layout, reject_reason
from planner.memory.params import rank_params
from planner.models.spec import ModelSpec, count_params, load_model
from planner.training.setup import TrainingSetup

# (world, tp, pp, cp, ep, etp): the planner's dp is world / (tp pp cp ep)
SHAPES = [(64, 8, 1, 1, 8, 8), (64, 8, 1, 1, 8, 2), (64, 8, 1, 1, 8, 1), (32, 4, 2, 1, 2, 2),
          (32, 2, 1, 2, 4, 1), (16, 4, 1, 1, 2, 4)]
BAD = (64, 4, 1, 1, 8, 3)       # 3 x 8 x 1 does not divide 64

_SCRIPT = GROUP_STUBS + r'''
shapes, bad, mlp_cases = json.loads(sys.argv[1])
out = {"groups": [], "bad": None, "mlp": []}
for w, tp, pp, cp, ep, etp in shapes + [bad]:
    world[0] = w
    ps.destroy_model_parallel()
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                     context_parallel_size=cp, expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=etp)
    except RuntimeError as e:
        out["bad"] = str(e)
        continue
    out["groups"].append([ps.get_data_parallel_world_size(), ps.get_expert_data_parallel_world_size(),
                          ps.get_expert_tensor_parallel_world_size()])
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.transformer_config import TransformerConfig
for h, f, n_experts, tp, ep, etp in mlp_cases:
    cfg = TransformerConfig(num_layers=1, hidden_size=h, num_attention_heads=8, ffn_hidden_size=f,
                            num_moe_experts=n_experts, moe_ffn_hidden_size=f, gated_linear_unit=True,
                            add_bias_linear=False, use_cpu_initialization=True, perform_initialization=False,
                            tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                            expert_tensor_parallel_size=etp, sequence_parallel=tp > 1)
    pg = ProcessGroupCollection(tp=Group(range(tp)), ep=Group(range(ep)), expt_tp=Group(range(etp)),
                                expt_dp=Group(range(1)), tp_ep=Group(range(ep * etp)))
    mlp = SequentialMLP(n_experts // ep, cfg, MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                              linear_fc2=RowParallelLinear), pg_collection=pg)
    out["mlp"].append(sum(p.numel() for p in mlp.parameters()))
print(json.dumps(out))
'''

TINY = ModelSpec(name="tiny-moe", model_type="mixtral", n_layers=1, d_model=64, n_heads=4, n_kv_heads=4,
                 head_dim=16, d_ff=128, vocab_size=1024, tied_embeddings=False, gated_mlp=True,
                 norm="rmsnorm", n_experts=8, n_experts_per_token=2)
MLP_CASES = [(64, 128, 8, 4, 2, etp) for etp in (1, 2, 4)] + [(64, 128, 8, 8, 4, 2)]


@pytest.fixture(scope="module")
def megatron() -> dict:
    require("megatron.core")
    arg = json.dumps([SHAPES, list(BAD), MLP_CASES])
    done = subprocess.run([sys.executable, "-c", _SCRIPT, arg], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _layout(world: int, tp: int, pp: int, cp: int, ep: int, etp: int) -> Layout:
    return Layout(dp=world // (tp * pp * cp * ep), tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)


@pytest.mark.slow
def test_expert_groups_equal_megatron_cores(megatron):
    """megatron-core's DP = the planner's dp x ep, its EDP = dp x cp x tp / etp, its ETP = etp."""
    want = [[lay.dp * lay.ep, lay.expert_shard_degree, lay.expert_tp] for lay in (_layout(*s) for s in SHAPES)]
    assert megatron["groups"] == want
    assert "not divisible" in megatron["bad"]


@pytest.mark.slow
def test_expert_params_per_rank_equal_megatron_cores_experts(megatron):
    pc = count_params(TINY)
    got = [rank_params(TINY, pc, Layout(tp=tp, ep=ep, etp=etp), 0, 1).expert for _, _, _, tp, ep, etp in MLP_CASES]
    assert got == megatron["mlp"]
    assert got[0] == 4 * 3 * 64 * 128          # 4 local experts, 3 matrices of h x f, whole at etp 1


def test_default_etp_leaves_the_layout_as_it_was():
    a, b = Layout(dp=2, tp=4, ep=2), Layout(dp=2, tp=4, ep=2, etp=4)
    assert a.expert_tp == b.expert_tp == 4
    assert a.key == b.key == "dp2_tp4_pp1_cp1_ep2_zero0_mb1_ga1_rnone"
    assert a.describe() == b.describe() and "etp" not in a.describe()
    assert a.expert_shard_degree == 2
    c = Layout(dp=2, tp=4, ep=2, etp=1)
    assert "_etp1_" in c.key and "etp=1" in c.describe() and c.expert_shard_degree == 8


def test_rules_refuse_an_etp_that_does_not_divide_tp_and_a_dense_model():
    m, setup = load_model("mixtral-8x7b"), TrainingSetup(seq_len=4096, global_batch=64)
    lay = Layout(dp=1, tp=4, ep=8, etp=3, micro_batch=1, grad_accum=8, seq_len=4096)
    assert "etp=3 does not divide tp=4" in reject_reason(m, setup, lay, 8)
    dense = load_model("llama3.1-8b")
    assert "dense" in reject_reason(dense, setup, Layout(dp=1, tp=4, ep=1, etp=2, micro_batch=1,
                                                        grad_accum=64, seq_len=4096), 8)


FIXED = ["--model", "mixtral-8x7b", "--gpus", "h100", "--dp", "1", "--tp", "8", "--pp", "1", "--ep", "8",
         "--zero", "1", "--micro-batch", "1", "--recompute", "full", "--n-gpus", "64", "--json"]


def _plan(*extra: str) -> dict:
    res = CliRunner().invoke(cli, FIXED + list(extra), prog_name="plan")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_etp_memory_and_time_terms():
    """Mixtral-8x7B, 64 x H100, tp 8, ep 8: each rank holds one expert; at etp 1 its whole
    expert (32 layers x 3 x 4096 x 14336 = 5.64e9 parameters) instead of an eighth of it, so
    16-bit weights and gradients grow by 2 B x 7/8 x 5.64e9 each, while the ZeRO-1 optimizer
    states, sharded over the expert data-parallel group (8 at etp 1, 1 at etp 8), stay."""
    base, one = _plan(), _plan("--etp", "1")
    assert one["plan"]["layout"]["etp"] == 1 and "etp" not in base["plan"]["layout"]
    mb, m1 = base["plan"]["memory_bytes"], one["plan"]["memory_bytes"]
    expert = 32 * 3 * 4096 * 14336
    grown = 2 * expert * 7 // 8
    assert m1["weights"] - mb["weights"] == pytest.approx(grown, rel=1e-6)
    assert m1["gradients"] - mb["gradients"] == pytest.approx(grown, rel=1e-6)
    assert m1["optimizer"] == pytest.approx(mb["optimizer"], rel=1e-9)
    # time: the MLP's tp collectives leave the tp group, the experts' gradients (8x as many
    # per rank) are reduced over 8 expert data-parallel ranks instead of none, and the ep
    # all-to-all runs on megatron-core's expert grid: at etp 8 its groups are tp-strided ranks
    # on 8 nodes, at etp 1 eight consecutive ranks of one node (tests/test_ep_fold.py checks
    # the ranks against parallel_state)
    tb, t1 = base["plan"]["time"]["comm_s"], one["plan"]["time"]["comm_s"]
    assert t1["tp"] < tb["tp"] and t1["dp"] > tb["dp"] and t1["ep"] < tb["ep"] / 4


def test_megatron_args_and_refusals(tmp_path):
    from planner import api
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import SearchSpace

    m = load_model("mixtral-8x7b")
    setup = TrainingSetup(seq_len=4096, global_batch=1024, stack="megatron")
    space = SearchSpace(dp=1, tp=8, pp=1, cp=1, ep=8, etp=2, zero_stage=1, micro_batches=(1,), recomputes=("full",))
    r = api.plan(m, get_gpu("h100"), setup, space=space, n_gpus=64)
    argv = to_megatron_args(r)
    assert argv[argv.index("--expert-tensor-parallel-size") + 1] == "2"
    default = api.plan(m, get_gpu("h100"), setup, space=SearchSpace(dp=1, tp=8, pp=1, cp=1, ep=8, zero_stage=1,
                                                          micro_batches=(1,), recomputes=("full",)), n_gpus=64)
    assert "--expert-tensor-parallel-size" not in to_megatron_args(default)
    for args, word in ((["--stack", "torchtitan", "--etp", "2"], "no expert tensor-parallel setting"),
                       (["--etp", "3"], "does not divide --tp 8")):
        res = CliRunner().invoke(cli, FIXED[:-1] + args, prog_name="plan")
        assert res.exit_code == 2 and word in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_a_search_with_etp_scores_its_layout_as_the_fixed_plan_does():
    """The batched search (layout groups, sweep's subset, peak's per-state grouping, the block and
    degree tables) and a plan of the one layout it chose give the same memory and step time."""
    res = CliRunner().invoke(cli, ["--model", "mixtral-8x7b", "--gpus", "h100", "--n-gpus", "64", "--tp", "4",
                                   "--etp", "1", "--json"], prog_name="plan")
    assert res.exit_code == 0, res.output
    found = json.loads(res.output)["plan"]
    lay = found["layout"]
    assert lay["etp"] == 1
    fixed = _plan_of(lay)
    assert fixed["memory_bytes"] == found["memory_bytes"]
    assert fixed["step_time_s"] == pytest.approx(found["step_time_s"], rel=1e-12)


def _plan_of(lay: dict) -> dict:
    args = ["--model", "mixtral-8x7b", "--gpus", "h100", "--n-gpus", "64", "--json",
            "--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"], "--etp", str(lay["etp"])]
    for k in ("dp", "tp", "pp", "cp", "ep"):
        args += [f"--{k}", str(lay[k])]
    args += ["--zero", str(lay["zero_stage"])] if lay["sharding"] == "zero" else ["--fsdp", lay["sharding"][5:]]
    if lay["vp"] > 1:
        args += ["--vp", str(lay["vp"])]
    res = CliRunner().invoke(cli, args, prog_name="plan")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["plan"]


def test_measure_refuses_etp():
    res = CliRunner().invoke(cli, ["measure", "--model", "mixtral-8x7b", "--etp", "1", "--method", "full"],
                             prog_name="plan")
    assert res.exit_code == 2 and "drop --etp" in res.output and "Traceback" not in res.output
