"""Hybrid Mamba-2 / attention / MoE models: NVIDIA's Nemotron-H and Nemotron 3 (Nano, Super,
Ultra), written from their config.json (transformers 5.x ``models/nemotron_h``).

Each layer is one norm and one mixer, named by a letter of Megatron-Core's hybrid pattern
(megatron/core/ssm/mamba_hybrid_layer_allocation.py: M Mamba-2, * self-attention, - MLP,
E MoE), which transformers' NemotronHConfig reads as ``hybrid_override_pattern``
(configuration_nemotron_h.py ``_pattern_to_list``) or as ``layers_block_type``.

The Mamba-2 mixer (NemotronHMamba2Mixer; Dao & Gu 2024, arXiv:2405.21060, Sec. 7.1): with
H heads of P channels (d_inner = H P), G groups of state size N and a causal depthwise conv
of kernel K, in_proj maps h to [z (d_inner), x (d_inner), B (G N), C (G N), dt (H)], conv1d
runs over x, B and C (d_inner + 2 G N channels, a bias each), then the SSD scan, a gated
RMSNorm over d_inner and out_proj back to h; per head dt_bias, A_log and D.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.errors import UserError
from planner.models.cfg import float_key, int_key, opt_int
from planner.models.deltanet import DELTANET_MODEL_TYPES, deltanet_params
from planner.models.kimi import KIMI_MODEL_TYPES
from planner.models.spec import BlockKind, ModelSpec, ParamCount, attention_params, mlp_params

HYBRID_MODEL_TYPES = ("nemotron_h", *DELTANET_MODEL_TYPES, *KIMI_MODEL_TYPES)

# transformers' layers_block_type names -> Megatron's pattern letters (NemotronHConfig._pattern_to_list)
_LETTERS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "moe": "E", "mlp": "-"}


def _pattern(cfg: dict[str, Any], where: str) -> str:
    """The layer pattern: layers_block_type (or layer_types) where given, else
    hybrid_override_pattern; NemotronHConfig's default ["linear_attention", "moe",
    "full_attention", "mlp"] (ME*-) when neither is."""
    types = cfg.get("layers_block_type", cfg.get("layer_types"))
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) and t in _LETTERS for t in types):
            raise UserError(f"{where}: key 'layers_block_type' must list one of {sorted(set(_LETTERS))} per layer")
        return "".join(_LETTERS[t] for t in types)
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        return "ME*-"
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("ME*-"):
        raise UserError(f"{where}: key 'hybrid_override_pattern' must be a string of M, E, * and - "
                        f"(Megatron's hybrid layer pattern), got {pattern!r}")
    return pattern


def nemotron_h_spec(cfg: dict[str, Any], common: dict[str, Any], where: str) -> ModelSpec:
    """The ModelSpec of a NemotronHConfig (``cfg`` without nulls); missing keys take the
    class's defaults (transformers 5.x configuration_nemotron_h.py). The routed experts are
    plain MLPs (up, relu2, down: NemotronHExperts, no gate), the shared expert and the '-'
    layers NemotronHMLP likewise; attention has no positional encoding (NemotronHAttention
    applies no rotary embedding) and no biases whatever attention_bias says (its q/k/v/o_proj are
    built with bias=False). The LM head is never tied to the embedding, whatever
    tie_word_embeddings says (NemotronHForCausalLM's _tied_weights_keys is empty).
    num_hidden_layers is ignored, as transformers ignores it: the pattern's length is the depth."""
    pattern = _pattern(cfg, where)
    h = int_key(cfg, "hidden_size", where)
    n_heads = opt_int(cfg, "num_attention_heads", where, 32, minimum=1)
    n_kv = opt_int(cfg, "num_key_value_heads", where, n_heads, minimum=1)
    n_exp = opt_int(cfg, "n_routed_experts", where, 8) if "E" in pattern else 0
    moe_ff = opt_int(cfg, "moe_intermediate_size", where, 7688, minimum=1)
    dense_ff = opt_int(cfg, "intermediate_size", where, 21504, minimum=1)
    spec = ModelSpec(
        **common, n_layers=len(pattern), d_model=h, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=opt_int(cfg, "head_dim", where, 128, minimum=1),
        d_ff=moe_ff if n_exp else dense_ff, vocab_size=opt_int(cfg, "vocab_size", where, 131072, minimum=1),
        max_positions=int(cfg.get("max_position_embeddings") or 0), position="none",
        tied_embeddings=False, gated_mlp=False,
        activation=str(cfg.get("mlp_hidden_act", "relu2")), norms_per_layer=1,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        n_experts=n_exp, n_experts_per_token=opt_int(cfg, "num_experts_per_tok", where, 2) if n_exp else 0,
        dense_d_ff=dense_ff, n_shared_experts=opt_int(cfg, "n_shared_experts", where, 1) if n_exp else 0,
        shared_d_ff=opt_int(cfg, "moe_shared_expert_intermediate_size", where, 7688) if n_exp else 0,
        attention_dropout=float_key(cfg, "attention_dropout"), hidden_dropout=float_key(cfg, "hidden_dropout"),
        layer_pattern=pattern,
        mamba_heads=opt_int(cfg, "mamba_num_heads", where, 128, minimum=1),
        mamba_head_dim=opt_int(cfg, "mamba_head_dim", where, 64, minimum=1),
        ssm_state=opt_int(cfg, "ssm_state_size", where, 128, minimum=1),
        ssm_groups=opt_int(cfg, "n_groups", where, 8, minimum=1),
        conv_kernel=opt_int(cfg, "conv_kernel", where, 4, minimum=1),
        ssm_chunk=opt_int(cfg, "chunk_size", where, 128, minimum=1),
        mamba_bias=bool(cfg.get("use_bias", False)), conv_bias=bool(cfg.get("use_conv_bias", True)),
        moe_latent=opt_int(cfg, "moe_latent_size", where, 0),
    )
    if spec.mamba_heads % spec.ssm_groups:
        raise UserError(f"{where}: n_groups ({spec.ssm_groups}) must divide mamba_num_heads ({spec.mamba_heads})")
    return spec


# The layers of one multi-token-prediction depth of a hybrid model: an attention and a MoE layer
# (Megatron-Bridge's Nemotron 3.5 Lightning defaults, perf_recipes/nemotronh: mtp_hybrid_override_pattern
# "*E"; transformers-side NemotronH MTP drafts use the same pattern). ASSUMED for Nemotron 3 Super and
# Ultra, whose shipped config.json files name no pattern.
MTP_LAYER_PATTERN = "*E"


def mtp_depth(m: ModelSpec) -> ModelSpec | None:
    """The layers one MTP depth of hybrid ``m`` runs, as a model of MTP_LAYER_PATTERN's layers
    (its mean layer is theirs); None for a model without a layer pattern, whose MTP module runs
    one block of its own (timing.flops.mtp_flops)."""
    if not m.layer_pattern:
        return None
    return replace(m, layer_pattern=MTP_LAYER_PATTERN, n_layers=len(MTP_LAYER_PATTERN), n_mtp_modules=0)


def mamba_params(m: ModelSpec) -> int:
    """One Mamba-2 mixer's parameters (NemotronHMamba2Mixer): in_proj h x (2 d_inner + 2 G N +
    H), conv1d (d_inner + 2 G N) x K plus a bias per channel, dt_bias, A_log and D (H each),
    the gated RMSNorm (d_inner), out_proj d_inner x h; in_proj and out_proj biased with use_bias."""
    h, inner, conv = m.d_model, m.mamba_inner, m.mamba_conv_dim
    in_out = inner + conv + m.mamba_heads
    b = m.mamba_bias
    return (h * in_out + (in_out if b else 0) + conv * m.conv_kernel + (conv if m.conv_bias else 0)
            + 3 * m.mamba_heads + inner + inner * h + (h if b else 0))


def hybrid_param_count(m: ModelSpec) -> ParamCount:
    """Exact parameter count of transformers' NemotronHForCausalLM / Qwen3NextForCausalLM for
    ``m`` (tests/test_hybrid.py and tests/test_deltanet.py build them on the meta device): per
    letter of the pattern one norm (h) and its mixer. M: mamba_params; G: deltanet.deltanet_params;
    *: attention_params; -: one MLP (NemotronHMLP up and down; Qwen3NextMLP gate, up and down).
    E: the router's E x h weight (Nemotron-H's e_score_correction_bias is a buffer), E routed
    experts (up and down, or gate_up and down when gated; latent width L in and out when
    moe_latent, else h), the shared expert, Qwen3-Next's shared_expert_gate (h x 1), and under
    latent MoE fc1/fc2_latent_proj (h x L each). Outside the blocks: the embedding, the final
    norm and the LM head (untied unless tied_embeddings)."""
    h = m.d_model
    width = m.moe_latent or h
    expert = (3 if m.gated_mlp else 2) * width * m.d_ff
    latent = 2 * h * m.moe_latent + (m.moe_latent + h if m.mlp_bias else 0) if m.moe_latent else 0
    shared = (mlp_params(m, m.shared_d_ff, m.mlp_bias) if m.shared_d_ff else 0) + (h if m.shared_expert_gate else 0)
    kinds = {
        "M": BlockKind(kind="mamba", n_layers=m.n_mamba_layers, attention=mamba_params(m) if m.n_mamba_layers else 0,
                       routed=0, other_mlp=0, norms=h),
        "G": BlockKind(kind="deltanet", n_layers=m.n_deltanet_layers,
                       attention=deltanet_params(m) if m.n_deltanet_layers else 0, routed=0, other_mlp=0, norms=h),
        "*": BlockKind(kind="attention", n_layers=m.n_attention_layers, attention=attention_params(m), routed=0,
                       other_mlp=0, norms=h),
        "-": BlockKind(kind="dense", n_layers=m.n_mlp_layers, attention=0, routed=0,
                       other_mlp=mlp_params(m, m.dense_d_ff, m.mlp_bias), norms=h),
        "E": BlockKind(kind="moe", n_layers=m.n_moe_layers, attention=0, routed=m.n_experts * (expert + h),
                       other_mlp=shared + latent, norms=h),
    }
    blocks = tuple(kinds[c] for c in "MG*-E" if kinds[c].n_layers)
    n = m.n_layers
    layers = sum(b.per_layer * b.n_layers for b in blocks)

    def mean(field: str) -> int:
        return sum(getattr(b, field) * b.n_layers for b in blocks) // n

    lm_head = 0 if m.tied_embeddings else m.vocab_size * h
    return ParamCount(
        embedding=m.vocab_size * h, per_layer=layers // n, n_layers=n, final=lm_head + h, lm_head=lm_head,
        expert_per_layer=expert * m.n_moe_layers // n if m.is_moe else 0, n_experts=m.n_experts,
        n_experts_per_token=m.n_experts_per_token, attention_per_layer=mean("attention"),
        mlp_per_layer=mean("routed"), norms_per_layer=h, other_mlp_per_layer=mean("other_mlp"),
        blocks=blocks, one_expert=expert)


def ssd_scan_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of one Mamba-2 layer's SSD scan, as the fused kernel runs it
    (Dao & Gu 2024, arXiv:2405.21060, Sec. 6, the chunked algorithm with chunk length Q, and
    mamba_ssm's ssd_combined.py): the intra-chunk scores C B^T per group, 2 Q N G; those scores
    (masked by the decays) times x per head, 2 Q P H; each chunk's state B^T x, 2 N P H; the
    output from the chunk-start states, C h, 2 N P H. The state passing between chunks is an
    element-wise recurrence (_state_passing_fwd), not counted. Grows with Q, not with the
    sequence: the scan is linear in s. transformers' torch fallback (mamba2_chunk_scan, what
    runs on the CPU) repeats B and C to every head, so its scores cost 2 Q N H, and passes the
    states with a (chunks+1)^2 matrix product, 2 (c+1)^2 H P N / s per token
    (torch_fallback_extra_flops_per_token)."""
    q, n, p, hh, g = m.ssm_chunk, m.ssm_state, m.mamba_head_dim, m.mamba_heads, m.ssm_groups
    return 2.0 * q * n * g + 2.0 * q * p * hh + 4.0 * n * p * hh


def torch_fallback_extra_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """What transformers' torch path multiplies beyond the fused kernels, per token of one Mamba
    layer (see ssd_scan_flops_per_token; the sequence padded to whole chunks), and its conv1d
    (F.conv1d padded by K - 1 on both sides, K - 1 outputs per sequence that causal_conv1d
    does not compute)."""
    chunks = -(-seq_len // m.ssm_chunk)
    q, n, p, hh, g = m.ssm_chunk, m.ssm_state, m.mamba_head_dim, m.mamba_heads, m.ssm_groups
    conv_pad = 2.0 * m.conv_kernel * m.mamba_conv_dim * (m.conv_kernel - 1) / seq_len
    return 2.0 * q * n * (hh - g) + 2.0 * (chunks + 1) ** 2 * hh * p * n / seq_len + conv_pad


def conv_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs per token of the depthwise causal conv1d: 2 K per channel."""
    return 2.0 * m.conv_kernel * m.mamba_conv_dim


# hybrid_param_count's BlockKind.kind of each letter
_KIND_OF_LETTER = {"M": "mamba", "G": "deltanet", "*": "attention", "-": "dense", "E": "moe"}


def largest_module_params(m: ModelSpec, pc: ParamCount) -> int:
    """Parameters of the largest layer module of the model's code: ``m.letters_per_block``
    consecutive letters of the pattern (a Qwen3NextDecoderLayer: its token mixer and its MLP),
    each letter's exact count from ``pc.blocks``."""
    per = {b.kind: b.per_layer for b in pc.blocks}
    k, pattern = m.letters_per_block, m.layer_pattern
    return max(sum(per[_KIND_OF_LETTER[c]] for c in pattern[i:i + k]) for i in range(0, len(pattern) - k + 1, k))
