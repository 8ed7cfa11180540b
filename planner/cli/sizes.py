"""Sizes on the command line: sequence lengths with a ``k`` suffix and batch sizes in tokens.

``--seq-len 8k`` is 8,192 tokens and ``128k`` is 131,072: context lengths are powers of two
and the suffixes are binary (k = 1,024, M = 1,048,576), as model cards use them (Llama 3.1's
"128K context" is max_position_embeddings 131,072).

``--global-batch`` counts sequences, as before. A batch in tokens is
``--global-batch-tokens 4M``: binary suffixes too, since published token batches are
sequences x a power-of-two length (Llama 2's "4M tokens" is 1,024 x 4,096 = 4,194,304 tokens,
Touvron et al. 2023, arXiv:2307.09288, Sec. 2.2); the planner divides by ``--seq-len`` and
rounds to the nearest whole sequence (at least one). A suffix on ``--global-batch`` is
refused with a pointer to ``--global-batch-tokens``, so that ``4M`` never silently means
four million sequences.
"""

from __future__ import annotations

import math
from typing import Any

import click

from planner.errors import UserError

BINARY_SUFFIXES = {"k": 2**10, "m": 2**20, "g": 2**30}


def parse_binary_size(text: str) -> float | None:
    """``8k`` -> 8192.0, ``4M`` -> 4194304.0, ``4096`` -> 4096.0; None when not a number."""
    s = str(text).strip().replace("_", "").replace(",", "")
    scale = BINARY_SUFFIXES.get(s[-1:].lower(), 1)
    try:
        return float(s[:-1] if scale != 1 else s) * scale
    except ValueError:
        return None


class SeqLength(click.ParamType):
    """A sequence length in tokens: 4096, 8k, 128k (k = 1,024), whole and at most ``upper``."""

    name = "TOKENS"

    def __init__(self, upper: int) -> None:
        self.upper = upper

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n: float | None = float(value)
        else:
            n = parse_binary_size(str(value))
        if n is None or not math.isfinite(n) or n != int(n):      # inf, nan: no whole number
            self.fail(f"{value!r} is not a sequence length in tokens (e.g. 4096, 8k, 128k)", param, ctx)
        if not 1 <= n <= self.upper:
            self.fail(f"{value!r} must be between 1 and {self.upper:,} tokens", param, ctx)
        return int(n)


class SequenceCount(click.ParamType):
    """A whole number of sequences; a size suffix points to --global-batch-tokens."""

    name = "SEQUENCES"

    def __init__(self, upper: int) -> None:
        self.upper = upper

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip().replace("_", "").replace(",", "")
            if text[-1:].lower() in BINARY_SUFFIXES or text[-1:].lower() in ("t", "b"):
                self.fail(f"{value!r}: --global-batch counts sequences; for a batch in tokens give "
                          f"--global-batch-tokens {text}", param, ctx)
            try:
                n = int(text)
            except ValueError:
                self.fail(f"{value!r} is not a whole number of sequences", param, ctx)
        if not 1 <= n <= self.upper:
            self.fail(f"{value!r} must be between 1 and {self.upper:,} sequences", param, ctx)
        return n


class TokenBatch(click.ParamType):
    """Tokens per optimizer step: 4194304, 4M, 512k (binary suffixes)."""

    name = "TOKENS"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        n = parse_binary_size(str(value))
        if n is None:
            self.fail(f"{value!r} is not a token count (e.g. 4M, 512k, 4194304)", param, ctx)
        if not 1 <= n <= 2**50:
            self.fail(f"{value!r} must be between 1 and 2^50 tokens", param, ctx)
        return n


def sequences_for_tokens(tokens: float, seq_len: int, upper: int) -> int:
    """The global batch in sequences for ``tokens`` per step at ``seq_len``: the nearest whole
    number of sequences, at least one; UserError beyond ``upper``."""
    n = max(1, round(tokens / seq_len))
    if n > upper:
        raise UserError(f"--global-batch-tokens {tokens:,.0f} at --seq-len {seq_len:,} is {n:,} sequences, "
                        f"beyond the limit of {upper:,}")
    return n


def global_batch_from(kw: dict[str, Any], upper: int) -> int | None:
    """--global-batch (sequences) or --global-batch-tokens (converted); None when neither is given."""
    tokens = kw.get("global_batch_tokens")
    if tokens is None:
        return kw.get("global_batch")
    if kw.get("global_batch") is not None:
        raise UserError("give --global-batch (sequences) or --global-batch-tokens (tokens), not both")
    return sequences_for_tokens(tokens, kw["seq_len"], upper)
