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


def transformers_count(cfg: dict[str, Any]) -> int:
    """transformers' own count: the causal LM built on the meta device, each tensor once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    rest = dict(cfg)
    config = AutoConfig.for_model(rest.pop("model_type"), **rest)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())
