"""The named parts of many layouts' steps, as arrays (StepArrays), and StepTime read from a row.

timing.fast.step_arrays() fills them, one element per layout on the placement order that
layout runs fastest on; StepTime of layout i is StepArrays.row(i). The terms:
step = m t_mb + bubble + dp exposed + dp slowdown + optimizer, with
t_mb the slowest stage's micro-batch (its compute, the exposed tp/cp/ep/pp communication and
the slowdown of what is hidden; Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.hardware.axes import AXES as PLACEMENT_AXES
from planner.timing.efficiency import Efficiency
from planner.timing.step import StepTime

COMM_AXES = PLACEMENT_AXES     # StepTime.comm_s's keys: each axis, in the placement order

# The data-parallel collectives of a step (ZeRO, Rajbhandari et al. 2020, arXiv:1910.02054,
# Sec. 5; FSDP, Zhao et al. 2023, arXiv:2304.11277, Sec. 3), by branch: plain data
# parallelism (all-reduce), ZeRO-1/2, FSDP shard-grad-op, ZeRO-3 or FSDP full shard, FSDP hybrid
ALL_REDUCE, ZERO_12, FSDP_GRAD_OP, SHARD_3, FSDP_HYBRID = range(5)
# the terms each branch has: 0 under the backward once a step (the gradient all-reduce or
# reduce-scatter; HSDP's all-reduce across replicas), 1 under the forward (the parameter
# all-gather; per micro-batch from FSDP_GRAD_OP on), 2 under the backward per micro-batch
DP_TERMS = {ALL_REDUCE: (0,), ZERO_12: (0, 1), FSDP_GRAD_OP: (1, 2), SHARD_3: (1, 2), FSDP_HYBRID: (0, 1, 2)}


@dataclass(frozen=True, kw_only=True, slots=True)
class DpCollective:
    """One data-parallel collective of one layout's step: seconds per occurrence, the
    compute window it may hide under ("fwd", "bwd" or "fwd+bwd" of a micro-batch) and the share of it
    it may use, how often it runs, and what of it is exposed and hidden per occurrence."""

    seconds: float
    window: str
    overlap: float
    per_micro_batch: bool
    times: int
    exposed_s: float
    hidden_s: float


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
    n_slow_bwd: np.ndarray        # int64: its blocks with a backward pass (kernels.backward_layers)
    n_comm: np.ndarray            # int64: its blocks' tp/cp/ep communication, the last stage's MTP layers' too
    grad_accum: np.ndarray        # int64: micro-batches per step
    dp_branch: np.ndarray         # int64: the branch of DP_TERMS
    dp_times: np.ndarray          # int64: occurrences of the per-micro-batch gather (dp_overlap.dp_times' first)
    # (seconds, exposed, hidden) x DP_TERMS' term x layout, per occurrence (None: not itemized,
    # timing.fast.step_times_picked's rows, whose StepTime does not read it)
    dp_each: np.ndarray | None
    efficiency: Efficiency
    tokens_per_step: np.ndarray   # int64
    n_gpus: np.ndarray            # int64
    model_flops: np.ndarray
    hardware_flops: np.ndarray
    peak_flops_per_s: float
    fp8_peak_flops_per_s: float | None = None    # under an FP8 recipe: the FP8 dense peak (MFU beside)
    regime: str = ""              # the error-bar regime of the plan (timing.intervals.regime_of)
    # int64: occurrences of the term under the backward (dp_overlap.dp_times' second; None: dp_times)
    dp_reduce_times: np.ndarray | None = None
    # bool: term 2 hides under a forward and a backward of the 1F1B steady state (dp_overlap.steady_reduce)
    dp_reduce_steady: np.ndarray | None = None
    mfu_ceiling: float | None = None    # the sustained MFU ceiling the steps obey (StepTime.mfu_ceiling)

    def __len__(self) -> int:
        return len(self.step_time_s)

    def comm(self, axis: str) -> np.ndarray:
        if axis not in COMM_AXES:
            raise KeyError(axis)
        return getattr(self, f"comm_{axis}_s")

    def row(self, i: int) -> StepTime:
        """The StepTime of layout ``i``."""
        return StepTime(compute_s=float(self.compute_s[i]),
                        comm_s={ax: float(self.comm(ax)[i]) for ax in COMM_AXES},
                        bubble_s=float(self.bubble_s[i]), optimizer_s=float(self.optimizer_s[i]),
                        micro_batch_s=float(self.micro_batch_s[i]), step_time_s=float(self.step_time_s[i]),
                        tokens_per_step=int(self.tokens_per_step[i]), n_gpus=int(self.n_gpus[i]),
                        model_flops=float(self.model_flops[i]), hardware_flops=float(self.hardware_flops[i]),
                        peak_flops_per_s=self.peak_flops_per_s, placement=self.orders[int(self.order[i])],
                        fp8_peak_flops_per_s=self.fp8_peak_flops_per_s,
                        step_time_factor=self.efficiency.step_time_factor, regime=self.regime,
                        mfu_ceiling=self.mfu_ceiling)

    def dp_collectives(self, i: int) -> tuple[DpCollective, ...]:
        """The data-parallel collectives of layout ``i``'s step, in DP_TERMS' order."""
        branch, eff, each = int(self.dp_branch[i]), self.efficiency, self.dp_each
        if each is None:
            raise ValueError("these step arrays were worked out without each data-parallel collective")
        per_mb = branch >= FSDP_GRAD_OP
        out = []
        for term in DP_TERMS[branch]:
            steady = self.dp_reduce_steady is not None and bool(self.dp_reduce_steady[i])
            window, overlap = (("bwd", eff.dp_overlap), ("fwd", eff.zero3_overlap if per_mb else
                                                          eff.param_gather_overlap),
                               ("fwd+bwd" if steady else "bwd", eff.zero3_overlap))[term]
            every = term == 2 or term == 1 and per_mb
            times = self.dp_times if term != 2 or self.dp_reduce_times is None else self.dp_reduce_times
            out.append(DpCollective(seconds=float(each[0, term, i]), window=window, overlap=overlap,
                                    per_micro_batch=every, times=int(times[i]) if every else 1,
                                    exposed_s=float(each[1, term, i]), hidden_s=float(each[2, term, i])))
        return tuple(out)

    def rows(self, which: Sequence[int] | None = None) -> list[StepTime]:
        return [self.row(i) for i in (range(len(self)) if which is None else which)]
