"""Model FLOPs per token (timing.flops.model_flops_per_token) against torch's own count.

The referee is torch.utils.flop_counter.FlopCounterMode running the transformers model's
forward and backward on the CPU: for every model family the planner ships a preset of, a
tiny config of that family (the preset's own config.json with its widths shrunk, its
structure kept: MLA, dense-first blocks, shared experts, interleaved MoE, fused projections,
sliding-window layer types) is built and one step over 128 tokens is counted. The routed
experts run transformers' eager experts implementation (config._experts_implementation),
whose per-expert matmuls FlopCounterMode counts (its default grouped_mm has no formula and
counts 0), on real tensors (the eager path's nonzero() has no fake-tensor shape). Windows are
longer than the 128 tokens, so the count is the full s x s the planner's convention uses.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tomllib
from pathlib import Path

import pytest
from conftest import fast_one, require

from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.timing.flops import model_flops_per_token

torch = require("torch")
transformers = require("transformers")

PRESETS_DIR = Path(__file__).resolve().parents[1] / "planner" / "presets" / "models"
SEQ = 128
VOCAB = 1024

# width keys -> tiny values (only keys the preset's config already has are changed)
TINY = {
    "hidden_size": 256, "n_embd": 256, "n_embed": 256,
    "num_attention_heads": 4, "n_head": 4,
    "head_dim": 64, "intermediate_size": 512, "intermediate_size_mlp": 512, "ffn_hidden_size": 1024,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
    "num_hidden_layers": 4, "n_layer": 4, "vocab_size": VOCAB,
    "num_local_experts": 8, "num_experts": 8, "n_routed_experts": 8,
    "n_group": 1, "topk_group": 1,
    "q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
    "sliding_window": 4 * SEQ, "attention_chunk_size": 4 * SEQ, "max_window_layers": 2,
    "first_k_dense_replace": 1,
}


def _family_presets() -> dict[str, str]:
    """One preset per model_type (the first in the catalog's order)."""
    with (PRESETS_DIR.parent / "models.toml").open("rb") as f:
        presets = tomllib.load(f)["model"]
    out: dict[str, str] = {}
    for p in presets:
        mt = json.loads((PRESETS_DIR.parent / p["config"]).read_text())["model_type"]
        out.setdefault(mt, p["name"])
    return out


# Families with a chunked scan count backward as twice forward, the model-FLOPs convention;
# transformers' reference Mamba-2 and gated-DeltaNet scans multiply more in backward (measured
# 2.66x forward on a tiny Nemotron-H), so a forward-and-backward count of them is not the same
# quantity. Nemotron-H, Qwen3-Next and Qwen3.5, written families (planner.models.hybrid,
# .deltanet), are checked on their forward pass in tests/test_hybrid.py and tests/test_deltanet.py
# (FlopCounterMode counted 15-17x the planner's forward and backward on Qwen3.5's tiny configs).
# Kimi Linear (written, planner.models.kimi) likewise, in tests/test_kimi_linear.py.
# DeepSeek-V3.2 (written, planner.models.dsa): its lightning indexer runs no backward
# in transformers' model; test_deepseek_v32_counts_the_indexer_backward below checks the difference.
GENERIC_FAMILIES = ("nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "kimi_linear", "deepseek_v32")
FAMILIES = {k: v for k, v in _family_presets().items() if k not in GENERIC_FAMILIES}


def _tiny_config(name: str, top_k: int = 2) -> dict:
    cfg = json.loads((PRESETS_DIR / f"{name}.json").read_text())
    for key, value in TINY.items():
        if cfg.get(key) is not None:
            cfg[key] = value
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    for key in ("num_key_value_heads", "num_kv_heads"):
        if cfg.get(key) is not None:     # keep GQA (2 of 4 heads), MHA or MQA (1)
            cfg[key] = 1 if cfg[key] == 1 else (2 if cfg[key] < 64 else heads)
    if cfg.get("n_inner") is not None:
        cfg["n_inner"] = 1024
    if cfg.get("num_experts_per_tok") is not None:
        cfg["num_experts_per_tok"] = top_k
    for key in ("layer_types", "no_rope_layers", "mlp_only_layers", "moe_layers"):
        if isinstance(cfg.get(key), list):
            cfg[key] = [x for x in cfg[key] if not isinstance(x, int) or x < 4][:4] if key in (
                "mlp_only_layers", "moe_layers") else cfg[key][:4]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):     # inside the tiny vocabulary
        if isinstance(cfg.get(key), int):
            cfg[key] = min(cfg[key], VOCAB - 1)
    for key in ("rope_scaling", "quantization_config", "auto_map"):
        cfg.pop(key, None)
    return cfg


@functools.cache
def _counted_flops_per_token(name: str, top_k: int = 2) -> float:
    """FlopCounterMode's FLOPs per token of one forward and backward of the tiny model."""
    cfg = _tiny_config(name, top_k)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    auto = transformers.AutoModelForMaskedLM if model_type == "bert" else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    model = auto.from_config(config)
    ids = torch.randint(0, VOCAB, (1, SEQ))
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops() / SEQ


def _planner_flops_per_token(name: str, top_k: int = 2, as_transformers_runs: bool = False) -> float:
    """The planner's model FLOPs per token of the tiny config. ``as_transformers_runs``: where
    transformers' reference code multiplies more than the model needs, the planner's count
    for that code: Llama4TextMoe (transformers 5.24 modeling_llama4.py, ``routed_in =
    hidden_states.repeat(router_scores.shape[1], 1)``) runs every token through all E experts
    and zeroes the unrouted ones by their router score, so it multiplies E experts per token,
    not the k a token is routed to."""
    m = spec_from_hf_config(_tiny_config(name, top_k), name, name)
    if as_transformers_runs and m.model_type == "llama4_text":
        m = dataclasses.replace(m, n_experts_per_token=m.n_experts)
    return model_flops_per_token(m, SEQ)


# the fast tier counts one family (routed experts: tests/test_deltanet.py::test_expert_flops_follow_top_k);
# the full suite every family
@pytest.mark.parametrize("family", fast_one(sorted(FAMILIES), "llama"))
def test_model_flops_match_flop_counter(family):
    name = FAMILIES[family]
    counted = _counted_flops_per_token(name)
    assert _planner_flops_per_token(name, as_transformers_runs=True) == pytest.approx(counted, rel=0.05)


@pytest.mark.slow
def test_deepseek_v32_counts_the_indexer_backward():
    """DeepSeek-V3.2 (planner.models.dsa) counts backward as twice forward, the indexer's too;
    transformers' model takes no gradient through the indexer (its top-k indices carry none;
    DeepSeek trains it on a separate KL loss, arXiv:2512.02556 Sec. 2), so FlopCounterMode's
    forward and backward fall short of the planner's by twice the indexer's forward: per
    token and block, its projections (q_lora to H x D queries, h to D keys, h to H weights)
    and its scores over all s keys (H x D multiply-adds, then H for the weights), with H =
    index_n_heads = 64 and D = index_head_dim = 128 left at the preset's widths by the shrink."""
    cfg = _tiny_config("deepseek-v3.2")
    h, q_lora, n = cfg["hidden_size"], cfg["q_lora_rank"], cfg["num_hidden_layers"]
    heads, dim = cfg["index_n_heads"], cfg["index_head_dim"]
    indexer_fwd = 2 * (q_lora * heads * dim + h * dim + h * heads) + 2 * SEQ * (heads * dim + heads)
    missing = _planner_flops_per_token("deepseek-v3.2") - _counted_flops_per_token("deepseek-v3.2")
    assert missing == pytest.approx(2 * n * indexer_fwd, rel=0.05)


@pytest.mark.slow
def test_expert_flops_follow_top_k():
    """The routed experts are counted: FlopCounterMode's count grows with top-k and the
    planner's follows it."""
    k2, k4 = _counted_flops_per_token("deepseek-v3", 2), _counted_flops_per_token("deepseek-v3", 4)
    assert k4 > 1.1 * k2
    assert _planner_flops_per_token("deepseek-v3", 4) - _planner_flops_per_token("deepseek-v3", 2) == (
        pytest.approx(k4 - k2, rel=0.05))


def test_deepseek_v3_flops_per_token():
    """DeepSeek-V3 at 4,096 tokens: 37.5B active parameters (DeepSeek-V3 paper, arXiv:2412.19437,
    Sec. 1; 6 x 37.5B = 225 GFLOP) plus MLA's scores over 128 heads of 192/128 dims
    (6 x 2 x 4096 x 128 x 320 x 61 = 123 GFLOP, full s x s) less the 0.9B-parameter embedding
    that runs no matmul: about 280-350, far below the 467 of the dense formula in h and l."""
    gflop = model_flops_per_token(load_model("deepseek-v3"), 4096) / 1e9
    assert 270 < gflop < 350


def _deepseek_v3_counted(n_layers: int, seq: int) -> float:
    """FlopCounterMode's FLOPs per token of DeepSeek-V3 at full width with ``n_layers`` blocks
    (the first 3 dense), under fake tensors. The routed experts run transformers' default
    grouped_mm, given a formula here: each of the token rows meets one expert's k x n matrix,
    2 rows k n FLOPs (forward, and each of its two backward grouped_mm calls alike)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    def grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[-1] * b_shape[-1]

    cfg = json.loads((PRESETS_DIR / "deepseek-v3.json").read_text())
    cfg.update(num_hidden_layers=n_layers)
    cfg.pop("rope_scaling")
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode():
            model = transformers.AutoModelForCausalLM.from_config(config)
            ids = torch.randint(0, 1000, (1, seq))
            with FlopCounterMode(display=False, custom_mapping={torch.ops.aten._grouped_mm: grouped_mm_flops}) as c:
                model(input_ids=ids, labels=ids).loss.backward()
    finally:
        torch.set_default_dtype(dtype)
    return c.get_total_flops() / seq


@pytest.mark.slow
def test_plan_explain_deepseek_v3_flops_per_token():
    """`plan explain --model deepseek-v3` prints model FLOPs per token within 5% of
    FlopCounterMode's count of the transformers model at full width: counted with 4 and 5
    blocks (3 dense, then 1 and 2 MoE), the 61-block model is the 4-block count plus 57 more
    MoE blocks (transformers builds no MTP module; the preset counts none)."""
    import re
    import subprocess
    import sys

    seq = 512
    c4, c5 = _deepseek_v3_counted(4, seq), _deepseek_v3_counted(5, seq)
    counted = c4 + 57 * (c5 - c4)
    out = subprocess.run([sys.executable, "-m", "planner", "explain", "--model", "deepseek-v3", "--gpus", "h100",
                          "--n-gpus", "64", "--dp", "1", "--tp", "1", "--pp", "1", "--cp", "1", "--ep", "64",
                          "--seq-len", str(seq), "--micro-batch", "1", "--global-batch", "64", "--zero", "1",
                          "--recompute", "none"], capture_output=True, text=True, check=True).stdout
    shown = float(re.search(r"model FLOPs per token \(no recomputation\): ([0-9.e+]+) FLOPs", out).group(1))
    assert shown == pytest.approx(counted, rel=0.05)
