"""Expert-parallel folding (Layout.ep_fold; issue 29): ep chosen within tp x cp x dp, refereed by
megatron-core 0.16.1.

1. parallel_state.initialize_model_parallel, run on CPU with torch.distributed's group calls
   stubbed (as tests/test_etp.py does): for folded layouts its data-parallel, expert
   data-parallel and expert-parallel sizes equal the planner's, its ep group is the one the
   step time places (etp-strided ranks, timing.degrees.layout_links), and it refuses the folded
   layout the planner refuses.
2. megatron-core's GPTModel (local layer spec, MoE) built on CPU on those groups: its dense and
   expert parameters on a rank equal the planner's, and the distributed optimizer's states per
   rank (dense over DP x cp, experts over the expert data-parallel group: megatron-core
   distributed/distributed_data_parallel.py lines 295-301) equal the planner's optimizer term.
One subprocess (the stubs must not leak into other tests), a few seconds.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_groups import GROUP_STUBS

from planner import api
from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout, SearchSpace, ep_folds, reject_reason
from planner.memory.params import rank_params
from planner.models.spec import ModelSpec, count_params, load_model
from planner.training.setup import TrainingSetup

# (world, tp, pp, cp, ep, etp): ep does not divide world / (tp pp cp), so it folds
FOLDED = [(256, 2, 8, 1, 32, 1), (64, 2, 1, 1, 64, 1), (16, 4, 1, 1, 8, 1), (64, 2, 2, 2, 16, 1),
          (32, 4, 1, 1, 16, 2)]
BAD = (256, 2, 8, 1, 64, 1)      # etp 1 x ep 64 x pp 8 = 512 does not divide 256 (Megatron-Bridge's misprint)
UNFOLDED = [(64, 8, 1, 1, 8, 1), (32, 2, 1, 2, 4, 2)]   # ep divides DP; etp < tp, or cp > 1
GPT = (16, 4, 1, 1, 8, 1)        # the GPTModel built on its groups (tp without sequence parallelism: local spec)

_SCRIPT = GROUP_STUBS + r'''
shapes, bad, gpt = json.loads(sys.argv[1])

def init(w, tp, pp, cp, ep, etp):
    world[0] = w
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 context_parallel_size=cp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=etp)

out = {"groups": [], "bad": None}
for shape in shapes:
    init(*shape)
    out["groups"].append([ps.get_data_parallel_world_size(), ps.get_expert_data_parallel_world_size(),
                          ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_group().ranks])
try:
    init(*bad)
except RuntimeError as e:
    out["bad"] = str(e)
import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig
w, tp, pp, cp, ep, etp = gpt
init(*gpt)
cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
                        num_moe_experts=8, moe_ffn_hidden_size=128, moe_router_topk=2, gated_linear_unit=True,
                        add_bias_linear=False, use_cpu_initialization=True, perform_initialization=False,
                        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
                        expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, sequence_parallel=False,
                        normalization="RMSNorm", params_dtype=torch.bfloat16, bf16=True,
                        pipeline_dtype=torch.bfloat16)
model = GPTModel(cfg, get_gpt_layer_local_spec(num_experts=8, moe_grouped_gemm=False, normalization="RMSNorm"),
                 vocab_size=1024, max_sequence_length=256, share_embeddings_and_output_weights=False,
                 position_embedding_type="rope")
# megatron-core marks expert parameters allreduce = False (their gradients reduce over the
# expert data-parallel group, distributed_data_parallel.py)
out["dense"] = sum(p.numel() for p in model.parameters() if getattr(p, "allreduce", True))
out["expert"] = sum(p.numel() for p in model.parameters() if not getattr(p, "allreduce", True))
out["gpt_groups"] = [ps.get_data_parallel_world_size(with_context_parallel=True),
                     ps.get_expert_data_parallel_world_size()]
print(json.dumps(out))
'''

# the model GPTModel builds above, as the planner describes it
TINY = ModelSpec(name="tiny-moe", model_type="mixtral", n_layers=2, d_model=64, n_heads=4, n_kv_heads=4,
                 head_dim=16, d_ff=128, vocab_size=1024, tied_embeddings=False, gated_mlp=True,
                 norm="rmsnorm", n_experts=8, n_experts_per_token=2)


@pytest.fixture(scope="module")
def megatron() -> dict:
    require("megatron.core")
    arg = json.dumps([FOLDED + UNFOLDED, list(BAD), list(GPT)])
    done = subprocess.run([sys.executable, "-c", _SCRIPT, arg], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _folded(world: int, tp: int, pp: int, cp: int, ep: int, etp: int, **kw) -> Layout:
    """The layout `plan` builds from --n-gpus world --tp --pp --cp --ep --etp (api.fixed_layout)."""
    setup = TrainingSetup(seq_len=256, global_batch=world // (tp * pp * cp) * 8, stack="megatron")
    space = SearchSpace(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, zero_stage=1, micro_batches=(1,),
                        recomputes=("none",))
    lay = api.fixed_layout(space, setup, world)
    assert lay is not None
    return lay


@pytest.mark.slow
def test_folded_groups_equal_megatron_cores(megatron):
    """megatron-core's DP = Layout.data_parallel, its EDP = Layout.expert_shard_degree, its EP = ep;
    rank 0's ep group is etp-strided consecutive ranks, the expert grid layout_links places."""
    for shape, (dp, edp, ep, ranks) in zip(FOLDED, megatron["groups"][:len(FOLDED)]):
        lay = _folded(*shape)
        assert lay.ep_fold and lay.n_gpus == shape[0]
        assert [lay.data_parallel, lay.expert_shard_degree, lay.ep] == [dp, edp, ep], shape
        assert ranks == list(range(0, lay.expert_tp * lay.ep, lay.expert_tp)), shape


@pytest.mark.slow
def test_the_folded_layout_megatron_refuses_is_refused_in_one_line(megatron):
    assert "not divisible by expert_tensor_model_pipeline_parallel" in megatron["bad"]
    n, tp, pp, _, ep, etp = BAD
    res = CliRunner().invoke(cli, ["--model", "qwen3-235b-a22b", "--gpus", "h100", "--stack", "megatron",
                                   "--n-gpus", str(n), "--tp", str(tp), "--pp", str(pp), "--ep", str(ep),
                                   "--etp", str(etp), "--micro-batch", "1", "--zero", "1", "--recompute", "none",
                                   "--global-batch", "8192"], prog_name="plan")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert "etp 1 x ep 64 = 64 does not divide tp x cp x dp = 32" in res.output and "megatron-core" in res.output


@pytest.mark.slow
def test_folded_memory_is_megatron_cores_parameters_and_sharding(megatron):
    """Weights per rank are GPTModel's parameters on the rank; the ZeRO-1 (distributed optimizer)
    states are fp32 master + Adam's two moments, 12 B per parameter, dense ones sharded over
    megatron-core's DP x cp, expert ones over its expert data-parallel group."""
    lay = _folded(*GPT)
    rp = rank_params(TINY, count_params(TINY), lay, 0, TINY.n_layers)
    assert (rp.dense, rp.expert) == (megatron["dense"], megatron["expert"])
    setup = TrainingSetup(seq_len=256, global_batch=lay.global_batch, stack="megatron")
    mem = api.evaluate_layout(TINY, get_gpu("h100"), setup, lay).best.memory.breakdown.as_dict()
    dp_cp, edp = megatron["gpt_groups"]
    assert mem["weights"] == 2 * (megatron["dense"] + megatron["expert"])
    assert mem["optimizer"] == 12 * megatron["dense"] // dp_cp + 12 * megatron["expert"] // edp


QWEN = ["--model", "qwen3-235b-a22b", "--gpus", "h100", "--stack", "megatron", "--n-gpus", "256", "--tp", "2",
        "--pp", "8", "--cp", "1", "--ep", "32", "--etp", "1", "--vp", "4", "--seq-len", "4096", "--micro-batch",
        "1", "--global-batch", "8192", "--zero", "1", "--precision", "fp8", "--fp8-recipe", "tensorwise",
        "--recompute", "none", "--pp-balance", "embedding-loss"]


def test_the_published_qwen3_235b_h100_layout_plans_as_published():
    """Megatron-Bridge's Qwen3-235B-A22B on 256 H100 (tests/data/megatron_bridge_runs.json, 25.11-26.04:
    TP 2, PP 8, VP 4, EP 32, GBS 8192, MBS 1) was trained, so it fits; tokens per step are the
    published global batch x sequence (ep multiplies no data-parallel count)."""
    res = CliRunner().invoke(cli, QWEN + ["--json"], prog_name="plan")
    assert res.exit_code == 0, res.output
    p = json.loads(res.output)["plan"]
    assert p["layout"]["ep_fold"] is True and p["layout"]["dp"] == 16 and p["layout"]["grad_accum"] == 512
    assert p["fits"]
    assert p["tokens_per_s"] * p["step_time_s"] == pytest.approx(8192 * 4096, rel=1e-9)


def test_folding_leaves_a_rank_s_tokens_as_they_were():
    """A folded rank sees the tokens an unfolded rank of the same tp, cp, ep and etp sees (its micro-batch
    over tp x cp; experts get T k ep etp / (E tp) each): the same micro-batch time, whatever the dp."""
    from planner.timing.model import step_time

    m, gpu = load_model("mixtral-8x7b"), get_gpu("h100")
    from planner.hardware.placement import cluster_for
    cluster = cluster_for(gpu)
    folded = Layout(dp=4, tp=4, ep=8, etp=1, ep_fold=True, zero_stage=1, sp=True, micro_batch=1, grad_accum=8,
                    seq_len=4096)
    plain = Layout(dp=1, tp=4, ep=8, etp=1, zero_stage=1, sp=True, micro_batch=1, grad_accum=4, seq_len=4096)
    assert folded.global_batch == plain.global_batch == 32
    setup = TrainingSetup(seq_len=4096, global_batch=32, stack="megatron")
    a, b = step_time(m, setup, folded, cluster), step_time(m, setup, plain, cluster)
    assert a.tokens_per_step == b.tokens_per_step == 32 * 4096
    assert a.compute_s / folded.grad_accum == pytest.approx(b.compute_s / plain.grad_accum, rel=1e-9)


def test_ep_that_divides_dp_is_not_folded():
    """Existing layouts keep their meaning: ep dividing Megatron's DP is the planner's dp x ep."""
    assert not ep_folds(64, 8, 1, 1, 8)
    assert ep_folds(256, 2, 8, 1, 32)
    lay = Layout(dp=2, tp=2, ep=4)
    assert (lay.data_parallel, lay.n_gpus, lay.ep_fold) == (8, 16, False) and "fold" not in lay.key


def test_folding_is_megatron_core_s():
    m, setup = load_model("qwen3-235b-a22b"), TrainingSetup(seq_len=4096, global_batch=8192, stack="torchtitan")
    lay = Layout(dp=16, tp=2, pp=8, ep=32, etp=1, ep_fold=True, zero_stage=1, sp=True, micro_batch=1,
                 grad_accum=512, seq_len=4096)
    assert reject_reason(m, setup, lay, 8) is not None
    for extra, word in ((["--etp", "1", "--stack", "deepspeed", "--micro-batch", "1", "--zero", "1", "--recompute",
                          "none"], "--stack deepspeed"),
                        ([], "etp 2 x ep 32 = 64 does not divide tp x cp x dp = 32")):   # etp = tp by default
        res = CliRunner().invoke(cli, ["--model", "qwen3-235b-a22b", "--gpus", "h100", "--n-gpus", "256", "--tp",
                                       "2", "--pp", "8", "--ep", "32"] + extra, prog_name="plan")
        assert res.exit_code == 2 and word in res.output and "Traceback" not in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_search_chooses_among_folded_layouts_and_scores_them_as_the_fixed_plan_does():
    """With --ep folding and the micro-batch, recomputation and sharding left open, `plan` searches them
    (layouts.layout.enumerate_folded); its choice planned as a fixed layout gives the same answer."""
    base = ["--model", "qwen3-235b-a22b", "--gpus", "h100", "--stack", "megatron", "--n-gpus", "256", "--tp", "2",
            "--pp", "8", "--ep", "32", "--etp", "1", "--global-batch", "8192", "--json"]
    res = CliRunner().invoke(cli, base, prog_name="plan")
    assert res.exit_code == 0, res.output
    found = json.loads(res.output)["plan"]
    lay = found["layout"]
    assert lay["ep_fold"] and found["fits"]
    assert_planned_again_alike(base, found)


def assert_planned_again_alike(base: list[str], found: dict) -> None:
    """The search's choice ``found`` planned with its open choices given (``base`` plus its micro-batch,
    recomputation, vp and sharding) scores the same memory and step time."""
    lay = found["layout"]
    fixed = base + ["--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"], "--vp", str(lay["vp"])]
    fixed += ["--zero", str(lay["zero_stage"])] if lay["sharding"] == "zero" else ["--fsdp", lay["sharding"][5:]]
    res = CliRunner().invoke(cli, fixed, prog_name="plan")
    assert res.exit_code == 0, res.output
    again = json.loads(res.output)["plan"]
    assert again["memory_bytes"] == found["memory_bytes"]
    assert again["step_time_s"] == pytest.approx(found["step_time_s"], rel=1e-12)


@pytest.mark.slow
def test_folded_megatron_args_pass_megatron_s_parser_and_checks(tmp_path):
    """--out writes --expert-model-parallel-size 32 --expert-tensor-parallel-size 1 beside tp 2, pp 8 on 256
    GPUs; megatron-core's TransformerConfig and the validate_args rule table take them, and Megatron's
    batch arithmetic (DP = world / (tp pp cp)) gives the global batch the plan has."""
    require("megatron.core")
    from megatron_args import LaunchEnv, megatron_args_errors, parse_args
    from test_emit_megatron import transformer_config

    from planner.emit.megatron import to_megatron_args

    m, gpu = load_model("qwen3-235b-a22b"), get_gpu("h100")
    setup = TrainingSetup(seq_len=4096, global_batch=8192, stack="megatron")
    lay = Layout(dp=16, tp=2, pp=8, vp=4, ep=32, etp=1, ep_fold=True, zero_stage=1, sp=True, micro_batch=1,
                 grad_accum=512, seq_len=4096, recompute="full")
    r = api.evaluate_layout(m, gpu, setup, lay)
    argv = to_megatron_args(r)
    a = parse_args(argv)
    assert (a.expert_model_parallel_size, a.expert_tensor_parallel_size) == (32, 1)
    # the helper maps the flags core_transformer_config_from_args maps, less the expert tensor-parallel
    # size, which dataclasses.replace sets (re-running TransformerConfig's checks)
    cfg = dataclasses.replace(transformer_config(a), expert_tensor_parallel_size=a.expert_tensor_parallel_size)
    assert cfg.expert_model_parallel_size == 32 and cfg.expert_tensor_parallel_size == 1
    assert megatron_args_errors(argv, LaunchEnv(world_size=256, cuda_device_max_connections="1",
                                                device_arch_major=9)) == []
    dp = 256 // (a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size)
    assert a.global_batch_size == 8192 and a.global_batch_size % (a.micro_batch_size * dp) == 0


def test_a_folded_all_to_all_runs_on_the_ranks_megatron_core_groups():
    """tp 2, pp 8, ep 32, etp 1 on 256 H100: megatron-core's ep group is 32 consecutive ranks
    (test_folded_groups_equal_megatron_cores), four 8-GPU nodes, so its all-to-all is timed as an
    unfolded layout's whose ep groups are those ranks (ep innermost, stride 1), not as tp-strided
    ranks over eight nodes."""
    from planner.hardware.placement import all_to_all_link, cluster_for
    from planner.timing.degrees import layout_links

    cluster = cluster_for(get_gpu("h100"))
    order = ("tp", "cp", "ep", "pp", "dp")
    _, folded = layout_links(cluster, (2, 1, 32, 16, 8), order, etp=1, ep_fold=1)
    assert folded == all_to_all_link(cluster, (1, 1, 32, 1, 8), order)
    assert folded.bus_bytes_per_s > all_to_all_link(cluster, (2, 1, 32, 1, 8), order).bus_bytes_per_s


@pytest.mark.slow
def test_the_all_to_all_runs_on_megatron_core_s_ep_groups_unfolded_too(megatron):
    """Bug fixed: with etp < tp or cp > 1, megatron-core's ep group is still etp-strided consecutive
    ranks (its expert grid leaves cp out), not the planner's ep axis strided by tp x cp; the
    all-to-all is timed on the ranks megatron-core groups."""
    from planner.hardware.placement import all_to_all_link, cluster_for
    from planner.timing.degrees import layout_links

    cluster = cluster_for(get_gpu("h100"))
    order = ("tp", "cp", "ep", "pp", "dp")
    for (world, tp, pp, cp, ep, etp), (_, _, _, ranks) in zip(UNFOLDED, megatron["groups"][len(FOLDED):]):
        lay = Layout(dp=world // (tp * pp * cp * ep), tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)
        assert ranks == list(range(0, etp * ep, etp))
        _, a2a = layout_links(cluster, (tp, cp, ep, lay.dp, pp), order, etp=etp)
        assert a2a == all_to_all_link(cluster, (etp, 1, ep, lay.expert_shard_degree, pp), order)
        # inside one 8-GPU node now, across nodes on the tp x cp stride before
        assert a2a.bus_bytes_per_s > all_to_all_link(cluster, (tp, cp, ep, lay.dp, pp), order).bus_bytes_per_s


def test_dp_given_as_megatron_s_data_parallel_size_is_answered_with_the_way_out():
    res = CliRunner().invoke(cli, ["--model", "qwen3-235b-a22b", "--gpus", "h100", "--n-gpus", "256", "--dp", "16",
                                   "--tp", "2", "--pp", "8", "--ep", "32", "--etp", "1"], prog_name="plan")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "drop --dp 16 to fold ep over tp x cp x dp" in res.output


SUPER = ["--model", "nemotron-3-super", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "64", "--tp", "2",
         "--ep", "64", "--etp", "1", "--seq-len", "8192", "--global-batch", "512", "--precision", "nvfp4", "--json"]


def test_a_published_folded_layout_is_found_with_the_pipeline_left_open():
    """Megatron-Bridge trained Nemotron 3 Super on 64 GB200 at TP 2, PP 1, EP 64, GBS 512, sequence 8192, NVFP4
    (tests/data/megatron_bridge_runs.json, mbridge-26.08-nemotron-3-super-gb200-nvfp4-64gpu): ep 64 folded over
    tp 2 x dp 32. Given its tp and ep with --pp left open, the search walks the folded shapes too
    (layouts.layout.folded_shapes); before, a fold was searched only with --tp, --pp and --ep all given, and this
    was answered "no layout fits on 64 x gb200, it fits from 128"."""
    res = CliRunner().invoke(cli, SUPER, prog_name="plan")
    assert res.exit_code == 0, res.output
    found = json.loads(res.output)["plan"]
    lay = found["layout"]
    assert found["fits"] and lay["ep_fold"] and (lay["tp"], lay["ep"], lay["etp"]) == (2, 64, 1)
    assert lay["dp"] * lay["tp"] * lay["pp"] == 64
    # the search's choice planned with every degree given scores the same
    assert_planned_again_alike(SUPER + ["--pp", str(lay["pp"])], found)
