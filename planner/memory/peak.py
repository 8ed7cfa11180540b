"""The memory model over a batch of layouts: the moments of a step, on every stage that can be
the most loaded, and the largest of them.

One code path: planner.memory.model.per_rank_memory is this on a batch of one. Branches on
the layout are numpy masks; branches on the model and the set-up are plain ``if``s; what
depends on a shape (a block's saved tensors, the loss, a stage's parameters and their
fine-tuning split) is computed once per distinct shape (planner.memory.shapes) and gathered.

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

from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any

import numpy as np

from planner.layouts.batch import RECOMPUTES, LayoutArrays
from planner.layouts.layout import SHARDINGS
from planner.limits import saturated_bytes
from planner.memory import shapes as sh
from planner.memory.activations import host_checkpoint_bytes, offloaded_block_bytes, stage_block_bytes
from planner.memory.buffers import (
    buffer_bytes,
    fsdp_backward_end_bytes,
    fsdp_forward_bytes,
    fsdp_post_backward_bytes,
)
from planner.memory.fp8 import fp8_weight_bytes
from planner.memory.params import optimizer_state_bytes
from planner.memory.states import (
    ModelStates,
    OffloadSplit,
    expert_padding,
    fp32_accumulated_gradients,
    model_state_bytes,
    offload_bytes,
    optimizer_step_transient_bytes,
    sharded_frozen_bytes,
)
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.images import image_saved_bytes_per_sequence
from planner.training.kernels import block_kernel_codes
from planner.training.setup import Precision, TrainingSetup

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
    if isinstance(x, tuple):
        return tuple(_per_state(v) for v in x)
    return type(x)(**{f.name: _per_state(getattr(x, f.name)) for f in fields(x)})


# what a layout's model states, buffers and optimizer temporaries depend on (its "state"):
# everything but the micro-batch, the accumulation, the virtual stages and recomputation
STATE_FIELDS = ("tp", "cp", "ep", "dp", "pp", "sharding", "zero_stage", "sp", "etp", "ep_fold")


def memory_batch(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
                 gpus_per_node: int = 8, seq_len: int | None = None) -> MemoryBatch:
    """The peak memory of the most loaded rank of every layout of ``a`` (valid layouts of
    sequence ``seq_len``, default the set-up's), by term, moment and stage.

    Terms that depend only on a layout's state (STATE_FIELDS: degrees and sharding) are
    computed once per distinct state (``sa``, (slot, state) arrays) and read per layout
    through ``inv``; the rest per layout ((slot, layout) arrays)."""
    pc = pc or count_params(m)
    seq = setup.seq_len if seq_len is None else seq_len
    n = len(a)
    prec = setup.precision_spec
    ft = setup.finetune
    lora16 = ft.is_lora and ft.adapter_bits == 16
    inv, first = sh.group([a.field(f) for f in STATE_FIELDS]) if n else (np.zeros(0, np.int64),) * 2
    sa = LayoutArrays(*(a.field(f)[first] for f in LayoutArrays.FIELDS))

    # ---- per state
    fsdp = sa.sharding > 0
    full_shard = fsdp & (sa.zero_stage == 3)
    dense_deg = sa.dense_shard_degree
    n_gpus = sa.n_gpus
    # the kernels each layout's blocks run: the stack's, or --kernels' (training.kernels, the
    # rule the step time reads too)
    kern = block_kernel_codes(setup, sa.tp, sa.pp, sa.cp, (sa.sharding == 0) & (sa.zero_stage == 0))
    autocast = kern == sh.AMP
    # trainable parameters kept in fp32 with fp32 gradients: everything under autocast; and
    # with a frozen base on replicated ranks, PEFT's adapters (autocast_adapter_dtype) and
    # freeze's trainable blocks (upcast, as LLaMA-Factory does) whatever the precision.
    # QLoRA's adapters are 16-bit. A frozen base loaded in 16 bits gives a 16-bit residual
    # stream, so its activations are those of eager kernels.
    replicated = (sa.sharding == 0) & (sa.zero_stage == 0) & (kern != sh.FUSED)
    fp32_trainables = replicated & (not ft.is_full and not lora16)
    amp_states = (autocast & (not lora16)) | fp32_trainables
    kernels = np.where(autocast, sh.EAGER, kern) if not ft.is_full else kern
    # QLoRA: 16-bit adapters with no master copy, updated by paged 8-bit AdamW
    state_prec = Precision.named("bf16") if lora16 else prec
    opt_pp = optimizer_state_bytes(m, setup)
    # freeze on replicated ranks upcasts the trainable blocks to fp32: in pure 16-bit
    # training (no autocast) their activations are fp32 too
    if ft.method == "freeze" and prec.activation_bytes < 4:
        act_fp32 = fp32_trainables & ~autocast
    else:
        act_fp32 = np.zeros(len(sa), dtype=bool)
    hybrid = sa.hybrid_shard(gpus_per_node)
    distributed = n_gpus > 1
    ranks_per_node = np.minimum(n_gpus, gpus_per_node)
    fixed = setup.overheads.fixed_bytes(distributed)

    # every stage that can be the most loaded: (slot, state) arrays
    st = sh.stage_figures(m, pc, setup, sa)
    stage, n_layers, n_act = st.stage, st.n_layers, st.n_act_layers
    rp, split = st.rank_params, st.split
    last = stage == sa.pp - 1
    pad = expert_padding(m, sa, hybrid)
    ms = model_state_bytes(split.trainable_dense, split.trainable_expert, state_prec, opt_pp, sa, hybrid,
                           amp=amp_states, expert_padding=pad, grad_sync=setup.fsdp_pipeline_grad_sync)
    fp32_grads = fp32_accumulated_gradients(setup, sa)
    if fp32_grads.any():    # DeepSpeed's BF16_Optimizer: 4-byte gradients, unsharded (ZeRO-0/1)
        ms = replace(ms, gradients=np.where(fp32_grads, ms.gradients * 4 // max(state_prec.grad_bytes, 1),
                                            ms.gradients))
    grad_unit = rp.block_unit     # a block's gradients have its parameters' shapes: never padded
    if m.is_moe:
        # gathered blocks carry the padded experts too
        padded = (pad > 1) & (n_layers > 0)
        extra = (rp.expert / np.maximum(n_layers, 1) * (pad - 1)).astype(np.int64)
        rp = rp.replace(block_unit=np.where(padded, rp.block_unit + extra, rp.block_unit))
    vocab_shard = -(-(m.vocab_size * m.d_model) // sa.tp)
    if ft.is_full:
        # autocast's 16-bit copies of every matmul weight, kept for backward
        amp_copies = np.where(kernels == sh.AMP, 2 * (rp.total - np.where(stage == 0, vocab_shard, 0)
                                                      - n_layers * pc.norms_per_layer), 0)
    else:
        amp_copies = np.where(autocast & amp_states, 2 * split.trainable, 0)   # copies of the fp32 trainables
    has_act = n_act > 0
    engine_buffers = buffer_bytes(m, setup, sa, rp, prec, split, kern)
    off = offload_bytes(setup, sa, ms, sharded_frozen_bytes(split, sa, hybrid), split, prec, hybrid)
    # FSDP2 keeps the root unit gathered
    root_gathered = np.where(full_shard, rp.root_unit * prec.weight_bytes, 0)
    # the FP8 recipe's fp8 weight copies and amax histories (memory.fp8)
    fp8_w = fp8_weight_bytes(m, prec, rp.total - rp.root_unit, n_layers, sa.ep, setup.fp8_param_gather)
    if setup.stack == "megatron":
        # Megatron FSDP (ZeRO-3 sharding) keeps the low-precision weights in its sharded buffer
        # and gathers them per module (Megatron-Bridge's FP8/MXFP8 recipes set fp8_param_gather,
        # training/mixed_precision.py): the copies are sharded like the weights, not cached whole
        fp8_w = np.where(sa.zero_stage == 3, -(-fp8_w // np.maximum(dense_deg, 1)), fp8_w)
    weights = off.weights + ms.unsharded_weights + root_gathered + fp8_w
    step_transient = np.where(off.step_on_host, 0,
                              optimizer_step_transient_bytes(m, setup, sa, kern, rp, hybrid, split))
    # FSDP2 reduce-scatters the root unit (embedding, final norm, LM head) in its own
    # post-backward, after every block: the LM head's unsharded gradient, made first in
    # backward, is held to the end of it (FSDPMemTracker on Llama-3-8B cut to 4 blocks,
    # fp32, 8 ranks: 3.10 GiB of temporaries in every block's backward, 1.47 GiB less
    # with a quarter of the vocabulary: (128,256 - 32,064) x 4096 x 4 B)
    head_grad = np.where(fsdp & last & has_act, vocab_shard * prec.weight_bytes, 0) if ft.is_full else 0 * stage
    # FSDP2 reshards every unit after its backward, the root and shard-grad-op's blocks
    # too (reshard_after_backward): no gathered weights are left at the optimizer step
    step_freed = np.where(fsdp, ms.unsharded_weights + root_gathered, 0)
    # FSDP2's moment is inside one block's backward (fsdp_blocks_done): the blocks done
    # have freed their activations, and only they have reduced (sharded) gradients
    fsdp_moment = fsdp & has_act
    done = np.where(fsdp_moment, fsdp_blocks_done(sa, n_act), 0)
    n_l = np.maximum(n_layers, 1)
    block_dense, block_expert = (rp.dense - rp.root_unit) // n_l, rp.expert // n_l
    # (two-block stages: the moment's blocks by kind, buffers.fsdp_two_block_bytes)
    share = largest_block_share(pc, m)
    end_w, end_a, end_b, done_share = fsdp_backward_end_bytes(sa, rp, prec, split, grad_unit, n_act, share)
    end_w, end_a, end_b = (np.where(has_act, x, 0) for x in (end_w, end_a, end_b))
    # the first block's post-backward, the other candidate for the backward-end moment
    post_w, post_a, post_b, post_ok = fsdp_post_backward_bytes(sa, rp, prec, split, grad_unit, n_act, share)
    # (with blocks alike it holds less than the moment above: a gathered block and one block's
    # sharded gradients less, buffers.fsdp_post_backward_bytes; so only for mixed block kinds)
    post_ok = post_ok & fsdp_moment & (share != 1.0) if ft.is_full else post_ok & False
    # one block's sharded gradients: a later block's backward holds more where they outweigh its
    # activations (fsdp_blocks_done), an early one otherwise
    block_sharded = model_state_bytes(block_dense, block_expert, state_prec, opt_pp, sa, hybrid,
                                      expert_padding=pad).gradients
    may_be_early = fsdp_moment & (sa.zero_stage == 3) & (n_act >= 3)
    done_dense = (done * block_dense * done_share).astype(np.int64)
    done_expert = (done * block_expert * done_share).astype(np.int64)
    done_grads = model_state_bytes(done_dense, done_expert, state_prec, opt_pp, sa, hybrid,
                                   expert_padding=pad).gradients
    fwd_w, fwd_b = (np.where(fsdp_moment, x, 0) for x in fsdp_forward_bytes(sa, rp, prec, split))
    # the optimizer step holds no activations: every part is the state's
    step_sum = -step_freed + off.gradients + step_transient
    base = weights + off.optimizer

    # ---- per layout: (slot, layout) arrays; state terms read through inv
    def g(x: np.ndarray) -> np.ndarray:
        return np.take(x, inv, axis=x.ndim - 1)

    kernels_l = kernels[inv]
    act = sh.activation_figures(m, setup, a, seq, kernels_l, act_fp32[inv])
    persistent = (a.grad_accum > 1) | (a.pp > 1) | g(~fsdp & (dense_deg > 1))
    stage_l, has_act_l, last_l = g(stage), g(has_act), g(last)
    held = sh.in_flight_microbatches(a, stage_l, m.n_layers, setup.pp_balance, g(n_layers), setup.pp_microbatch_group)
    # in float: layers x bytes per layer passes int64 at the option limits (limits.saturated_bytes)
    # Megatron's full recomputation by method (memory.activations.stage_block_bytes)
    full_rc = a.recompute == RECOMPUTES.index("full")
    n_act_l = g(n_act)
    stage_acts, recomputed = stage_block_bytes(setup, n_act_l, a.vp, full_rc, act.layer_act, act.full_layer)
    # Megatron-Core's CPU activation offload: the offloaded layers' tensors on the host line
    stage_acts, offloaded = offloaded_block_bytes(setup, n_act_l, stage_acts, act.layer_act)
    block_acts = saturated_bytes(stage_acts * held)
    # DeepSpeed's cpu_checkpointing: the host copy (the host line) and the input it keeps on the GPU
    ckpt_host: np.ndarray | int = saturated_bytes(offloaded * held) if setup.offload_activations > 0 else 0
    if setup.stack == "deepspeed" and "cpu" in setup.ds_checkpointing:
        ckpt_host, ckpt_gpu = host_checkpoint_bytes(m, setup, a.micro_batch, seq // a.cp, a.tp, full_rc, n_act_l,
                                                    held)
        block_acts = block_acts + ckpt_gpu
    dropout_embed = a.micro_batch * (seq // a.cp) * m.d_model if m.hidden_dropout > 0 else np.zeros(n, np.int64)
    acts = block_acts + g(amp_copies) if amp_copies.any() else block_acts
    embed_acts: np.ndarray | int = 0
    if ft.is_full and m.hidden_dropout > 0:
        embed_acts = saturated_bytes(dropout_embed * held) * (stage_l == 0)
        acts = acts + embed_acts
    image_bytes = image_saved_bytes_per_sequence(m, ft, setup.images_per_sample)
    if image_bytes:     # a trained image side's saved tensors, on the first stage (training.images)
        acts = acts + saturated_bytes(np.multiply(a.micro_batch * held, image_bytes, dtype=np.float64)) * (stage_l == 0)
    # inside the last block's backward: its recomputed tensors and its gradients' working
    # set (the eager attention's fp32 score gradients)
    working = ((recomputed - act.layer_act) + act.score_grad) * has_act_l
    logits = act.logits * last_l * (1 + setup.mtp_layers)     # each MTP module keeps its own loss
    buffers = g(engine_buffers) + act.pipeline_buffers
    # FSDP under a pipeline (grad sync "step") holds unsharded gradients through the
    # micro-batches in place of the sharded ones (states.no_sync_gradient_bytes)
    grads = g(np.where(ms.accumulated_gradients > 0, ms.accumulated_gradients, off.gradients))
    g_held = grads * persistent
    last_block = act.full_layer * has_act_l
    any_fsdp = bool(fsdp.any())
    # (masks select by multiplying: x * mask, or y + (x - y) * mask, is np.where(mask, x, y)
    # on int64 bytes, without np.where's branch per element)
    held_parts = g_held + acts        # what the moments before the end of backward share
    ps = _per_state
    fsdp_end_t: tuple[np.ndarray, np.ndarray, np.ndarray] = (ps(end_w), ps(end_a), ps(end_b))
    done_t: np.ndarray = ps(done)
    done_dense_l: np.ndarray | int = -1
    done_expert_l: np.ndarray | int = -1
    if any_fsdp:
        fsdp_l, head_l, end_a_l = g(fsdp_moment), g(head_grad), g(end_a)
        # full shard over three blocks or more: the second block in backward (one done) where a
        # block's activations outweigh its sharded gradients, else block 1 (fsdp_blocks_done)
        counted = fsdp_l & ~persistent & (grads != 0) if ft.is_full else None
        done_l, done_g, done_dense_l, done_expert_l = g(done), g(done_grads), g(done_dense), g(done_expert)
        if may_be_early.any():
            # (gradients that persist, or a frozen base's, are held whatever is done: 0 added)
            added = g(block_sharded) if counted is None else g(block_sharded) * counted
            early = g(may_be_early) & (act.layer_act > added)
            done_l = done_l + (1 - done_l) * early
            done_g = done_g + (g(block_sharded) - done_g) * early
            done_dense_l = done_dense_l + (g(block_dense) - done_dense_l) * early
            done_expert_l = done_expert_l + (g(block_expert) - done_expert_l) * early
        done_acts = saturated_bytes(np.multiply(done_l, act.layer_act, dtype=np.float64))
        end_acts = last_block + (acts - done_acts + working + head_l - last_block) * fsdp_l + end_a_l
        block_working = working + head_l
        end_grads = grads if counted is None else grads + (done_g - grads) * counted
        done_t = done_l
        end_w_l, end_b_l, fwd_w_l = g(end_w), np.maximum(buffers, g(end_b)), g(fwd_w)
        if post_ok.any():
            # the first block's post-backward where it holds more (buffers.fsdp_post_backward_bytes):
            # its activations freed, no working set, no sharded gradients yet
            post_a_l = g(post_a)
            post_acts = acts - act.layer_act + head_l + post_a_l
            post_grads = grads if counted is None else grads - grads * counted
            post_b_l = np.maximum(buffers, g(post_b))
            post = g(post_ok) & (g(post_w) + post_grads + post_acts + post_b_l
                                 > end_w_l + end_grads + end_acts + end_b_l)
            end_w_l = end_w_l + (g(post_w) - end_w_l) * post
            end_grads = end_grads + (post_grads - end_grads) * post
            end_acts = end_acts + (post_acts - end_acts) * post
            end_b_l = end_b_l + (post_b_l - end_b_l) * post
            end_a_l = end_a_l + (post_a_l - end_a_l) * post
            done_l = done_l + (1 - done_l) * post
            if counted is not None:
                counted = counted & ~post
            fsdp_end_t = (end_w_l, end_a_l, g(end_b) + (g(post_b) - g(end_b)) * post)
            done_t = done_l
        fwd_b_l = np.maximum(buffers, g(fwd_b))
        fwd_grads = ABSENT + (g_held - ABSENT) * fsdp_l
        moments = {
            "backward-start": Moment(0, g_held, acts, logits, buffers, 0),
            "block-backward": Moment(0, g_held, acts + block_working, 0, buffers, 0),
            "backward-end": Moment(end_w_l, end_grads, end_acts, 0, end_b_l, 0),
            # (summed per state: step_sum; its parts are read per state)
            "optimizer-step": Moment(_per_state(-step_freed), _per_state(off.gradients), 0, 0, 0,
                                     _per_state(step_transient)),
            "forward-end": Moment(fwd_w_l, fwd_grads, acts - act.layer_act, 0, fwd_b_l, 0),
        }
        sums = (held_parts + (logits + buffers), held_parts + (block_working + buffers),
                end_w_l + end_grads + end_acts + end_b_l, g(step_sum),
                fwd_w_l + fwd_grads + (acts - act.layer_act) + fwd_b_l)
    else:
        counted = None
        moments = {
            "backward-start": Moment(0, g_held, acts, logits, buffers, 0),
            "block-backward": Moment(0, g_held, acts + working, 0, buffers, 0),
            "backward-end": Moment(0, grads, last_block, 0, buffers, 0),
            "optimizer-step": Moment(0, _per_state(off.gradients), 0, 0, 0, _per_state(step_transient)),
            "forward-end": Moment(0, np.full(stage_l.shape, ABSENT), acts - act.layer_act, 0, buffers, 0),
        }
        sums = (held_parts + (logits + buffers), held_parts + (working + buffers), grads + last_block + buffers,
                g(step_sum), np.full(stage_l.shape, ABSENT))
    best = sums[0]
    for x in sums[1:]:
        best = np.maximum(best, x)
    tracked_slots = g(np.where(st.valid, base, ABSENT)) + best     # ABSENT: a slot the pipeline lacks
    slots = StageMemory(
        stage=stage_l, n_layers=ps(n_layers), n_act_layers=ps(n_act), rank_params=ps(rp), split=ps(split),
        states=ps(ms), offload=ps(off), expert_padding=ps(pad), grad_unit=ps(grad_unit), held=held,
        layer_act=act.layer_act, full_layer=act.full_layer, score_grad=act.score_grad, dropout_embed=dropout_embed,
        block_acts=block_acts, embed_acts=embed_acts, amp_copies=ps(amp_copies), working=working,
        last_block=last_block, logits=logits, buffers=buffers, root_gathered=ps(root_gathered),
        fp8_weights=ps(fp8_w),
        step_transient=ps(step_transient), fsdp_end=fsdp_end_t,
        fsdp_forward=(ps(fwd_w), ps(fwd_b)), fsdp_done=done_t, head_grad=ps(head_grad), step_freed=ps(step_freed),
        end_grad_params=((np.where(counted, done_dense_l, -1), np.where(counted, done_expert_l, -1))
                         if counted is not None else (-1, -1)),
        moments=moments, weights=ps(weights), moment_sums=sums, tracked=tracked_slots,
        checkpoint_host=ckpt_host)
    # the most loaded stage's total (MemoryBatch.pick): fixed costs and fragmentation on top
    # of its tracked bytes
    share = setup.overheads.fragmentation
    if share >= 0:
        tracked = tracked_slots.max(axis=0)
    else:
        slot_totals = tracked_slots + setup.overheads.fragmentation_bytes(tracked_slots)
        tracked = tracked_slots[slot_totals.argmax(axis=0), np.arange(n)]
    frag = setup.overheads.fragmentation_bytes(tracked)
    return MemoryBatch(slots=slots, total=tracked + fixed[inv] + frag, tracked=tracked, fragmentation=frag,
                       state_inv=inv, kernels=kernels_l, act_fp32=act_fp32[inv], amp_states=amp_states[inv],
                       hybrid=hybrid[inv], persistent_grads=persistent, distributed=distributed[inv],
                       ranks_per_node=ranks_per_node[inv], fixed_overhead=fixed[inv], state_precision=state_prec,
                       optimizer_bytes_per_param=opt_pp, fragmentation_share=share)


def fsdp_blocks_done(a: LayoutArrays, n_blocks: np.ndarray) -> np.ndarray:
    """Blocks whose backward is over at FSDP2's backward peak (the "backward-end" moment).

    PyTorch FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, post_backward)
    reshards a block as soon as its backward is over (reshard_after_backward defaults to
    True, whatever reshard_after_forward is), then copies its gradients into a
    reduce-scatter input that stays allocated until the next block's post-backward
    (reduce_scatter_max_input_buffers = 1). So the peak is inside the backward of the
    block after the first one that is reduced:

    - full shard (ZeRO-3): the second-to-last block in backward (block 1), with block 0
      prefetched and every later block reduced: n_blocks - 2 done. Block 0 has nothing
      to prefetch, and each block done adds only its sharded gradients. Over two blocks
      there is no block 1 with a later block reduced: 1 done, either block 0 in backward
      with block 1 reduced or block 1 in its post-backward with its activations freed
      (buffers.fsdp_two_block_bytes takes the larger; FSDPMemTracker on qwen3-235b-a22b-2l,
      llama4-scout-2l and deepseek-v3-2l, docs/accuracy.md);
    - shard-grad-op (ZeRO-2): the second block in backward (block n - 2): 1 done. Every
      block done frees its gathered 16-bit weights (2 bytes per parameter, or 4 in fp32)
      and adds sharded gradients of 4/dp bytes or less, so the total only falls after.

    Measured with FSDPMemTracker on Mixtral-8x7B (bf16-mixed): full shard on 64 ranks peaks
    in block 1's experts' backward with 30 of 32 blocks' sharded gradients; shard-grad-op
    on 8 ranks in block 30's with one block's gradients and one block's gathered weights
    freed.

    Full shard over three blocks or more, a block done frees its activations and adds its
    sharded gradients, so the total inside a block's backward runs straight between the
    second block in backward and block 1: block 1 (this count) where a block's sharded
    gradients outweigh its activations, the second block in backward (1 done) otherwise,
    which memory_batch chooses per layout (FSDPMemTracker on qwen3-235b-a22b-8l, 64 ranks,
    micro-batch 4: the peak in block 6's backward, 1.46 GiB of activations per block against
    0.145 of sharded gradients).
    """
    return np.where(a.zero_stage == 3, np.where(n_blocks == 2, 1, np.maximum(0, n_blocks - 2)),
                    np.where(n_blocks >= 2, 1, 0))


def largest_block_share(pc: ParamCount, m: ModelSpec | None = None) -> float:
    """The largest kind of block's parameters over the mean block's (1.0 when every block is
    alike): DeepSeek-V3's MoE blocks beside its first dense ones, Llama 4's interleaved MoE
    blocks (models.spec.BlockKind, counted as transformers builds them). Used for two-block
    stages (buffers.fsdp_two_block_bytes), on the model's mean block: exact without tp and ep,
    where experts and dense parts would split differently. A hybrid whose layer module holds
    several letters (``m.letters_per_block``: the unit FSDP wraps, params.block_unit) compares
    its largest module (hybrid.largest_module_params) with that many mean letters."""
    if len(pc.blocks) < 2 or pc.per_layer <= 0:
        return 1.0
    if m is not None and m.letters_per_block > 1:
        from planner.models.hybrid import largest_module_params

        return largest_module_params(m, pc) / (m.letters_per_block * pc.per_layer)
    return max(b.per_layer for b in pc.blocks) / pc.per_layer


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
