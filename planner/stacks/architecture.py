"""Architecture facts a stack's config needs beyond ModelSpec: rope base, scaling and rotary
share, norm epsilon, the router's scoring.

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
    """RoPE frequency scaling (config.json "rope_scaling"): Llama 3.1's (rope_type "llama3":
    the low/high frequency factors) or YaRN (rope_type "yarn", DeepSeek-V3: beta_fast/slow,
    mscale, mscale_all_dim; absent keys take transformers' defaults in
    modeling_rope_utils._compute_yarn_parameters: beta_fast 32, beta_slow 1, truncate True;
    mscale_all_dim absent reads as 0 in DeepseekV3Attention's softmax scale)."""

    rope_type: str
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None   # YaRN's magnitude scale given directly
    truncate: bool = True                   # YaRN's correction range rounded to integers


@dataclass(frozen=True, kw_only=True, slots=True)
class Architecture:
    rope_theta: float
    rope_scaling: RopeScaling | None
    norm_eps: float
    router_aux_loss_coef: float | None   # Mixtral's load-balancing loss weight
    rotary_fraction: float = 1.0         # the share of head_dim rotary embeddings turn (GLM-4.5: 0.5)
    sigmoid_router: bool = False         # sigmoid scores with a correction bias choose the top-k
    router_scaling: float = 1.0          # routed_scaling_factor on the top-k weights (GLM-4.5: 2.5)
    router_normalised: bool = True       # norm_topk_prob: the top-k sigmoid weights divided by their sum
    mla_rope_interleave: bool = True     # MLA's rotary dims stored interleaved (DeepseekV3Config.rope_interleave)


# The families whose router scores experts by a sigmoid and picks the top-k by score plus a
# per-expert correction bias (a buffer the aux-loss-free balancing updates; DeepSeek-V3,
# arXiv:2412.19437, Sec. 2.1.2), then normalises the k weights: transformers 5.x
# Glm4MoeTopkRouter (modeling_glm4_moe.py) and MiniMaxM2TopKRouter with its block's
# e_score_correction_bias (modeling_minimax_m2.py), DeepSeek-V3's DeepseekV3TopkRouter and
# DeepseekV3MoE.route_tokens_to_experts (modeling_deepseek_v3.py; Kimi K2 is this model_type)
SIGMOID_ROUTER_TYPES = ("glm4_moe", "minimax_m2", "deepseek_v3", "deepseek_v32")


def _rope_parameters(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers 5's rope_parameters (it writes rope_theta and partial_rotary_factor there)."""
    given = cfg.get("rope_parameters")
    return given if isinstance(given, dict) else {}


def rotary_fraction(cfg: dict[str, Any], model_type: str) -> float:
    """The share of head_dim that rotary embeddings turn: config.json's partial_rotary_factor
    (at the top or in rope_parameters; Glm4MoeConfig.__post_init__ defaults it to 0.5;
    Qwen3NextConfig, Qwen3_5TextConfig and Qwen3_5MoeTextConfig to 0.25), or MiniMax-M2's
    rotary_dim / head_dim (MiniMaxM2Config.convert_rope_params_to_dict); 1.0 elsewhere."""
    from planner.models.deltanet import DELTANET_MODEL_TYPES

    given = cfg.get("partial_rotary_factor", _rope_parameters(cfg).get("partial_rotary_factor"))
    if given is not None:
        return float(given)
    if model_type == "minimax_m2" and cfg.get("rotary_dim"):
        return float(cfg["rotary_dim"]) / float(cfg.get("head_dim") or 128)
    if model_type in DELTANET_MODEL_TYPES:
        return 0.25
    return 0.5 if model_type == "glm4_moe" else 1.0


def _float_or_none(x: Any) -> float | None:
    return None if x is None else float(x)


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
        kind = str(rs.get("rope_type", rs.get("type", "")))
        # YaRN without the key reads the model's own context (transformers'
        # _compute_yarn_parameters); Llama 3's default is 8192 (its apply_rope_scaling)
        original = rs.get("original_max_position_embeddings",
                          cfg.get("max_position_embeddings", 8192) if kind == "yarn" else 8192)
        scaling = RopeScaling(rope_type=kind,
                              factor=float(rs.get("factor", 1.0)),
                              low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
                              high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
                              original_max_positions=int(original),
                              beta_fast=float(rs.get("beta_fast", 32.0)), beta_slow=float(rs.get("beta_slow", 1.0)),
                              mscale=_float_or_none(rs.get("mscale")),
                              mscale_all_dim=_float_or_none(rs.get("mscale_all_dim")),
                              attention_factor=_float_or_none(rs.get("attention_factor")),
                              truncate=bool(rs.get("truncate", True)))
    eps_default = 1e-6 if m.norm == "rmsnorm" else 1e-5
    eps = next((float(cfg[k]) for k in NORM_EPS_KEYS if k in cfg), eps_default)
    theta = float(cfg.get("rope_theta", _rope_parameters(cfg).get("rope_theta", 10000.0)))
    aux = cfg.get("router_aux_loss_coef")
    sigmoid = m.is_moe and m.model_type in SIGMOID_ROUTER_TYPES
    return Architecture(rope_theta=theta, rope_scaling=scaling, norm_eps=eps,
                        router_aux_loss_coef=float(aux) if m.is_moe and aux is not None else None,
                        rotary_fraction=rotary_fraction(cfg, m.model_type), sigmoid_router=sigmoid,
                        router_scaling=float(cfg.get("routed_scaling_factor", 1.0)) if sigmoid else 1.0,
                        router_normalised=bool(cfg.get("norm_topk_prob", True)) if sigmoid else True,
                        mla_rope_interleave=bool(cfg.get("rope_interleave", True)) if m.is_mla else True)
