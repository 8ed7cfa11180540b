"""Qwen3-Next as a written family (planner.models.deltanet, in the layer pattern of
planner.models.hybrid): referees are transformers 5.x's Qwen3NextForCausalLM (parameters on the
meta device, FLOPs under torch's FlopCounterMode, saved tensors under autograd's
saved_tensors_hooks on fake tensors through the generic path's probe, its own inference cache),
PEFT's LoRA count, and megatron-core's GatedDeltaNet splits (tensor parallelism)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import fast_one, require
from saved_tensors import transformers_cache_bytes

from planner.models.families import spec_from_hf_config
from planner.models.load import load_model, preset_config
from planner.models.spec import count_params

sys.path.insert(0, str(Path(__file__).parent))
from causal_families import (  # noqa: E402
    assert_deltanet_forward_flops,
    counted_forward_flops_per_token,
    hybrid_layer_saved_bytes,
    transformers_count,
)

# A tiny Qwen3-Next: 3 gated DeltaNet layers and one gated attention layer (every 4th), MoE
# everywhere; key and value head dims differ, so a formula that swapped them would show
TINY = {
    "model_type": "qwen3_next", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 192, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 24, "num_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96,
    "vocab_size": 512,
}
VARIANTS = {
    "moe": TINY,
    "dense-layer-and-bias": {**TINY, "mlp_only_layers": [1], "attention_bias": True},
    "sparse-step": {**TINY, "decoder_sparse_step": 2},
    "tied": {**TINY, "tie_word_embeddings": True},
    "layer_types": {**TINY, "layer_types": ["full_attention", "linear_attention", "linear_attention",
                                            "full_attention"]},
    "dense": {**TINY, "num_experts": 0},
    # Qwen3.5's text models: the same layers (in_proj split four ways); the dense one reads no
    # expert keys, the MoE one puts the MoE block on every layer
    "qwen3_5_text": {**TINY, "model_type": "qwen3_5_text"},
    "qwen3_5_moe_text": {**TINY, "model_type": "qwen3_5_moe_text"},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_parameter_count_is_transformers_count(name):
    require("torch")
    require("transformers")
    cfg = VARIANTS[name]
    m = spec_from_hf_config(dict(cfg), name, "test")
    assert not m.is_generic and m.is_hybrid and m.n_deltanet_layers
    assert count_params(m).total == transformers_count(cfg)


@pytest.mark.parametrize("mt", ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def test_default_config_count_is_transformers_count(mt):
    # each configuration class's own defaults (AutoConfig.for_model, shrunk to 4 layers as
    # tests/causal_families.py does): the translator's defaults are the class's
    require("torch")
    require("transformers")
    from causal_families import default_config

    cfg = default_config(mt)
    m = spec_from_hf_config(dict(cfg), mt, "test")
    assert not m.is_generic and count_params(m).total == transformers_count(cfg)


def test_pattern_is_two_letters_per_decoder_layer():
    # Qwen3NextConfig: linear attention except every full_attention_interval-th layer; the MoE
    # block except on mlp_only_layers and off decoder_sparse_step (Qwen3NextDecoderLayer.__init__)
    def pattern(cfg: dict) -> str:
        return spec_from_hf_config(dict(cfg), "x", "test").layer_pattern

    assert pattern(TINY) == "GEGEGE*E"
    assert pattern(VARIANTS["dense-layer-and-bias"]) == "GEG-GE*E"
    assert pattern(VARIANTS["sparse-step"]) == "G-GEG-*E"
    assert pattern(VARIANTS["dense"]) == "G-G-G-*-"
    assert pattern(VARIANTS["qwen3_5_text"]) == "G-G-G-*-"
    assert pattern({**VARIANTS["qwen3_5_moe_text"], "mlp_only_layers": [1]}) == "GEGEGE*E"


def test_preset():
    # transformers' count of the shipped config.json on the meta device; Qwen's model card:
    # "80B parameters in total and 3B activated" (the 3.87B here hold the 0.62B embedding and
    # untied head)
    m = load_model("qwen3-next-80b-a3b")
    assert not m.is_generic and m.n_deltanet_layers == 36 and m.n_attention_layers == 12
    c = count_params(m)
    assert (c.total, c.active) == (79_674_391_296, 3_874_929_408)
    require("torch")
    require("transformers")
    assert transformers_count(preset_config("qwen3-next-80b-a3b")) == c.total



@pytest.mark.parametrize("name", fast_one(["moe", "dense-layer-and-bias", "qwen3_5_text", "qwen3_5_moe_text"],
                                          "qwen3_5_text"))
def test_forward_flops_match_flop_counter(name):
    # FlopCounterMode on transformers' model (real CPU tensors: the eager experts' nonzero()),
    # 128 tokens = 2 chunks of 64. On the CPU the gated DeltaNet layers run transformers' torch
    # delta rule, which forms w and u by torch.linalg.solve_triangular (no FlopCounterMode
    # formula) where fla's kernels multiply, and F.conv1d computes W - 1 padded outputs more:
    # deltanet_torch_gap_flops_per_token names that difference, and the rest agrees to the FLOP
    assert_deltanet_forward_flops(VARIANTS[name], name)


def test_expert_flops_follow_top_k():
    from planner.timing.flops import layer_flops

    k4_cfg = {**TINY, "num_experts_per_tok": 4}
    counted = counted_forward_flops_per_token(k4_cfg, 128) - counted_forward_flops_per_token(TINY, 128)
    k2, k4 = (spec_from_hf_config(dict(c), "k", "test") for c in (TINY, k4_cfg))
    ours = k4.n_layers * (layer_flops(k4, 128).total - layer_flops(k2, 128).total)
    assert counted > 0 and ours == pytest.approx(counted, rel=1e-9)


# hidden 512, 4 layers (3 gated DeltaNet, 1 gated attention), key heads of 32, value heads of
# 128, chunk 64: every width of the delta rule differs
SAVED = {"model_type": "qwen3_next", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1024, "linear_num_key_heads": 4,
         "linear_num_value_heads": 8, "linear_key_head_dim": 32, "linear_value_head_dim": 128,
         "num_experts": 0, "vocab_size": 8192}


@pytest.mark.parametrize("mt, moe", fast_one([("qwen3_next", False), ("qwen3_next", True), ("qwen3_5_text", False),
                                              ("qwen3_5_moe_text", True)], ("qwen3_5_moe_text", True), unpack=True))
def test_saved_tensors_match_autograd(mt, moe):
    # Each decoder layer's saved tensors (two letters: its token mixer and its MLP or MoE, with
    # their norms) against the generic probe's measurement (autograd's saved_tensors_hooks on
    # transformers' own layers under fake tensors, bf16, each storage once) at 256 tokens.
    # Seen: dense 75,102.75 / 75,126.75 (gated DeltaNet layers) and 42,024 / 42,114 (attention
    # layer); MoE 80,320.75 / 80,360.875 and 47,242 / 47,348.125 bytes per token. What is left
    # out: per sequence, the norms' fp32 weights, A_log's copies; the rotary cos/sin tables
    require("torch")
    require("transformers")
    cfg = {**SAVED, "model_type": mt}
    if moe:
        cfg.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=512)
    planner, measured = hybrid_layer_saved_bytes(cfg, 256, "DeltaNet", moe=moe)
    assert planner["mixer"] == pytest.approx(measured["mixer"], rel=0.005)
    assert planner["attention"] == pytest.approx(measured["attention"], rel=0.005)


def test_deltanet_mixer_bytes_are_its_tensors():
    # the G letter alone, term by term (memory.hybrid.torch_deltanet_bytes_per_token), at the
    # widths above: 57,694.75 bytes per token with its input, as autograd's saved tensors of one
    # Qwen3NextGatedDeltaNet under fake tensors add up (each storage once, seen)
    from planner.memory.hybrid import torch_deltanet_bytes_per_token

    m = spec_from_hf_config(dict(SAVED), "x", "test")
    assert torch_deltanet_bytes_per_token(m, 256, 2) + 2 * m.d_model == pytest.approx(57_694.75)


def test_inference_cache_is_transformers_cache():
    # transformers' own cache after a forward with use_cache (Qwen3-Next: keys and values of the
    # attention layer, a conv state of W positions and an fp32 recurrent state per gated DeltaNet
    # layer), each storage once: 77,312 bytes for 2 sequences of 64 tokens of TINY (seen)
    from planner.memory.inference import kv_cache_bytes

    m = spec_from_hf_config(dict(TINY), "tiny", "test")
    assert kv_cache_bytes(m, 2, 64) == transformers_cache_bytes(TINY, 2, 64) == 77_312


def test_tensor_and_expert_parallel_plans_and_refusals(tmp_path):
    import json

    from click.testing import CliRunner

    from planner.cli.main import cli

    def run(*args: str, model: str = "qwen3-next-80b-a3b"):
        return CliRunner().invoke(cli, ["--model", model, "--gpus", "h200", *args], prog_name="plan")

    r = run("--tp", "2", "--ep", "8", "--n-gpus", "16")
    assert r.exit_code == 0 and "tp=2" in r.output, r.output
    # megatron-core's GatedDeltaNet splits key and value heads by tp: TINY's 2 key heads refuse
    # tp 4, which its 4 attention heads, 2 KV heads and MLP widths accept
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    r = run("--tp", "4", "--n-gpus", "4", model=str(path))
    assert r.exit_code == 2 and "gated DeltaNet" in r.output and "Traceback" not in r.output, r.output
    # no context parallelism in megatron-core 0.16.1's GatedDeltaNet
    r = run("--cp", "2", "--n-gpus", "16")
    assert r.exit_code == 2 and "GatedDeltaNet" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("ours, peft_targets", [
    # PEFT's all-linear on Qwen3-Next: the mixers' projections, attention, the router and the routed
    # experts (transformers 5's "qwen2_moe" conversion, fused 3-D parameters) and shared_expert_gate;
    # the shared expert's and dense layers' gate/up/down_proj get none (the conversion drops them)
    # (Qwen3.5's: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a; PEFT converts no experts of
    # qwen3_5_moe_text, whose shared expert's MLP it adapts instead)
    (("all-linear",), "all-linear"),
    (("attention",), ["q_proj", "k_proj", "v_proj", "o_proj"]),
    (("in_proj_qkvz",), ["in_proj_qkvz"]),
    (("mlp",), ["gate_proj", "up_proj", "down_proj", "shared_expert_gate"]),
])
@pytest.mark.parametrize("name", ["moe", "dense-layer-and-bias", "qwen3_5_text", "qwen3_5_moe_text"])
def test_lora_count_equals_peft(name, ours, peft_targets):
    require("torch")
    transformers = require("transformers")
    require("peft")
    import warnings

    from peft import LoraConfig, get_peft_model

    from planner.training.finetune import n_trainable_params
    from planner.training.setup import FinetuneSpec

    cfg = VARIANTS[name] if name in VARIANTS else {**TINY, "model_type": name}
    if name.startswith("qwen3_5") and ours == ("in_proj_qkvz",):
        ours, peft_targets = ("in_proj_qkv",), ["in_proj_qkv"]
    rest = dict(cfg)
    config = transformers.AutoConfig.for_model(rest.pop("model_type"), **rest)
    model = transformers.AutoModelForCausalLM.from_config(config)
    present = peft_targets if isinstance(peft_targets, str) else [
        t for t in peft_targets if any(n.endswith("." + t) for n, _ in model.named_modules())]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=present))
    peft = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    m = spec_from_hf_config(dict(cfg), name, "test")
    assert n_trainable_params(m, FinetuneSpec(method="lora", lora_rank=8, lora_targets=ours)) == peft
