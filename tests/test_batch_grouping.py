"""The batched models' grouping of rows and saturation of bytes, against numpy's own
np.unique and the IEEE semantics they replace."""

import numpy as np
import pytest

from planner.cli.alloc import keep_freed_memory
from planner.limits import MAX_MODELLED_BYTES, saturated_bytes
from planner.memory.shapes import group


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
    rows = np.stack([c.astype(np.int64) for c in cols], axis=1)
    uniq, first_np, inv_np = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    assert np.array_equal(inv, inv_np.reshape(-1))
    assert np.array_equal(first, first_np)                   # the first row of each group
    assert np.array_equal(rows[first], uniq)


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
