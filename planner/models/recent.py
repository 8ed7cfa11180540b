"""The families of 2024-2026: Qwen3 (dense and MoE), DeepSeek-V3 (and Kimi K2), Llama 4,
Gemma 3, gpt-oss, Phi-3, OLMo 2, GLM-4.5/4.6, MiniMax-M2 and DeepSeek-V3.2 (DeepSeek Sparse
Attention, planner.models.dsa), from their Hugging Face config.json.

Each translator reads the keys transformers' configuration class reads and takes that
class's default for a missing key (transformers 5.x, ``models/<type>/configuration_<type>.py``);
the module layout each ModelSpec field stands for is the one in the same version's
``modeling_<type>.py``, which tests/test_param_counts.py builds on the meta device.
"""

from __future__ import annotations

from typing import Any

from planner.errors import UserError
from planner.models.cfg import float_key, int_key, int_list, opt_int, str_list
from planner.models.spec import ModelSpec

RECENT_MODEL_TYPES = ("qwen3", "qwen3_moe", "deepseek_v3", "llama4_text", "gemma3_text", "gpt_oss", "phi3", "olmo2",
                      "glm4_moe", "minimax_m2", "deepseek_v32")


def _attention(cfg: dict[str, Any], where: str, head_dim_default: int | None) -> dict[str, Any]:
    """Width, heads and head_dim. ``head_dim_default`` None: hidden_size // heads (the
    ``getattr(config, "head_dim", h // n_heads)`` of the modeling files)."""
    h = int_key(cfg, "hidden_size", where)
    n_heads = int_key(cfg, "num_attention_heads", where)
    n_kv = opt_int(cfg, "num_key_value_heads", where, n_heads, minimum=1)
    head_dim = opt_int(cfg, "head_dim", where, head_dim_default or h // n_heads, minimum=1)
    return {"d_model": h, "n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": head_dim}


def _local_layers(types: list[str] | None, fallback: list[bool]) -> int:
    """Blocks whose layer_types entry is a local (sliding or chunked) attention."""
    if types is None:
        return sum(fallback)
    return sum(t in ("sliding_attention", "chunked_attention") for t in types)


# The MoE block DeepSeek-V3 introduced and GLM-4.5 and DeepSeek-V3.2 reuse, as each configuration
# class defaults it: (n_routed_experts, moe_intermediate_size, first_k_dense_replace,
# n_shared_experts, num_experts_per_tok, n_group, topk_group, num_nextn_predict_layers)
DEEPSEEK_V3_MOE = (256, 2048, 3, 1, 8, 8, 4, 1)     # DeepseekV3Config
GLM4_MOE_MOE = (128, 1408, 1, 1, 8, 1, 1, 1)        # Glm4MoeConfig


def deepseek_moe(cfg: dict[str, Any], where: str, n_layers: int, defaults: tuple[int, ...],
                  mtp: bool) -> dict[str, Any]:
    """The ModelSpec fields of a DeepSeek-V3-style MLP side (DeepseekV3MoE, Glm4MoeMoE): routed
    experts of moe_intermediate_size with a sigmoid router, n_shared_experts beside them as one
    MLP of n_shared x the expert width, the first first_k_dense_replace blocks a dense MLP of
    intermediate_size; a model whose blocks are all dense (no experts, or every block among the
    first k) is the dense MLP alone. ``mtp``: count num_nextn_predict_layers MTP modules."""
    n_exp_d, moe_ff_d, first_d, shared_d, top_k_d, groups_d, limit_d, mtp_d = defaults
    n_exp = opt_int(cfg, "n_routed_experts", where, n_exp_d)
    moe_ff = opt_int(cfg, "moe_intermediate_size", where, moe_ff_d, minimum=1)
    first_dense = min(opt_int(cfg, "first_k_dense_replace", where, first_d), n_layers)
    if not (n_exp > 0 and first_dense < n_layers):
        return {"d_ff": int_key(cfg, "intermediate_size", where)}
    n_shared = opt_int(cfg, "n_shared_experts", where, shared_d)
    return {
        "d_ff": moe_ff, "n_experts": n_exp,
        "n_experts_per_token": opt_int(cfg, "num_experts_per_tok", where, top_k_d),
        "n_dense_layers": first_dense, "dense_d_ff": int_key(cfg, "intermediate_size", where),
        "n_shared_experts": n_shared,
        # DeepseekV3TopkRouter: the experts in n_group groups, each token's top-k in its best
        # topk_group groups (DeepSeek-V3, arXiv:2412.19437, Sec. 2.1.2 and 3.2.2: node-limited
        # routing, at most M = 4 nodes per token)
        "routing_groups": opt_int(cfg, "n_group", where, groups_d),
        "routing_group_limit": opt_int(cfg, "topk_group", where, limit_d),
        "shared_d_ff": moe_ff * n_shared,
        "n_mtp_modules": opt_int(cfg, "num_nextn_predict_layers", where, mtp_d) if mtp else 0,
    }


def _dense_first(cfg: dict[str, Any], where: str, n_layers: int) -> int:
    """DeepseekV32Config's dense blocks: mlp_layer_types ("dense" / "sparse" per layer) when
    given, else the first first_k_dense_replace (3). A pattern whose dense blocks are not all
    first is refused: the ModelSpec places them first."""
    types = str_list(cfg, "mlp_layer_types", where, n_layers)
    if types is None:
        return opt_int(cfg, "first_k_dense_replace", where, 3)
    n_dense = types.count("dense")
    if types != ["dense"] * n_dense + ["sparse"] * (n_layers - n_dense):
        raise UserError(f"{where}: mlp_layer_types must list its 'dense' layers first, then 'sparse' ones")
    return n_dense


def recent_spec(cfg: dict[str, Any], mt: str, common: dict[str, Any], where: str, mtp: bool = False) -> ModelSpec:
    """The ModelSpec of a config of one of RECENT_MODEL_TYPES (``cfg`` without nulls)."""
    n_layers = int_key(cfg, "num_hidden_layers", where)
    vocab = int_key(cfg, "vocab_size", where)
    bias = bool(cfg.get("attention_bias", mt == "gpt_oss"))
    base: dict[str, Any] = {
        **common, "n_layers": n_layers, "vocab_size": vocab,
        "max_positions": int(cfg.get("max_position_embeddings") or 0),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", mt == "gemma3_text")),
        "qkv_bias": bias, "out_bias": bias, "attention_dropout": float_key(cfg, "attention_dropout"),
    }
    if mt == "qwen3":
        # Qwen3Config: head_dim 128; QK RMSNorm over head_dim (modeling_qwen3.py q_norm, k_norm);
        # layer_types: sliding from max_window_layers on when use_sliding_window
        att = _attention(cfg, where, 128)
        window = opt_int(cfg, "sliding_window", where, 4096) if cfg.get("use_sliding_window") else 0
        first = opt_int(cfg, "max_window_layers", where, 28)
        local = _local_layers(str_list(cfg, "layer_types", where, n_layers),
                              [bool(window) and i >= first for i in range(n_layers)])
        return ModelSpec(**base, **att, d_ff=int_key(cfg, "intermediate_size", where), qk_norm="head",
                         local_attention="sliding" if local else "", attention_window=window if local else 0,
                         n_local_layers=local)
    if mt == "qwen3_moe":
        # Qwen3MoeConfig: 128 experts, top-8, moe_intermediate_size 768; a block is MoE when
        # it is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer)
        att = _attention(cfg, where, None)
        n_exp = opt_int(cfg, "num_experts", where, 128)
        step = opt_int(cfg, "decoder_sparse_step", where, 1, minimum=1)
        only = set(int_list(cfg, "mlp_only_layers", where, n_layers) or [])
        moe = [i not in only and n_exp > 0 and (i + 1) % step == 0 for i in range(n_layers)]
        dense_ff = int_key(cfg, "intermediate_size", where)
        if not any(moe):
            return ModelSpec(**base, **att, d_ff=dense_ff, qk_norm="head")
        return ModelSpec(**base, **att, d_ff=opt_int(cfg, "moe_intermediate_size", where, 768, minimum=1),
                         qk_norm="head", n_experts=n_exp, n_experts_per_token=opt_int(cfg, "num_experts_per_tok",
                                                                                      where, 8),
                         n_dense_layers=moe.count(False), dense_d_ff=dense_ff)
    if mt in ("deepseek_v3", "deepseek_v32"):
        # DeepseekV3Config defaults (the 671B model): MLA with q_lora_rank 1536, kv_lora_rank
        # 512, rope 64 + nope 128 per head, v 128; 256 routed + 1 shared experts of 2048, top-8;
        # the first 3 blocks dense (intermediate_size 18432)
        h = int_key(cfg, "hidden_size", where)
        n_heads = int_key(cfg, "num_attention_heads", where)
        rope = opt_int(cfg, "qk_rope_head_dim", where, 64)
        nope = opt_int(cfg, "qk_nope_head_dim", where, 128)
        if rope + nope < 1:
            raise UserError(f"{where}: qk_rope_head_dim + qk_nope_head_dim must be at least 1")
        # DeepseekV32Config (configuration_deepseek_v32.py): DeepSeek-V3's defaults, and its lightning
        # indexer: index_n_heads 64 of index_head_dim 128 picking index_topk 2048 keys per query;
        # DeepseekV32Attention always has the query bottleneck (its indexer reads the latent)
        dsa: dict[str, Any] = {}
        if mt == "deepseek_v32":
            dsa = {"index_n_heads": opt_int(cfg, "index_n_heads", where, 64, minimum=1),
                   "index_head_dim": opt_int(cfg, "index_head_dim", where, 128, minimum=1),
                   "index_topk": opt_int(cfg, "index_topk", where, 2048, minimum=1)}
            cfg = {**cfg, "first_k_dense_replace": _dense_first(cfg, where, n_layers)}
        return ModelSpec(
            **base, d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=rope + nope, **dsa,
            q_lora_rank=opt_int(cfg, "q_lora_rank", where, 1536, minimum=1 if dsa else 0),
            kv_lora_rank=opt_int(cfg, "kv_lora_rank", where, 512, minimum=1),
            qk_rope_head_dim=rope, v_head_dim=opt_int(cfg, "v_head_dim", where, 128, minimum=1),
            **deepseek_moe(cfg, where, n_layers, DEEPSEEK_V3_MOE, mtp),
        )
    if mt == "glm4_moe":
        # Glm4MoeConfig (transformers 5.x configuration_glm4_moe.py; modeling_glm4_moe.py):
        # GQA attention (96 heads / 8 KV; head_dim getattr(config, "head_dim", h // heads)) whose
        # q/k/v carry attention_bias and whose o_proj never does; q_norm and k_norm (RMSNorm over
        # head_dim) only when use_qk_norm (default False); rotary on partial_rotary_factor (0.5)
        # of head_dim, which changes no parameter and no matmul. Glm4MoeMoE is DeepSeek-V3's block:
        # n_routed_experts (128) of moe_intermediate_size (1408), top-8 by a sigmoid router with a
        # correction-bias buffer in n_group (1) groups of which topk_group (1) are kept, one
        # Glm4MoeMLP of moe_intermediate_size x n_shared_experts (1) beside them; the first
        # first_k_dense_replace (1) blocks hold a dense Glm4MoeMLP of intermediate_size (10944).
        # num_nextn_predict_layers (alias num_mtp_layers, 1) MTP layers are not built by transformers.
        att = _attention(cfg, where, None)
        bias = bool(cfg.get("attention_bias", False))
        return ModelSpec(**{**base, "qkv_bias": bias, "out_bias": False}, **att,
                         qk_norm="head" if cfg.get("use_qk_norm", False) else "",
                         **deepseek_moe(cfg, where, n_layers, GLM4_MOE_MOE, mtp))
    if mt == "minimax_m2":
        # MiniMaxM2Config (transformers 5.x configuration_minimax_m2.py; modeling_minimax_m2.py):
        # GQA without biases (48 heads / 8 KV of head_dim 128); q_norm and k_norm are RMSNorms over
        # the whole q and k widths (n_heads x head_dim, n_kv x head_dim), built on every block
        # whatever use_qk_norm / qk_norm_type say (qk_norm_type "per_layer" names this norm);
        # rotary on rotary_dim (64) of head_dim, no parameter and no matmul. MiniMaxM2SparseMoeBlock
        # on every block: num_local_experts (256) of intermediate_size (1536), top-8 by a sigmoid
        # router (E x h, no bias) plus the e_score_correction_bias buffer; no shared expert
        # (shared_intermediate_size is not read). The checkpoint's 3 MTP modules are not built by
        # transformers and not counted.
        att = _attention(cfg, where, 128)
        return ModelSpec(**{**base, "qkv_bias": False, "out_bias": False}, **att, qk_norm="full",
                         d_ff=opt_int(cfg, "intermediate_size", where, 1536, minimum=1),
                         n_experts=opt_int(cfg, "num_local_experts", where,
                                           opt_int(cfg, "num_experts", where, 256), minimum=1),
                         n_experts_per_token=opt_int(cfg, "num_experts_per_tok", where, 8))
    if mt == "llama4_text":
        # Llama4TextConfig: experts of intermediate_size 8192 plus one shared expert of the same
        # width, dense blocks of intermediate_size_mlp 16384; moe_layers default
        # range(step - 1, n_layers, step); rotary blocks use chunked attention of
        # attention_chunk_size (8192), every no_rope_layer_interval-th (4) block is global
        # NoPE; the QK norm is a weightless L2 norm (Llama4TextL2Norm)
        att = _attention(cfg, where, 128)
        n_exp = opt_int(cfg, "num_local_experts", where, 16)
        step = opt_int(cfg, "interleave_moe_layer_step", where, 1, minimum=1)
        moe_layers = int_list(cfg, "moe_layers", where, n_layers)
        moe_set = set(moe_layers if moe_layers is not None else range(step - 1, n_layers, step))
        n_moe = sum(1 for i in range(n_layers) if i in moe_set) if n_exp else 0
        ff = opt_int(cfg, "intermediate_size", where, 8192, minimum=1)
        dense_ff = opt_int(cfg, "intermediate_size_mlp", where, 16384, minimum=1)
        chunk = opt_int(cfg, "attention_chunk_size", where, 8192)
        interval = opt_int(cfg, "no_rope_layer_interval", where, 4, minimum=1)
        no_rope = int_list(cfg, "no_rope_layers", where, n_layers)
        rope_layers = [bool(x) for x in no_rope] if no_rope else [(i + 1) % interval != 0 for i in range(n_layers)]
        local = sum(rope_layers[:n_layers]) if chunk else 0
        local_kw: dict[str, Any] = {"local_attention": "chunked", "attention_window": chunk,
                                    "n_local_layers": local} if local else {}
        if cfg.get("use_qk_norm", True):     # Llama4TextAttention: only where use_rope
            local_kw |= {"qk_norm": "l2", "n_qk_norm_layers": sum(rope_layers[:n_layers]) or n_layers}
        if n_moe == 0:
            return ModelSpec(**base, **att, d_ff=dense_ff, **local_kw)
        return ModelSpec(**base, **att, d_ff=ff, n_experts=n_exp,
                         n_experts_per_token=opt_int(cfg, "num_experts_per_tok", where, 1),
                         n_dense_layers=n_layers - n_moe, dense_d_ff=dense_ff, n_shared_experts=1, shared_d_ff=ff,
                         **local_kw)
    if mt == "gemma3_text":
        # Gemma3TextConfig: head_dim 256, vocabulary 262,208, tied; four norms per block and
        # QK RMSNorm over head_dim; sliding_window 4096 on every block but each
        # sliding_window_pattern-th (6) unless layer_types says otherwise
        att = _attention(cfg, where, 256)
        window = opt_int(cfg, "sliding_window", where, 4096)
        pattern = opt_int(cfg, "sliding_window_pattern", where, 6, minimum=1)
        local = _local_layers(str_list(cfg, "layer_types", where, n_layers),
                              [bool((i + 1) % pattern) for i in range(n_layers)]) if window else 0
        return ModelSpec(**base, **att, d_ff=int_key(cfg, "intermediate_size", where),
                         norms_per_layer=4, qk_norm="head", local_attention="sliding" if local else "",
                         attention_window=window if local else 0, n_local_layers=local)
    if mt == "gpt_oss":
        # GptOssConfig: 128 experts of 2880, top-4, biased experts and router, attention
        # bias, one sink logit per head; sliding_window 128 on every other block
        att = _attention(cfg, where, 64)
        window = opt_int(cfg, "sliding_window", where, 128)
        local = _local_layers(str_list(cfg, "layer_types", where, n_layers),
                              [bool((i + 1) % 2) for i in range(n_layers)]) if window else 0
        return ModelSpec(**base, **att, d_ff=int_key(cfg, "intermediate_size", where),
                         n_experts=opt_int(cfg, "num_local_experts", where, 128, minimum=1),
                         n_experts_per_token=opt_int(cfg, "num_experts_per_tok", where, 4),
                         mlp_bias=True, router_bias=True, attention_sinks=True,
                         local_attention="sliding" if local else "", attention_window=window if local else 0,
                         n_local_layers=local)
    if mt == "phi3":
        # Phi3: fused qkv_proj and gate_up_proj (same counts as separate projections), no biases
        att = _attention(cfg, where, None)
        window = opt_int(cfg, "sliding_window", where, 0)
        return ModelSpec(**{**base, "qkv_bias": False, "out_bias": False}, **att,
                         d_ff=int_key(cfg, "intermediate_size", where),
                         local_attention="sliding" if window else "", attention_window=window,
                         n_local_layers=n_layers if window else 0)
    # olmo2: post-norms only (post_attention_layernorm, post_feedforward_layernorm) and
    # QK RMSNorm over the whole q and k widths (modeling_olmo2.py)
    att = _attention(cfg, where, None)
    return ModelSpec(**base, **att, d_ff=int_key(cfg, "intermediate_size", where), qk_norm="full")
