"""The data-parallel collectives of a step and what of them the compute hides (timing.fast).

Each layout's ZeRO stage and sharding select a branch of parts.DP_TERMS (ZeRO, Rajbhandari et
al. 2020, arXiv:1910.02054, Sec. 5; FSDP, Zhao et al. 2023, arXiv:2304.11277, Sec. 3); within a
pipeline shape (LayoutGroups' P) layouts differ only in that branch and in whether the optimizer
states are sharded: their kind (DpKinds). dp_times() and steady_reduce() say how often each
collective runs and under which compute window; dp_exposure() splits the collectives of one
kind into the seconds exposed and those hidden (x Efficiency.overlap_slowdown), in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.layouts.layout import SHARDINGS
from planner.timing.collectives import hide
from planner.timing.degrees import BRANCH
from planner.timing.efficiency import Efficiency
from planner.timing.parts import DP_TERMS, FSDP_GRAD_OP


def dp_times(branch: np.ndarray | int, pp: np.ndarray, grad_accum: np.ndarray,
             grad_sync: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """How often the per-micro-batch data-parallel collectives run in a step: (the parameter
    all-gather under the forward, parts.DP_TERMS' term 1; the term under the backward, term 2).

    Once per micro-batch, except FSDP under a pipeline (the rules refuse ZeRO-2/3 with one, so
    these branches are FSDP's there). PyTorch's pipeline schedules (``grad_sync`` "step") run
    every backward but the last with set_requires_gradient_sync(False) and
    set_reshard_after_backward(False) on an FSDP2 module and reduce-scatter once, after the
    last micro-batch (torch 2.13 torch/distributed/pipelining/stage.py lines 844-847,
    backward_maybe_with_nosync; perform_reduce_grad). Shard-grad-op then gathers once and
    reduces once (it does not reshard after forward: the Llama 3 paper, arXiv:2407.21783,
    Sec. 3.3.2, to avoid the backward's all-gather). Full shard and hybrid still reshard after
    each forward, so each micro-batch's backward gathers again while the forward after a
    backward finds the parameters gathered: the first forward's gather and one per backward,
    with one reduce-scatter: term 1 (the gather) x micro-batches plus term 2 (gather and
    reduce) once. Under "micro-batch" (Llama 3's sharded gradients;
    training.setup.FSDP_PIPELINE_GRAD_SYNCS) term 2 runs every micro-batch."""
    b = np.asarray(branch)
    piped = (b >= FSDP_GRAD_OP) & (pp > 1)
    gather = np.where((b == FSDP_GRAD_OP) & piped, 1.0, grad_accum)
    if grad_sync == "micro-batch":
        return gather, np.asarray(grad_accum, dtype=np.float64)
    return gather, np.where(piped, 1.0, grad_accum)


def steady_reduce(branch: np.ndarray | int, pp: np.ndarray, grad_sync: str) -> np.ndarray:
    """Where a micro-batch's reduce-scatter may hide under the next micro-batch's forward and
    backward as well as its own backward: FSDP shard-grad-op under a pipeline reduce-scattering
    every micro-batch (grad_sync "micro-batch"; term 2 of parts.DP_TERMS is then its
    reduce-scatter alone). In 1F1B's steady state each stage alternates one forward and one
    backward (Narayanan et al. 2021, SC21, Sec. 2.2.1, Fig. 4; torch 2.13
    torch/distributed/pipelining/schedules.py Schedule1F1B, its steady phase of one forward
    and one backward per micro-batch), so between two backward passes of a stage lies one
    forward and one backward. FSDP2 runs each group's reduce-scatter on its own stream as that
    group's backward ends, and the compute stream waits for the ones in flight only at the
    first group's post-backward of the next backward pass (torch 2.13
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py: reduce_scatter_stream;
    post_backward waits on reduce_scatter_states beyond reduce_scatter_max_input_buffers,
    default 1, when _param_group_index is the last group's): a micro-batch's reduce-scatters
    run from early in its backward to early in the next one, a backward and a forward of
    compute. Full shard and hybrid keep their backward window: their term 2 holds the
    backward's all-gather, which that backward needs. Warm-up and cool-down are not credited
    (their idle time stays in the bubble)."""
    b = np.asarray(branch)
    if grad_sync != "micro-batch":
        return np.zeros(np.broadcast(b, pp).shape, dtype=bool)
    return (b == FSDP_GRAD_OP) & (pp > 1)


@dataclass(frozen=True, slots=True)
class DpKinds:
    """The kinds of data-parallel step in a batch: (branch of parts.DP_TERMS, optimizer states
    sharded) pairs, sorted (``kinds``); each layout's place in the (kind, P) table (``at_kind``);
    and per kind the P rows that have layouts of it, or None where more than half of them do (a
    kind in few of them, ZeRO-3 without a pipeline for one, is worked out on those alone)."""

    kinds: list[tuple[int, int]]
    at_kind: np.ndarray               # int64, per layout: kind x n_p + P
    rows_of: list[np.ndarray | None]
    any_hybrid: bool                  # an FSDP hybrid-sharded layout is in the batch

    @staticmethod
    def of(pair: np.ndarray, p_inv: np.ndarray, n_p: int) -> DpKinds:
        """The kinds of the layouts whose (ZeRO stage, sharding) is ``pair`` (LayoutGroups.pair)
        and pipeline shape ``p_inv``, among ``n_p`` pipeline shapes."""
        pairs = np.flatnonzero(np.bincount(pair, minlength=4 * len(SHARDINGS)))   # the (ZeRO stage, sharding)s present
        any_hybrid = any(k % len(SHARDINGS) == SHARDINGS.index("fsdp-hybrid") for k in pairs.tolist())
        kinds = [(int(BRANCH[k]), int(k >= len(SHARDINGS))) for k in pairs]
        kind_list = sorted(set(kinds))
        kind_of = np.zeros(4 * len(SHARDINGS), dtype=np.int64)
        for k, kind in zip(pairs, kinds):
            kind_of[k] = kind_list.index(kind)
        at_kind = kind_of[pair] * n_p + p_inv              # each layout's place in the (kind, P) table
        has = np.zeros(len(kind_list) * n_p, dtype=bool)
        has[at_kind] = True
        rows_of = [None if 2 * int(np.count_nonzero(h)) > n_p else np.flatnonzero(h) for h in has.reshape(-1, n_p)]
        return DpKinds(kinds=kind_list, at_kind=at_kind, rows_of=rows_of, any_hybrid=any_hybrid)


def dp_exposure(branch: int, at: np.ndarray, c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, fwd: np.ndarray,
                bwd: np.ndarray, ga: tuple[np.ndarray, np.ndarray], eff: Efficiency,
                terms: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = None,
                steady: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """The data-parallel seconds one branch of parts.DP_TERMS leaves exposed over a step, and
    overlap_slowdown x those it hides (None where it hides none), with the collectives' rows
    ``at`` of c0, c1, c2 (seconds per occurrence, degrees.Degrees) under the forward ``fwd`` and
    backward ``bwd`` of a micro-batch, ``ga`` times (dp_times). The terms the branch lacks are
    0.0 and add nothing: e + 0.0 is e and 0.0 + e is e for the non-negative times here, so only
    the branch's own are summed, in timing's order (c0, c1 x per micro-batch, c2 x
    accumulation). ``terms``, where given, gets each collective's (term, seconds, exposed,
    hidden) once per occurrence. ``steady``: where term 2 hides under a forward and a backward
    (steady_reduce)."""
    per_mb = branch >= FSDP_GRAD_OP
    reduce_window = bwd if steady is None or not steady.any() else np.where(steady, fwd + bwd, bwd)
    exposed = hidden = None
    for term in DP_TERMS[branch]:
        c, window, overlap = ((c0, bwd, eff.dp_overlap), (c1, fwd, eff.zero3_overlap if per_mb else
                                                          eff.param_gather_overlap),
                              (c2, reduce_window, eff.zero3_overlap))[term]
        if overlap == 0.0:             # nothing hidden: min(c, 0.0 x window) is 0.0
            e, h = c[at], None
        else:
            e, h = hide(c[at], window, overlap)
        if terms is not None:
            terms.append((term, c[at], e, np.zeros_like(e) if h is None else h))
        if term == 2 or term == 1 and per_mb:      # (x 1.0 otherwise: x itself)
            times = ga[term - 1]
            e, h = e * times, None if h is None else h * times
        exposed = e if exposed is None else exposed + e
        hidden = h if hidden is None else hidden if h is None else hidden + h
    assert exposed is not None
    return exposed, None if hidden is None else eff.overlap_slowdown * hidden
