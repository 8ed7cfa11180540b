"""The named parts of many layouts' steps, as arrays (StepArrays), and StepTime read from a row.

timing.fast.step_arrays() fills them, one element per layout on the placement order that
layout runs fastest on; StepTime of layout i is StepArrays.row(i). The terms are those of
timing.step.StepParts: step = m t_mb + bubble + dp exposed + dp slowdown + optimizer, with
t_mb the slowest stage's micro-batch (its compute, the exposed tp/cp/ep/pp communication and
the slowdown of what is hidden; Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.timing.step import StepTime

COMM_AXES = ("tp", "cp", "ep", "dp", "pp")     # StepTime.comm_s's keys, in timing.pipeline_part's order


@dataclass(frozen=True, slots=True)
class StepArrays:
    """One float64 (or int64) array per named term, one element per layout (seconds unless
    named). ``order`` indexes ``orders``: the placement each layout is timed on."""

    orders: tuple[tuple[str, ...], ...]
    order: np.ndarray             # int64
    step_time_s: np.ndarray
    compute_s: np.ndarray         # m (forward + backward) of the slowest stage
    comm_tp_s: np.ndarray         # exposed communication per axis, over the step
    comm_cp_s: np.ndarray
    comm_ep_s: np.ndarray
    comm_dp_s: np.ndarray
    comm_pp_s: np.ndarray
    bubble_s: np.ndarray
    optimizer_s: np.ndarray
    dp_slowdown_s: np.ndarray     # Efficiency.overlap_slowdown x the data-parallel seconds hidden
    micro_batch_s: np.ndarray     # t_mb: one micro-batch on the slowest stage, sends and slowdown included
    fwd_mb_s: np.ndarray          # its forward and backward compute
    bwd_mb_s: np.ndarray
    slow_stage: np.ndarray        # int64: the slowest stage
    n_slow: np.ndarray            # int64: its blocks
    tokens_per_step: np.ndarray   # int64
    n_gpus: np.ndarray            # int64
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    peak_flops_per_s: float

    def __len__(self) -> int:
        return len(self.step_time_s)

    def comm(self, axis: str) -> np.ndarray:
        return {"tp": self.comm_tp_s, "cp": self.comm_cp_s, "ep": self.comm_ep_s, "dp": self.comm_dp_s,
                "pp": self.comm_pp_s}[axis]

    def row(self, i: int) -> StepTime:
        """The StepTime of layout ``i``."""
        return StepTime(compute_s=float(self.compute_s[i]),
                        comm_s={ax: float(self.comm(ax)[i]) for ax in COMM_AXES},
                        bubble_s=float(self.bubble_s[i]), optimizer_s=float(self.optimizer_s[i]),
                        micro_batch_s=float(self.micro_batch_s[i]), step_time_s=float(self.step_time_s[i]),
                        tokens_per_step=int(self.tokens_per_step[i]), n_gpus=int(self.n_gpus[i]),
                        model_flops=float(self.model_flops[i]), hardware_flops=float(self.hardware_flops[i]),
                        peak_flops_per_s=self.peak_flops_per_s, placement=self.orders[int(self.order[i])])

    def rows(self, which: Sequence[int] | None = None) -> list[StepTime]:
        return [self.row(i) for i in (range(len(self)) if which is None else which)]
