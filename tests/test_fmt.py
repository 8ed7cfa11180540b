"""planner.fmt: the one formatter of units and money. The expected strings are what the
committed example outputs print (examples/*/output.txt), so a change here shows there too;
GiB is the IEC binary unit, 2**30 bytes (IEC 80000-13)."""

from __future__ import annotations

import pytest

from planner import fmt


def test_gib_is_binary():
    # 80 GiB = 85,899,345,920 bytes (an H100's 80 GB of HBM3 read as 2**30 units)
    assert fmt.gib(85_899_345_920) == "80.00 GiB"
    assert fmt.gib(2**40) == "1,024.00 GiB"
    assert fmt.gib_of(79.30 * 2**30, 79.65 * 2**30) == "79.30/79.65 GiB"
    assert fmt.to_gib(3 * 2**30) == 3.0


@pytest.mark.parametrize("seconds, text", [
    (1.84, "1.84 s"), (119.0, "119 s"), (120.0, "2.0 min"), (7200.0, "2.0 h"),
    (2 * 86_400.0, "2.0 days"), (90 * 86_400.0, "90.0 days"),
])
def test_duration_largest_unit_spanned_twice(seconds, text):
    assert fmt.duration(seconds) == text


@pytest.mark.parametrize("usd, text", [(812.4, "$812"), (450_000, "$450k"), (1_234_567, "$1.23M"),
                                       (2.5e9, "$2.5B")])
def test_usd(usd, text):
    assert fmt.usd(usd) == text


def test_counts_and_plurals():
    assert fmt.count(16384) == "16,384"
    assert fmt.plural(1, "GPU") == "1 GPU"
    assert fmt.plural(8, "GPU") == "8 GPUs"
    assert fmt.plural(1, "micro-batch", "micro-batches") == "1 micro-batch"
    # Llama-3-8B: 8,030,261,248 parameters (transformers' count, docs/facts.md)
    assert fmt.params(8_030_261_248) == "8.03B"
