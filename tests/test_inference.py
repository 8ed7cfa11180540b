"""``--task load`` (planner.memory.inference): the memory to hold a model for inference.

The KV cache is checked against the cache transformers itself builds; weights against the
parameter count at each storage format; the GPU counts against the arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.memory.inference import LoadSetup, kv_cache_bytes, load_memory, plan_load
from planner.models.spec import count_params, load_model, spec_from_hf_config
from planner.units import GiB

TINY_GQA = {
    "model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 3,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 500,
    "max_position_embeddings": 512, "tie_word_embeddings": False,
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name, kv_bytes", [("float32", 4), ("bfloat16", 2)])
def test_kv_cache_equals_transformers_cache(dtype_name, kv_bytes):
    torch = require("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(TINY_GQA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype_name)).eval()
    batch, context = 2, 40
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 500, (batch, context)), use_cache=True)
    cache = out.past_key_values
    stored = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    m = spec_from_hf_config(TINY_GQA, "tiny-gqa", "test")
    # 2 x 3 layers x 2 KV heads x 16 head_dim x 40 tokens x 2 sequences x bytes
    assert kv_cache_bytes(m, batch, context, kv_bytes) == stored == 2 * 3 * 2 * 16 * 40 * 2 * kv_bytes


def test_llama3_8b_kv_cache_is_one_gib_at_8k():
    # 2 x 32 layers x 8 KV heads x 128 x 8192 tokens x 2 B = 1 GiB; GQA saves 4x over 32 heads
    assert kv_cache_bytes(load_model("llama3.1-8b"), 1, 8192) == GiB


def test_weights_at_each_format():
    m = load_model("llama3.1-70b")
    n = count_params(m).total
    assert load_memory(m, LoadSetup()).weights == 2 * n
    assert load_memory(m, LoadSetup(weight_bytes=4)).weights == 4 * n
    int8 = load_memory(m, LoadSetup(quant="int8")).weights
    nf4 = load_memory(m, LoadSetup(quant="nf4")).weights
    embeddings = 2 * 128256 * 8192                    # input embedding and LM head, kept 16-bit
    assert 1.0 < (int8 - 2 * embeddings) / (n - embeddings) < 1.01     # 1 B + a scale per row
    assert nf4 < int8 < 2 * n


def test_fewest_gpus():
    h100 = get_gpu("h100")
    assert plan_load(load_model("llama3.1-8b"), h100, LoadSetup()).n_gpus == 1
    seventy = plan_load(load_model("llama3.1-70b"), h100, LoadSetup())
    assert (seventy.tp, seventy.pp) == (2, 1) and seventy.fits       # 141 GB of bf16 weights
    assert plan_load(load_model("llama3.1-70b"), h100, LoadSetup(quant="nf4")).n_gpus == 1
    assert plan_load(load_model("llama3.1-405b"), h100, LoadSetup()).n_gpus > 8


def test_tensor_parallel_replicates_kv_heads_beyond_their_count():
    m = load_model("llama3.1-8b")            # 8 KV heads
    assert kv_cache_bytes(m, 1, 4096, tp=8) == kv_cache_bytes(m, 1, 4096) // 8
    assert kv_cache_bytes(m, 1, 4096, tp=16) == kv_cache_bytes(m, 1, 4096, tp=8)


def test_cli_task_load_json():
    res = CliRunner().invoke(cli, ["--task", "load", "--model", "llama3.1-8b", "--gpus", "l40s", "--quant", "nf4",
                                   "--micro-batch", "4", "--seq-len", "8192", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["task"] == "load" and out["load"]["n_gpus"] == 1 and out["load"]["fits"]
    assert out["load"]["memory_bytes"]["kv_cache"] == 4 * GiB
    assert out["assumptions"]["quant"] == "nf4"


def test_cli_task_load_rejects_training_options():
    res = CliRunner().invoke(cli, ["--task", "load", "--model", "llama3.1-8b", "--gpus", "h100", "--zero", "3"])
    assert res.exit_code == 2 and "training option" in res.output


FAMILY_CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"


def _transformers_cache_bytes(path: Path, batch: int, context: int) -> int:
    torch = require("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads(path.read_text())
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, config.vocab_size, (batch, context)), use_cache=True)
    return sum(t.numel() * t.element_size() for layer in out.past_key_values.layers for t in (layer.keys, layer.values))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-deepseek-v3", "tiny-gemma3-text", "tiny-gpt-oss", "tiny-llama4-text"])
@pytest.mark.parametrize("context", [100, 300])
def test_mla_and_local_attention_caches_equal_transformers(name, context):
    """MLA's latent cache and sliding/chunked layers' bounded caches (windows of 128 tokens in the
    tiny configs) against transformers 5.24.0's DynamicCache, summed over its tensors. Past the
    window transformers keeps window - 1 tokens per local layer (DynamicSlidingWindowLayer); the
    planner sizes the whole window, one token more per local layer."""
    path = FAMILY_CONFIGS / f"{name}.json"
    m = load_model(str(path))
    batch = 2
    stored = _transformers_cache_bytes(path, batch, context)
    one_token_per_local_layer = 0
    if m.local_attention and context > m.attention_window:
        one_token_per_local_layer = m.n_local_layers * 2 * m.n_kv_heads * m.head_dim * batch * 2
    assert kv_cache_bytes(m, batch, context) == stored + one_token_per_local_layer


def test_deepseek_v3_cache_layouts_against_the_paper():
    """DeepSeek-V3 (61 layers, kv_lora_rank 512, rope 64; 128 heads of 192 / 128): the latent
    cache is (d_c + d_h^R) = 576 elements per token and layer (DeepSeek-V2 paper, Table 1),
    whole on every tensor-parallel rank; the per-head layout 128 x (192 + 128) = 40,960,
    split by tp."""
    m = load_model("deepseek-v3")
    latent = kv_cache_bytes(m, 1, 4096)
    assert latent == 61 * 576 * 4096 * 2
    assert kv_cache_bytes(m, 1, 4096, tp=8) == latent
    per_head = kv_cache_bytes(m, 1, 4096, mla_cache="per-head")
    assert per_head == 61 * 128 * (192 + 128) * 4096 * 2
    assert kv_cache_bytes(m, 1, 4096, tp=8, mla_cache="per-head") * 8 == per_head


def test_gemma3_27b_local_layers_hold_the_window_only():
    """Gemma 3 27B: 62 layers, 5 of every 6 sliding over 1024 tokens (layer_types), 16 KV heads
    of 128: at 128k context the 52 local layers hold 1024 tokens each."""
    m = load_model("gemma3-27b")
    n_global = m.n_layers - m.n_local_layers
    per_token_layer = 2 * m.n_kv_heads * m.head_dim * 2
    expected = per_token_layer * (n_global * 131072 + m.n_local_layers * m.attention_window)
    assert (m.n_layers, m.n_local_layers, m.attention_window) == (62, 52, 1024)
    assert kv_cache_bytes(m, 1, 131072) == expected


def test_cli_task_load_mla_cache_flag():
    """--mla-cache picks the layout plan_load sizes and the report names it: DeepSeek-V3's latent
    is kv_lora_rank 512 + rope 64 = 576 elements per token and block (DeepSeek-V2, arXiv:2405.04434,
    Table 1: (d_c + d_h^R) l with d_c = 4 d_h = 512, d_h^R = d_h / 2 = 64); per-head K and V are
    128 x (192 + 128) = 40,960, split over tp."""
    args = ["--task", "load", "--model", "deepseek-v3", "--gpus", "h200", "--tp", "8", "--pp", "2",
            "--seq-len", "32768", "--micro-batch", "4"]
    outs = {}
    for layout in ("latent", "per-head"):
        res = CliRunner().invoke(cli, [*args, "--json", "--mla-cache", layout])
        assert res.exit_code in (0, 2), res.output
        outs[layout] = json.loads(res.output)
        assert outs[layout]["assumptions"]["mla_cache"] == layout
    kv = {k: v["load"]["memory_bytes"]["kv_cache"] for k, v in outs.items()}
    assert kv["latent"] == 576 * 31 * 32768 * 4 * 2      # the first stage's 31 of 61 blocks, bf16, on every tp rank
    assert kv["per-head"] / kv["latent"] == pytest.approx(128 / 8 * (192 + 128) / 576)
    text = CliRunner().invoke(cli, args).output
    assert "MLA cache: latent, kv_lora_rank 512 + rotary key 64 = 576 elements" in text
    assert "16 heads x (K 192 + V 128) = 5,120" in CliRunner().invoke(cli, [*args, "--mla-cache", "per-head"]).output


def test_cli_mla_cache_refusals():
    res = CliRunner().invoke(cli, ["--task", "load", "--model", "llama3.1-8b", "--gpus", "h100", "--mla-cache",
                                   "latent"])
    assert res.exit_code == 2 and "drop --mla-cache" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["--model", "deepseek-v3", "--gpus", "h200", "--mla-cache", "per-head"])
    assert res.exit_code == 2 and "use it with --task load" in res.output
    res = CliRunner().invoke(cli, ["--task", "load", "--model", "llama3.1-8b", "--gpus", "h100", "--json"])
    assert json.loads(res.output)["assumptions"]["mla_cache"] is None


def test_the_cli_offers_the_cache_layouts_the_model_knows():
    from planner.cli import task_options
    from planner.memory import inference

    assert task_options.MLA_CACHES == inference.MLA_CACHES
