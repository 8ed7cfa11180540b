"""Reading keys of a Hugging Face config.json dict, with one-line errors naming the file."""

from __future__ import annotations

from typing import Any

from planner.errors import UserError


def need_key(cfg: dict[str, Any], key: str, where: str, *alts: str) -> Any:
    """The value of the first of ``key, *alts`` present and not null; UserError if none is."""
    for k in (key, *alts):
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    names = " or ".join(repr(k) for k in (key, *alts))
    raise UserError(f"{where}: missing key {names}; it is required for model_type {cfg.get('model_type')!r}")


def int_key(cfg: dict[str, Any], key: str, where: str, *alts: str, minimum: int = 1) -> int:
    """A required integer key of at least ``minimum``."""
    v = need_key(cfg, key, where, *alts)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UserError(f"{where}: key {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def opt_int(cfg: dict[str, Any], key: str, where: str, default: int, minimum: int = 0) -> int:
    """An optional integer key: ``default`` (the configuration class's) when absent or null."""
    if cfg.get(key) is None:
        return default
    return int_key(cfg, key, where, minimum=minimum)


def float_key(cfg: dict[str, Any], key: str, default: float = 0.0) -> float:
    v = cfg.get(key, default)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def int_list(cfg: dict[str, Any], key: str, where: str, n_layers: int) -> list[int] | None:
    """An optional list of integers (layer indices or 0/1 flags); None when absent."""
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) > 10 * max(n_layers, 1) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise UserError(f"{where}: key {key!r} must be a list of integers, one per layer at most")
    return list(v)


def str_list(cfg: dict[str, Any], key: str, where: str, n_layers: int) -> list[str] | None:
    """An optional list of strings, one per layer (``layer_types``); None when absent."""
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != n_layers or not all(isinstance(x, str) for x in v):
        raise UserError(f"{where}: key {key!r} must list one string per layer ({n_layers})")
    return list(v)
