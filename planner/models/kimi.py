"""Kimi Linear (transformers 5.x ``models/kimi_linear``, KimiLinearForCausalLM; Kimi Team 2025,
arXiv:2510.26692), written in the layer pattern of planner.models.hybrid with the gated
DeltaNet family's letter and fields (planner.models.deltanet): two letters per
KimiLinearDecoderLayer, its token mixer (G: Kimi Delta Attention, KimiLinearDeltaAttention, on
``linear_attention`` layers; *: MLA, KimiLinearAttention, on ``full_attention`` layers) and its
channel mixer (E: KimiLinearMoE on ``sparse`` mlp_layer_types; -: the dense KimiLinearMLP).

Kimi Delta Attention (KDA) is gated DeltaNet with a channel-wise decay: with H heads of d
(K = V = H d), q_proj, k_proj and v_proj (h -> K each, no bias) feed one causal depthwise conv1d
over 3 K channels (no bias, kernel W) and SiLU; the forget gate is low-rank, f_a_proj h -> d and
f_b_proj d -> K, plus dt_bias (K) and A_log (H); beta = sigmoid(b_proj(x)), h -> H; the output
gate is low-rank too, g_a_proj h -> d and g_b_proj d -> V, into a gated RMSNorm of one d weight
(o_norm); o_proj V -> h. So the DeltaNet fields hold H key heads and H value heads of d, and
ModelSpec.kda_gate_rank holds the low-rank width d of the two gates (0 for gated DeltaNet).

MLA is DeepSeek-V3's (attention_params' MLA branch): q_proj (no q_lora_rank by default),
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; Kimi Linear applies no rotary embedding
(the checkpoint's mla_use_nope), which changes no parameter and no FLOP. The MoE is
DeepSeek-V3's (recent.deepseek_moe): a sigmoid router (E x h, its correction bias a buffer),
routed SwiGLU experts of moe_intermediate_size, num_shared_experts as one MLP beside them, the
first first_k_dense_replace layers a dense MLP of intermediate_size.
"""

from __future__ import annotations

from typing import Any

from planner.errors import UserError
from planner.models.cfg import float_key, int_key, opt_int, str_list
from planner.models.deltanet import DELTA_RULE_CHUNK
from planner.models.recent import DEEPSEEK_V3_MOE, deepseek_moe
from planner.models.spec import ModelSpec

KIMI_MODEL_TYPES = ("kimi_linear",)


def _linear_attn(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The checkpoint's linear_attn_config sub-dict (KimiLinearConfig.__post_init__ reads it)."""
    sub = cfg.get("linear_attn_config") or {}
    if not isinstance(sub, dict):
        raise UserError(f"{where}: key 'linear_attn_config' must be an object")
    return sub


def _layer_types(cfg: dict[str, Any], where: str, n: int) -> list[str]:
    """KimiLinearConfig.__post_init__: layer_types; else linear_attn_config's 1-indexed
    full_attn_layers and kda_layers; else full attention where i > 0 and i % 4 == 0."""
    types = str_list(cfg, "layer_types", where, n)
    sub = _linear_attn(cfg, where)
    if types is None and "full_attn_layers" in sub and "kda_layers" in sub:
        full, kda = sub["full_attn_layers"], sub["kda_layers"]
        if not (isinstance(full, list) and isinstance(kda, list)
                and sorted([*full, *kda]) == list(range(1, n + 1))):
            raise UserError(f"{where}: linear_attn_config's full_attn_layers and kda_layers must share out "
                            f"layers 1 to {n} (num_hidden_layers)")
        types = ["full_attention" if i + 1 in full else "linear_attention" for i in range(n)]
    if types is None:
        return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    bad = sorted(set(types) - {"linear_attention", "full_attention"})
    if bad:
        raise UserError(f"{where}: key 'layer_types' must hold 'linear_attention' or 'full_attention', got {bad[0]!r}")
    return types


def kimi_linear_pattern(cfg: dict[str, Any], where: str) -> str:
    """Two letters per KimiLinearDecoderLayer (module docstring): G or *, then E or - (E where
    mlp_layer_types says 'sparse'; by default every layer from first_k_dense_replace on)."""
    n = int_key(cfg, "num_hidden_layers", where)
    types = _layer_types(cfg, where, n)
    mlp = str_list(cfg, "mlp_layer_types", where, n)
    if mlp is None:
        first = opt_int(cfg, "first_k_dense_replace", where, 1)
        mlp = ["dense" if i < first else "sparse" for i in range(n)]
    if set(mlp) - {"dense", "sparse"}:
        raise UserError(f"{where}: key 'mlp_layer_types' must hold 'dense' or 'sparse'")
    return "".join(("G" if t == "linear_attention" else "*") + ("E" if f == "sparse" else "-")
                   for t, f in zip(types, mlp, strict=True))


def _first(cfg: dict[str, Any], keys: tuple[str, ...], default: int) -> Any:
    """The first of ``keys`` that ``cfg`` holds (KimiLinearConfig.attribute_map: the stored name,
    e.g. num_experts, wins over the modelling code's, num_local_experts), else ``default``."""
    return next((cfg[k] for k in keys if k in cfg), default)


def kimi_linear_spec(cfg: dict[str, Any], common: dict[str, Any], where: str) -> ModelSpec:
    """The ModelSpec of a KimiLinearConfig (``cfg`` without nulls); missing keys take the class's
    defaults (transformers 5.x configuration_kimi_linear.py: h 2304, 32 heads, kv_lora 512, nope
    128 + rope 64, v 128, 256 experts of 1024, top-8, 1 shared, dense 9216, vocabulary 163,840;
    KDA 32 heads of 128, conv 4). The LM head is never tied to the embedding, whatever
    tie_word_embeddings says (KimiLinearForCausalLM's _tied_weights_keys is empty)."""
    pattern = kimi_linear_pattern(cfg, where)
    sub = _linear_attn(cfg, where)
    h = int_key(cfg, "hidden_size", where)
    n_heads = opt_int(cfg, "num_attention_heads", where, 32, minimum=1)
    rope = opt_int(cfg, "qk_rope_head_dim", where, 64)
    nope = opt_int(cfg, "qk_nope_head_dim", where, 128)
    if rope + nope < 1:
        raise UserError(f"{where}: qk_rope_head_dim + qk_nope_head_dim must be at least 1")
    moe_cfg = {"n_routed_experts": _first(cfg, ("num_experts", "num_local_experts"), 256),
               "num_experts_per_tok": _first(cfg, ("num_experts_per_token", "num_experts_per_tok"), 8),
               "n_shared_experts": _first(cfg, ("num_shared_experts", "n_shared_experts"), 1),
               "n_group": _first(cfg, ("num_expert_group", "n_group"), 1), "topk_group": cfg.get("topk_group", 1),
               "moe_intermediate_size": cfg.get("moe_intermediate_size", 1024),
               "intermediate_size": cfg.get("intermediate_size", 9216), "first_k_dense_replace": 0}
    moe = deepseek_moe(moe_cfg, where, 1, DEEPSEEK_V3_MOE, False) if "E" in pattern else \
        {"d_ff": opt_int(moe_cfg, "intermediate_size", where, 9216, minimum=1)}
    moe.pop("n_dense_layers", None)     # the pattern's '-' letters are the dense layers
    moe.setdefault("dense_d_ff", moe["d_ff"])
    d = int(_first(sub, ("head_dim",), opt_int(cfg, "linear_head_dim", where, 128, minimum=1)))
    heads = int(_first(sub, ("num_heads",), opt_int(cfg, "linear_num_heads", where, 32, minimum=1)))
    kernel = int(_first(sub, ("short_conv_kernel_size",), opt_int(cfg, "linear_conv_kernel_dim", where, 4,
                                                                   minimum=1)))
    if min(d, heads, kernel) < 1:
        raise UserError(f"{where}: linear_attn_config's head_dim, num_heads and short_conv_kernel_size must be "
                        f"at least 1")
    max_pos = _first(cfg, ("model_max_length", "max_position_embeddings"), 1048576)
    return ModelSpec(
        **common, n_layers=len(pattern), d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=rope + nope,
        q_lora_rank=opt_int(cfg, "q_lora_rank", where, 0), kv_lora_rank=opt_int(cfg, "kv_lora_rank", where, 512,
                                                                                 minimum=1),
        qk_rope_head_dim=rope, v_head_dim=opt_int(cfg, "v_head_dim", where, 128, minimum=1),
        qkv_bias=bool(cfg.get("attention_bias", False)), out_bias=bool(cfg.get("attention_bias", False)),
        vocab_size=opt_int(cfg, "vocab_size", where, 163840, minimum=1), max_positions=int(max_pos or 0),
        tied_embeddings=False, norms_per_layer=1, position="none",
        attention_dropout=float_key(cfg, "attention_dropout"), layer_pattern=pattern, letters_per_block=2,
        **moe,
        conv_kernel=kernel, ssm_chunk=DELTA_RULE_CHUNK, gdn_key_heads=heads, gdn_value_heads=heads,
        gdn_key_dim=d, gdn_value_dim=d, kda_gate_rank=d,
    )


def kda_torch_backward_working_bytes(m: ModelSpec, micro_batch: int, seq_len: int) -> int:
    """Bytes one Kimi Delta Attention layer's backward holds at its peak beyond its saved tensors
    under transformers' torch path (chunk_kimi_delta_attention), for ``micro_batch`` sequences of
    ``seq_len`` tokens on one rank (every head: the caller divides by tp). 0 for gated DeltaNet
    (its torch path's C x C tensors are dk times smaller).

    From its code (transformers 5.24 modeling_kimi_linear.py, chunk_kimi_delta_attention): the
    pairwise decay ``decay_mask`` is fp32, C x C x dk per chunk and head; its gradient is
    accumulated over the chunk loop (each ``decay_mask[:, :, i]`` read gives back a full-size
    gradient) and, in the backward of ``k_beta.unsqueeze(-2) * key.unsqueeze(-3) * decay_mask``,
    sits beside that product's gradient and the new decay gradient: three full-size C x C x dk
    fp32 tensors, 3 x 4 H C dk bytes per token over the sequence padded to whole chunks (read
    from the code; the measured slope agrees). FITTED to the measurements below, not traced
    tensor by tensor: 6 x 4 H dk more per token (six fp32 H x dk tensors, the size of the
    inputs' gradients), and 4 H C (C + 5) dk per sequence whatever its length (one chunk's
    broadcast q_i k_i product gradient, C x C x dk per head, and 5 C x dk more).
    MEASURED: MemTracker's "Temp" at the peak of the function's backward under fake tensors
    (torch 2.13, transformers 5.24; H 8, dk 64, C 64): 112,852,992, 216,662,016, 424,280,064 and
    839,516,160 B at 256, 512, 1,024 and 2,048 tokens, this formula to the byte; H 4 halves it;
    dk 128 at 1,024 tokens 848,822,272 B, this formula 0.03% under. The last function held
    2 x 4 H C dk per token: 268,435,456 B at 1,024 tokens, 37% short.
    """
    if not m.kda_gate_rank:
        return 0
    h, c, dk = m.gdn_value_heads, m.ssm_chunk, m.gdn_key_dim
    padded = -(-seq_len // c) * c
    per_sequence = padded * 4 * h * dk * (3 * c + 6) + 4 * h * c * (c + 5) * dk
    return micro_batch * per_sequence
