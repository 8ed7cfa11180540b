"""Kept for planner.timing.fast, which still imports these names: the batched memory model's
totals (planner.memory.peak.memory_batch). No formula lives here."""

from __future__ import annotations

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.layouts.groups import LayoutGroups, TableCache
from planner.memory.peak import memory_batch
from planner.models.spec import ModelSpec, ParamCount
from planner.training.setup import TrainingSetup

# planner.memory.shapes keeps its own per-shape tables; nothing is stored here
STATE_CACHE = TableCache(max_entries=1, max_bytes=1)


def peak_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
               gpus_per_node: int = 8, groups: LayoutGroups | None = None) -> np.ndarray:
    """memory_batch(...).total: the peak bytes of each layout of ``a`` (int64)."""
    return memory_batch(m, setup, a, pc, gpus_per_node).total
