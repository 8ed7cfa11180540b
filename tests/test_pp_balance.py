"""--pp-balance embedding-loss (Llama 3's pipeline balance, arXiv:2407.21783 Sec. 3.3.2), refereed
by megatron-core 0.16.1's own code on CPU:

- the layers per stage and per model chunk against transformer_block.get_num_layers_to_build
  under TransformerConfig's account_for_embedding_in_pipeline_split and
  account_for_loss_in_pipeline_split;
- the activations a stage holds under the interleaved schedule against a walk of
  pipeline_parallel/schedules.py's own schedule table (get_schedule_table) and warm-up count
  (get_pp_rank_microbatches), with those chunk sizes;
- the Megatron-LM arguments the plan writes against TransformerConfig's own checks.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_args import LaunchEnv, megatron_args_errors, parse_args

from planner import api
from planner.cli.main import cli
from planner.emit.megatron import to_megatron_args
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout, reject_reason
from planner.memory.model import per_rank_memory, stage_layers
from planner.memory.pipeline import chunk_layers, held_layer_micro_batches
from planner.models.spec import count_params, load_model
from planner.training.setup import TrainingSetup

require("megatron.core")

BALANCE = "embedding-loss"
# (layers, pp, vp): Llama 3 405B's 126 layers on 16 stages (8 chunks of one layer, the paper's
# layout: 126 + embedding + loss = 16 x 8), and smaller splits with several layers per chunk
SPLITS = [(126, 16, 8), (126, 16, 4), (126, 16, 1), (30, 4, 2), (30, 4, 1), (62, 8, 2), (14, 4, 4)]


def _megatron():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
    return torch, schedules, get_num_layers_to_build, TransformerConfig


def _config(n_layers: int, pp: int, vp: int, **kw):
    torch, _, _, TransformerConfig = _megatron()
    return TransformerConfig(num_layers=n_layers, hidden_size=64, num_attention_heads=4,
                             pipeline_model_parallel_size=pp,
                             virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
                             account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True,
                             bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, **kw)


def _megatron_chunks(n_layers: int, pp: int, vp: int) -> list[list[int]]:
    """Blocks per (rank, chunk), as megatron-core builds them."""
    _, _, layers_to_build, _ = _megatron()
    cfg = _config(n_layers, pp, vp)
    return [[layers_to_build(cfg, vp_stage=c if vp > 1 else None, pp_rank=r) for c in range(vp)] for r in range(pp)]


@pytest.mark.parametrize("n_layers, pp, vp", SPLITS)
def test_layers_per_stage_and_chunk_are_megatron_cores(n_layers, pp, vp):
    chunks = _megatron_chunks(n_layers, pp, vp)
    assert [list(c) for c in chunk_layers(n_layers, pp, vp, BALANCE)] == chunks
    assert stage_layers(n_layers, pp, BALANCE) == [sum(c) for c in chunks]


def test_llama3_405b_split_is_the_papers():
    """126 layers, pp 16, vp 8: the first chunk of rank 0 is the embedding alone, the last of
    rank 15 the output projection and loss alone (Sec. 3.3.2), one block everywhere else."""
    chunks = _megatron_chunks(126, 16, 8)
    assert chunks[0] == [0] + [1] * 7 and chunks[-1] == [1] * 7 + [0]
    assert all(c == [1] * 8 for c in chunks[1:-1])


def _walk_peak(schedules, n_micro: int, pp: int, vp: int, rank: int, layers: list[int], group: int = 0) -> int:
    """The most blocks' activations rank ``rank`` keeps at once, walking megatron-core's own
    schedule table and warm-up count: forward passes in table order, each steady step a
    forward then a backward (schedules.py forward_backward_pipelining_with_interleaving), a
    backward's chunk the table's reversed (get_model_chunk_id(forward=False))."""
    comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: rank),
                           virtual_pipeline_model_parallel_size=vp)
    total, _, warmup, remaining = schedules.get_pp_rank_microbatches(n_micro, vp, group or pp, p2p_communicator=comm)
    table = schedules.get_schedule_table(n_micro, vp, group or pp)
    fwd = [layers[c] for _, c in table]
    bwd = [layers[vp - 1 - c] for _, c in table]
    live = peak = 0
    for k in range(warmup):
        live += fwd[k]
        peak = max(peak, live)
    for k in range(remaining):
        live += fwd[warmup + k]
        peak = max(peak, live)
        live -= bwd[k]
    assert total == vp * n_micro
    return peak


@pytest.mark.parametrize("n_layers, pp, vp, n_micro", [(126, 16, 8, 32), (126, 16, 8, 16), (126, 16, 4, 48),
                                                       (30, 4, 2, 8), (30, 4, 2, 12), (14, 4, 4, 4)])
def test_held_activations_walk_megatron_cores_schedule(n_layers, pp, vp, n_micro):
    _, schedules, _, _ = _megatron()
    chunks = _megatron_chunks(n_layers, pp, vp)
    for r in range(pp):
        assert held_layer_micro_batches(n_layers, pp, vp, n_micro, r, BALANCE) == \
            _walk_peak(schedules, n_micro, pp, vp, r, chunks[r]), r


def _405b_layout(vp: int, dp: int = 64) -> Layout:
    return Layout(dp=dp, tp=8, pp=16, sp=True, vp=vp, micro_batch=1, grad_accum=2048 // dp, seq_len=8192,
                  zero_stage=2, sharding="fsdp-grad-op", recompute="none")


def test_memory_model_holds_megatrons_peak_on_the_peak_stage():
    """Llama 3 405B at vp 8 with the balance: the memory model's most loaded stage holds the
    walk's peak layer-micro-batches (stage 1: 141 = (16 - 2) x 2 + 7 x 16 + 1 single-layer
    chunks, more than stage 0's 112: its embedding chunk keeps no block)."""
    _, schedules, _, _ = _megatron()
    m = load_model("llama3.1-405b")
    setup = TrainingSetup(seq_len=8192, global_batch=2048, pp_balance=BALANCE, fsdp_pipeline_grad_sync="micro-batch")
    r = per_rank_memory(m, setup, _405b_layout(8), count_params(m), 8)
    chunks = _megatron_chunks(126, 16, 8)
    walks = [_walk_peak(schedules, 32, 16, 8, s, chunks[s]) for s in range(16)]
    assert r.stage == 1 and walks.index(max(walks)) == 1
    assert r.in_flight * r.n_layers_on_stage == pytest.approx(walks[1])


def test_balance_off_keeps_the_default_split_and_answers():
    """Default off: 'none' is the planner's split as before; for 126 layers on 16 stages that
    split already gives the first and last stages 7 (so vp 1 times the same either way)."""
    assert stage_layers(126, 16) == stage_layers(126, 16, "none") == [7] + [8] * 14 + [7]
    assert stage_layers(126, 16, BALANCE) == stage_layers(126, 16)
    assert stage_layers(32, 4, BALANCE) == [7, 9, 9, 7] and stage_layers(32, 4) == [8, 8, 8, 8]


def test_rules_follow_megatron_cores_divisibility():
    m = load_model("llama3.1-405b")
    setup = TrainingSetup(seq_len=8192, global_batch=2048, pp_balance=BALANCE)
    assert reject_reason(m, TrainingSetup(seq_len=8192, global_batch=2048), _405b_layout(8), 8) is not None
    assert reject_reason(m, setup, _405b_layout(8), 8) is None
    why = reject_reason(m, setup, _405b_layout(3, dp=32), 8)
    assert why is not None and "--pp-balance" in why and "layers + 2" in why
    with pytest.raises(ValueError):   # megatron-core refuses the same split
        _config(126, 16, 3)


def test_cli_refuses_a_split_megatron_cannot_build_in_one_line():
    res = CliRunner().invoke(cli, ["--model", "llama3.1-405b", "--gpus", "h100", "--n-gpus", "8192", "--tp", "8",
                                   "--pp", "16", "--dp", "64", "--vp", "3", "--pp-balance", BALANCE,
                                   "--seq-len", "8192", "--global-batch", "2048"])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "--pp-balance" in lines[0] and "Traceback" not in res.output


def test_megatron_args_carry_the_balance_and_megatron_core_accepts_them():
    m = load_model("llama3.1-405b")
    setup = TrainingSetup(seq_len=8192, global_batch=2048, pp_balance=BALANCE, fsdp_pipeline_grad_sync="micro-batch")
    lay = Layout(dp=2, tp=8, pp=16, sp=True, vp=8, micro_batch=1, grad_accum=1024, seq_len=8192, zero_stage=1,
                 recompute="full")
    r = api.evaluate_layout(m, get_gpu("b200"), setup, lay)
    args = to_megatron_args(r)
    assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    assert "--pipeline-model-parallel-layout" not in args
    a = parse_args(args)
    assert a.num_virtual_stages_per_pipeline_rank == 8
    assert megatron_args_errors(args, LaunchEnv(world_size=lay.n_gpus, cuda_device_max_connections="1",
                                                device_arch_major=10)) == []
    cfg = _config(a.num_layers, a.pipeline_model_parallel_size, a.num_virtual_stages_per_pipeline_rank)
    assert cfg.account_for_embedding_in_pipeline_split and cfg.account_for_loss_in_pipeline_split


@pytest.mark.parametrize("name, lay", [
    ("llama3.1-405b", _405b_layout(8)), ("llama3.1-405b", _405b_layout(4, dp=128)),
    ("qwen2.5-0.5b", Layout(dp=2, tp=1, pp=2, vp=13, micro_batch=1, grad_accum=8, seq_len=2048)),
    ("qwen2.5-0.5b", Layout(dp=1, tp=1, pp=13, vp=1, micro_batch=1, grad_accum=16, seq_len=2048)),
])
def test_floors_stay_below_the_balanced_memory(name, lay):
    """The search's floors read the same split and warm-up, so they stay lower bounds."""
    from planner.memory.floors import activation_floor_bytes, model_state_floor
    m = load_model(name)
    setup = TrainingSetup(seq_len=lay.seq_len, global_batch=lay.global_batch, pp_balance=BALANCE)
    assert reject_reason(m, setup, lay, 8) is None
    r = per_rank_memory(m, setup, lay, count_params(m), 8)
    assert activation_floor_bytes(m, setup, lay) <= r.total
    assert model_state_floor(m, setup, lay).at_step <= r.total


def test_json_names_the_balance_only_when_set():
    import json
    base = ["--model", "llama3.1-405b", "--gpus", "h100", "--n-gpus", "8192", "--tp", "8", "--pp", "16", "--dp", "64",
            "--vp", "8", "--seq-len", "8192", "--global-batch", "2048", "--micro-batch", "1", "--json"]
    on = json.loads(CliRunner().invoke(cli, [*base, "--pp-balance", BALANCE]).output)
    assert on["assumptions"]["pp_balance"] == BALANCE
    off = CliRunner().invoke(cli, base[:-1] + ["--vp", "4", "--json"])
    assert "pp_balance" not in json.loads(off.output)["assumptions"]


# --pp-microbatch-group (TrainingSetup.pp_microbatch_group): the same walk of megatron-core's own
# get_pp_rank_microbatches and get_schedule_table with microbatch_group_size_per_vp_stage N.
# megatron-core runs N from pp to the micro-batches; below pp (Llama 3's schedule, arXiv:2407.21783
# Sec. 3.3.2) its two functions still lay out that schedule, which is what the planner reads.
@pytest.mark.parametrize("n_layers, pp, vp, n_micro, group", [
    (126, 16, 8, 32, 5), (126, 16, 8, 32, 8), (126, 16, 8, 32, 32), (30, 4, 2, 12, 6), (30, 4, 2, 12, 2),
    (62, 8, 2, 16, 16)])
def test_held_activations_follow_the_micro_batch_group(n_layers, pp, vp, n_micro, group):
    _, schedules, _, _ = _megatron()
    chunks = _megatron_chunks(n_layers, pp, vp)
    for r in range(pp):
        assert held_layer_micro_batches(n_layers, pp, vp, n_micro, r, BALANCE, group) == \
            _walk_peak(schedules, n_micro, pp, vp, r, chunks[r], group), r


def test_llama3_405b_fits_h100_with_its_papers_group_and_not_megatrons_default():
    """The issue's Llama 3 405B layout on 80 GB H100s: the peak stage holds the walk's
    layer-micro-batches for the group given, and the group sets whether it fits."""
    _, schedules, _, _ = _megatron()
    m = load_model("llama3.1-405b")
    chunks = _megatron_chunks(126, 16, 8)
    gpu = get_gpu("h100")
    fits = {}
    for group in (0, 5):
        setup = TrainingSetup(seq_len=8192, global_batch=2048, pp_balance=BALANCE,
                              fsdp_pipeline_grad_sync="micro-batch", pp_microbatch_group=group)
        cand = api.evaluate_layout(m, gpu, setup, _405b_layout(8)).best
        walks = [_walk_peak(schedules, 32, 16, 8, s, chunks[s], group) for s in range(16)]
        assert cand.memory.in_flight * cand.memory.n_layers_on_stage == pytest.approx(max(walks))
        fits[group] = cand.fits
    assert fits == {0: False, 5: True}


def test_megatron_args_carry_the_group_only_where_megatron_core_takes_it():
    from planner.errors import UserError
    m = load_model("llama3.1-405b")
    lay = Layout(dp=2, tp=8, pp=16, sp=True, vp=8, micro_batch=1, grad_accum=1024, seq_len=8192, zero_stage=1,
                 recompute="full")
    flag = "--microbatch-group-size-per-virtual-pipeline-stage"
    for group, written in ((0, None), (16, None), (32, "32")):
        setup = TrainingSetup(seq_len=8192, global_batch=2048, pp_balance=BALANCE, pp_microbatch_group=group)
        args = to_megatron_args(api.evaluate_layout(m, get_gpu("b200"), setup, lay))
        assert (args[args.index(flag) + 1] if flag in args else None) == written
        if written:
            assert parse_args(args).microbatch_group_size_per_virtual_pipeline_stage == 32
            # megatron-core's own config takes it (ModelParallelConfig field of the same name)
            assert _config(126, 16, 8, microbatch_group_size_per_vp_stage=32).microbatch_group_size_per_vp_stage == 32
    setup = TrainingSetup(seq_len=8192, global_batch=2048, pp_balance=BALANCE, pp_microbatch_group=5)
    with pytest.raises(UserError, match="below pp=16"):
        to_megatron_args(api.evaluate_layout(m, get_gpu("b200"), setup, lay))


def test_cli_refuses_a_group_above_the_micro_batches_in_one_line():
    res = CliRunner().invoke(cli, ["--model", "llama3.1-405b", "--gpus", "h100", "--n-gpus", "8192", "--tp", "8",
                                   "--pp", "16", "--dp", "64", "--vp", "8", "--micro-batch", "1", "--seq-len", "8192",
                                   "--global-batch", "2048", "--pp-balance", BALANCE, "--pp-microbatch-group", "64"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--pp-microbatch-group 64 exceeds the 32 micro-batches" in res.output


def test_a_group_of_pp_is_megatron_cores_default_under_either_balance():
    """--pp-microbatch-group pp is the default (ModelParallelConfig.__post_init__ sets N = pp):
    the same memory as leaving it out, with or without the balance; another N changes it."""
    m = load_model("qwen2.5-0.5b")
    for balance, vp in (("none", 2), (BALANCE, 13)):     # 24 layers; 24 + 2 = 2 x 13 under the balance
        lay = Layout(dp=1, tp=1, pp=2, vp=vp, micro_batch=1, grad_accum=8, seq_len=2048)
        mem = {}
        for n in (0, 2, 4):
            setup = TrainingSetup(seq_len=2048, global_batch=8, pp_balance=balance, pp_microbatch_group=n)
            assert reject_reason(m, setup, lay, 8) is None
            mem[n] = per_rank_memory(m, setup, lay, count_params(m), 8).total
        assert mem[0] == mem[2] < mem[4], balance
