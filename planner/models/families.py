"""Hugging Face config.json -> ModelSpec, for every supported model_type.

The families before 2024 (Llama, Mistral, Mixtral, Qwen2, Gemma 1/2, GPT-2, BERT, Falcon,
BLOOM, GPT-NeoX) are translated here; those of 2024-2026 in planner.models.recent.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.errors import UserError
from planner.limits import MAX_PARAMS, check_config_types
from planner.models.cfg import float_key, int_key, opt_int
from planner.models.deltanet import DELTANET_MODEL_TYPES, qwen3_next_spec
from planner.models.hybrid import HYBRID_MODEL_TYPES, nemotron_h_spec
from planner.models.kimi import KIMI_MODEL_TYPES, kimi_linear_spec
from planner.models.recent import RECENT_MODEL_TYPES, recent_spec
from planner.models.spec import ModelSpec, count_params
from planner.models.vision.load import VLM_MODEL_TYPES, text_config, vision_profile

SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2",
    "gpt2", "bert", "falcon", "bloom", "gpt_neox", *RECENT_MODEL_TYPES, *HYBRID_MODEL_TYPES,
)


def _per_layer_as_widest(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with each non-empty list of integers (a per-layer width, e.g. Gemma 3n's
    intermediate_size, which transformers accepts) replaced by its largest element, so the
    generic path's type and range checks read the widest layer; the config the model is built
    from keeps its lists."""
    return {k: (max(v) if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in v) else v)
            for k, v in cfg.items()}


def spec_from_hf_config(cfg: dict[str, Any], name: str, where: str, source: str = "", mtp: bool = False) -> ModelSpec:
    """Translate a Hugging Face config.json dict into a ModelSpec.

    ``where`` names the file in error messages. Defaults follow transformers'
    configuration classes (e.g. LlamaConfig.tie_word_embeddings=False,
    GPT2Config.n_inner=None meaning 4h, FalconConfig.bias=False). ``mtp``: count
    DeepSeek-V3's multi-token prediction modules (num_nextn_predict_layers), which
    transformers does not build.
    """
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: expected a JSON object (a Hugging Face config.json)")
    mt = cfg.get("model_type")
    if mt is None:
        raise UserError(f"{where}: missing key 'model_type'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if not isinstance(mt, str) or not mt:
        raise UserError(
            f"{where}: unsupported model_type {mt!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    if mt in VLM_MODEL_TYPES:
        return vlm_spec(cfg, name, where, source)
    bad = check_config_types(cfg if mt in SUPPORTED_MODEL_TYPES else _per_layer_as_widest(cfg), where) or \
        config_class_refusal(cfg, mt, where)
    if bad:
        raise UserError(bad)
    if mt not in SUPPORTED_MODEL_TYPES:
        from planner.models.generic.spec import generic_spec

        common_generic = {"name": name, "model_type": mt, "source": source}
        spec = generic_spec({k: v for k, v in cfg.items()}, common_generic, where, SUPPORTED_MODEL_TYPES)
        _check_shape(spec, where)
        return spec
    if mt == "deepseek_v3" and "q_lora_rank" in cfg and cfg["q_lora_rank"] is None:
        cfg = {**cfg, "q_lora_rank": 0}     # DeepseekV3Config: null means a full q_proj (DeepSeek-V2-Lite)
    cfg = {k: v for k, v in cfg.items() if v is not None}    # a key set to null takes its default
    common: dict[str, Any] = {"name": name, "model_type": mt, "source": source}
    if mt != "gpt2":
        act = cfg.get("hidden_activation") or cfg.get("hidden_act")
        common["activation"] = str(act) if act else ("gelu" if mt in ("bert", "falcon", "bloom",
                                                                      "gpt_neox") else "silu")

    if mt in DELTANET_MODEL_TYPES:
        spec = qwen3_next_spec(cfg, common, where)
    elif mt in KIMI_MODEL_TYPES:
        spec = kimi_linear_spec(cfg, common, where)
    elif mt in HYBRID_MODEL_TYPES:
        spec = nemotron_h_spec(cfg, {k: v for k, v in common.items() if k != "activation"}, where)
    elif mt in RECENT_MODEL_TYPES:
        spec = recent_spec(cfg, mt, common, where, mtp=mtp)
    elif mt in ("llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2"):
        h = int_key(cfg, "hidden_size", where)
        n_heads = int_key(cfg, "num_attention_heads", where)
        # LlamaConfig & co.: num_key_value_heads None means num_attention_heads; 0 is kept and
        # divides by zero in the attention (issue 32, W7), as head_dim 0 sizes empty heads
        n_kv = opt_int(cfg, "num_key_value_heads", where, n_heads, minimum=1)
        head_dim = opt_int(cfg, "head_dim", where, h // n_heads, minimum=1)
        bias = bool(cfg.get("attention_bias", False))
        spec = ModelSpec(
            **common,
            n_layers=int_key(cfg, "num_hidden_layers", where),
            d_model=h, n_heads=n_heads, n_kv_heads=int(n_kv), head_dim=int(head_dim),
            d_ff=int_key(cfg, "intermediate_size", where),
            vocab_size=int_key(cfg, "vocab_size", where),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", mt in ("gemma", "gemma2"))),
            qkv_bias=bias or mt == "qwen2",
            out_bias=bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            norms_per_layer=4 if mt == "gemma2" else 2,
            n_experts=int(cfg.get("num_local_experts") or 0) if mt == "mixtral" else 0,
            n_experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if mt == "mixtral" else 0,
            attention_dropout=float_key(cfg, "attention_dropout"),
        )
    elif mt == "gpt2":
        h = int_key(cfg, "n_embd", where, "hidden_size")
        n_heads = int_key(cfg, "n_head", where, "num_attention_heads")
        spec = ModelSpec(
            **common,
            n_layers=int_key(cfg, "n_layer", where, "num_hidden_layers"),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=int(cfg.get("n_inner") or 4 * h),
            vocab_size=int_key(cfg, "vocab_size", where),
            max_positions=int_key(cfg, "n_positions", where, "max_position_embeddings"),
            position="learned", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
            activation=str(cfg.get("activation_function", "gelu_new")),
            hidden_dropout=float_key(cfg, "resid_pdrop", 0.1),
            attention_dropout=float_key(cfg, "attn_pdrop", 0.1),
        )
    elif mt == "bert":
        h = int_key(cfg, "hidden_size", where)
        n_heads = int_key(cfg, "num_attention_heads", where)
        spec = ModelSpec(
            **common,
            n_layers=int_key(cfg, "num_hidden_layers", where),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=int_key(cfg, "intermediate_size", where),
            vocab_size=int_key(cfg, "vocab_size", where),
            max_positions=int_key(cfg, "max_position_embeddings", where),
            position="learned", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
            embedding_norm=True, n_token_types=int(cfg.get("type_vocab_size", 2)),
            mlm_head=True, causal=False, final_norm=False,
            hidden_dropout=float_key(cfg, "hidden_dropout_prob", 0.1),
            attention_dropout=float_key(cfg, "attention_probs_dropout_prob", 0.1),
        )
    elif mt == "falcon":
        h = int_key(cfg, "hidden_size", where)
        n_heads = int_key(cfg, "num_attention_heads", where, "n_head")
        new_arch = bool(cfg.get("new_decoder_architecture", False))
        if new_arch:
            n_kv = int(cfg.get("num_kv_heads") or n_heads)
        elif cfg.get("multi_query", True):
            n_kv = 1
        else:
            n_kv = n_heads
        parallel = bool(cfg.get("parallel_attn", True))
        spec = ModelSpec(
            **common,
            n_layers=int_key(cfg, "num_hidden_layers", where, "n_layer"),
            d_model=h, n_heads=n_heads, n_kv_heads=n_kv, head_dim=h // n_heads,
            d_ff=int(cfg.get("ffn_hidden_size") or 4 * h),
            vocab_size=int_key(cfg, "vocab_size", where),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            position="alibi" if cfg.get("alibi") else "rope",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm",
            norms_per_layer=2 if (new_arch or not parallel) else 1,
            qkv_bias=bool(cfg.get("bias", False)), out_bias=bool(cfg.get("bias", False)),
            mlp_bias=bool(cfg.get("bias", False)), parallel_block=parallel,
            hidden_dropout=float_key(cfg, "hidden_dropout"),
            attention_dropout=float_key(cfg, "attention_dropout"),
        )
    elif mt == "bloom":
        h = int_key(cfg, "hidden_size", where, "n_embed")
        n_heads = int_key(cfg, "n_head", where, "num_attention_heads")
        spec = ModelSpec(
            **common,
            n_layers=int_key(cfg, "n_layer", where, "num_hidden_layers"),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=4 * h, vocab_size=int_key(cfg, "vocab_size", where),
            position="alibi", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
            embedding_norm=True,
            hidden_dropout=float_key(cfg, "hidden_dropout"),
            attention_dropout=float_key(cfg, "attention_dropout"),
        )
    else:  # gpt_neox
        h = int_key(cfg, "hidden_size", where)
        n_heads = int_key(cfg, "num_attention_heads", where)
        bias = bool(cfg.get("attention_bias", True))
        spec = ModelSpec(
            **common,
            n_layers=int_key(cfg, "num_hidden_layers", where),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=int_key(cfg, "intermediate_size", where),
            vocab_size=int_key(cfg, "vocab_size", where),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            gated_mlp=False, norm="layernorm", qkv_bias=bias, out_bias=bias, mlp_bias=True,
            parallel_block=bool(cfg.get("use_parallel_residual", True)),
            hidden_dropout=float_key(cfg, "hidden_dropout"),
            attention_dropout=float_key(cfg, "attention_dropout"),
        )
    _check_shape(spec, where)
    return spec


# The families whose modeling file derives head_dim as hidden_size // heads and raises unless
# the heads divide the width (transformers 5: GPT2Attention "`embed_dim` must be divisible by
# num_heads", BertSelfAttention "is not a multiple of the number of attention heads",
# FalconAttention and BloomAttention "`hidden_size` must be divisible by num_heads",
# GPTNeoXConfig "The hidden size is not divisible by the number of attention heads")
HEADS_DIVIDE_WIDTH = {"gpt2": ("n_embd", "n_head"), "bert": ("hidden_size", "num_attention_heads"),
                      "falcon": ("hidden_size", "num_attention_heads"), "bloom": ("hidden_size", "n_head"),
                      "gpt_neox": ("hidden_size", "num_attention_heads")}
# The families whose MoE blocks route num_experts_per_tok of the routed experts wherever the
# config places an MoE block (MixtralSparseMoeBlock, DeepseekV3MoE, Llama4TextMoe: a top-k over
# zero experts fails); Qwen3-MoE builds dense blocks when num_experts is 0, so it is not here
ROUTED_EXPERTS = {"mixtral": ("num_local_experts", 2), "deepseek_v3": ("n_routed_experts", 8),
                  "llama4_text": ("num_local_experts", 1), "glm4_moe": ("n_routed_experts", 8),
                  "minimax_m2": ("num_local_experts", 8), "deepseek_v32": ("n_routed_experts", 8)}


def config_class_refusal(cfg: dict[str, Any], mt: str, where: str) -> str | None:
    """Where transformers' configuration or modeling classes refuse the config although
    every key alone has a good type: heads that do not divide the width, zero routed experts
    with a top-k above zero (issue 32, W7: planned as another, dense model). None when fine."""
    if mt in HEADS_DIVIDE_WIDTH:
        wk, hk = HEADS_DIVIDE_WIDTH[mt]
        alts = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "num_attention_heads": "n_head"}
        h, n = cfg.get(wk, cfg.get(alts.get(wk, ""))), cfg.get(hk, cfg.get(alts.get(hk, "")))
        if isinstance(h, int) and isinstance(n, int) and n > 0 and h % n:
            return (f"{where}: {hk} = {n} does not divide {wk} = {h} (transformers' {mt} attention refuses it); "
                    f"give a divisor of {h}")
    if mt in ROUTED_EXPERTS:
        ek, top_k_default = ROUTED_EXPERTS[mt]
        top_k = cfg.get("num_experts_per_tok")
        top_k = top_k_default if top_k is None else top_k
        if cfg.get(ek) == 0 and isinstance(top_k, int) and top_k > 0:
            return (f"{where}: {ek} = 0 with num_experts_per_tok = {top_k}: the MoE blocks would route to no "
                    f"expert; give {ek} of at least {top_k}, or the dense model's own config")
    return None


def vlm_spec(cfg: dict[str, Any], name: str, where: str, source: str) -> ModelSpec:
    """A vision-language wrapper (VLM_MODEL_TYPES): its text tower from ``text_config`` by the
    tower's written family, with the image side's exact parameters (planner.models.vision)."""
    text = spec_from_hf_config(text_config(cfg, where), name, f"{where} text_config", source)
    if text.vision is not None or text.model_type in VLM_MODEL_TYPES:
        raise UserError(f"{where}: text_config is itself a vision-language config; pass the model's own config.json")
    spec = replace(text, vision=vision_profile(cfg, where, count_params(text).total))
    _check_shape(spec, where)
    return spec


def _check_shape(m: ModelSpec, where: str) -> None:
    for key in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
        if getattr(m, key) < 1:
            raise UserError(f"{where}: {key} = {getattr(m, key)} must be at least 1 (check the config's "
                            f"sizes; head_dim is hidden_size // num_attention_heads unless given)")
    if m.n_heads % m.n_kv_heads:
        raise UserError(
            f"{where}: num_attention_heads ({m.n_heads}) must be a multiple of "
            f"num_key_value_heads ({m.n_kv_heads})"
        )
    if m.is_moe and not 0 < m.n_experts_per_token <= m.n_experts:
        raise UserError(f"{where}: num_experts_per_tok must be between 1 and num_local_experts")
    for key in ("n_layers", "d_model", "vocab_size", "d_ff", "head_dim", "dense_d_ff", "shared_d_ff",
                "q_lora_rank", "kv_lora_rank", "v_head_dim", "n_experts"):
        v = getattr(m, key)
        if v > 10**7:
            raise UserError(f"{where}: {key} = {v} is beyond the planner's limit of 10,000,000")
    n_params = count_params(m).total
    if n_params > MAX_PARAMS:
        raise UserError(f"{where}: {n_params:.3g} parameters is beyond the planner's limit of {MAX_PARAMS:.0e}; "
                        f"check hidden_size, intermediate_size, num_hidden_layers and vocab_size")


