"""DeepSeek-V3.2 (deepseek_v32): DeepSeek-V3's MLA and MoE with DeepSeek Sparse Attention's
lightning indexer, a written family (planner.models.recent, planner.models.dsa).

Referees: transformers 5.x's DeepseekV32ForCausalLM (the indexer's parameters as its
DeepseekV32Indexer module holds them; `plan measure` through FSDPMemTracker under fake tensors);
the DeepSeek-V3.2 paper (arXiv:2512.02556, Sec. 2.1) for what transformers does not run: its
attention is dense with a top-k mask, while DSA's kernel attends index_topk keys per query, so
past 2,048 tokens the main attention's FLOPs stop growing and only the indexer's do. The dense
part of the FLOPs is checked against FlopCounterMode in tests/test_model_flops.py
(test_deepseek_v32_counts_the_indexer_backward), the LoRA count against PEFT and the tiny count
against transformers in tests/test_models_recent.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli
from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.models.spec import count_params
from planner.timing.flops import model_flops_per_token

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"


@pytest.mark.slow
def test_indexer_parameters_are_transformers_indexer_module():
    torch = require("torch")
    transformers = require("transformers")
    cfg = json.loads((CONFIGS / "tiny-deepseek-v32.json").read_text())
    rest = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("deepseek_v32", **rest))
    indexer = sum(p.numel() for p in model.model.layers[0].self_attn.indexer.parameters())
    m = spec_from_hf_config(dict(cfg), "t", "t")
    plain = spec_from_hf_config({**cfg, "model_type": "deepseek_v3"}, "t", "t")
    assert count_params(m).total - count_params(plain).total == m.n_layers * indexer
    assert count_params(m).total == sum(p.numel() for p in model.parameters())


def test_sparse_attention_stops_growing_at_top_k():
    """arXiv:2512.02556 Sec. 2.1: each query attends its index_topk (2,048) selected keys, so from
    4,096 to 8,192 tokens the main MLA attention's FLOPs per token are unchanged and only the
    indexer's scores grow, 2 (H^I D^I + H^I) FLOPs per extra key per block (64 heads of 128),
    three times for forward and backward; DeepSeek-V3 (dense) grows by its full scores too."""
    v32, v3 = load_model("deepseek-v3.2"), load_model("deepseek-v3")
    grow = model_flops_per_token(v32, 8192) - model_flops_per_token(v32, 4096)
    assert grow == pytest.approx(3 * 61 * 2 * 4096 * (64 * 128 + 64))
    dense_grow = model_flops_per_token(v3, 8192) - model_flops_per_token(v3, 4096)
    assert dense_grow == pytest.approx(3 * 61 * 2 * 4096 * 128 * (192 + 128))       # 128 heads, qk 192, v 128
    # below the top-k the two attend the same keys: V3.2 is V3 plus its indexer
    assert model_flops_per_token(v32, 2048) > model_flops_per_token(v3, 2048)


def test_sparse_attention_time_is_a_window_of_top_k():
    """The fused kernel's share of the s x s scores: query p attends min(p, 2048) keys; at 2,048
    tokens or fewer that is the causal half, at 8,192 (2048 - 2048 x 2047 / 16384) / 8192."""
    from planner.timing.kernels import local_attention_share

    m = load_model("deepseek-v3.2")
    assert local_attention_share(m, 2048) == pytest.approx(0.5, rel=1e-3)
    assert local_attention_share(m, 8192) == pytest.approx((2048 - 2048 * 2047 / 16384) / 8192)


@pytest.mark.slow
def test_plan_measure_tiny_deepseek_v32_within_ten_percent():
    """`plan measure` on bench/configs/tiny-deepseek-v32.json (tiny-deepseek-v3 with an indexer of
    4 heads of 32, top-128), FSDP over 8 fake ranks, bf16 mixed precision, 2 x 1024 tokens: the
    indexer's broadcast key copy and scores (dsa.indexer_working_bytes_per_token) at the forward's
    peak; predicted within 10% (seen: +1.2% at 1024 since FSDP2's block-backward moment holds the
    block gathered and its 16-bit gradients, memory.buffers.fsdp_block_backward_bytes; before that
    +0.3% at 1024, +0.8% at 512, +2.1% at 256; -56% at 1024 before the indexer's working set was
    modelled)."""
    require("torch")
    require("transformers")
    from planner.layouts.layout import Layout
    from planner.measure.accuracy import compare
    from planner.training.setup import TrainingSetup

    cfg = json.loads((CONFIGS / "tiny-deepseek-v32.json").read_text())
    m = spec_from_hf_config(dict(cfg), "tiny-deepseek-v32", "tiny-deepseek-v32")
    lay = Layout(dp=8, zero_stage=3, sharding="fsdp-full", micro_batch=2, seq_len=1024, recompute="none")
    setup = TrainingSetup(seq_len=1024, global_batch=16, precision="bf16-mixed")
    rows = {r.category: r for r in compare(m, cfg, setup, lay, in_process=True).rows}
    assert rows["total"].error == pytest.approx(0.0, abs=0.10)


@pytest.mark.slow
def test_inference_cache_holds_the_indexer_keys_as_transformers_does():
    # transformers' cache after one forward of the tiny model (bf16): per layer and token the
    # latent (kv_lora_rank 64 + rope 16) and the indexer's key (index_head_dim 32)
    require("torch")
    require("transformers")
    from saved_tensors import transformers_cache_bytes

    from planner.memory.inference import kv_cache_bytes

    cfg = json.loads((CONFIGS / "tiny-deepseek-v32.json").read_text())
    m = spec_from_hf_config(dict(cfg), "t", "t")
    assert kv_cache_bytes(m, 2, 100) == transformers_cache_bytes(cfg, 2, 100) == 3 * (64 + 16 + 32) * 2 * 100 * 2


def test_deepseek_v32_plans_expert_parallel_on_h200():
    r = CliRunner().invoke(cli, ["--model", "deepseek-v3.2", "--gpus", "h200", "--ep", "8"], prog_name="plan",
                           env={"NO_COLOR": "1", "COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "ep=8" in r.output and "generic path" not in r.output
    assert not load_model("deepseek-v3.2").is_generic


def test_dense_blocks_after_moe_blocks_are_refused_in_one_line(tmp_path):
    # DeepseekV32Config's mlp_layer_types may place a dense block anywhere; the planner's blocks
    # are dense first (first_k_dense_replace), so another order is refused, exit 2, one line
    cfg = json.loads((CONFIGS / "tiny-deepseek-v32.json").read_text())
    path = tmp_path / "v32.json"
    path.write_text(json.dumps({**cfg, "mlp_layer_types": ["sparse", "dense", "sparse"]}))
    r = CliRunner().invoke(cli, ["--model", str(path), "--gpus", "h100"], prog_name="plan")
    assert r.exit_code == 2 and "mlp_layer_types" in r.output and len(r.output.strip().splitlines()) == 1, r.output
