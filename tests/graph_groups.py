"""Rank groups and bandwidths for the topology tests: the mesh placement over all axes and the
bandwidth of a group, a pair or every axis on a cluster graph. Moved here from
planner/hardware/graph.py, where no command used them; the groups come from the planner's own
placement rule (planner.hardware.placement._axis_groups), the bandwidths from its graph
(ring_bandwidth_bytes_per_s, the max flow)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from planner.errors import UserError
from planner.hardware.axes import AXES
from planner.hardware.graph import _check_gpu, _max_flow_bytes_per_s, ring_bandwidth_bytes_per_s
from planner.hardware.placement import _axis_groups


def place_groups(n_gpus: int, *, tp: int = 1, cp: int = 1, ep: int = 1, dp: int = 1, pp: int = 1,
                 order: Sequence[str] = AXES) -> dict[str, list[list[int]]]:
    """Rank groups of each parallel axis, the first axis of `order` innermost (adjacent GPU ids).

    GPU id = sum over axes of index[axis] * stride[axis], strides growing along `order`, as in
    Megatron-LM's and torchtitan's device meshes (tp innermost keeps it inside an NVLink domain).
    """
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    if sorted(order) != sorted(AXES):
        raise UserError(f"order must list each of {AXES} once, got {tuple(order)}")
    if any(s < 1 for s in sizes.values()) or math.prod(sizes.values()) != n_gpus:
        raise UserError(f"tp*cp*ep*dp*pp = {math.prod(sizes.values())} must equal n_gpus = {n_gpus}")
    strides, stride = {}, 1
    for axis in order:
        strides[axis] = stride
        stride *= sizes[axis]
    return {axis: _axis_groups(strides[axis], sizes[axis], n_gpus) for axis in AXES}


def group_bandwidth_bytes_per_s(g: Any, gpu_ids: Sequence[int]) -> float:
    """Bus bandwidth per GPU of one ring collective over `gpu_ids`, with the rest of the cluster idle."""
    return ring_bandwidth_bytes_per_s(g, [gpu_ids])


def pair_bandwidth_bytes_per_s(g: Any, a: int, b: int) -> float:
    """Max flow from GPU a to GPU b, per direction, with no other GPU relaying."""
    _check_gpu(g, a)
    _check_gpu(g, b)
    if a == b:
        return math.inf
    return _max_flow_bytes_per_s(g, {a}, {b})


def axis_bandwidths_bytes_per_s(g: Any, groups: Mapping[str, Sequence[Sequence[int]]]) -> dict[str, float]:
    """Bus bandwidth per GPU of each axis's collectives, all groups of an axis running at once."""
    return {axis: ring_bandwidth_bytes_per_s(g, grps) for axis, grps in groups.items()}
