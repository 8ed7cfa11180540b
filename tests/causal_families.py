"""Every causal-LM family transformers ships, as the default config.json of its config class,
for tests/test_generic_families.py and bench/generic_families.py.

The default config of a family is ``AutoConfig.for_model(model_type).to_dict()``: what a user
gets from transformers with no checkpoint. Large defaults are shrunk to SHRUNK_LAYERS blocks
(num_hidden_layers, and a per-layer list such as layer_types cut to match) where the config
class accepts it; the parameter count is then checked on the same shrunk config.
"""

from __future__ import annotations

from typing import Any

SHRUNK_LAYERS = 4

# Per-layer lists some configs keep beside num_hidden_layers (cut to the shrunk depth).
_PER_LAYER_KEYS = ("layer_types", "layers_block_type", "no_rope_layers", "block_types", "mlp_layer_types",
                   "indexer_types")
# Lists of layer indices (cut to the indices below the shrunk depth).
_INDEX_KEYS = ("moe_layers", "mlp_only_layers")


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def default_config(model_type: str) -> dict[str, Any]:
    """The default config.json dict of ``model_type``, shrunk where its class allows."""
    from transformers import AutoConfig

    full = AutoConfig.for_model(model_type).to_dict()
    if "num_experts_per_tok" in full and full["num_experts_per_tok"] is None and full.get("n_routed_experts"):
        # DeepseekV2Config's default routes to no expert (the planner refuses it: probe.unset_router);
        # transformers' own tests run every causal LM with 2 (tests/causal_lm_tester.py,
        # CausalLMModelTester num_experts_per_tok=2). Top-k changes no parameter
        full["num_experts_per_tok"] = 2
    n = full.get("num_hidden_layers")
    if not isinstance(n, int) or n <= SHRUNK_LAYERS:
        return full
    shrunk = {**full, "num_hidden_layers": SHRUNK_LAYERS}
    for key in _PER_LAYER_KEYS:
        if isinstance(full.get(key), list) and len(full[key]) == n:
            shrunk[key] = full[key][:SHRUNK_LAYERS]
    for key in _INDEX_KEYS:
        if isinstance(full.get(key), list):
            shrunk[key] = [i for i in full[key] if isinstance(i, int) and i < SHRUNK_LAYERS]
    if isinstance(full.get("hybrid_override_pattern"), str) and len(full["hybrid_override_pattern"]) == n:
        shrunk["hybrid_override_pattern"] = full["hybrid_override_pattern"][:SHRUNK_LAYERS]
    try:
        cfg = dict(shrunk)
        cfg.pop("model_type")
        if AutoConfig.for_model(model_type, **cfg).num_hidden_layers != SHRUNK_LAYERS:
            return full
    except Exception:  # noqa: BLE001 -- a config class that rejects the cut keeps its default depth
        return full
    return shrunk


def transformers_causal_lm(cfg: dict[str, Any]) -> tuple[int, str]:
    """transformers' own count, the causal LM built on the meta device (each tensor once), and
    the class it builds."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    rest = dict(cfg)
    config = AutoConfig.for_model(rest.pop("model_type"), **rest)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), type(model).__name__


def transformers_count(cfg: dict[str, Any]) -> int:
    """transformers' own count: the causal LM built on the meta device, each tensor once."""
    return transformers_causal_lm(cfg)[0]


def family_row(model_type: str) -> dict[str, Any]:
    """Build, count and plan one family's default config: its outcome ("written", "generic",
    "refused" or "skipped"), transformers' count and the planner's, whether a plan came back,
    and for the last two outcomes why (the exception's first line)."""
    from planner import api
    from planner.errors import UserError
    from planner.hardware.gpus import get_gpu
    from planner.models.families import spec_from_hf_config
    from planner.models.spec import count_params
    from planner.training.setup import TrainingSetup

    try:
        cfg = default_config(model_type)
        ref, built = transformers_causal_lm(cfg)
    except Exception as e:  # noqa: BLE001 -- the family's default config or model does not build
        return {"status": "skipped", "why": f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"}
    try:
        m = spec_from_hf_config(dict(cfg), model_type, f"default {model_type}")
    except UserError as e:
        return {"status": "refused", "why": str(e)[:400]}
    # 1,024 tokens, or a learned position table's length where shorter (BERT's 512)
    seq_len = min(1024, m.max_positions) if m.position == "learned" and m.max_positions else 1024
    r = api.plan(m, get_gpu("h100"), TrainingSetup(seq_len=seq_len, global_batch=64))
    row = {"status": "generic" if m.is_generic else "written", "transformers": ref,
           "planner": count_params(m).total, "planned": r.best is not None}
    if m.vision is not None and not built.endswith("ForConditionalGeneration"):
        # the causal LM of llama4, qwen3_5 and qwen3_5_moe is the text model alone (Llama4ForCausalLM,
        # Qwen3_5ForCausalLM, ...): the planner's count of that part is compared, the image side
        # (checked against transformers' whole model in tests/test_vision.py) kept beside it
        row["planner"], row["image_side"] = row["planner"] - m.vision.params, m.vision.params
    return row


def counted_forward_flops_per_token(cfg: dict[str, Any], seq: int) -> float:
    """FlopCounterMode's count of one forward pass of transformers' causal LM built from ``cfg``
    (real CPU tensors, eager experts and attention), per token of one sequence of ``seq``."""
    from conftest import require

    torch = require("torch")
    transformers = require("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    transformers.logging.set_verbosity_error()      # "falling back to its reference PyTorch implementation"
    rest = dict(cfg)
    config = transformers.AutoConfig.for_model(rest.pop("model_type"), **rest)
    config._experts_implementation = "eager"    # FlopCounterMode counts no FLOPs for grouped_mm (FACTS.md)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    ids = torch.randint(0, cfg["vocab_size"], (1, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    return counter.get_total_flops() / seq


def assert_deltanet_forward_flops(cfg: dict[str, Any], name: str, seq: int = 128) -> None:
    """The planner's forward FLOPs per token of a gated DeltaNet or Kimi Delta Attention hybrid
    equal FlopCounterMode's count of transformers' model (counted_forward_flops_per_token) once the
    products transformers' torch path forms without a counted matmul, and F.conv1d's W - 1 padded
    outputs, are taken out (deltanet_torch_gap_flops_per_token, a share under 10%)."""
    import pytest

    from planner.models.deltanet import deltanet_torch_gap_flops_per_token
    from planner.models.families import spec_from_hf_config
    from planner.timing.flops import head_flops, layer_flops

    m = spec_from_hf_config(dict(cfg), name, "test")
    planner_fwd = m.n_layers * layer_flops(m, seq).total + head_flops(m)
    gap = m.n_deltanet_layers * deltanet_torch_gap_flops_per_token(m, seq)
    assert planner_fwd - gap == pytest.approx(counted_forward_flops_per_token(cfg, seq), rel=1e-9)
    assert 0 < gap < 0.1 * planner_fwd


def hybrid_layer_saved_bytes(cfg: dict[str, Any], seq: int, mixer: str,
                             moe: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Saved tensors per token of a gated DeltaNet / Kimi Delta Attention hybrid's two kinds of
    decoder layer, (planner, measured), each keyed "mixer" and "attention". Measured: the generic
    probe (autograd's saved_tensors_hooks on transformers' own layers under fake tensors, bf16,
    each storage once) at ``seq`` tokens; layer 3 is the attention layer (the probe names blocks by
    their classes' kinds, which read Qwen3_5Moe* as experts throughout, so the layer index tells
    them apart). Planner: the per-letter terms of memory.activations.layer_activation_terms, a
    decoder layer being two letters (its token mixer ``mixer``'s, or attention's, and its MLP or
    MoE), each with its own norm and the fp32 normalised tensor memory.norms adds per letter."""
    from planner.layouts.layout import Layout
    from planner.memory.activations import layer_activation_terms
    from planner.memory.attention import attention_saved_delta_bytes
    from planner.memory.norms import block_norm_delta_bytes
    from planner.models.families import spec_from_hf_config
    from planner.models.generic.probe import profile_config
    from planner.training.setup import TrainingSetup

    measured = {("attention" if "(layers 3)" in b.name else "mixer"):
                b.saved_bytes_per_token + b.saved_bytes_per_token_per_seq * seq
                for b in profile_config(cfg, "test").blocks}
    m = spec_from_hf_config(dict(cfg), "x", "test")
    lay = Layout(seq_len=seq, micro_batch=1, recompute="none")
    setup = TrainingSetup(seq_len=seq, attention="eager")
    terms = layer_activation_terms(m, setup, lay, "eager")
    n = m.n_layers

    def letter(label: str, n_letters: int) -> float:
        return sum(t.bytes for t in terms if f"[{label}:" in t.name) * n / n_letters / seq

    norm = 2 * (sum(t.bytes for t in terms if "[every layer" in t.name)
                + block_norm_delta_bytes(m, setup, lay, "eager")) / seq
    mlp = letter("MoE", m.n_moe_layers) if moe else letter("MLP", m.n_mlp_layers)
    qk = attention_saved_delta_bytes(m, setup, lay, "eager") * n / m.n_attention_layers / seq
    planner = {"mixer": norm + letter(mixer, m.n_deltanet_layers) + mlp,
               "attention": norm + letter("attention", m.n_attention_layers) + qk + mlp}
    return planner, measured
