"""`plan measure --real --calibration-out FILE`: the calibration file `plan calibrate` writes,
fitted on a measured step instead of a training log.

A real measurement (planner.measure.trackers on CUDA) times TIMED_STEPS training steps after
the tracked ones, outside the tracker; their mean is the step time, torch.cuda's peak reserved
and allocated bytes the memory, exactly the fields a log gives plan calibrate
(timing.calibrate.Observation). The fit and the file are timing.calibrate's (fit, to_toml), so
both commands write the same file for the same measurement.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from planner.errors import UserError
from planner.hardware.placement import Cluster
from planner.layouts.layout import Layout
from planner.memory.model import per_rank_memory
from planner.models.spec import ModelSpec
from planner.timing.calibrate import Calibration, Observation, fit
from planner.timing.model import Efficiency
from planner.training.setup import TrainingSetup


def measured_observation(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster,
                         measured: Mapping[str, Any], name: str, stack: str) -> Observation:
    """The measurement as plan calibrate's Observation: the measured setup and layout (one
    micro-batch per step, global batch = micro-batch x dp), the mean timed step, the peaks."""
    times = [float(t) for t in measured.get("step_times_s") or []]
    if not times:
        raise UserError("the measurement timed no steps (only a run on CUDA GPUs does: plan measure --real); "
                        "nothing to calibrate")
    if min(times) <= 0:
        raise UserError(f"the measurement's step times {times} are not positive")
    tracked = per_rank_memory(m, setup, lay, gpus_per_node=cluster.gpu.gpus_per_node).breakdown.tracked
    return Observation(name=name, stack=stack, model=m, setup=setup, layout=lay, cluster=cluster,
                       step_time_s=statistics.fmean(times), tracked_bytes=tracked,
                       max_reserved_bytes=measured.get("max_reserved_bytes"),
                       max_allocated_bytes=measured.get("max_allocated_bytes"))


def measured_calibration(obs: Observation, planner_version: str, created: str) -> Calibration:
    """The calibration plan calibrate would fit on this one observation."""
    return fit([obs], Efficiency(), planner_version, created)
