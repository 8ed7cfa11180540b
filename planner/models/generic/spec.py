"""A ModelSpec for a config no family translator is written for, from its measured profile."""

from __future__ import annotations

from typing import Any

from planner.errors import UserError
from planner.models.generic.cache import read_cached, transformers_version, write_cached
from planner.models.generic.profile import GenericProfile
from planner.models.spec import ModelSpec


def causal_lm_types() -> tuple[str, ...]:
    """The model_types transformers builds as causal LMs (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES);
    () without transformers."""
    if not transformers_version():
        return ()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def generic_profile(cfg: dict[str, Any], where: str) -> GenericProfile:
    """The cached profile of ``cfg``, else measured now (torch and transformers imported) and cached."""
    cached = read_cached(cfg)
    if cached is not None:
        return cached
    from planner.models.generic.probe import profile_config

    profile = profile_config(cfg, where)
    write_cached(cfg, profile)
    return profile


def _first_int(cfg: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def generic_spec(cfg: dict[str, Any], common: dict[str, Any], where: str, supported: tuple[str, ...]) -> ModelSpec:
    """The ModelSpec of a config transformers builds as a causal LM but no translator is
    written for. Widths are read where the config names them (hidden_size, heads, head_dim,
    intermediate_size, vocab_size under their usual names) for the terms outside the blocks
    (logits, pipeline sends); parameters, saved tensors and FLOPs are the profile's."""
    mt = cfg["model_type"]
    cached = read_cached(cfg)
    if cached is None and mt not in causal_lm_types():
        why = ("transformers is not installed to build it (pip install '.[measure]')" if not transformers_version()
               else f"nor a causal LM that transformers {transformers_version()} builds")
        raise UserError(f"{where}: unsupported model_type {mt!r}: no written family ({', '.join(supported)}) "
                        f"{why}")
    profile = cached or generic_profile(cfg, where)
    h = _first_int(cfg, ("hidden_size", "n_embd", "d_model", "dim", "n_embed"), 1)
    n_heads = _first_int(cfg, ("num_attention_heads", "n_head", "n_heads", "num_heads"), 1)
    n_kv = _first_int(cfg, ("num_key_value_heads", "n_kv_heads", "num_kv_heads"), n_heads)
    if n_heads % n_kv:
        n_kv = n_heads
    head_dim = _first_int(cfg, ("head_dim", "attention_head_dim"), max(h // n_heads, 1))
    vocab = _first_int(cfg, ("vocab_size", "n_vocab", "padded_vocab_size"), 1)
    if profile.n_layers < 1:
        raise UserError(f"{where}: transformers' {mt} model has no blocks to plan")
    common = {**common, "source": common.get("source") or
              f"generic: transformers {profile.transformers_version}'s {mt}, measured"}
    return ModelSpec(
        **common, n_layers=profile.n_layers, d_model=h, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        d_ff=_first_int(cfg, ("intermediate_size", "ffn_hidden_size", "n_inner", "d_ff"), 4 * h),
        vocab_size=vocab, max_positions=_first_int(cfg, ("max_position_embeddings", "n_positions"), 0),
        tied_embeddings=profile.head == 0, profile=profile)
