"""The first blocks of a model, for measuring a large model at its real width.

A step of DeepSeek-V3 (61 blocks of 256 experts) or Llama 4 Maverick under fake tensors takes
far longer than its first blocks do, and a block of a given shape keeps the same tensors
whatever the depth, so ``plan measure --blocks N`` measures a model whose config.json is the
original with ``num_hidden_layers = N`` (and the per-layer lists cut to N), and predicts the
same N-block model: nothing is scaled, and the report names the model "first N of L blocks".
Blocks keep their position: the first N of a model whose first k blocks are dense (DeepSeek-V3's
first_k_dense_replace) are dense when N <= k.
"""

from __future__ import annotations

from typing import Any

from planner.errors import UserError

# config.json keys whose value is one entry per block (transformers' configuration classes)
PER_LAYER_LISTS = ("layer_types", "no_rope_layers", "moe_layers")
DEPTH_KEYS = ("num_hidden_layers", "n_layer")


def depth(hf_config: dict[str, Any]) -> int:
    """The config's number of blocks (num_hidden_layers, or GPT-2's n_layer)."""
    for key in DEPTH_KEYS:
        if isinstance(hf_config.get(key), int):
            return int(hf_config[key])
    raise UserError("--blocks: the config.json has no num_hidden_layers")


def first_blocks_config(hf_config: dict[str, Any], n: int) -> dict[str, Any]:
    """``hf_config`` cut to its first ``n`` blocks (UserError unless 1 <= n <= the depth)."""
    total = depth(hf_config)
    if not isinstance(n, int) or not 1 <= n <= total:
        raise UserError(f"--blocks {n}: give 1 to {total} (the model's blocks)")
    out = dict(hf_config)
    for key in DEPTH_KEYS:
        if key in out:
            out[key] = n
    for key in PER_LAYER_LISTS:
        if isinstance(out.get(key), list) and len(out[key]) == total:
            out[key] = out[key][:n]
    if isinstance(out.get("mlp_only_layers"), list):      # Qwen MoE: indices of dense blocks
        out["mlp_only_layers"] = [i for i in out["mlp_only_layers"] if isinstance(i, int) and i < n]
    if isinstance(out.get("max_window_layers"), int):
        out["max_window_layers"] = min(out["max_window_layers"], n)
    return out
