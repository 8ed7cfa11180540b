"""The expert-parallel all-to-all overlap, CUDA graphs and FP8 attention (training.moe_runtime):
what megatron-core 0.16.1's TransformerConfig accepts is what `plan --out` writes, the plan refuses
what it refuses, and each setting moves the step time the way its mechanism does."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli
from planner.training.setup import TrainingSetup

QWEN = ["--model", "qwen3-30b-a3b", "--gpus", "b200", "--stack", "megatron", "--n-gpus", "8", "--tp", "1",
        "--pp", "1", "--ep", "8", "--dp", "1", "--micro-batch", "1", "--global-batch", "512"]


def _result(setup_kw: dict, **lay_kw):
    from planner import api
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import Layout
    from planner.models.spec import load_model
    from planner.timing.efficiency import MEGATRON_BRIDGE

    lay = Layout(**{"dp": 1, "ep": 8, "micro_batch": 1, "grad_accum": 64, "seq_len": 4096, "zero_stage": 1,
                    **lay_kw})
    setup = TrainingSetup(seq_len=4096, global_batch=512 * lay.dp // max(1, lay.dp), stack="megatron",
                          **setup_kw)
    setup = replace(setup, global_batch=lay.micro_batch * lay.grad_accum * lay.dp * lay.ep)
    return api.evaluate_layout(load_model("qwen3-30b-a3b"), get_gpu("b200"), setup, lay, efficiency=MEGATRON_BRIDGE)


def test_emitted_overlap_and_graphs_pass_megatron_cores_transformer_config():
    """megatron-core 0.16.1's TransformerConfig.__post_init__ (transformer_config.py lines 1688-1740,
    1852-1906) checks the dispatcher, the overlap and the graph scope the plan writes."""
    require("megatron.core")
    from megatron_args import parse_args
    from test_emit_megatron import transformer_config

    from planner.emit.megatron import to_megatron_args

    r = _result({"cuda_graphs": "moe"})
    a = parse_args(to_megatron_args(r))
    assert a.overlap_moe_expert_parallel_comm and a.moe_token_dispatcher_type == "alltoall"
    assert a.cuda_graph_impl == "transformer_engine" and a.cuda_graph_scope == ["attn", "moe_router", "moe_preprocess"]
    cfg = transformer_config(a)
    assert cfg.overlap_moe_expert_parallel_comm


def test_flex_dispatcher_is_written_and_accepted_by_megatron_core():
    require("megatron.core")
    from megatron_args import parse_args
    from test_emit_megatron import transformer_config

    from planner.emit.megatron import to_megatron_args

    a = parse_args(to_megatron_args(_result({"moe_dispatcher": "flex"})))
    assert a.moe_token_dispatcher_type == "flex"
    assert transformer_config(a).moe_token_dispatcher_type == "flex"


def test_no_overlap_written_where_megatron_core_refuses_it():
    """Full recomputation: megatron-core refuses the overlap; the plan neither writes nor times it."""
    require("megatron.core")
    from megatron_args import parse_args
    from test_emit_megatron import transformer_config

    from planner.emit.megatron import to_megatron_args

    r = _result({}, recompute="full")
    a = parse_args(to_megatron_args(r))
    assert not a.overlap_moe_expert_parallel_comm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(AssertionError, match="disable full recomputation"):
            transformer_config(parse_args([*to_megatron_args(r), "--overlap-moe-expert-parallel-comm"]))


def test_each_setting_moves_the_step_time_its_way():
    base = _result({}).best.time.step_time_s
    off = _result({"moe_a2a_overlap": "off"}).best.time.step_time_s
    graphs = _result({"cuda_graphs": "moe"}).best.time.step_time_s
    full = _result({"cuda_graphs": "full-iteration"}).best.time.step_time_s
    assert off > base          # all-to-alls no longer hidden
    assert graphs == base      # the dropless host sync stays under the TE graphs (test below)
    assert full < base         # no host sync per MoE block (Efficiency.moe_block_overhead_s)


def test_te_graphs_of_the_router_keep_the_dropless_host_sync():
    """megatron-core 0.16.1's alltoall dispatcher: the moe_preprocess graph scope moves the
    device-to-host copy of the token counts (cuda_dtoh_point), not the wait on it; a dropless layer
    with ep > 1 still waits before its all-to-all, and only drop-and-pad skips both
    (training.moe_runtime.host_sync_per_moe_block)."""
    require("megatron.core")
    import inspect

    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as D

    from planner.training.moe_runtime import host_sync_per_moe_block

    init, pre = inspect.getsource(D.__init__), inspect.getsource(D.preprocess)
    wait = inspect.getsource(D._maybe_dtoh_and_synchronize)
    assert 'self.cuda_dtoh_point = "before_ep_alltoall"' in init        # what the graph scope changes
    assert "cuda_sync_point = \"no_sync\"" in init and "moe_preprocess" not in pre
    assert '_maybe_update_cuda_sync_point("before_ep_alltoall")' in pre  # ep > 1, dropless
    assert "if not self.drop_and_pad:" in wait and "d2h_event.synchronize()" in wait
    assert host_sync_per_moe_block("none") and host_sync_per_moe_block("moe")
    assert not host_sync_per_moe_block("full-iteration")


@pytest.mark.parametrize("extra,says", [
    (["--stack", "", "--cuda-graphs", "moe"], "add --stack megatron"),
    (["--fp8-attention"], "add --precision fp8"),
    (["--pp", "2", "--n-gpus", "16", "--moe-a2a-overlap", "on"], "--vp > 1"),
    (["--cuda-graphs", "all"], "--cuda-graphs"),
    (["--stack", "", "--moe-dispatcher", "flex"], "add --stack megatron"),
])
def test_bad_settings_exit_2_with_one_line(extra, says):
    args = list(QWEN)
    if "--stack" in extra:
        i = args.index("--stack")
        del args[i:i + 2]
    if "--pp" in extra:
        for flag in ("--pp", "--n-gpus"):
            i = args.index(flag)
            del args[i:i + 2]
    extra = [x for x in extra if x not in ("--stack", "")]
    r = CliRunner().invoke(cli, [*args, *extra])
    assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output
