"""The parallel degrees as the placement reads them: AxisSizes, in placement order.

The links of each axis depend on the five degrees and on the order the groups are placed in,
innermost first (Megatron-LM's and torchtitan's device-mesh order by default: tp, cp, ep, dp,
pp; hardware.placement.axis_links). AxisSizes names them; it is a tuple, so it hashes and
caches as one, and Layout.axis_sizes builds it from a layout.
"""

from __future__ import annotations

from typing import NamedTuple


class AxisSizes(NamedTuple):
    """The degree of each parallel axis, in the default placement order (1: not split)."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1


AXES: tuple[str, ...] = AxisSizes._fields      # ("tp", "cp", "ep", "dp", "pp"): the default placement order
