"""The time terms of a step, per pipeline shape and placement order, and how they combine (timing.fast).

A step of a layout on one placement order is (Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2)

    m t_mb + (p-1)/v t_mb + dp exposed + overlap slowdown x dp hidden + optimizer

with t_mb one micro-batch on the slowest stage (stage.slowest_stages: its compute and exposed
tp, cp and ep communication), its 2 v pipeline sends, overlap slowdown x what of that
communication is hidden, and the gradient accumulation pass. MicroBatchTerms holds each term as
an (order, P) array, one function per term builds it (micro_batch_terms calls them), and the
combination is written once: micro_batch_s() (t_mb), pipeline_s() (m t_mb plus the bubble),
step_s() (plus the data-parallel terms, dp_overlap.dp_exposure, and the optimizer update) and
floored_s() (the sustained-rate ceiling and Efficiency.step_time_factor). A new term is a field
here, its function, and its place in the combination (and in fast's named parts, if it is one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.hardware.placement import Cluster
from planner.layouts.groups import LayoutGroups
from planner.models.spec import ModelSpec
from planner.timing.degrees import N_VALS, Degrees
from planner.timing.dp import optimizer_update_bytes_per_param
from planner.timing.efficiency import Efficiency, ceiling_floor_s
from planner.timing.kernels import image_time_s
from planner.timing.stage import SlowestStages
from planner.training.setup import TrainingSetup


@dataclass(frozen=True, slots=True)
class MicroBatchTerms:
    """One micro-batch on the slowest stage of each pipeline shape (LayoutGroups' P), per
    placement order: float64 (order, P) arrays in seconds unless named; a layout reads its P's
    column. The exposed tp, cp and ep seconds are inside ``stage_s`` (the slowest stage is the
    one with the longest compute plus exposed communication)."""

    stage_s: np.ndarray            # forward + backward compute + exposed tp/cp/ep communication
    fwd_compute_s: np.ndarray      # the stage's forward compute (dp gathers hide under it)
    bwd_compute_s: np.ndarray      # its backward compute (dp reductions hide under it)
    tp_cp_ep_comm_s: np.ndarray    # exposed tp, cp and ep communication of its blocks and edges
    cp_comm_block_s: np.ndarray    # one block's exposed cp seconds
    ep_comm_block_s: np.ndarray    # one block's exposed ep seconds
    hidden_comm_s: np.ndarray      # tp, cp and ep seconds hidden under compute
    pp_comm_s: np.ndarray          # exposed pipeline sends
    pp_hidden_s: np.ndarray        # pipeline sends hidden under compute
    grad_accum_pass_s: np.ndarray | None   # the gradient accumulation pass (None: the engine has none)
    micro_batches: np.ndarray      # (P,) micro-batches per step, as float64
    bubble_share: np.ndarray       # (P,) (p-1)/v: the bubble in micro-batch times
    slot: np.ndarray               # int64 (order, P): which of degrees.SLOTS the slowest stage is
    stage_at: np.ndarray           # int64 (order, P): its (slot, D) place in the degree tables


def micro_batch_terms(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, g: LayoutGroups,
                      deg: Degrees, slow: SlowestStages) -> MicroBatchTerms:
    """The terms of one micro-batch of every pipeline shape of ``g``, from its slowest stage."""
    pd, pp = g.p_d, g.degrees[4]
    _, pvp, mb_p, _, pga = g.p_cols
    stage, fwd, bwd, hidden, comm, cp_block, ep_block = (slow.vals[:, k] for k in range(N_VALS))
    stage, fwd, bwd = with_images(m, setup, cluster, eff, mb_p, stage, fwd, bwd)
    stage_at = slow.slot * len(g.d_rep) + pd                  # (slot, D) of each P's slowest stage
    pp_all = pp_send_s(deg, pd, pvp, slow)
    with np.errstate(invalid="ignore", over="ignore"):
        pp_comm, pp_hidden = pp_all * (1 - eff.pp_overlap), pp_all * eff.pp_overlap
    return MicroBatchTerms(stage_s=stage, fwd_compute_s=fwd, bwd_compute_s=bwd, tp_cp_ep_comm_s=comm,
                           cp_comm_block_s=cp_block, ep_comm_block_s=ep_block, hidden_comm_s=hidden,
                           pp_comm_s=pp_comm, pp_hidden_s=pp_hidden,
                           grad_accum_pass_s=grad_accum_pass_s(m, setup, eff, deg, stage_at),
                           micro_batches=pga.astype(np.float64), bubble_share=bubble_share(pp[pd], pvp),
                           slot=slow.slot, stage_at=stage_at)


def with_images(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, mb_p: np.ndarray,
                stage: np.ndarray, fwd: np.ndarray, bwd: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stage's time, forward and backward with a vision-language model's image side on the
    first stage's micro-batches (kernels.image_time_s; ``mb_p``: sequences per micro-batch) added
    to the slowest stage's: exact without a pipeline, an upper bound by it with one."""
    img_fwd_s, img_bwd_s = image_time_s(m, setup, cluster.gpu, eff)
    if not img_fwd_s:
        return stage, fwd, bwd
    return stage + mb_p * (img_fwd_s + img_bwd_s), fwd + mb_p * img_fwd_s, bwd + mb_p * img_bwd_s


def pp_send_s(deg: Degrees, pd: np.ndarray, pvp: np.ndarray, slow: SlowestStages) -> np.ndarray:
    """The pipeline sends of one micro-batch on the slowest stage, in seconds: 2 v sends (a
    forward activation and a backward gradient per virtual stage; Narayanan et al. 2021, Sec.
    2.2.2) of the block's output, each latency + bytes / bandwidth over the pp link; 0.0
    without a pipeline."""
    sends = 2 * pvp.astype(np.float64)
    p2p_bytes = slow.p2p_bytes
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if slow.p2p_positive:    # a D that sends nothing: latency 0.0 and bandwidth inf give 0.0 + x / inf = 0.0
            lat, bw = np.take(deg.pp_send, pd, axis=2)
            return sends * (lat + p2p_bytes / bw)
        lat, bw = np.take(deg.pp_link, pd, axis=2)
        return sends * np.where(np.take(deg.pp_on, pd, axis=1) & (p2p_bytes > 0), lat + p2p_bytes / bw, 0.0)


def grad_accum_pass_s(m: ModelSpec, setup: TrainingSetup, eff: Efficiency, deg: Degrees,
                      stage_at: np.ndarray) -> np.ndarray | None:
    """The gradient accumulation pass after each micro-batch's backward
    (Efficiency.grad_accum_bytes_per_param): the stage's trainable parameters, unsharded, at the
    optimizer update's HBM rate (degrees.optimizer_s, per byte), in seconds; None without one."""
    if not eff.grad_accum_bytes_per_param:
        return None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return deg.optimizer_s[stage_at] * (eff.grad_accum_bytes_per_param / optimizer_update_bytes_per_param(m, setup))


def bubble_share(pp: np.ndarray, vp: np.ndarray) -> np.ndarray:
    """The pipeline bubble in micro-batch times, (p-1)/v (Narayanan et al. 2021, Sec. 2.2.2:
    interleaving divides the fill and drain by the virtual stages)."""
    return (pp - 1) / vp.astype(np.float64)


# ---------------------------------------------------------------- the combination

def micro_batch_s(t: MicroBatchTerms, eff: Efficiency) -> np.ndarray:
    """t_mb, (order, P) seconds: the slowest stage, its exposed pipeline sends, overlap
    slowdown x the communication hidden under its compute (Efficiency.overlap_slowdown), and
    the gradient accumulation pass."""
    with np.errstate(invalid="ignore", over="ignore"):
        t_mb = t.stage_s + t.pp_comm_s                            # + 0.0 without a pipeline: exact
        t_mb = t_mb + eff.overlap_slowdown * (t.hidden_comm_s + t.pp_hidden_s)
        if t.grad_accum_pass_s is not None:
            t_mb = t_mb + t.grad_accum_pass_s
    return t_mb


def pipeline_s(t: MicroBatchTerms, t_mb: np.ndarray) -> np.ndarray:
    """m t_mb + (p-1)/v t_mb, (order, P) seconds: the micro-batches and the bubble."""
    with np.errstate(invalid="ignore", over="ignore"):
        return t.micro_batches * t_mb + t.bubble_share * t_mb


def step_s(pipeline: np.ndarray, dp_exposed: np.ndarray, dp_slowdown: np.ndarray | None,
           optimizer: np.ndarray) -> np.ndarray:
    """The step on one placement order, seconds: the pipeline, the data-parallel seconds left
    exposed, the slowdown of those hidden (None: none hidden) and the optimizer update."""
    with np.errstate(invalid="ignore", over="ignore"):
        step = pipeline + dp_exposed
        if dp_slowdown is not None:        # (+ overlap_slowdown x 0.0 otherwise: nothing)
            step = step + dp_slowdown
        return step + optimizer


def floored_s(step: np.ndarray, model_flops: np.ndarray, n_gpus: np.ndarray, peak_flops_per_s: float,
              ceiling: float | None, eff: Efficiency) -> np.ndarray:
    """The step no faster than its model FLOPs at the GPU's sustained training rate
    (efficiency.mfu_ceiling, ceiling_floor_s), times Efficiency.step_time_factor, seconds."""
    if ceiling is not None:
        step = np.maximum(step, ceiling_floor_s(model_flops, n_gpus, peak_flops_per_s, ceiling))
    if eff.step_time_factor != 1.0:
        step = step * eff.step_time_factor
    return step
