"""Collectives with the alpha-beta model over a link's bus bandwidth and hop latency, and what
of a communication a window of compute hides."""

from __future__ import annotations

import math

from planner.hardware.placement import (
    AxisLink,
)
from planner.timing.efficiency import Efficiency


def all_reduce_s(n_bytes: float, n: int, link: AxisLink, eff: Efficiency) -> float:
    """Ring all-reduce: 2(n-1) steps of latency plus 2(n-1)/n x S over the bus bandwidth
    (Patarasuk & Yuan 2009; nccl-tests' busbw definition)."""
    if n <= 1 or n_bytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * n_bytes / (link.bus_bytes_per_s * eff.bus_fraction)


def gather_s(n_bytes: float, n: int, link: AxisLink, eff: Efficiency) -> float:
    """Ring all-gather or reduce-scatter of S bytes in all: (n-1) steps, (n-1)/n x S."""
    if n <= 1 or n_bytes <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * n_bytes / (link.bus_bytes_per_s * eff.bus_fraction)


def send_s(n_bytes: float, link: AxisLink, eff: Efficiency) -> float:
    """One point-to-point send: latency plus bytes over the per-direction bandwidth."""
    if n_bytes <= 0 or math.isinf(link.latency_s):
        return 0.0
    return link.latency_s + n_bytes / (link.bus_bytes_per_s * eff.bus_fraction)


def hide(comm_s: float, window_s: float, overlap: float) -> tuple[float, float]:
    """(exposed, hidden) seconds of a communication that may run under ``overlap`` x window_s
    of compute."""
    hidden = min(comm_s, max(0.0, overlap * window_s))
    return comm_s - hidden, hidden
