"""Collectives with the alpha-beta model, on arrays of groups: ring all-reduce, all-gather and
reduce-scatter, point-to-point sends, and what a compute window hides of them.

A ring collective over n ranks of S bytes in all takes steps (n-1) hops of latency alpha plus
steps (n-1)/n x S over the bus bandwidth B x bus fraction: steps 2 for an all-reduce, 1 for an
all-gather or reduce-scatter (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms";
nccl-tests' busbw definition, NVIDIA/nccl-tests doc/PERFORMANCE.md). all_reduce_s() and
gather_s() are the same arithmetic on one group.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from planner.hardware.placement import AxisLink
from planner.timing.efficiency import Efficiency


class Ring(NamedTuple):
    """The parts of a ring collective that depend on the group alone, per group: the time of S
    bytes is latency + volume x S / bandwidth, in that order, and 0 where ``on`` is false (one
    rank) or S <= 0."""

    latency: np.ndarray        # steps (n-1) x hop latency
    volume: np.ndarray         # steps (n-1) / n
    bandwidth: np.ndarray      # bus bandwidth x Efficiency.bus_fraction
    on: np.ndarray             # n > 1

    @staticmethod
    def of(n: np.ndarray, bw: np.ndarray | float, lat: np.ndarray | float, bus: float, steps: int) -> Ring:
        n_f = n.astype(np.float64)
        return Ring(steps * (n_f - 1) * lat, steps * (n_f - 1) / n_f, np.asarray(bw * bus), n > 1)

    def take(self, idx: np.ndarray) -> Ring:
        return Ring(*(x[idx] for x in self))

    def time_s(self, n_bytes: np.ndarray) -> np.ndarray:
        return np.where(self.on & (n_bytes > 0), self.latency + self.volume * n_bytes / self.bandwidth, 0.0)


def send_s(n_bytes: np.ndarray, bw: np.ndarray, lat: np.ndarray, bus: float) -> np.ndarray:
    """One point-to-point send: latency plus bytes over the per-direction bandwidth x bus
    fraction; 0 for no bytes or no link (infinite latency)."""
    return np.where((n_bytes > 0) & ~np.isinf(lat), lat + n_bytes / (bw * bus), 0.0)


def hide(comm_s: np.ndarray, window_s: np.ndarray, overlap: float) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, hidden) seconds of communication that may run under ``overlap`` x window_s of
    compute: hidden = min(comm, max(0, overlap x window)). The windows are sums of
    non-negative times, so with overlap 1 max(0, overlap x window) is the window itself, and
    with a non-negative overlap the product."""
    if overlap == 1.0:
        hidden = np.minimum(comm_s, window_s)
    elif overlap >= 0.0:
        hidden = np.minimum(comm_s, overlap * window_s)
    else:
        hidden = np.minimum(comm_s, np.maximum(0.0, overlap * window_s))
    return comm_s - hidden, hidden


def _one(n_bytes: float, n: int, link: AxisLink, eff: Efficiency, steps: int) -> float:
    ring = Ring.of(np.array([n]), link.bus_bytes_per_s, link.latency_s, eff.bus_fraction, steps)
    return float(ring.time_s(np.array([float(n_bytes)]))[0])


def all_reduce_s(n_bytes: float, n: int, link: AxisLink, eff: Efficiency) -> float:
    """Ring all-reduce of ``n_bytes`` over ``n`` ranks on ``link``, in seconds."""
    return _one(n_bytes, n, link, eff, 2)


def gather_s(n_bytes: float, n: int, link: AxisLink, eff: Efficiency) -> float:
    """Ring all-gather or reduce-scatter of ``n_bytes`` in all over ``n`` ranks, in seconds."""
    return _one(n_bytes, n, link, eff, 1)
