"""Architecture facts a stack's config needs beyond ModelSpec: rope base and scaling, norm epsilon.

Read from the model's Hugging Face config.json (the preset's shipped file, or the user's
path). Defaults are transformers' own when a key is absent: rope_theta 10000.0
(LlamaConfig, MistralConfig), rms_norm_eps 1e-6 (LlamaConfig), layer_norm_eps 1e-5
(GPT2Config's layer_norm_epsilon, BertConfig's layer_norm_eps 1e-12 is given in its file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.models.spec import ModelSpec

NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")


@dataclass(frozen=True, kw_only=True, slots=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (config.json "rope_scaling", rope_type "llama3")."""

    rope_type: str
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Architecture:
    rope_theta: float
    rope_scaling: RopeScaling | None
    norm_eps: float
    router_aux_loss_coef: float | None   # Mixtral's load-balancing loss weight
    rotary_fraction: float = 1.0          # partial_rotary_factor: the share of head_dim rotated (Qwen3-Next 0.25)


def _hf_config(m: ModelSpec) -> dict[str, Any]:
    from planner.models.spec import load_hf_config, load_presets

    if m.name in load_presets():
        return load_hf_config(m.name)
    if m.source:
        return load_hf_config(m.source)
    return {}


def _rotary_default(m: ModelSpec) -> float:
    """partial_rotary_factor where a config.json leaves it out: 0.25 for Qwen3-Next and Qwen3.5's
    text models (transformers 5.x Qwen3NextConfig, Qwen3_5TextConfig and Qwen3_5MoeTextConfig
    defaults), else 1 (every dimension of head_dim rotated)."""
    from planner.models.deltanet import DELTANET_MODEL_TYPES

    return 0.25 if m.model_type in DELTANET_MODEL_TYPES else 1.0


def architecture(m: ModelSpec) -> Architecture:
    """The facts of ``m``'s config.json that ModelSpec does not carry."""
    cfg = _hf_config(m)
    rs = cfg.get("rope_scaling") or None
    scaling = None
    if isinstance(rs, dict):
        scaling = RopeScaling(rope_type=str(rs.get("rope_type", rs.get("type", ""))),
                              factor=float(rs.get("factor", 1.0)),
                              low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
                              high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
                              original_max_positions=int(rs.get("original_max_position_embeddings", 8192)))
    eps_default = 1e-6 if m.norm == "rmsnorm" else 1e-5
    eps = next((float(cfg[k]) for k in NORM_EPS_KEYS if k in cfg), eps_default)
    # transformers 5 writes rope_theta and partial_rotary_factor inside rope_parameters
    given = cfg.get("rope_parameters")
    rope: dict[str, Any] = given if isinstance(given, dict) else {}
    theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
    fraction = float(cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", _rotary_default(m))))
    aux = cfg.get("router_aux_loss_coef")
    return Architecture(rope_theta=theta, rope_scaling=scaling, norm_eps=eps,
                        router_aux_loss_coef=float(aux) if m.is_moe and aux is not None else None,
                        rotary_fraction=fraction)
