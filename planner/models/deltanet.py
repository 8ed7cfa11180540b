"""Gated DeltaNet hybrids: Qwen3-Next and Qwen3.5's text models (transformers 5.x
``models/qwen3_next``, ``models/qwen3_5``, ``models/qwen3_5_moe``), written in the layer pattern of
planner.models.hybrid. Qwen3.5's layers are Qwen3-Next's with the in_proj split into four linears
(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a: the same shapes and FLOPs); its dense text model
has no experts, its MoE text model the MoE block on every layer.

A Qwen3NextDecoderLayer is two residual sub-layers, each one norm and one mixer: a token mixer
(gated DeltaNet, Qwen3NextGatedDeltaNet, on ``linear_attention`` layers; gated full attention,
Qwen3NextAttention, on ``full_attention`` layers: every 4th by default) and a channel mixer (the
MoE block Qwen3NextSparseMoeBlock, or the dense Qwen3NextMLP on ``mlp_only_layers`` and off
``decoder_sparse_step``). Each sub-layer is one letter of the hybrid pattern, as Megatron-Core's
hybrid pattern writes a Nemotron-H layer: G gated DeltaNet (this module's letter; Megatron has
none: megatron-core 0.16.1 runs Qwen3-Next as a GPTModel whose attention is
ssm/gated_delta_net.py's GatedDeltaNet on all but every linear_attention_freq-th layer),
* attention, E MoE, - dense MLP. So a 48-layer Qwen3-Next is a 96-letter pattern GEGEGE*E...

Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464, Sec. 3; Qwen3NextGatedDeltaNet):
with Hk key heads of dk and Hv value heads of dv (K = Hk dk, V = Hv dv), in_proj_qkvz maps h to
[q (K), k (K), v (V), z (V)] and in_proj_ba to [b (Hv), a (Hv)]; a causal depthwise conv1d of
kernel W (no bias) runs over q, k and v (2K + V channels), then SiLU; q and k are L2-normalised
and repeated to the Hv value heads; beta = sigmoid(b), the decay g = -exp(A_log) softplus(a +
dt_bias); the chunked gated delta rule; a gated RMSNorm over each value head (one dv weight,
silu(z) gate); out_proj V x h.
"""

from __future__ import annotations

from typing import Any

from planner.errors import UserError
from planner.models.cfg import float_key, int_key, int_list, opt_int, str_list
from planner.models.spec import ModelSpec

DELTANET_MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

# Each configuration class's defaults for the keys read with one (transformers 5.x
# configuration_qwen3_next.py Qwen3NextConfig, configuration_qwen3_5.py Qwen3_5TextConfig,
# configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig). Qwen3.5's dense text model has no experts;
# its MoE text model puts the MoE block on every layer (no mlp_only_layers, no decoder_sparse_step)
_DEFAULTS: dict[str, dict[str, int]] = {
    "qwen3_next": {"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5632,
                   "vocab_size": 151936, "num_experts": 512, "num_experts_per_tok": 10,
                   "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
    "qwen3_5_text": {"num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 12288,
                     "vocab_size": 248320, "num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0,
                     "shared_expert_intermediate_size": 0},
    "qwen3_5_moe_text": {"num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                         "intermediate_size": 1, "vocab_size": 248320, "num_experts": 256, "num_experts_per_tok": 8,
                         "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512},
}
# keys a family's class does not read: taken as its default whatever the config says
_IGNORED = {"qwen3_next": (), "qwen3_5_text": ("num_experts", "mlp_only_layers", "decoder_sparse_step"),
            "qwen3_5_moe_text": ("intermediate_size", "mlp_only_layers", "decoder_sparse_step")}

# The chunk of the delta rule: fla's chunk_gated_delta_rule (fla/ops/gated_delta_rule/chunk.py,
# BT = 64), which megatron-core's GatedDeltaNet and transformers' kernels path call, and the
# default chunk_size of transformers' torch_chunk_gated_delta_rule
DELTA_RULE_CHUNK = 64


def _layer_types(cfg: dict[str, Any], where: str, n: int) -> list[str]:
    """Qwen3NextConfig.__post_init__: layer_types, else linear_attention except every
    full_attention_interval-th layer (default 4)."""
    types = str_list(cfg, "layer_types", where, n)
    if types is None:
        every = opt_int(cfg, "full_attention_interval", where, 4, minimum=1)
        return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    bad = sorted(set(types) - {"linear_attention", "full_attention"})
    if bad:
        raise UserError(f"{where}: key 'layer_types' must hold 'linear_attention' or 'full_attention', got {bad[0]!r}")
    return types


def _read(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with the keys its family's class does not read removed (their defaults apply)."""
    return {k: v for k, v in cfg.items() if k not in _IGNORED[str(cfg.get("model_type"))]}


def qwen3_next_pattern(cfg: dict[str, Any], where: str) -> str:
    """Two letters per Qwen3NextDecoderLayer (module docstring): the token mixer (G or *), then
    the channel mixer (E where Qwen3NextDecoderLayer builds Qwen3NextSparseMoeBlock: the layer
    is not in mlp_only_layers, num_experts > 0 and (i + 1) % decoder_sparse_step == 0; else -)."""
    cfg = _read(cfg)
    n = int_key(cfg, "num_hidden_layers", where)
    types = _layer_types(cfg, where, n)
    dense = set(int_list(cfg, "mlp_only_layers", where, n) or [])
    step = opt_int(cfg, "decoder_sparse_step", where, 1, minimum=1)
    moe = opt_int(cfg, "num_experts", where, _DEFAULTS[str(cfg["model_type"])]["num_experts"]) > 0
    return "".join(("G" if t == "linear_attention" else "*")
                   + ("E" if moe and i not in dense and (i + 1) % step == 0 else "-")
                   for i, t in enumerate(types))


def qwen3_next_spec(cfg: dict[str, Any], common: dict[str, Any], where: str) -> ModelSpec:
    """The ModelSpec of a Qwen3NextConfig (``cfg`` without nulls); missing keys take the class's
    defaults (transformers 5.x configuration_qwen3_next.py). Gated (SwiGLU) experts, shared
    expert and dense MLPs; the shared expert's output scaled by sigmoid(shared_expert_gate(x));
    attention with per-head q/k RMSNorm, rotary on partial_rotary_factor of head_dim and an
    output gate from a q_proj twice as wide; attention_bias on q/k/v/o_proj."""
    pattern = qwen3_next_pattern(cfg, where)
    cfg = _read(cfg)
    d = _DEFAULTS[str(cfg["model_type"])]
    h = int_key(cfg, "hidden_size", where)
    n_heads = opt_int(cfg, "num_attention_heads", where, d["num_attention_heads"], minimum=1)
    n_exp = opt_int(cfg, "num_experts", where, d["num_experts"]) if "E" in pattern else 0
    bias = bool(cfg.get("attention_bias", False))
    shared = opt_int(cfg, "shared_expert_intermediate_size", where, d["shared_expert_intermediate_size"])
    dense_ff = opt_int(cfg, "intermediate_size", where, d["intermediate_size"], minimum=1)
    spec = ModelSpec(
        **common, n_layers=len(pattern), d_model=h, n_heads=n_heads,
        n_kv_heads=opt_int(cfg, "num_key_value_heads", where, d["num_key_value_heads"], minimum=1),
        head_dim=opt_int(cfg, "head_dim", where, d["head_dim"], minimum=1),
        d_ff=opt_int(cfg, "moe_intermediate_size", where, d["moe_intermediate_size"], minimum=1) if n_exp else
        dense_ff,
        vocab_size=opt_int(cfg, "vocab_size", where, d["vocab_size"], minimum=1),
        max_positions=int(cfg.get("max_position_embeddings") or 0),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), norms_per_layer=1,
        qkv_bias=bias, out_bias=bias, qk_norm="head", n_qk_norm_layers=pattern.count("*"), attention_gate=True,
        n_experts=n_exp,
        n_experts_per_token=opt_int(cfg, "num_experts_per_tok", where, d["num_experts_per_tok"]) if n_exp else 0,
        dense_d_ff=dense_ff,
        n_shared_experts=1 if n_exp and shared else 0, shared_d_ff=shared if n_exp else 0,
        shared_expert_gate=bool(n_exp and shared),
        attention_dropout=float_key(cfg, "attention_dropout"), layer_pattern=pattern, letters_per_block=2,
        conv_kernel=opt_int(cfg, "linear_conv_kernel_dim", where, 4, minimum=1), ssm_chunk=DELTA_RULE_CHUNK,
        gdn_key_heads=opt_int(cfg, "linear_num_key_heads", where, 16, minimum=1),
        gdn_value_heads=opt_int(cfg, "linear_num_value_heads", where, 32, minimum=1),
        gdn_key_dim=opt_int(cfg, "linear_key_head_dim", where, 128, minimum=1),
        gdn_value_dim=opt_int(cfg, "linear_value_head_dim", where, 128, minimum=1),
    )
    if spec.gdn_value_heads % spec.gdn_key_heads:
        raise UserError(f"{where}: linear_num_key_heads ({spec.gdn_key_heads}) must divide "
                        f"linear_num_value_heads ({spec.gdn_value_heads})")
    return spec


def deltanet_params(m: ModelSpec) -> int:
    """One gated DeltaNet mixer's parameters (Qwen3NextGatedDeltaNet): in_proj_qkvz h x (2K + 2V),
    in_proj_ba h x 2 Hv, conv1d (2K + V) x W without bias, dt_bias and A_log (Hv each), the gated
    RMSNorm's weight (dv, shared by the heads), out_proj V x h; no biases. Kimi Delta Attention
    (KimiLinearDeltaAttention, kda_gate_rank r): q/k/v_proj h x (2K + V), conv1d (2K + V) x W,
    f_a_proj h x r, f_b_proj r x K, dt_bias K, A_log Hv, b_proj h x Hv, g_a_proj h x r, g_b_proj
    r x V, o_norm dv, o_proj V x h; no biases."""
    h, v, hv = m.d_model, m.gdn_value_width, m.gdn_value_heads
    if m.kda_gate_rank:     # Kimi Delta Attention (planner.models.kimi's docstring)
        r, k = m.kda_gate_rank, m.gdn_key_width
        return (h * (2 * k + v) + m.gdn_conv_dim * m.conv_kernel + h * r + r * k + k + hv + h * hv
                + h * r + r * v + m.gdn_value_dim + v * h)
    return (h * (2 * m.gdn_key_width + 2 * v) + h * 2 * hv + m.gdn_conv_dim * m.conv_kernel
            + 2 * hv + m.gdn_value_dim + v * h)


def delta_rule_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs per token of one gated DeltaNet layer's chunked delta rule, as fla's fused
    kernels run it (fla/ops/gated_delta_rule/chunk.py, chunk C, per value head with q and k
    repeated to it; Yang et al. 2024, arXiv:2412.06464, Sec. 3.3, the WY/UT form): the
    intra-chunk k_beta k^T, 2 C dk; w = A (k_beta decayed), 2 C dk, and u = A v_beta, 2 C dv
    (recompute_w_u_fwd); the state pass v_new = u - w S and S += k^T v_new, 4 dk dv
    (chunk_gated_delta_rule_fwd_h); the output q S, 2 dk dv, and the masked q k^T times v_new,
    2 C dk + 2 C dv (chunk_fwd_o). Linear in the sequence. Not counted: the inverse of the
    unit-lower-triangular C x C system per chunk (solve_tril, about C^2 / 3 per token and head) and
    the element-wise decays and L2 norms."""
    c, dk, dv = m.ssm_chunk, m.gdn_key_dim, m.gdn_value_dim
    return m.gdn_value_heads * (6.0 * c * dk + 4.0 * c * dv + 6.0 * dk * dv)


def deltanet_conv_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs per token of gated DeltaNet's depthwise causal conv1d: 2 W per channel."""
    return 2.0 * m.conv_kernel * m.gdn_conv_dim


def deltanet_torch_gap_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """The fused count (delta_rule_flops_per_token + the conv) minus what FlopCounterMode counts
    on transformers' torch path (torch_chunk_gated_delta_rule and causal_conv1d_fn of
    modeling_qwen3_next.py, what runs without fla), per token of one layer, for a sequence of
    whole chunks: the torch path forms w and u by two torch.linalg.solve_triangular calls,
    which FlopCounterMode has no formula for (-(2 C dk + 2 C dv) per value head); its
    F.conv1d pads W - 1 on both sides and computes W - 1 outputs per sequence that the fused
    causal_conv1d does not (+2 W (2K + V)(W - 1) / s). Kimi Delta Attention's torch path
    (chunk_kimi_delta_attention of modeling_kimi_linear.py) forms the decayed k_beta k^T and,
    per chunk, the decayed q k^T as broadcast products and sums, which FlopCounterMode does not
    count (-4 C dk per head; its matmuls attn v_beta, attn (k_beta exp g), (q exp g) S, k_cumdecay
    S, attn_intra v_new and k^T v_new are counted), and its conv pads as above."""
    c, dk, dv = m.ssm_chunk, m.gdn_key_dim, m.gdn_value_dim
    conv_pad = 2.0 * m.conv_kernel * m.gdn_conv_dim * (m.conv_kernel - 1) / seq_len
    if m.kda_gate_rank:     # KDA's two channel-decayed C x C x dk products are element-wise
        return m.gdn_value_heads * 4.0 * c * dk - conv_pad
    return m.gdn_value_heads * (2.0 * c * dk + 2.0 * c * dv) - conv_pad
