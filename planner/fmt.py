"""The one place that turns numbers into text: memory (GiB = 2**30 bytes, binary as the
GPU makers' capacities are), durations, US dollars and counts. Every report (text, the
terminal, plots, advice) and the CLI format through these, so one quantity reads the
same everywhere.

Units: planner.units (bytes are int, times float seconds, money float US dollars).
"""

from __future__ import annotations

from planner.units import GiB

MINUTE_S = 60
HOUR_S = 3600
DAY_S = 86_400


def to_gib(n_bytes: float) -> float:
    """Bytes as a number of GiB (2**30 bytes), for an axis or a table cell."""
    return n_bytes / GiB


def gib(n_bytes: float, digits: int = 2) -> str:
    """``1,234.57 GiB``: bytes in GiB with thousands separators."""
    return f"{n_bytes / GiB:,.{digits}f} GiB"


def gib_of(used_bytes: float, capacity_bytes: float) -> str:
    """``79.30/79.65 GiB``: a use against a capacity, two decimals, no separators."""
    return f"{used_bytes / GiB:.2f}/{capacity_bytes / GiB:.2f} GiB"


def gib_number(n_bytes: float, digits: int = 2) -> str:
    """``79.30``: bytes in GiB without the unit (the unit stands in a heading)."""
    return f"{n_bytes / GiB:.{digits}f}"


def duration(seconds: float) -> str:
    """A duration in the largest unit it spans twice: ``3.5 days``, ``4.2 h``, ``12.0 min``;
    shorter ones in seconds with three significant digits, trailing zeros kept (``2.00 s``,
    ``18.6 s``, ``119 s``, ``0.0123 s``)."""
    for unit, size in (("days", DAY_S), ("h", HOUR_S), ("min", MINUTE_S)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    if 1 <= seconds < 100:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    return f"{seconds:.3g} s"


def days_or_hours(seconds: float) -> str:
    """Days with three significant digits from a day up (``30 days``, ``1.5 days``), else hours
    (``12.5 h``): the cost planner's deadlines and horizons in its one-line diagnoses."""
    d = seconds / DAY_S
    return f"{d:,.3g} days" if d >= 1 else f"{seconds / HOUR_S:,.3g} h"


def days(seconds: float, digits: int = 1) -> str:
    """A number of days without the unit: ``12.5``."""
    return f"{seconds / DAY_S:,.{digits}f}"


def usd(x: float) -> str:
    """US dollars with a suffix past a thousand, three significant digits: ``$1.23M``,
    ``$450k``, ``$2.5B``; smaller amounts whole (``$812``)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"${x / size:,.3g}{unit}"
    return f"${x:,.0f}"


def count(n: float) -> str:
    """A count with thousands separators, whole: ``16,384``."""
    return f"{n:,.0f}"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 GPU``, ``8 GPUs``, ``1 micro-batch``: the count and the noun in the right number."""
    return f"{n:,} {noun if n == 1 else (nouns or noun + 's')}"


def amount(x: float, noun: str, nouns: str) -> str:
    """A count in whole units: ``1 micro-batch``, ``4 micro-batches``; a fractional one (an
    average over a stage's layers) rounded and said so: ``about 46 micro-batches`` (issue 33:
    "46.02 micro-batches" reads as a count)."""
    if float(x).is_integer():
        return plural(int(x), noun, nouns)
    n = max(1, round(x))
    return f"about {plural(n, noun, nouns)}"


def params(n: int) -> str:
    """A parameter count with a suffix: ``8.03B``, ``494.03M``, ``1.50T``."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)
