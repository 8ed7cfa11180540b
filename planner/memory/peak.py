"""The memory model over a batch of layouts: the moments of a step, on every stage that can be
the most loaded, and the largest of them.

One code path: planner.memory.model.per_rank_memory is this on a batch of one. Branches on
the layout are numpy masks; branches on the model and the set-up are plain ``if``s; what
depends on a shape (a block's saved tensors, the loss, a stage's parameters and their
fine-tuning split) is computed once per distinct shape (planner.memory.shapes) and gathered.

How memory_batch reads: the terms that depend on a layout's degrees and sharding only, once
per distinct state (state_terms.StateTerms: weights, model states and offload, buffers, the
optimizer step's temporaries, FSDP2's pieces); the terms that depend on the micro-batch,
accumulation and recomputation too, once per layout (StepTerms: activations in flight, the
last block's working set, logits, gradients held); then one function per moment of the step
(forward_end_moment, backward_start_moment, block_backward_moment, backward_end_moment,
optimizer_step_moment) adds the terms live at it. Each stage slot's tracked bytes are the
weights and optimizer states plus its largest moment; the most loaded stage is
MemoryBatch.pick, its peak moment MemoryBatch.pick_phase.

Three moments can be the peak, and the largest is taken: the start of backward (all
in-flight activations and the loss held; gradients only if they persist, i.e. with
gradient accumulation, pipelining, or DDP/ZeRO gradient buffers), the end of backward (all
gradients, one block's activations), and the optimizer step (all gradients and the step's
temporaries, no activations). The categories are those of that moment, as a memory tracker
reports them at its peak. Overhead adds the fixed CUDA/NCCL costs and the allocator's
fragmentation on top of the tracked bytes.

FSDP2 frees as it goes, so its moments differ (each checked with FSDPMemTracker on
Mixtral-8x7B, Llama-3-8B and the two- and eight-block Qwen3-235B, Llama 4 Scout and
DeepSeek-V3 cuts, docs/accuracy.md): "backward-end" is inside the backward of one block
(fsdp_blocks_done: near the end under full shard, or the second block in backward where a
block's activations outweigh its sharded gradients; the second block under shard-grad-op;
block 0 over two blocks), with the gradients of the blocks done only, or, with mixed block
kinds, the first block's post-backward (buffers.fsdp_post_backward_bytes); "forward-end" is the last
block's all-gather in forward, two all-gather buffers at once; at the optimizer step every
unit is resharded, so no gathered weights are left; and the LM head's unsharded gradient is
held through backward (the root unit is reduced last).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np

from planner.layouts.batch import RECOMPUTES, LayoutArrays
from planner.layouts.groups import group
from planner.layouts.layout import SHARDINGS
from planner.limits import saturated_bytes
from planner.memory import shapes as sh
from planner.memory.activations import host_checkpoint_bytes, offloaded_block_bytes, stage_block_bytes
from planner.memory.fp8 import bf16_layer_input_bytes
from planner.memory.state_terms import StateTerms, fsdp_blocks_done, largest_block_share, state_terms
from planner.memory.states import ModelStates, OffloadSplit
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.images import image_saved_bytes_per_sequence
from planner.training.setup import Precision, TrainingSetup, block_table_setup

# the moments of a step, in the order the peak is chosen among equals (and a step goes:
# MOMENTS_IN_STEP_ORDER)
MOMENTS = ("backward-start", "block-backward", "backward-end", "optimizer-step", "forward-end")
MOMENTS_IN_STEP_ORDER = ("forward-end", "backward-start", "block-backward", "backward-end", "optimizer-step")
# what a moment holds beyond the weights and optimizer states every moment holds
MOMENT_PARTS = ("extra_weights", "gradients", "activations", "logits", "buffers", "step_temporaries")
ABSENT = -(2**60)     # a moment or stage a layout does not have: below any other


@dataclass(frozen=True, slots=True)
class Moment:
    """What one moment of the step holds beyond the weights and optimizer states (bytes,
    arrays over the batch; ABSENT in ``gradients`` where a layout has no such moment)."""

    extra_weights: np.ndarray | int       # 0: none at this moment
    gradients: np.ndarray
    activations: np.ndarray | int
    logits: np.ndarray | int
    buffers: np.ndarray | int
    step_temporaries: np.ndarray | int

    def sum(self) -> np.ndarray:
        parts = [getattr(self, f) for f in MOMENT_PARTS]
        out = parts[1] + parts[2]
        for p in (parts[0], *parts[3:]):
            if not (isinstance(p, int) and p == 0):
                out = out + p
        return out

    def take(self, idx: np.ndarray, cols: np.ndarray) -> Moment:
        return Moment(*(getattr(self, f)[idx, cols] for f in MOMENT_PARTS))


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Every named term of the model on one stage of each layout of a batch (arrays over the
    batch, or (slot, batch) on the way): its parameters and their fine-tuning split, the
    model states and where offload puts them, the activations, the loss, the buffers, and
    the moments."""

    stage: np.ndarray
    n_layers: np.ndarray
    n_act_layers: np.ndarray
    rank_params: sh.ParamsArrays
    split: sh.SplitArrays
    states: ModelStates
    offload: OffloadSplit
    expert_padding: np.ndarray        # float
    grad_unit: np.ndarray             # a block's parameters, unpadded (its gradients' shapes)
    held: np.ndarray                  # float: micro-batches in flight
    layer_act: np.ndarray
    full_layer: np.ndarray
    score_grad: np.ndarray
    dropout_embed: np.ndarray
    block_acts: np.ndarray
    embed_acts: np.ndarray | int
    image_acts: np.ndarray | int
    amp_copies: np.ndarray
    working: np.ndarray
    last_block: np.ndarray
    logits: np.ndarray
    buffers: np.ndarray
    root_gathered: np.ndarray
    fp8_weights: np.ndarray
    step_transient: np.ndarray
    fsdp_end: tuple[np.ndarray, np.ndarray, np.ndarray]      # weights, activations, buffers
    fsdp_forward: tuple[np.ndarray, np.ndarray]               # weights, buffers
    fsdp_block: tuple[np.ndarray, np.ndarray]                 # weights, activations (the last block's backward)
    fsdp_done: np.ndarray
    head_grad: np.ndarray
    step_freed: np.ndarray
    end_grad_params: tuple[np.ndarray | int, np.ndarray | int]   # (dense, expert), -1 where not counted
    moments: dict[str, Moment]
    weights: np.ndarray               # every moment's weights (before a moment's extra)
    moment_sums: tuple[np.ndarray, ...]   # each moment's parts summed, in MOMENTS order
    tracked: np.ndarray               # the tracked bytes at the stage's peak moment (ABSENT: no such stage)
    checkpoint_host: np.ndarray | int   # DeepSpeed cpu_checkpointing host bytes (activations.host_checkpoint_bytes)


@dataclass(frozen=True)
class MemoryBatch:
    """The memory of the most loaded rank of each layout of a batch: every stage slot's
    terms (``slots``, (slot, layout) arrays, or (slot, state) ones marked PerState), and per
    layout the total, the tracked bytes and fragmentation of its most loaded stage, and the
    facts that do not depend on the stage. ``term()`` picks one term of the most loaded
    stage, ``at`` all of them (built on first use). ``kernels`` indexes shapes.KERNELS;
    ``hybrid`` is 0 where FSDP does not shard hybrid."""

    slots: StageMemory
    total: np.ndarray
    tracked: np.ndarray
    fragmentation: np.ndarray
    state_inv: np.ndarray      # each layout's state: the column of the per-state terms (PerState)
    kernels: np.ndarray
    act_fp32: np.ndarray
    amp_states: np.ndarray
    hybrid: np.ndarray
    persistent_grads: np.ndarray
    distributed: np.ndarray
    ranks_per_node: np.ndarray
    fixed_overhead: np.ndarray
    state_precision: Precision
    optimizer_bytes_per_param: float
    fragmentation_share: float

    def __len__(self) -> int:
        return len(self.total)

    def pick(self, rows: np.ndarray) -> np.ndarray:
        """The most loaded stage slot of the layouts at ``rows``: the first of equals, in stage
        order. The total grows with the tracked bytes (strictly, with a fragmentation share
        >= 0), so the slot with the most tracked bytes has the largest total."""
        t = self.slots.tracked[:, rows]
        if self.fragmentation_share < 0:
            t = t + (t * self.fragmentation_share).astype(np.int64)
        return t.argmax(axis=0)

    def term(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The most loaded stage's term ``name`` ("offload.host_bytes",
        "moments.backward-end.gradients"), per layout (at ``rows``, default every layout)."""
        x: object = self.slots
        for part in name.split("."):
            x = x[part] if isinstance(x, dict) else getattr(x, part)
        cols = np.arange(len(self)) if rows is None else rows
        if not isinstance(x, np.ndarray):
            return np.full(len(cols), x)
        picked = pick_terms(x, self.pick(cols), cols, self.state_inv[cols])
        assert isinstance(picked, np.ndarray)
        return picked

    def pick_phase(self, rows: np.ndarray) -> np.ndarray:
        """The peak moment (an index into MOMENTS) of the most loaded stage at ``rows``: the
        first of equals, in MOMENTS order."""
        slot = self.pick(rows)
        return np.stack([s[slot, rows] for s in self.slots.moment_sums]).argmax(axis=0)

    @cached_property
    def at(self) -> StageMemory:
        cols = np.arange(len(self))
        out = pick_terms(self.slots, self.pick(cols), cols, self.state_inv)
        assert isinstance(out, StageMemory)
        return out


def pick_terms(x: Any, idx: np.ndarray, cols: np.ndarray, state_cols: np.ndarray) -> Any:
    """Row ``idx[j]`` of column j of a (slot, layout) array, or of column ``state_cols[j]``
    of a (slot, state) one (PerState), or of every array in a tuple or dataclass of them;
    per-layout arrays at ``cols``."""
    if isinstance(x, PerState):
        x = np.asarray(x)
        return x[idx, state_cols] if x.ndim == 2 else x[state_cols]
    if isinstance(x, np.ndarray):
        return x[idx, cols] if x.ndim == 2 else x[cols]
    if isinstance(x, (int, float)):
        return x
    if isinstance(x, tuple):
        return tuple(pick_terms(v, idx, cols, state_cols) for v in x)
    if isinstance(x, dict):
        return {k: pick_terms(v, idx, cols, state_cols) for k, v in x.items()}
    if isinstance(x, Moment):
        return Moment(*(pick_terms(getattr(x, f), idx, cols, state_cols) for f in MOMENT_PARTS))
    return type(x)(**{f.name: pick_terms(getattr(x, f.name), idx, cols, state_cols) for f in fields(x)})


class PerState(np.ndarray):
    """A term computed once per distinct state of a batch ((slot, state) or (state,)): read
    per layout through MemoryBatch.state_inv."""


def _per_state(x: Any) -> Any:
    """``x`` (an array, or a tuple or dataclass of them) marked as per state."""
    if isinstance(x, np.ndarray):
        return x.view(PerState)
    if isinstance(x, (int, float)):
        return x
    if isinstance(x, tuple):
        return tuple(_per_state(v) for v in x)
    return type(x)(**{f.name: _per_state(getattr(x, f.name)) for f in fields(x)})


# what a layout's model states, buffers and optimizer temporaries depend on (its "state"):
# everything but the micro-batch, the accumulation, the virtual stages and recomputation
STATE_FIELDS = ("tp", "cp", "ep", "dp", "pp", "sharding", "zero_stage", "sp", "etp", "ep_fold",
                "optimizer_instances")


# state_terms of the last batches, at most KEPT_BATCHES of at most KEPT_STATES states each and
# KEPT_BYTES of arrays in all (with their sizes)
_KEPT: dict[tuple[object, ...], tuple[StateTerms, int]] = {}
KEPT_BATCHES = 16
KEPT_STATES = 4096
KEPT_BYTES = 16 * 2**20


def forget_states() -> None:
    """Drop the state terms kept across batches (a benchmark's cold start)."""
    _KEPT.clear()


def _kept_state_terms(m: ModelSpec, setup: TrainingSetup, sa: LayoutArrays, pc: ParamCount,
                      gpus_per_node: int) -> StateTerms:
    """state_terms of the distinct states ``sa``, kept per (model, set-up as the block tables key
    it, parameter count, GPUs per node, the states' STATE_FIELDS): state_terms reads no other
    field of a state's layout (tests/test_shape_caches.py sizes each state through its first and
    its last layout) and no global batch (training.setup.block_table_setup). `plan buy` of 128
    Llama 3.1 8B jobs, each its own global batch (issue 32, H1), sized the same states 1,147
    times, 1.1 s of CPU. Kept arrays are read-only: a consumer that wrote to one would fail."""
    if len(sa) > KEPT_STATES:
        return state_terms(m, setup, sa, pc, gpus_per_node)
    key = (m, block_table_setup(setup), pc, gpus_per_node, len(sa),
           *(sa.field(f).astype(np.int64, copy=False).tobytes() for f in STATE_FIELDS))
    hit = _KEPT.get(key)
    if hit is not None:
        return hit[0]
    terms = state_terms(m, setup, sa, pc, gpus_per_node)
    size = _read_only(terms)
    while _KEPT and (len(_KEPT) >= KEPT_BATCHES or sum(n for _, n in _KEPT.values()) + size > KEPT_BYTES):
        del _KEPT[next(iter(_KEPT))]        # the oldest
    if size <= KEPT_BYTES:
        _KEPT[key] = (terms, size)
    return terms


def _read_only(x: Any) -> int:
    """Mark every array in ``x`` (a dataclass of arrays, tuples and dataclasses) read-only; their bytes."""
    if isinstance(x, np.ndarray):
        x.flags.writeable = False
        return int(x.nbytes)
    if isinstance(x, tuple):
        return sum(_read_only(v) for v in x)
    if hasattr(x, "__dataclass_fields__"):
        return sum(_read_only(getattr(x, f.name)) for f in fields(x))
    return 0


@dataclass(frozen=True, slots=True)
class Held:
    """What a moment holds beyond the weights and optimizer states, before it is named a
    Moment: the parts of the end of backward, or of the end of forward (bytes, (slot,
    layout) arrays)."""

    weights: np.ndarray | int
    gradients: np.ndarray
    activations: np.ndarray | int
    buffers: np.ndarray | int


@dataclass(frozen=True, slots=True)
class StepTerms:
    """The per-layout terms of a batch, computed once ((slot, layout) arrays, bytes unless
    named otherwise), that the moments of the step add up: the activations in flight and
    their parts, the loss, the buffers, the gradients held through the micro-batches and at
    the end of backward, and the end-of-backward and end-of-forward parts (FSDP2's, or the
    engines' that free nothing as they go)."""

    held: np.ndarray                    # float: micro-batches in flight
    layer_act: np.ndarray               # one layer's saved activations
    full_layer: np.ndarray              # one layer's activations, recomputed whole
    score_grad: np.ndarray
    dropout_embed: np.ndarray
    block_acts: np.ndarray              # the stage's blocks' saved activations, every micro-batch in flight
    embed_acts: np.ndarray | int        # the embedding's dropout outputs in flight
    image_acts: np.ndarray | int        # a trained image side's saved tensors in flight (training.images)
    activations: np.ndarray             # every activation in flight (blocks, autocast copies, embedding)
    working: np.ndarray                 # inside the last block's backward: recomputed tensors, score gradients
    block_working: np.ndarray           # and FSDP2's LM head gradient and the block's 16-bit gradients
    block_weights: np.ndarray | int     # FSDP2 full shard: the block gathered for its backward
    last_block: np.ndarray
    logits: np.ndarray
    buffers: np.ndarray
    gradients: np.ndarray               # every gradient of the stage (the end of backward, the step)
    held_gradients: np.ndarray          # the gradients that persist through forward and backward
    persistent: np.ndarray              # bool: gradients persist (accumulation, pipeline, DDP/ZeRO buckets)
    checkpoint_host: np.ndarray | int   # DeepSpeed cpu_checkpointing host bytes (activations.host_checkpoint_bytes)
    backward_end: Held
    forward_end: Held
    fsdp_end: tuple[np.ndarray, np.ndarray, np.ndarray]     # FSDP2's (weights, activations, buffers)
    fsdp_done: np.ndarray
    end_grad_params: tuple[np.ndarray | int, np.ndarray | int]   # (dense, expert), -1 where not counted


# ---- the moments of the step: what each holds beyond the weights and optimizer states

def forward_end_moment(t: StepTerms) -> Moment:
    """The last block's forward: its all-gathers in flight under FSDP2, every earlier
    activation saved (absent without FSDP: backward-start holds more)."""
    f = t.forward_end
    return Moment(f.weights, f.gradients, f.activations, 0, f.buffers, 0)


def backward_start_moment(t: StepTerms) -> Moment:
    """The start of backward: every activation in flight and the loss's logits, the
    gradients only where they persist."""
    return Moment(0, t.held_gradients, t.activations, t.logits, t.buffers, 0)


def block_backward_moment(t: StepTerms) -> Moment:
    """Inside the last block's backward: its working set on top of every activation (FSDP2:
    the block gathered, its 16-bit gradients, buffers.fsdp_block_backward_bytes)."""
    return Moment(t.block_weights, t.held_gradients, t.activations + t.block_working, 0, t.buffers, 0)


def backward_end_moment(t: StepTerms) -> Moment:
    """The end of backward: every gradient and one block's activations (FSDP2: inside one
    block's backward, state_terms.fsdp_blocks_done)."""
    e = t.backward_end
    return Moment(e.weights, e.gradients, e.activations, 0, e.buffers, 0)


def optimizer_step_moment(s: StateTerms) -> Moment:
    """The optimizer step, per state: every gradient and the step's temporaries, no
    activations; FSDP2 has resharded every unit (``step_freed`` less weights)."""
    return Moment(-s.step_freed, s.offload.gradients, 0, 0, 0, s.step_transient)


def memory_batch(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
                 gpus_per_node: int = 8, seq_len: int | None = None) -> MemoryBatch:
    """The peak memory of the most loaded rank of every layout of ``a`` (valid layouts of
    sequence ``seq_len``, default the set-up's), by term, moment and stage.

    Terms that depend only on a layout's state (STATE_FIELDS: degrees and sharding) are
    computed once per distinct state (state_terms, (slot, state) arrays) and read per layout
    through ``inv``; the rest once per layout (step_terms, (slot, layout) arrays). Each
    moment adds the terms live at it; the peak is the largest moment of the most loaded
    stage."""
    pc = pc or count_params(m)
    seq = setup.seq_len if seq_len is None else seq_len
    n = len(a)
    inv, first = group([a.field(f) for f in STATE_FIELDS])
    s = _kept_state_terms(m, setup, a.take(first), pc,
                          gpus_per_node)
    t = step_terms(m, setup, a, seq, s, inv)

    def g(x: np.ndarray) -> np.ndarray:
        return np.take(x, inv, axis=x.ndim - 1)

    step = optimizer_step_moment(s)
    moments = {"backward-start": backward_start_moment(t), "block-backward": block_backward_moment(t),
               "backward-end": backward_end_moment(t), "optimizer-step": _per_state(step),
               "forward-end": forward_end_moment(t)}
    sums = tuple(g(step.sum()) if k == "optimizer-step" else moments[k].sum() for k in MOMENTS)
    best = sums[0]
    for x in sums[1:]:
        best = np.maximum(best, x)
    tracked_slots = g(np.where(s.valid, s.base, ABSENT)) + best     # ABSENT: a slot the pipeline lacks
    ps = _per_state
    slots = StageMemory(
        stage=g(s.stage), n_layers=ps(s.n_layers), n_act_layers=ps(s.n_act_layers), rank_params=ps(s.rank_params),
        split=ps(s.split), states=ps(s.states), offload=ps(s.offload), expert_padding=ps(s.expert_padding),
        grad_unit=ps(s.grad_unit), held=t.held, layer_act=t.layer_act, full_layer=t.full_layer,
        score_grad=t.score_grad, dropout_embed=t.dropout_embed, block_acts=t.block_acts, embed_acts=t.embed_acts,
        image_acts=t.image_acts,
        amp_copies=ps(s.amp_copies), working=t.working, last_block=t.last_block, logits=t.logits,
        buffers=t.buffers, root_gathered=ps(s.root_gathered), fp8_weights=ps(s.fp8_weights),
        step_transient=ps(s.step_transient), fsdp_end=t.fsdp_end,
        fsdp_forward=(ps(s.fsdp.forward_weights), ps(s.fsdp.forward_buffers)), fsdp_done=t.fsdp_done,
        fsdp_block=(ps(s.fsdp.last_weights), ps(s.fsdp.last_activations)),
        head_grad=ps(s.fsdp.head_grad), step_freed=ps(s.step_freed), end_grad_params=t.end_grad_params,
        moments=moments, weights=ps(s.weights), moment_sums=sums, tracked=tracked_slots,
        checkpoint_host=t.checkpoint_host)
    # the most loaded stage's total (MemoryBatch.pick): fixed costs and fragmentation on top
    # of its tracked bytes
    share = setup.overheads.fragmentation
    if share >= 0:
        tracked = tracked_slots.max(axis=0)
    else:
        slot_totals = tracked_slots + setup.overheads.fragmentation_bytes(tracked_slots)
        tracked = tracked_slots[slot_totals.argmax(axis=0), np.arange(n)]
    frag = setup.overheads.fragmentation_bytes(tracked)
    fixed = s.fixed_overhead[inv]
    return MemoryBatch(slots=slots, total=tracked + fixed + frag, tracked=tracked, fragmentation=frag,
                       state_inv=inv, kernels=s.kernels[inv], act_fp32=s.act_fp32[inv],
                       amp_states=s.amp_states[inv], hybrid=s.hybrid[inv], persistent_grads=t.persistent,
                       distributed=s.distributed[inv], ranks_per_node=s.ranks_per_node[inv], fixed_overhead=fixed,
                       state_precision=s.state_precision, optimizer_bytes_per_param=s.optimizer_bytes_per_param,
                       fragmentation_share=share)


def step_terms(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, seq: int, s: StateTerms,
               inv: np.ndarray) -> StepTerms:
    """The per-layout terms (StepTerms) of the layouts ``a`` of sequence ``seq``, their
    states' terms ``s`` read through ``inv``."""
    ft = setup.finetune

    def g(x: np.ndarray) -> np.ndarray:
        return np.take(x, inv, axis=x.ndim - 1)

    n = len(a)
    act = sh.activation_figures(m, setup, a, seq, s.kernels[inv], s.act_fp32[inv])
    persistent = (a.grad_accum > 1) | (a.pp > 1) | g(~s.is_fsdp & (s.dense_shard_degree > 1))
    stage_l, has_act_l, last_l = g(s.stage), g(s.has_act), g(s.last)
    held = sh.in_flight_microbatches(a, stage_l, m.n_layers, setup.pp_balance, g(s.n_layers),
                                     setup.pp_microbatch_group, setup.mtp_layers)
    # in float: layers x bytes per layer passes int64 at the option limits (limits.saturated_bytes)
    # Megatron's full recomputation by method (memory.activations.stage_block_bytes)
    full_rc = a.recompute == RECOMPUTES.index("full")
    n_act_l = g(s.n_act_layers)
    stage_acts, recomputed = stage_block_bytes(setup, n_act_l, a.vp, full_rc, act.layer_act, act.full_layer)
    # Megatron-Core's CPU activation offload: the offloaded layers' tensors on the host line
    stage_acts, offloaded = offloaded_block_bytes(setup, n_act_l, stage_acts, act.layer_act)
    if setup.bf16_layers != (0, 0):     # layers kept in BF16 save their linear inputs in 16 bits (memory.fp8)
        stage_acts = stage_acts + bf16_layer_input_bytes(m, setup, a, seq, stage_l, g(s.n_layers))
    block_acts = saturated_bytes(stage_acts * held)
    # DeepSpeed's cpu_checkpointing: the host copy (the host line) and the input it keeps on the GPU
    ckpt_host: np.ndarray | int = saturated_bytes(offloaded * held) if setup.offload_activations > 0 else 0
    if setup.stack == "deepspeed" and "cpu" in setup.ds_checkpointing:
        ckpt_host, ckpt_gpu = host_checkpoint_bytes(m, setup, a.micro_batch, a.seq_len_per_rank(seq), a.tp, full_rc,
                                                    n_act_l, held)
        block_acts = block_acts + ckpt_gpu
    dropout_embed = (a.micro_batch * a.seq_len_per_rank(seq) * m.d_model if m.hidden_dropout > 0
                     else np.zeros(n, np.int64))
    acts = block_acts + g(s.amp_copies) if s.amp_copies.any() else block_acts
    embed_acts: np.ndarray | int = 0
    if ft.is_full and m.hidden_dropout > 0:
        embed_acts = saturated_bytes(dropout_embed * held) * (stage_l == 0)
        acts = acts + embed_acts
    image_acts: np.ndarray | int = 0
    image_bytes = image_saved_bytes_per_sequence(m, ft, setup.images_per_sample)
    if image_bytes:     # a trained image side's saved tensors, on the first stage (training.images)
        image_acts = saturated_bytes(np.multiply(a.micro_batch * held, image_bytes, dtype=np.float64)) * (stage_l == 0)
        acts = acts + image_acts
    # inside the last block's backward: its recomputed tensors and its gradients' working
    # set (the eager attention's fp32 score gradients)
    working = ((recomputed - act.layer_act) + act.score_grad) * has_act_l
    logits = act.logits * last_l * (1 + setup.mtp_layers)     # each MTP module keeps its own loss
    buffers = g(s.engine_buffers) + act.pipeline_buffers
    # FSDP under a pipeline (grad sync "step") holds unsharded gradients through the
    # micro-batches in place of the sharded ones (states.no_sync_gradient_bytes)
    grads = g(np.where(s.states.accumulated_gradients > 0, s.states.accumulated_gradients, s.offload.gradients))
    g_held = grads * persistent
    last_block = act.full_layer * has_act_l
    common = dict(held=held, layer_act=act.layer_act, full_layer=act.full_layer, score_grad=act.score_grad,
                  dropout_embed=dropout_embed, block_acts=block_acts, embed_acts=embed_acts, image_acts=image_acts,
                  activations=acts,
                  working=working, last_block=last_block, logits=logits, buffers=buffers, gradients=grads,
                  held_gradients=g_held, persistent=persistent, checkpoint_host=ckpt_host)
    f = s.fsdp
    ps = _per_state
    if not s.is_fsdp.any():
        return StepTerms(**common, block_working=working, block_weights=0,
                         backward_end=Held(0, grads, last_block, buffers),
                         forward_end=Held(0, np.full(stage_l.shape, ABSENT), 0, 0),   # no such moment
                         fsdp_end=(ps(f.end_weights), ps(f.end_activations), ps(f.end_buffers)),
                         fsdp_done=ps(f.done), end_grad_params=(-1, -1))
    return _fsdp_step_terms(s, common, g, ft.is_full, m.letters_per_block)


def _fsdp_step_terms(s: StateTerms, common: dict[str, Any], g: Any, full_training: bool,
                     letters_per_block: int) -> StepTerms:
    """StepTerms where some layout of the batch is FSDP: FSDP2's end of backward (inside one
    block's backward, or the first block's post-backward where that holds more) and end of
    forward, per layout; the other layouts' as step_terms gives them. A block done frees
    the activations of the unit FSDP2 wraps: ``letters_per_block`` mean letters of a hybrid's
    pattern (params.block_units)."""
    f = s.fsdp
    acts, grads, g_held = common["activations"], common["gradients"], common["held_gradients"]
    buffers = common["buffers"]
    layer_act, working, last_block = common["layer_act"] * letters_per_block, common["working"], common["last_block"]
    fsdp_l, head_l, end_a_l = g(f.moment), g(f.head_grad), g(f.end_activations)
    # full shard over three blocks or more: the second block in backward (one done) where a
    # block's activations outweigh its sharded gradients, else block 1 (fsdp_blocks_done)
    counted = fsdp_l & ~common["persistent"] & (grads != 0) if full_training else None
    done_l, done_g, done_dense_l, done_expert_l = g(f.done), g(f.done_grads), g(f.done_dense), g(f.done_expert)
    if f.may_be_early.any():
        # (gradients that persist, or a frozen base's, are held whatever is done: 0 added)
        sharded_l = g(f.block_sharded_grads)
        added = sharded_l if counted is None else sharded_l * counted
        early = g(f.may_be_early) & (layer_act > added)
        done_l = done_l + (1 - done_l) * early
        done_g = done_g + (sharded_l - done_g) * early
        done_dense_l = done_dense_l + (g(f.block_dense) - done_dense_l) * early
        done_expert_l = done_expert_l + (g(f.block_expert) - done_expert_l) * early
    # (masks select by multiplying: x * mask, or y + (x - y) * mask, is np.where(mask, x, y)
    # on int64 bytes, without np.where's branch per element)
    done_acts = saturated_bytes(np.multiply(done_l, layer_act, dtype=np.float64))
    end_acts = last_block + (acts - done_acts + working + head_l - last_block) * fsdp_l + end_a_l
    end_grads = grads if counted is None else grads + (done_g - grads) * counted
    end_buf_l = g(f.end_buffers)
    end_w_l, end_b_l = g(f.end_weights), np.maximum(buffers, end_buf_l)
    fsdp_end = (_per_state(f.end_weights), _per_state(f.end_activations), _per_state(f.end_buffers))
    if f.post_ok.any():
        # the first block's post-backward where it holds more (buffers.fsdp_post_backward_bytes):
        # its activations freed, no working set, no sharded gradients yet
        post_a_l = g(f.post_activations)
        post_acts = acts - layer_act + head_l + post_a_l
        post_grads = grads if counted is None else grads - grads * counted
        post_w_l, post_buf_l = g(f.post_weights), g(f.post_buffers)
        post_b_l = np.maximum(buffers, post_buf_l)
        post = g(f.post_ok) & (post_w_l + post_grads + post_acts + post_b_l
                               > end_w_l + end_grads + end_acts + end_b_l)
        end_w_l = end_w_l + (post_w_l - end_w_l) * post
        end_grads = end_grads + (post_grads - end_grads) * post
        end_acts = end_acts + (post_acts - end_acts) * post
        end_b_l = end_b_l + (post_b_l - end_b_l) * post
        end_a_l = end_a_l + (post_a_l - end_a_l) * post
        done_l = done_l + (1 - done_l) * post
        if counted is not None:
            counted = counted & ~post
        fsdp_end = (end_w_l, end_a_l, end_buf_l + (post_buf_l - end_buf_l) * post)
    fwd = Held(g(f.forward_weights), ABSENT + (g_held - ABSENT) * fsdp_l, acts - layer_act,
               np.maximum(buffers, g(f.forward_buffers)))
    return StepTerms(**common, block_working=working + head_l + g(f.last_activations),
                     block_weights=g(f.last_weights), backward_end=Held(end_w_l, end_grads, end_acts, end_b_l),
                     forward_end=fwd, fsdp_end=fsdp_end, fsdp_done=done_l,
                     end_grad_params=((np.where(counted, done_dense_l, -1), np.where(counted, done_expert_l, -1))
                                      if counted is not None else (-1, -1)))


__all__ = [
    "MOMENTS",
    "MOMENTS_IN_STEP_ORDER",
    "MOMENT_PARTS",
    "SHARDINGS",
    "MemoryBatch",
    "Moment",
    "StageMemory",
    "fsdp_blocks_done",
    "largest_block_share",
    "memory_batch",
]
