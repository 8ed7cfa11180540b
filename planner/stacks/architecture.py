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


def _hf_config(m: ModelSpec) -> dict[str, Any]:
    from planner.models.spec import load_hf_config, load_presets

    if m.name in load_presets():
        return load_hf_config(m.name)
    if m.source:
        return load_hf_config(m.source)
    return {}


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
    theta = float(cfg.get("rope_theta", 10000.0))
    aux = cfg.get("router_aux_loss_coef")
    return Architecture(rope_theta=theta, rope_scaling=scaling, norm_eps=eps,
                        router_aux_loss_coef=float(aux) if m.is_moe and aux is not None else None)
