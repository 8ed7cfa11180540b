"""The one answer to "the distinct rows of these columns, and each row's group": every
batched model that works once per distinct shape (layout groups, per-shape tables, states,
the memory model's shapes and stages) asks it here.

numpy is imported by this package's batch modules only (never by `plan --help`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Unsupported(Exception):
    """The set-up or the numbers are outside what the batched models cover."""


def renumber(values: np.ndarray, span: int) -> tuple[np.ndarray, int]:
    """The distinct values of ``values`` (0 <= values < span) numbered 0, 1, ... in
    increasing order, through a lookup table of ``span`` entries: (numbers, how many)."""
    present = np.zeros(span, dtype=bool)
    present[values] = True
    distinct = np.flatnonzero(present)
    number = np.empty(span, dtype=np.int64)
    number[distinct] = np.arange(len(distinct))
    return number[values], len(distinct)


def _ranks(values: np.ndarray) -> tuple[np.ndarray, int]:
    """renumber() of values of any range, by a sort (np.unique): (numbers, how many)."""
    _, inverse = np.unique(values, return_inverse=True)
    return inverse.reshape(-1), int(inverse.max(initial=-1)) + 1


_KEY_LIMIT = 2**62      # a packed key's range stays below this (int64, with room to add one column)


def group(columns: Sequence[np.ndarray], bounds: Sequence[tuple[int, int | None] | None] | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, representatives): the group of each row by its values in ``columns`` (integer
    or bool arrays of equal length), and a row of each group (its first or its last: every row
    of a group holds its values, all a caller reads there). Groups are numbered in
    increasing order of the rows read from the LAST column to the first (the last column
    most significant: np.unique(np.stack(columns[::-1], axis=1), axis=0)'s order). The one
    answer to "the distinct rows of these columns, and ids back" of the batched models
    (layout groups, per-shape tables, states, the memory model's shapes).
    ``bounds``: (lowest, highest) possible value of each column where known (None
    where not), which spares a pass over it for its minimum and maximum; (lowest, None)
    spares the pass for the minimum (a column whose largest value is the lowest possible is
    constant, and one with a positive lowest value is packed from 0 rather than shifted).

    The columns are packed into one int64 key (mixed radix, the first column least
    significant; a column with one value is left out). A wide column (a dp of up to
    16,384) has its values numbered first, and the columns packed so far are numbered by
    their distinct values whenever the key range would outgrow a lookup table (by a sort
    where even that would overflow the key); all keep the order of the keys. A small key
    range is grouped through a lookup table, with no sort."""
    n = len(columns[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    limit = max(1 << 16, 4 * n)
    key, scale = None, 1
    for i, col in enumerate(columns):
        col = col.astype(np.int64, copy=False)     # (a bool or narrower column: no wraparound)
        bound = bounds[i] if bounds is not None else None
        if bound is None:
            lo, hi = int(col.min()), int(col.max())
        elif bound[1] is None:      # only the lowest possible value known: a column at it is
            lo, hi = bound[0], int(col.max())      # constant, else it is packed from 0 up
            if hi == lo:
                continue
            lo = min(lo, 0)
        else:
            lo, hi = bound[0], int(bound[1])
        span = hi - lo + 1
        if span == 1:
            continue
        if span >= _KEY_LIMIT:      # (values apart by more than any key holds, or col - lo would wrap)
            col, span = _ranks(col)
        elif lo:
            col = col - lo
        if 64 < span <= limit and (key is None and span > 1024 or scale * span > limit):
            col, span = renumber(col, span)
        if key is None:
            key, scale = col, span
            continue
        if scale * span > limit and scale <= limit:
            key, scale = renumber(key, scale)
        elif scale * span >= _KEY_LIMIT:
            key, scale = _ranks(key)
        if scale * span >= _KEY_LIMIT:
            col, span = _ranks(col)
        if scale * span >= _KEY_LIMIT:     # (more than 2**31 rows)
            raise Unsupported("shape columns too wide to pack into one key")
        key = key + col * scale
        scale *= span
    if key is None:
        return np.zeros(n, dtype=np.int64), np.zeros(1, dtype=np.int64)
    if scale <= limit:
        return group_packed(key, scale)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


def group_packed(key: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """group() of one column already packed into 0 <= key < span, for a span small
    enough for a lookup table: (inverse, representatives), in increasing key order. One
    pass writes each row's number into the table at its key (the last row of a group is
    written last and stands), which gives the representatives; the table then numbers the
    groups. The keys present are marked in the table itself (initialised to -1) or, where the
    table is more than twice as long as the column (a few thousand layouts against the
    smallest table, 65,536 entries: most calls of the 256-job `plan buy`), in a table of
    bools, which spares filling and reading the long table (44 -> 19 us at 3,000 rows)."""
    n = len(key)
    if span > 2 * n:
        present = np.zeros(span, dtype=bool)
        present[key] = True
        keys = np.flatnonzero(present)
        table = np.empty(span, dtype=np.int64)
        table[key] = arange(n)
    else:
        table = np.full(span, -1, dtype=np.int64)
        table[key] = arange(n)
        keys = np.flatnonzero(table >= 0)
    rep = table[keys]
    table[keys] = arange(len(keys))
    return table[key], rep


_ARANGE = np.arange(0)


def arange(n: int) -> np.ndarray:
    """np.arange(n), read-only, from one array kept across calls."""
    global _ARANGE
    if n > len(_ARANGE):
        _ARANGE = np.arange(max(n, 2 * len(_ARANGE)))
        _ARANGE.flags.writeable = False
    return _ARANGE[:n]
