"""The batched models' grouping of rows (layouts.groups.group, the one answer to "the distinct
rows of these columns") and saturation of bytes, against numpy's own np.unique over the rows
(the last column most significant: group's order) and the IEEE semantics they replace."""

import numpy as np
import pytest

from planner.cli.alloc import keep_freed_memory
from planner.layouts.groups import group
from planner.limits import MAX_MODELLED_BYTES, saturated_bytes


@pytest.mark.parametrize("seed", range(12))
def test_group_equals_numpy_unique(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    tops = [2, 9, 16_385, 3, 1 << 22, 200][: 2 + seed % 5]     # small, mixed and very large values
    cols = [rng.integers(0, t, n) for t in tops]
    if seed % 2:
        cols.append(rng.random(n) > 0.5)                     # a bool column
    if seed % 3:    # columns of one value (a constant, a zero, an all-true bool), which group skips
        cols[1:1] = [np.full(n, 7, np.int64), np.zeros(n, np.int64), np.ones(n, bool)][: seed % 3 + 1]
    inv, first = group(cols)
    rows = np.stack([c.astype(np.int64) for c in cols[::-1]], axis=1)     # group: the last column first
    uniq, first_np, inv_np = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    assert np.array_equal(inv, inv_np.reshape(-1))
    assert np.array_equal(rows[first], uniq) and np.array_equal(inv[first], np.arange(len(uniq)))   # a row of each


def test_group_of_nothing() -> None:
    inv, first = group([np.zeros(0, np.int64), np.zeros(0, np.int64)])
    assert len(inv) == 0 and len(first) == 0


def test_group_of_one_row_value() -> None:
    # every column of one value: one group, its first row 0 (np.unique's answer)
    inv, first = group([np.full(5, 3, np.int64), np.ones(5, bool)])
    assert inv.tolist() == [0] * 5 and first.tolist() == [0]


def test_saturated_bytes_never_casts_out_of_range() -> None:
    x = np.array([0.0, 1e3, 2.0**70, np.inf, np.nan, -np.inf])
    out = saturated_bytes(x)
    assert out.dtype == np.int64
    assert out.tolist() == [0, 1000, MAX_MODELLED_BYTES, MAX_MODELLED_BYTES, MAX_MODELLED_BYTES,
                            -MAX_MODELLED_BYTES]


def test_keep_freed_memory_answers() -> None:
    assert isinstance(keep_freed_memory(), bool)


def test_group_of_columns_whose_distinct_counts_overflow_a_key():
    # six columns of ~3,000 distinct values each: their product (~2**69) does not fit an int64
    # key, which group must code afresh on the way; against np.unique over the rows, order too
    rng = np.random.default_rng(1)
    cols = [rng.integers(0, 3000, 4000) for _ in range(6)] + [rng.integers(0, 2, 4000)]
    cols[3][:2000] = cols[3][2000:]      # (repeated rows as well)
    for c in cols:
        c[:2000] = c[2000:]
    inv, first = group(cols)
    rows = np.stack(cols[::-1], axis=1)
    uniq, inv_np = np.unique(rows, axis=0, return_inverse=True)
    assert inv.tolist() == inv_np.reshape(-1).tolist() and np.array_equal(rows[first], uniq)


@pytest.mark.parametrize("seed", range(6))
def test_group_with_bounds_and_wide_values_equals_numpy_unique(seed: int) -> None:
    # the layout groups' calls (bounds known, degrees of at least 1) and values far apart
    # (negative, up to 2**62: no key holds their range) group as np.unique does, order too
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 5000))
    cols = [rng.integers(1, 9, n), rng.integers(0, 2, n), rng.integers(1, 16_385, n),
            rng.choice(np.array([-(2**62), -3, 0, 5, 2**62]), n), rng.integers(0, 3, n)]
    bounds = [(1, None), (0, 1), (1, None), None, (0, 2)]
    if seed % 2:
        cols, bounds = cols[:3], bounds[:3]
    inv, first = group(cols, bounds)
    rows = np.stack(cols[::-1], axis=1)
    uniq, inv_np = np.unique(rows, axis=0, return_inverse=True)
    assert inv.tolist() == inv_np.reshape(-1).tolist() and np.array_equal(rows[first], uniq)
