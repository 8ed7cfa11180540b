"""The slowest pipeline stage of one micro-batch, per pipeline shape and placement order (timing.fast).

Per block shape (LayoutGroups' B: tp, cp, ep, kernels, sp, micro-batch, recomputation) one
block's compute time and collective volumes (layer.block_table, once per
block shape); per pipeline depth with the same tp, cp and ep links (Degrees.q_d, with the block
shape: a Q) the stages that can be the slowest (the first, the last and the fullest) with their
blocks' forward and backward, the LM head and loss on the last, and the exposed
tensor-parallel all-reduces (two per pipeline edge besides the blocks'), context-parallel K/V
ring sends (what the attention time does not hide) and expert-parallel all-to-alls; the slowest
of them is kept (degrees.SlowestMemo), worked out only for the Q rows not seen before. None of
this depends on dp, vp or the accumulation. Where the second placement order gives the tp, cp
and ep groups the same links as the first, only the Q rows whose links change are redone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from planner.hardware.placement import Cluster
from planner.layouts.groups import LayoutGroups
from planner.layouts.groups import rows as _rows
from planner.models.spec import ModelSpec
from planner.timing.collectives import Ring, hide, send_s
from planner.timing.degrees import (
    A2A_BW,
    A2A_LAT,
    INNER_ROWS,
    N_VALS,
    PER_SLOT,
    Degrees,
    SlowestMemo,
    table_setup,
)
from planner.timing.efficiency import Efficiency
from planner.timing.layer import BLOCK_ROWS, block_table
from planner.training.kernels import KERNELS, block_kernel_codes
from planner.training.setup import TrainingSetup


@dataclass(frozen=True, slots=True)
class SlowestStages:
    """The slowest stage of each pipeline shape (P) on each placement order: ``vals`` (order,
    N_VALS, P): its time (compute, exposed tp/cp/ep communication, inf where a stage is absent),
    forward and backward compute, hidden and exposed tp/cp/ep seconds, one block's exposed cp and
    ep seconds; ``slot`` (order, P): which of degrees.SLOTS it is; ``p2p_bytes`` (P): the bytes
    of one pipeline send; ``p2p_positive``: every block shape sends a positive, finite amount."""

    vals: np.ndarray
    slot: np.ndarray
    p2p_bytes: np.ndarray
    p2p_positive: bool


def slowest_stages(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, g: LayoutGroups,
                   deg: Degrees, etp: int) -> SlowestStages:
    """The slowest stage of every pipeline shape of ``g`` on each placement order of ``deg``,
    read off (and where new, worked out into) deg.slowest."""
    tp, cp, ep, _, pp = g.degrees
    pd = g.p_d
    sp_p, _, mb_p, rc_p, _ = g.p_cols
    # the block shape (tp, sp, cp, ep, micro-batch, recomputation, kernels): LayoutGroups' B
    # (training.kernels, the rule the memory model reads; the sharding is not known per D,
    # so amp is timed as the eager ops it runs)
    kernel_names = KERNELS
    kern_d = block_kernel_codes(setup, tp, pp, cp, False)
    b_inv, b_first = g.b_inv, g.b_rep
    b_d = pd[b_first]
    block_rows = _rows(BLOCK_ROWS, np.float64, "block", m, table_setup(setup), cluster, eff, etp)

    def new_rows(shapes: np.ndarray) -> np.ndarray:
        """layer.block_table of new block shapes ((7, N): tp, sp, cp, ep, micro-batch, recomputation,
        kernels), one call per kernel set, as (N, BLOCK_ROWS) rows."""
        out = np.empty((shapes.shape[1], BLOCK_ROWS))
        for k in np.unique(shapes[6]).tolist():
            at = np.flatnonzero(shapes[6] == k)
            out[at] = block_table(m, setup, cluster, eff, kernel_names[k], etp, *shapes[:6, at]).T
        return out

    b_row, blocks_t = block_rows.columns_of(
        (tp[b_d], sp_p[b_first], cp[b_d], ep[b_d], mb_p[b_first], rc_p[b_first], kern_d[b_d]), many=new_rows)
    p2p_bytes = blocks_t[13][b_inv]
    p2p_positive = bool((blocks_t[13] > 0).all() and np.isfinite(blocks_t[13]).all())
    # ---- per Q: the P rows with the same block shape, pipeline depth and tp, cp and ep
    # links on every order (Degrees.q_d) have the same slowest stage, whatever their dp,
    # vp and accumulation: it is worked out once per Q, when first asked for, and kept
    # (SlowestMemo); each P reads its Q's
    memo = deg.slowest
    at_p = memo.places(block_rows, b_row[b_inv], deg.q_d[pd])     # each P's Q in the memo
    known = memo.known[at_p]
    if not known.all():
        miss = np.flatnonzero(~known)
        at_miss, first = np.unique(at_p[miss], return_index=True)      # the Q rows not worked out before
        p_of = miss[first]                                            # a P standing for each of them
        _fill_slowest(memo, at_miss, pd[p_of], np.take(blocks_t, b_inv[p_of], axis=1), deg, tp, cp, ep,
                      eff.bus_fraction, eff)
    # every placement order at once: (order, P) arrays, each order reading its set of tp,
    # cp, ep links' slowest stages
    sets = list(deg.inner_of)
    vals, slot_p = np.take(memo.vals, at_p, axis=2), np.take(memo.slot, at_p, axis=1)   # (set, N_VALS, P), (set, P)
    if sets != list(range(len(sets))):
        vals, slot_p = vals[sets], slot_p[sets]
    return SlowestStages(vals=vals, slot=slot_p, p2p_bytes=p2p_bytes, p2p_positive=p2p_positive)


class _Block(NamedTuple):
    """The block table's columns (layer.block_table) for some Q rows: one block's forward,
    backward and attention seconds, its tp all-reduce bytes and count, cp K/V bytes and passes,
    ep all-to-all bytes and count and hidden share, what the last stage adds to the forward and
    backward, the bytes of the tp all-reduce at each pipeline edge, and of a pipeline send,
    what a layer kept in BF16 adds to the forward and backward (TrainingSetup.bf16_layers), and
    the MTP modules' forward and backward, which the last stage adds."""

    fwd_s: np.ndarray
    bwd_s: np.ndarray
    attn_s: np.ndarray
    tp_bytes: np.ndarray
    tp_collectives: np.ndarray
    cp_bytes: np.ndarray
    cp_passes: np.ndarray
    ep_bytes: np.ndarray
    ep_all_to_alls: np.ndarray
    ep_hidden_share: np.ndarray
    head_fwd_s: np.ndarray
    head_bwd_s: np.ndarray
    edge_bytes: np.ndarray
    p2p_bytes: np.ndarray
    bf16_fwd_s: np.ndarray
    bf16_bwd_s: np.ndarray
    mtp_fwd_s: np.ndarray
    mtp_bwd_s: np.ndarray


class _Comm(NamedTuple):
    """Communication seconds of one block (or stage): exposed and hidden under compute."""

    exposed_s: np.ndarray
    hidden_s: np.ndarray


def _tp_comm(blk: _Block, ring_tp: Ring, eff: Efficiency) -> tuple[np.ndarray, _Comm]:
    """A block's tensor-parallel all-reduces (or their reduce-scatter and all-gather under sp),
    all of them, and split by Efficiency.tp_overlap (Megatron-Core's TP communication overlap)."""
    tp_all = blk.tp_collectives * ring_tp.time_s(blk.tp_bytes)
    return tp_all, _Comm(tp_all * (1 - eff.tp_overlap), tp_all * eff.tp_overlap)


def _cp_comm(blk: _Block, cp: np.ndarray, lk: np.ndarray, d: np.ndarray, bus: float, eff: Efficiency) -> _Comm:
    """A block's context-parallel ring: cp - 1 K/V sends per pass, hidden under the attention
    of that pass up to Efficiency.cp_overlap (Liu et al. 2023, Ring Attention)."""
    cp_all = blk.cp_passes * (cp - 1) * send_s(blk.cp_bytes, lk[2][d], lk[3][d], bus)
    return _Comm(*hide(cp_all, blk.attn_s * blk.cp_passes, eff.cp_overlap))


def _ep_comm(blk: _Block, ep: np.ndarray, lk: np.ndarray, d: np.ndarray, bus: float) -> _Comm:
    """A block's expert-parallel all-to-alls, hidden by the block's own share
    (Efficiency.ep_overlap where the block overlaps them)."""
    ep_all = blk.ep_all_to_alls * Ring.of(ep, lk[A2A_BW], lk[A2A_LAT], bus, 1).take(d).time_s(blk.ep_bytes)
    return _Comm(ep_all * (1 - blk.ep_hidden_share), ep_all * blk.ep_hidden_share)


def _pick_slowest(t: np.ndarray, fwd: np.ndarray, bwd: np.ndarray, comm: np.ndarray, hidden: np.ndarray | None,
                  n_slots: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The slot of the slowest stage per column, as max() over (time, fwd, bwd, comm, hidden,
    stage) picks it: the longest time, ties to the longer forward, backward, exposed and hidden
    communication, then the later stage; and ``hidden`` (zeros where it was None and a tie
    needed it)."""
    width = t.shape[1]
    slot = t.argmax(axis=0)
    t_max = np.take(t, slot * width + np.arange(width))
    if (t == t_max).sum(axis=0).max() <= 1:
        return slot, hidden
    if hidden is None:
        hidden = np.zeros_like(t)
    cols = np.arange(width)
    slot = np.zeros(width, dtype=np.int64)       # equal in all, the later stage wins
    for j in range(1, n_slots):
        b = slot, cols
        win = (t[j] > t[b]) | (t[j] == t[b]) & ((fwd[j] > fwd[b]) | (fwd[j] == fwd[b]) & (
            (bwd[j] > bwd[b]) | (bwd[j] == bwd[b]) & ((comm[j] > comm[b]) | (comm[j] == comm[b])
                                                      & (hidden[j] >= hidden[b]))))
        slot = np.where(win, j, slot)
    return slot, hidden


def _fill_slowest(memo: SlowestMemo, at_miss: np.ndarray, qd: np.ndarray, q_blocks: np.ndarray, deg: Degrees,
                  tp: np.ndarray, cp: np.ndarray, ep: np.ndarray, bus: float, eff: Efficiency) -> None:
    """Work out the slowest stage of the Q rows not worked out before (their places
    ``at_miss`` in ``memo``; ``qd``: a D standing for each, ``q_blocks``: its block's
    row of the block table) on each set of tp, cp and ep links, into ``memo``."""
    links, n_slots = deg.links, deg.n_slots
    blocks = _Block(*q_blocks)
    qcp = cp[qd]
    per_slot = np.take(deg.per_slot, qd, axis=1)
    layers_p, edges_p, last_p, absent_p, bwd_layers_p, bf16_p, comm_layers_p = (
        per_slot[i * n_slots:(i + 1) * n_slots] for i in range(PER_SLOT))
    use_cp, use_ep = bool((cp > 1).any()), bool((ep > 1).any())
    # the stages' compute does not depend on the links
    stage_fwd = layers_p * blocks.fwd_s + last_p * blocks.head_fwd_s    # + 0.0 where not the last stage: exact
    stage_bwd = bwd_layers_p * blocks.bwd_s + last_p * blocks.head_bwd_s
    if bf16_p.any():
        # the layers kept in BF16 (training.layer_precision: the first stage's and the last's; the
        # low-precision recipe refuses freezing, so each runs its backward)
        stage_fwd = stage_fwd + bf16_p * blocks.bf16_fwd_s
        stage_bwd = stage_bwd + bf16_p * blocks.bf16_bwd_s
    if blocks.mtp_fwd_s.any():
        # the MTP modules, on the last stage (layer.block_table)
        stage_fwd = stage_fwd + last_p * blocks.mtp_fwd_s
        stage_bwd = stage_bwd + last_p * blocks.mtp_bwd_s

    def slowest(lk: np.ndarray, sel: np.ndarray | slice) -> tuple[np.ndarray, ...]:
        """(t, fwd, bwd, hidden, comm, one block's exposed cp, and ep, slot) of the slowest
        stage of the Q rows ``sel`` (all of them first, then a subset), before the pipeline
        sends."""
        d = qd[sel]
        blk = _Block(*(x[sel] for x in blocks))
        ring_tp = Ring.of(tp, lk[0], lk[1], bus, 2).take(d)
        tp_all, block = _tp_comm(blk, ring_tp, eff)
        width = len(tp_all)
        cp_b = ep_b = np.zeros(width)
        if use_cp:
            cp_c = _cp_comm(blk, qcp[sel], lk, d, bus, eff)
            block = _Comm(block.exposed_s + cp_c.exposed_s, block.hidden_s + cp_c.hidden_s)
            cp_b = cp_c.exposed_s
        if use_ep:
            ep_c = _ep_comm(blk, ep, lk, d, bus)
            block = _Comm(block.exposed_s + ep_c.exposed_s, block.hidden_s + ep_c.hidden_s)
            ep_b = ep_c.exposed_s
        # the stage: its blocks' communication (the MTP modules' layers' too, each the mean
        # block's: degrees.build_degrees) and the tp all-reduces at its pipeline edges
        edge_all = ring_tp.time_s(blk.edge_bytes)
        layers, edges = comm_layers_p[:, sel], edges_p[:, sel]
        fwd, bwd = stage_fwd[:, sel], stage_bwd[:, sel]
        hidden: np.ndarray | None
        if eff.tp_overlap == 0.0:       # x * 1.0 is x; with finite times, x * 0.0 is 0.0 throughout
            comm = layers * block.exposed_s + edges * edge_all
            hidden = None if not (use_cp or use_ep) and np.isfinite(tp_all).all() and np.isfinite(edge_all).all() \
                else layers * block.hidden_s + edges * edge_all * eff.tp_overlap
        else:
            comm = layers * block.exposed_s + edges * (edge_all * (1 - eff.tp_overlap))
            hidden = layers * block.hidden_s + edges * edge_all * eff.tp_overlap
        t = fwd + bwd + comm + absent_p[:, sel]
        slot, hidden = _pick_slowest(t, fwd, bwd, comm, hidden, n_slots)
        at = slot * width + np.arange(width)                # (slot, column) in the flattened tables
        return (np.take(t, at), np.take(fwd, at), np.take(bwd, at),
                np.zeros(width) if hidden is None else np.take(hidden, at), np.take(comm, at), cp_b, ep_b, slot)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        first = slowest(links[0], slice(None))
        for j in sorted(set(deg.inner_of)):     # each set of tp, cp, ep links: redo the Q rows whose links change
            q_stage = tuple(x.copy() for x in first)
            if j:
                sel = np.flatnonzero((links[0][INNER_ROWS] != links[j][INNER_ROWS]).any(axis=0)[qd])
                for x, y in zip(q_stage, slowest(links[j], sel)):
                    x[sel] = y
            for k in range(N_VALS):
                memo.vals[j, k, at_miss] = q_stage[k]
            memo.slot[j, at_miss] = q_stage[N_VALS]
        memo.known[at_miss] = True
