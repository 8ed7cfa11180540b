"""Valid layouts and their peak memory, many at once, as numpy arrays.

planner.memory.model.per_rank_memory builds a breakdown object per layout (about 100 us) and
layouts.enumerate_layouts a Layout and a reject reason per candidate (about 20 us); a
search over thousands of GPU counts and layouts spends its time there. Here:

- valid_layouts() returns the layouts enumerate_layouts() accepts, in its order, as one
  int64 array per field: the parallel degrees are walked in Python, and each rule of
  layouts.reject_reason is an array operation on the axes it reads (degrees, sharding,
  virtual stages, micro-batch) broadcast over the grid;
- peak_bytes() returns per_rank_memory(...).total for each of them. What depends on a
  layout's shape (a block's activations, the loss, a stage's parameters) is computed once
  per distinct shape by planner.memory.model's own functions; model states, buffers and optimizer
  temporaries once per distinct (degrees, sharding), in tables kept across calls for the
  same model, set-up, GPUs per node and states (a least-recently-used cache of at most
  32 entries and 64 MiB, STATE_CACHE); the rest (in-flight micro-batches, the four peak moments,
  fragmentation) is array arithmetic that mirrors per_rank_memory line by line, with
  the same integer and float rounding.

Both are equal to planner.layouts.layout and planner.memory.model to the layout and the byte
(tests/test_properties.py checks random models, set-ups, counts and search spaces); the
search (planner.search.search.size_count) builds full breakdowns only for layouts that fit, and
re-checks each of those totals against per_rank_memory. Covered: full training (every
sharding, precision, optimizer, kernel and attention choice, ZeRO-Offload, ZeRO-Infinity
and FSDP CPU offload); LoRA, QLoRA, freeze, and numbers so large that int64 could
overflow raise Unsupported, and the caller falls back to the per-layout path. numpy is
imported only here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from planner.layouts.batch import RECOMPUTES, LayoutArrays, Unsupported, supports
from planner.layouts.groups import SAFE_BYTES, LayoutGroups, TableCache
from planner.layouts.groups import group as _group
from planner.layouts.groups import group_packed as _group_packed
from planner.layouts.groups import memo as _memo
from planner.layouts.groups import per_unique as _per_unique
from planner.layouts.groups import rows as _rows
from planner.layouts.layout import SHARDINGS, Layout
from planner.memory.model import (
    _activation_key,
    _block_activations,
    _optimizer_bytes_per_param,
    _stages_to_check,
    eager_score_gradient_bytes,
    logits_bytes,
    rank_params,
    stage_layers,
)
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.setup import TrainingSetup

KERNELS = ("fused", "eager", "amp")
EXACT_FLOAT_INT = 2**53     # integers below this are exact as float64
NO_SLOT = -(2**61)          # a stage slot the pipeline does not have: below any moment







def _hybrid(a: LayoutArrays, gpus_per_node: int) -> np.ndarray:
    """memory._hybrid_degree for every layout: the largest divisor of dp*cp*ep that fits in
    gpus_per_node // tp for FSDP hybrid sharding, 0 (None) otherwise."""
    hybrid = a.sharding == SHARDINGS.index("fsdp-hybrid")
    out = np.zeros(len(a), dtype=np.int64)
    if not hybrid.any():
        return out

    def degree(dense: int, tp: int) -> tuple[int]:
        inside = max(1, gpus_per_node // tp)
        d = dense
        while d > inside or dense % d:
            d -= 1
        return (max(d, 1),)

    idx = np.nonzero(hybrid)[0]
    (deg,) = _per_unique([(a.dp * a.cp * a.ep)[idx], a.tp[idx]], degree, 1, _memo("hybrid", gpus_per_node))
    out[idx] = deg
    return out


MAX_SLOTS = 4   # the first and last stage, and the earliest middle one of each of two layer counts


@lru_cache(maxsize=4096)
def _stage_slots(n_layers: int, pp: int) -> tuple[tuple[int, int], ...]:
    """(stage, layers on it) for the stages that can be the most loaded
    (memory._stages_to_check)."""
    counts = stage_layers(n_layers, pp)
    return tuple((s, counts[s]) for s in _stages_to_check(counts))


def _ceil_div(n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return -(-n // d)


def _trunc(x: np.ndarray) -> np.ndarray:
    """int() elementwise: floats toward zero, integers unchanged."""
    x = np.asarray(x)
    return x.astype(np.int64) if x.dtype.kind == "f" else x



class _States(NamedTuple):
    """What peak_bytes() reads per distinct degrees (D) and per state (a distinct degrees,
    sharding and ZeRO stage): (slot, D) and (slot, state) tables."""

    stage_d: np.ndarray        # (slot, D): the stage, -1 where the pipeline has fewer slots
    layers_d: np.ndarray       # (slot, D): its layers
    last_d: np.ndarray         # (slot, D): 1 where it is the last stage, else 0
    ahead_d: np.ndarray        # (slot, D): pp - stage, the most micro-batches the stage holds (pp where no slot)
    pipelined_d: np.ndarray    # per D: 1 where pp > 1, else 0
    kern: np.ndarray           # per state: KERNELS index (memory.resolve_kernels)
    persistent: np.ndarray     # per state: gradients held across micro-batches in any case
    fixed: np.ndarray          # per state: the fixed overhead
    tracked: np.ndarray        # per state: the optimizer-step moment, largest over the slots
    end_max: np.ndarray | None  # per state: its part of the backward-end moment, largest over the slots
    #                            (None where a slot may hold no layers)
    fsdp_any: bool             # some state has an FSDP moment (f_on)
    parts: tuple[np.ndarray, ...]   # (slot, state): base_start, base_end, end_state, base_fwd, held_grads,
    #                            buffer_parts, end_buffers, f_on, f_done, f_end_grads, f_head, fwd_buffers


# Degree and state tables kept across calls, per (model, set-up, GPUs per node, distinct
# states): a search scores the same GPU counts' states again for other micro-batches and
# recomputation modes, and these tables are most of a call's fixed cost. Least recently
# used first out.
STATE_CACHE = TableCache(max_entries=32, max_bytes=64 * 2**20)


def _state_tables(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, gpus_per_node: int, a: LayoutArrays,
                  g: LayoutGroups, state_rows: np.ndarray, state_key: np.ndarray) -> _States:
    """_build_states() for the states of ``a`` (one row of each, ``state_rows``; their
    degrees' index among g's, sharding and ZeRO stage packed in ``state_key``), or its
    answer for the same model, set-up, GPUs per node, degrees and states from an earlier
    call."""
    key = (m, pc, setup, gpus_per_node, g.degrees_key, state_key[state_rows].tobytes())
    hit = STATE_CACHE.get(key)
    if hit is not None:
        return hit
    st = LayoutArrays(*(getattr(a, f)[state_rows] for f in LayoutArrays.FIELDS))
    tp_d, _, ep_d, _, pp_d = g.degrees
    out = _build_states(m, pc, setup, gpus_per_node, st, g.d_inv[state_rows], (tp_d, ep_d, pp_d))
    STATE_CACHE.put(key, out)
    return out


def _build_states(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, gpus_per_node: int,
                  st: LayoutArrays, s_d: np.ndarray, d_deg: tuple[np.ndarray, ...]) -> _States:
    """Per distinct degrees (``d_deg``: tp, ep, pp) the stages that can be the most loaded;
    per state (``st``, one layout standing for each, and ``s_d`` its degrees' index) the
    rank's parameters, model states, buffers and optimizer temporaries, and the parts of
    the moments per_rank_memory compares that belong to the state. Raises Unsupported for
    numbers too large for exact int64 arithmetic."""
    prec = setup.precision_spec
    h = m.d_model

    # memory.resolve_kernels: fused / eager / amp (autocast for replicated mixed precision)
    def kernels_of(x: LayoutArrays) -> np.ndarray:
        if setup.kernels == "auto":
            kern = np.where((x.tp > 1) | (x.pp > 1) | (x.cp > 1), 0, 1)
        else:
            kern = np.full(len(x), KERNELS.index(setup.kernels))
        if prec.is_mixed:
            kern = np.where((kern == 1) & (x.sharding == 0) & (x.zero_stage == 0), 2, kern)
        return kern

    opt_pp = _optimizer_bytes_per_param(m, setup.optimizer)
    if setup.optimizer_state_bytes is not None:
        opt_pp = setup.optimizer_state_bytes
    foreach = setup.optimizer_foreach and setup.optimizer in ("adamw", "adam8bit")
    bucket = setup.buffers.zero_bucket_numel
    wb, gb = prec.weight_bytes, prec.grad_bytes
    moe = m.is_moe

    # ---- per pipeline depth: the stages that can be the most loaded (memory._stages_to_check),
    # as (slot, D) tables; stage -1 where the pipeline has fewer slots
    tp_d, ep_d, pp_d = d_deg
    pp_inv, pp_rep = _group([pp_d])
    slots = [_stage_slots(m.n_layers, p) for p in pp_d[pp_rep].tolist()]
    n_slots = max(len(row) for row in slots)
    stage_d = np.full((n_slots, len(pp_rep)), -1, dtype=np.int64)
    layers_d = np.zeros((n_slots, len(pp_rep)), dtype=np.int64)
    for i, row in enumerate(slots):
        for j, (s, c) in enumerate(row):
            stage_d[j, i], layers_d[j, i] = s, c
    stage_d, layers_d = stage_d[:, pp_inv], layers_d[:, pp_inv]
    s_stage_of, s_layers_of = stage_d[:, s_d], layers_d[:, s_d]             # (slots, states)

    # ---- per (tp, ep, pp) and stage slot: the rank's parameters (memory.rank_params)
    combo_inv, combo_rep = _group([tp_d, ep_d, pp_d])
    memo = _memo("stage", m, pc)
    rows = []
    for key in zip(tp_d[combo_rep].tolist(), ep_d[combo_rep].tolist(), pp_d[combo_rep].tolist()):
        figures = memo.get(key)
        if figures is None:
            tp_c, ep_c, pp_c = key
            figures = ()
            for stage_j, layers_j in _stage_slots(m.n_layers, pp_c):
                rp = rank_params(m, pc, Layout(tp=tp_c, ep=ep_c, pp=pp_c), stage_j, layers_j)
                figures += (rp.dense, rp.expert, rp.block_unit, rp.root_unit, rp.largest_module)
            figures = memo[key] = figures + (0,) * (5 * MAX_SLOTS - len(figures))
        rows.append(figures)
    params = np.array(rows, dtype=np.int64).reshape(len(rows), MAX_SLOTS, 5)[:, :n_slots]
    if int(params.max()) * 64 >= SAFE_BYTES:
        raise Unsupported("a stage's parameters are too many for exact int64 arithmetic")
    s_params = np.ascontiguousarray(params[combo_inv[s_d]].transpose(2, 1, 0))   # (5, slots, states)

    s_kern = kernels_of(st)
    fsdp_any = bool((st.sharding > 0).any())
    # ---- per state (memory.per_rank_memory's fixed overhead, memory.model_state_bytes ...)
    s_dense_deg = st.dp * st.cp * st.ep                 # Layout.dense_shard_degree
    s_n_gpus = s_dense_deg * st.tp * st.pp
    fixed = (setup.overheads.fixed_bytes(True) * (s_n_gpus > 1)
             + setup.overheads.fixed_bytes(False) * (s_n_gpus <= 1))
    s_fsdp = st.sharding > 0
    s_amp = s_kern == 2
    s_grad_op = st.sharding == SHARDINGS.index("fsdp-grad-op")
    s_full_shard = s_fsdp & (st.zero_stage == 3)
    s_expert_deg = st.dp * st.cp
    hybrid = _hybrid(st, gpus_per_node)                 # memory._hybrid_degree, 0 for None
    s_dd = np.where(hybrid > 0, hybrid, s_dense_deg)
    s_de = np.maximum(1, np.where(hybrid > 0, np.minimum(s_expert_deg, hybrid), s_expert_deg))
    if moe:                                             # memory.fsdp_expert_padding
        d_pad = np.where(hybrid > 0, hybrid, s_expert_deg)
        s_pad = np.where(s_fsdp & (st.ep == 1), d_pad * _ceil_div(np.int64(m.n_experts), d_pad) / m.n_experts, 1.0)
    else:
        s_pad = np.ones(len(st))
    s_d_step = np.where(st.zero_stage >= 1, s_dd, 1)
    s_step_applies = s_fsdp | s_amp
    s_vocab_shard = _ceil_div(np.int64(m.vocab_size * h), st.tp)
    largest_tensor = np.maximum(s_vocab_shard, _ceil_div(np.int64(m.d_ff * h), st.tp))
    s_largest_step = 2 * 4 * _ceil_div(largest_tensor, s_d_step)
    stored = 4 if prec.is_mixed else wb
    fgrad = 4 if prec.is_mixed else gb
    reduce_bytes = 4 if prec.is_mixed else gb
    z_opt_pp = prec.master_bytes + opt_pp

    def shard(nd_bytes: np.ndarray, ne_bytes: np.ndarray, sharded: np.ndarray | bool) -> np.ndarray:
        # dense models hold no expert bytes: int(nd + 0) = int(nd), and 0 shards to 0
        split = whole = None
        if sharded is not False:
            split = _ceil_div(_trunc(nd_bytes), s_dd)
            if moe:
                split = split + _ceil_div(_trunc(ne_bytes), s_de)
        if sharded is not True:
            whole = _trunc(nd_bytes + ne_bytes) if moe else _trunc(nd_bytes)
        return split if whole is None else whole if split is None else np.where(sharded, split, whole)

    # ---- per state (memory.model_state_bytes, buffer_bytes, optimizer_step_transient_bytes,
    # fsdp_backward_end_bytes), every stage slot at once: (slot, state) arrays. Out come
    # the parts of the moments per_rank_memory compares that belong to the state (a slot
    # the pipeline does not have gets NO_SLOT, below any other moment) and, for FSDP
    # (memory.fsdp_blocks_done, fsdp_forward_bytes), the backward moment's gradients of the
    # blocks done and their count, the LM head's gradient and the forward moment
    s_stage = np.maximum(s_stage_of, 0)
    s_layers = s_layers_of
    dense, expert, block_unit, root_unit, largest_module = s_params
    total_params = dense + expert
    grad_unit = block_unit                          # gradients are never padded
    amp_any = bool(s_amp.any())
    # (without an FSDP or autocast state, the np.where(s_fsdp, ...) and np.where(s_amp,
    # ...) below pick neither, and their operands are left out)
    f_weights = f_grads = f_opt = f_unsharded = a_opt = 0
    if fsdp_any:
        # FSDP's expert padding
        expert_padded = np.where(s_fsdp, _trunc(expert * s_pad), expert)
        block_unit = np.where((s_pad > 1) & (s_layers > 0),
                              block_unit + _trunc(expert / np.maximum(s_layers, 1) * (s_pad - 1)), block_unit)
        f_weights = shard(dense * stored, expert_padded * stored, True)
        f_grads = shard(dense * fgrad, expert_padded * fgrad, True)
        f_opt = shard(dense * opt_pp, expert_padded * opt_pp, True)
        f_unsharded = np.where(s_grad_op, _trunc((dense + expert * s_pad) * wb), 0)
    a_weights = total_params * 4
    if amp_any:
        a_opt = _trunc(total_params * opt_pp)
    z_weights = shard(dense * wb, expert * wb, st.zero_stage >= 3)
    z_grads = shard(dense * gb, expert * gb, st.zero_stage >= 2)
    z_opt = shard(dense * z_opt_pp, expert * z_opt_pp, st.zero_stage >= 1)
    # offload (memory.offload_bytes): what moves to CPU memory or NVMe leaves the GPU
    zeros = np.zeros(len(st), dtype=np.int64)
    if setup.offload_params == "cpu":     # FSDP: parameters, gradients, optimizer states
        f_weights = f_grads = f_opt = zeros
    if setup.offload_optimizer != "none":  # ZeRO-Offload: the optimizer partition (and grads)
        z_grads = np.where(st.zero_stage >= 2, 0, z_grads)
        z_opt = zeros
    if setup.offload_params != "none":     # ZeRO-Infinity: the parameter shards
        z_weights = zeros
    ms_grads, ms_opt, weights = z_grads, z_opt, z_weights
    if amp_any:
        ms_grads = np.where(s_amp, a_weights, ms_grads)
        ms_opt = np.where(s_amp, a_opt, ms_opt)
        weights = np.where(s_amp, a_weights, weights)
    if fsdp_any:
        ms_grads = np.where(s_fsdp, f_grads, ms_grads)
        ms_opt = np.where(s_fsdp, f_opt, ms_opt)
        weights = np.where(s_fsdp, f_weights + f_unsharded, weights) + np.where(s_full_shard, root_unit * wb, 0)
    buffers = np.where((st.sharding == 0) & ((st.zero_stage == 1) | (st.zero_stage == 2)),
                       np.minimum(bucket, total_params) * gb, 0)
    buffers = buffers + np.where(st.zero_stage == 3,
                                 np.where(s_fsdp, block_unit * wb,
                                          2 * (largest_module * wb) + np.minimum(bucket, total_params) * gb), 0)
    transient = 4 * _ceil_div(total_params, s_d_step) if foreach else s_largest_step
    transient = np.where(s_step_applies, transient, 0)
    if setup.offload_params == "cpu":     # FSDP's CPU offload: its optimizer steps on the CPU
        transient = np.where(s_fsdp, 0, transient)
    s_z3 = st.zero_stage == 3
    if fsdp_any:
        end_on = s_fsdp & (s_layers > 0)
        end_w = np.where(end_on, np.where(s_z3, block_unit * wb, -(block_unit * wb)), 0)
        end_a = np.where(end_on, grad_unit * wb, 0)
        end_b = np.where(end_on, np.where(s_z3, block_unit * wb, 0) + block_unit * reduce_bytes, 0)
        done = np.where(end_on, np.where(s_z3, np.maximum(0, s_layers - 2), np.where(s_layers >= 2, 1, 0)), 0)
        n_l = np.maximum(s_layers, 1)
        done_grads = shard(done * ((dense - root_unit) // n_l) * fgrad,
                           _trunc(done * (expert // n_l) * s_pad) * fgrad, True)
        if setup.offload_params == "cpu":
            done_grads = zeros
        f_end_grads = np.where(end_on, done_grads, ms_grads)
        f_head = np.where(end_on & (s_stage == st.pp - 1), s_vocab_shard * wb, 0)
        fwd_buffers = np.where(end_on, 2 * (block_unit * wb), 0)
        step_freed = np.where(s_fsdp, f_unsharded + np.where(s_full_shard, root_unit * wb, 0), 0)
    else:       # no FSDP state: no backward-end or forward moment of its own
        end_on = np.zeros(s_stage_of.shape, dtype=bool)
        end_w = end_a = end_b = done = f_head = fwd_buffers = step_freed = 0
        f_end_grads = ms_grads
    f_on, f_done = end_on, done
    # autocast's 16-bit copies of the weights, kept for backward (an activation)
    amp_copies = 0
    if amp_any:
        amp_copies = np.where(s_amp, 2 * (total_params - np.where(s_stage == 0, s_vocab_shard, 0)
                                          - s_layers * pc.norms_per_layer), 0)
    # the parts of the moments that hold no activations: the weights and optimizer
    # states always; at the start of backward autocast's copies and the buffers; at
    # the end of backward FSDP's gathered block and gradients; at the optimizer step
    # the gradients and the step's temporaries
    base = weights + ms_opt + np.where(s_stage_of >= 0, 0, NO_SLOT)
    base_start = base + amp_copies + buffers
    base_end = base + end_w + ms_grads + end_a
    base_step = base + ms_grads + transient - step_freed
    base_fwd = np.where(end_on, base + np.where(s_z3, block_unit * wb, 0), NO_SLOT) if fsdp_any else NO_SLOT
    held_grads, buffer_parts, end_buffers = ms_grads, buffers, end_b
    every_slot_has_layers = bool((s_layers_of[s_stage_of >= 0] > 0).all())
    (base_start, base_end, base_step, base_fwd, held_grads, buffer_parts, end_buffers, f_on, f_done, f_end_grads,
     f_head, fwd_buffers) = (np.broadcast_to(x, s_stage_of.shape) for x in (
        base_start, base_end, base_step, base_fwd, held_grads, buffer_parts, end_buffers, f_on, f_done,
        f_end_grads, f_head, fwd_buffers))
    return _States(stage_d, layers_d, (stage_d == (pp_d - 1)).astype(np.int64), pp_d - np.maximum(stage_d, 0),
                   (pp_d > 1).astype(np.int64), s_kern, (st.sharding == 0) & (s_dense_deg > 1), fixed,
                   base_step.max(axis=0), (base_end + buffer_parts).max(axis=0) if every_slot_has_layers else None,
                   bool(f_on.any()),
                   (base_start, base_end, base_end + buffer_parts, base_fwd, held_grads, buffer_parts, end_buffers,
                    f_on, f_done, f_end_grads, f_head, fwd_buffers))



def peak_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
               gpus_per_node: int = 8, groups: LayoutGroups | None = None) -> np.ndarray:
    """per_rank_memory(m, setup, layout, pc, gpus_per_node).total for every layout of
    ``a`` (all valid: layouts.reject_reason gives None, and seq_len = setup.seq_len), in
    bytes, as int64. ``groups``: LayoutGroups.of(a), when the caller has it. Raises
    Unsupported where per_rank_memory must answer instead."""
    if not supports(setup):
        raise Unsupported("only full training is vectorised")
    n = len(a)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    pc = pc or count_params(m)
    prec = setup.precision_spec
    seq = setup.seq_len
    h = m.d_model
    if pc.total * 64 >= SAFE_BYTES:
        raise Unsupported("model states too large for exact int64 arithmetic")
    if setup.overheads.fragmentation < 0:
        raise Unsupported("the total is taken on the largest tracked bytes, which needs fragmentation >= 0")

    # ---- per layout shape: a block's activations, the eager score gradients, the loss
    def shape_figures(tp: int, sp: int, cp: int, mb: int, rc: int, k: int) -> tuple[int, ...]:
        lay = Layout(tp=tp, sp=bool(sp), cp=cp, micro_batch=mb, seq_len=seq, recompute=RECOMPUTES[rc])
        kernels = KERNELS[k]
        kept, full = _block_activations(m, setup, _activation_key(lay), kernels)
        # and a pipeline's buffers (memory.per_rank_memory): two micro-batches' activations
        # at a stage boundary, split by tp under sequence parallelism
        tokens_local = mb * (seq // cp)
        return (kept, full, eager_score_gradient_bytes(m, setup, lay, kernels),
                logits_bytes(m, setup, lay, kernels),
                2 * -(-(tokens_local * h * prec.activation_bytes) // (tp if sp == 1 else 1)))

    # ---- groups. Model states, buffers and the optimizer's temporaries do not depend on
    # the micro-batch, accumulation, virtual stages or recomputation: they are sized once per
    # state, a distinct (tp, cp, ep, dp, pp, sharding, ZeRO stage). Activations, the loss and
    # the pipeline's buffers are sized once per activation shape, a distinct (tp, cp, ep, dp,
    # pp, sp, vp, micro-batch, accumulation, recomputation, kernels). Both build on
    # LayoutGroups' degrees and pipeline shapes.
    g = groups or LayoutGroups.of(a)
    d_inv, d_rep = g.d_inv, g.d_rep
    n_k = 4 * len(SHARDINGS)                            # (sharding, ZeRO stage) pairs
    state_key = d_inv * n_k + g.pair
    if len(d_rep) * n_k <= max(1 << 16, 4 * n):
        state_inv, state_rows = _group_packed(state_key, len(d_rep) * n_k)
    else:
        state_inv, state_rows = _group([d_inv, g.pair])
    sts = _state_tables(m, pc, setup, gpus_per_node, a, g, state_rows, state_key)
    stage_d, layers_d, s_kern, n_slots = sts.stage_d, sts.layers_d, sts.kern, len(sts.stage_d)
    # ---- per activation shape: a pipeline shape P, and for the layouts that run under
    # autocast (memory.resolve_kernels: replicated mixed precision with eager kernels) the
    # same P again with kernels "amp". A block's activations, the eager score gradients and
    # the loss are looked up once per block shape (LayoutGroups' B) and kernels.
    tp_d, cp_d, _, _, pp_d = g.degrees
    p_d, (p_sp, p_vp, p_mb, p_rc, p_ga) = g.p_d, g.p_cols
    n_p = len(p_d)
    if setup.kernels == "auto":                         # KERNELS: fused 0, eager 1
        k_d = 1 - g.fused_d
    else:
        k_d = np.full(len(d_rep), KERNELS.index(setup.kernels), dtype=np.int64)
    shapes = _rows(5, np.int64, "shape", m, setup)

    def figures(b: np.ndarray, k: np.ndarray) -> np.ndarray:
        """(5, len(b)): shape_figures of the block shapes ``b`` under kernels ``k``."""
        p, d = g.b_rep[b], p_d[g.b_rep[b]]
        _, table = shapes.columns_of((tp_d[d], p_sp[p], cp_d[d], p_mb[p], p_rc[p], k), shape_figures)
        if table.size and int(table.max()) >= SAFE_BYTES:
            raise Unsupported("a per-shape figure is too large for exact int64 arithmetic")
        return table

    n_b = len(g.b_rep)
    table = figures(np.arange(n_b), k_d[p_d[g.b_rep]])        # (5, B)
    amp_l = (s_kern == 2)[state_inv] if (s_kern == 2).any() else None
    if amp_l is None:
        act_inv, act_p = g.p_inv, None
        shape_p = np.take(table, g.b_inv, axis=1)              # (5, P)
    else:
        mark = np.zeros(n_p, dtype=bool)
        mark[g.p_inv[amp_l]] = True
        amp_p = np.flatnonzero(mark)
        pos = np.zeros(n_p, dtype=np.int64)
        pos[amp_p] = np.arange(n_p, n_p + len(amp_p))
        act_inv = np.where(amp_l, pos[g.p_inv], g.p_inv)
        act_p = amp_p                   # the P rows the activation shapes after the first n_p repeat
        b_of_amp = g.b_inv[amp_p]
        b_amp_inv, b_amp_rep = _group_packed(b_of_amp, n_b)
        b_amp = b_of_amp[b_amp_rep]
        table = np.concatenate([table, figures(b_amp, np.full(len(b_amp), KERNELS.index("amp"), dtype=np.int64))],
                               axis=1)
        shape_p = np.take(table, np.concatenate([g.b_inv, n_b + b_amp_inv]), axis=1)   # (5, P + amp)
    layer_act, full_layer, score_grad, logits_all, pp_buffer = shape_p

    def per_act(x: np.ndarray) -> np.ndarray:
        """A per-P column, per activation shape."""
        return x if act_p is None else np.concatenate([x, x[act_p]])

    a_d, ga_a = per_act(p_d), per_act(p_ga)

    # ---- per activation shape: the pipeline's buffers; per stage slot, the activations
    # held at the start of backward with the larger of the logits and the last block's
    # working set, and the last block
    pp_buffer = pp_buffer * sts.pipelined_d[a_d]      # no buffers without a pipeline
    layers_a = np.take(layers_d, a_d, axis=1)
    working_all = (full_layer - layer_act) + score_grad
    # the micro-batches each slot holds (memory.in_flight_microbatches) follow from the
    # depth, the stage, the virtual stages and the accumulation: min(pp - stage, ga), which
    # is 1 without a pipeline (stage 0, ga >= 1); integers while the product stays exact
    # as a float (as memory multiplies them), floats with interleaving
    ahead = np.minimum(np.take(sts.ahead_d, a_d, axis=1), ga_a)
    if int(p_vp.max()) > 1:
        vp_a, pp_a = per_act(p_vp), pp_d[a_d]
        held = np.where((pp_a > 1) & (vp_a > 1), ahead * (1 + (pp_a - 1) / (pp_a * vp_a)), ahead.astype(np.float64))
        acts = _trunc((layers_a * layer_act) * held)
    else:
        held = ahead
        if int(layers_d.max()) * int(layer_act.max(initial=0)) * int(ahead.max(initial=0)) < EXACT_FLOAT_INT:
            acts = (layers_a * layer_act) * ahead
        else:
            acts = _trunc((layers_a * layer_act) * ahead.astype(np.float64))
    if m.hidden_dropout > 0:
        tokens_local = per_act(p_mb) * (seq // cp_d[a_d])
        acts = acts + np.where((stage_d <= 0)[:, a_d], _trunc(tokens_local * h * held.astype(np.float64)), 0)
    x_logits = np.take(sts.last_d, a_d, axis=1) * logits_all      # last_d is 0 or 1: exact
    # FSDP's moments (memory.per_rank_memory): the held activations, the loss and the
    # working set apart, since FSDP adds the LM head's gradient to the working set.
    # Every stage slot at once: (slot, activation shape) arrays. A slot the pipeline does
    # not have holds no layers; its moments are below any other (NO_SLOT), so where every
    # stage holds layers its working set need not be zeroed.
    fast = not sts.fsdp_any and sts.end_max is not None
    has_layers = None if fast else layers_a > 0
    x_working = working_all if fast else np.where(has_layers, working_all, 0)
    x_acts = acts + np.maximum(x_logits, x_working) + pp_buffer
    x_held, x_block = acts, np.where(has_layers, layer_act, 0) if sts.fsdp_any else None
    # (an autocast activation shape has its P's accumulation and depth)
    persistent = ((p_ga > 1) | (pp_d[p_d] > 1))[g.p_inv] | sts.persistent[state_inv]
    fixed = sts.fixed[state_inv]
    (base_start, base_end, end_state, base_fwd, held_grads, buffer_parts, end_buffers, f_on, f_done, f_end_grads,
     f_head, fwd_buffers) = sts.parts

    # ---- per layout: the four moments per_rank_memory compares (backward-start and
    # block-backward, backward-end, optimizer-step), in integers, so the parts add in any
    # order; the tracked bytes are the largest, over the stage slots. Which moment or slot
    # wins a tie changes the breakdown, not the total, and the total grows with the
    # tracked bytes (fragmentation >= 0), so it is taken once, on the largest. The
    # optimizer-step moment is the state's alone, its largest over the slots taken per
    # state; without FSDP the backward-end moment holds no buffers of its own (end_b = 0),
    # so the larger of them and the other buffers is the latter, and its parts add up per
    # state and per activation shape ahead of the pass (FSDP's moments replace it).
    tracked = sts.tracked[state_inv]
    if fast:
        # the state's parts of the backward-start moment with and without the gradients
        # held across micro-batches, one table, read at state + states x persistent. At the
        # end of backward every stage holds its last block and the pipeline's buffer, the
        # same bytes on each (every stage holds a block), so the state's part is taken at
        # its largest over the slots
        n_st = len(sts.tracked)
        start = np.concatenate([base_start, base_start + held_grads], axis=1)
        at_start = (np.take(start, state_inv + n_st * persistent, axis=1)
                    + np.take(x_acts, act_inv, axis=1)).max(axis=0)
        at_end = sts.end_max[state_inv] + (full_layer + pp_buffer)[act_inv]
        tracked = np.maximum(tracked, np.maximum(at_start, at_end))
        return tracked + (fixed + _trunc(tracked * setup.overheads.fragmentation))
    end_act = np.where(has_layers, full_layer, 0) + pp_buffer    # the last block
    pp_buffer = pp_buffer[act_inv]
    if not sts.fsdp_any:
        n_st = len(sts.tracked)
        start = np.concatenate([base_start, base_start + held_grads], axis=1)
        at_start = np.take(start, state_inv + n_st * persistent, axis=1) + np.take(x_acts, act_inv, axis=1)
        at_end = np.take(end_state, state_inv, axis=1) + np.take(end_act, act_inv, axis=1)
        tracked = np.maximum(tracked, np.maximum(at_start, at_end).max(axis=0))
        return tracked + (fixed + _trunc(tracked * setup.overheads.fragmentation))
    for j in range(n_slots):
        at_start = base_start[j][state_inv] + persistent * held_grads[j][state_inv] + x_acts[j][act_inv]
        at_end = end_state[j][state_inv] + end_act[j][act_inv]
        on = f_on[j][state_inv] > 0
        if on.any():                       # FSDP: the LM head's gradient in the working set, the blocks done, forward
            head, held = f_head[j][state_inv], x_held[j][act_inv]
            g_held = persistent * held_grads[j][state_inv]
            at_start = np.where(on, base_start[j][state_inv] + g_held + held + pp_buffer
                                + np.maximum(x_logits[j][act_inv], x_working[j][act_inv] + head), at_start)
            grads_end = np.where(persistent, held_grads[j][state_inv], f_end_grads[j][state_inv])
            at_fsdp_end = (base_end[j][state_inv] - held_grads[j][state_inv] + grads_end + held
                           - f_done[j][state_inv] * x_block[j][act_inv] + x_working[j][act_inv] + head
                           + np.maximum(buffer_parts[j][state_inv] + pp_buffer, end_buffers[j][state_inv]))
            at_fwd = (base_fwd[j][state_inv] + g_held + held - x_block[j][act_inv]
                      + np.maximum(buffer_parts[j][state_inv] + pp_buffer, fwd_buffers[j][state_inv]))
            at_end = np.where(on, np.maximum(at_fsdp_end, at_fwd), at_end)
        tracked = np.maximum(tracked, np.maximum(at_start, at_end))
    return tracked + (fixed + _trunc(tracked * setup.overheads.fragmentation))
