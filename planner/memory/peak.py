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
Mixtral-8x7B and Llama-3-8B, docs/accuracy.md): "backward-end" is inside the backward of
one block (fsdp_blocks_done: near the end under full shard, the second block under
shard-grad-op), with the gradients of the blocks done only; "forward-end" is the last
block's all-gather in forward, two all-gather buffers at once; at the optimizer step every
unit is resharded, so no gathered weights are left; and the LM head's unsharded gradient is
held through backward (the root unit is reduced last).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import SHARDINGS
from planner.memory import shapes as sh
from planner.memory.buffers import buffer_bytes, fsdp_backward_end_bytes, fsdp_forward_bytes
from planner.memory.states import (
    ModelStates,
    OffloadSplit,
    expert_padding,
    hybrid_degree,
    model_state_bytes,
    offload_bytes,
    optimizer_step_transient_bytes,
    sharded_frozen_bytes,
)
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.setup import Precision, TrainingSetup

# the moments of a step, in the order the peak is chosen among equals (and a step goes:
# MOMENTS_IN_STEP_ORDER)
MOMENTS = ("backward-start", "block-backward", "backward-end", "optimizer-step", "forward-end")
MOMENTS_IN_STEP_ORDER = ("forward-end", "backward-start", "block-backward", "backward-end", "optimizer-step")
# what a moment holds beyond the weights and optimizer states every moment holds
MOMENT_PARTS = ("extra_weights", "gradients", "activations", "logits", "buffers", "step_temporaries")
ABSENT = -(2**62)     # a moment or stage a layout does not have: below any other


@dataclass(frozen=True, slots=True)
class Moment:
    """What one moment of the step holds beyond the weights and optimizer states (bytes,
    arrays over the batch; ABSENT in ``gradients`` where a layout has no such moment)."""

    extra_weights: np.ndarray
    gradients: np.ndarray
    activations: np.ndarray
    logits: np.ndarray
    buffers: np.ndarray
    step_temporaries: np.ndarray

    def sum(self) -> np.ndarray:
        return (self.extra_weights + self.gradients + self.activations + self.logits + self.buffers
                + self.step_temporaries)

    def take(self, idx: np.ndarray, cols: np.ndarray) -> Moment:
        return Moment(*(getattr(self, f)[idx, cols] for f in MOMENT_PARTS))


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Every named term of the model on one stage of each layout of a batch (arrays over the
    batch, or (slot, batch) on the way): its parameters and their fine-tuning split, the
    model states and where offload puts them, the activations, the loss, the buffers, and
    the moments. ``phase`` indexes MOMENTS."""

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
    embed_acts: np.ndarray
    amp_copies: np.ndarray
    working: np.ndarray
    last_block: np.ndarray
    logits: np.ndarray
    buffers: np.ndarray
    root_gathered: np.ndarray
    step_transient: np.ndarray
    fsdp_end: tuple[np.ndarray, np.ndarray, np.ndarray]      # weights, activations, buffers
    fsdp_forward: tuple[np.ndarray, np.ndarray]               # weights, buffers
    fsdp_done: np.ndarray
    head_grad: np.ndarray
    step_freed: np.ndarray
    end_grad_params: tuple[np.ndarray, np.ndarray]            # (dense, expert), -1 where not counted
    moments: dict[str, Moment]
    weights: np.ndarray               # every moment's weights (before a moment's extra)
    phase: np.ndarray
    tracked: np.ndarray
    fragmentation: np.ndarray
    total: np.ndarray


@dataclass(frozen=True)
class MemoryBatch:
    """The memory of the most loaded rank of each layout of a batch: every stage slot's
    terms (``slots``, (slot, batch) arrays), the most loaded slot of each layout (``pick``),
    and per layout the facts that do not depend on the stage. ``at`` holds the chosen
    stage's terms (built on first use); ``term()`` picks one. ``kernels`` indexes
    shapes.KERNELS; ``hybrid`` is 0 where FSDP does not shard hybrid."""

    slots: StageMemory
    pick: np.ndarray
    total: np.ndarray
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

    def __len__(self) -> int:
        return len(self.total)

    def term(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The chosen stage's term ``name`` ("offload.host_bytes", "moments.backward-end.gradients"),
        per layout (at ``rows``, default every layout)."""
        x: object = self.slots
        for part in name.split("."):
            x = x[part] if isinstance(x, dict) else getattr(x, part)
        assert isinstance(x, np.ndarray)
        cols = np.arange(len(self)) if rows is None else rows
        picked = _pick(x, self.pick[cols], cols)
        assert isinstance(picked, np.ndarray)
        return picked

    def pick_phase(self, rows: np.ndarray) -> np.ndarray:
        """The peak moment (an index into MOMENTS) of the chosen stage at ``rows``."""
        return self.term("phase", rows)

    @cached_property
    def at(self) -> StageMemory:
        cols = np.arange(len(self))
        out = _pick(self.slots, self.pick, cols)
        assert isinstance(out, StageMemory)
        return out


def _pick(x: object, idx: np.ndarray, cols: np.ndarray) -> object:
    """Row ``idx[j]`` of column j of a (slot, batch) array (broadcast from (slot, 1) or
    (1, batch)) or of every array in a tuple or dataclass of them; per-layout arrays as they
    are."""
    if isinstance(x, np.ndarray):
        if x.ndim < 2:
            return x[cols] if len(x) != len(cols) or len(cols) < len(x) else x
        if x.shape[0] == 1:
            return x[0, cols] if x.shape[1] > 1 else np.broadcast_to(x[0, 0], cols.shape)
        return x[idx, 0] if x.shape[1] == 1 else x[idx, cols]
    if isinstance(x, tuple):
        return tuple(_pick(v, idx, cols) for v in x)
    if isinstance(x, dict):
        return {k: _pick(v, idx, cols) for k, v in x.items()}
    if isinstance(x, Moment):
        return x.take(idx, cols)
    return type(x)(**{f.name: _pick(getattr(x, f.name), idx, cols) for f in fields(x)})  # type: ignore[arg-type]


def memory_batch(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
                 gpus_per_node: int = 8, seq_len: int | None = None) -> MemoryBatch:
    """The peak memory of the most loaded rank of every layout of ``a`` (valid layouts of
    sequence ``seq_len``, default the set-up's), by term, moment and stage."""
    pc = pc or count_params(m)
    seq = setup.seq_len if seq_len is None else seq_len
    n = len(a)
    prec = setup.precision_spec
    ft = setup.finetune
    lora16 = ft.is_lora and ft.adapter_bits == 16
    fsdp = a.sharding > 0
    full_shard = fsdp & (a.zero_stage == 3)
    dense_deg = a.dp * a.cp * a.ep
    n_gpus = dense_deg * a.tp * a.pp
    # fused (Megatron-style), eager (PyTorch ops in the compute dtype, as under FSDP's or
    # DeepSpeed's 16-bit parameters) or amp (eager ops under torch.autocast with fp32
    # parameters: what DDP and the Hugging Face Trainer run for replicated mixed precision)
    if setup.kernels == "auto":
        kern = np.where((a.tp > 1) | (a.pp > 1) | (a.cp > 1), sh.FUSED, sh.EAGER)
    else:
        kern = np.full(n, sh.KERNELS.index(setup.kernels), dtype=np.int64)
    if prec.is_mixed:
        kern = np.where((kern == sh.EAGER) & (a.sharding == 0) & (a.zero_stage == 0), sh.AMP, kern)
    autocast = kern == sh.AMP
    # trainable parameters kept in fp32 with fp32 gradients: everything under autocast; and
    # with a frozen base on replicated ranks, PEFT's adapters (autocast_adapter_dtype) and
    # freeze's trainable blocks (upcast, as LLaMA-Factory does) whatever the precision.
    # QLoRA's adapters are 16-bit. A frozen base loaded in 16 bits gives a 16-bit residual
    # stream, so its activations are those of eager kernels.
    replicated = (a.sharding == 0) & (a.zero_stage == 0) & (kern != sh.FUSED)
    fp32_trainables = replicated & (not ft.is_full and not lora16)
    amp_states = (autocast & (not lora16)) | fp32_trainables
    kernels = np.where(autocast, sh.EAGER, kern) if not ft.is_full else kern
    # QLoRA: 16-bit adapters with no master copy, updated by paged 8-bit AdamW
    state_prec = Precision.named("bf16") if lora16 else prec
    opt_pp = sh.optimizer_bytes_per_param(m, "adam8bit" if ft.paged_8bit_optimizer else setup.optimizer)
    if setup.optimizer_state_bytes is not None:
        opt_pp = setup.optimizer_state_bytes
    # freeze on replicated ranks upcasts the trainable blocks to fp32: in pure 16-bit
    # training (no autocast) their activations are fp32 too
    if ft.method == "freeze" and prec.activation_bytes < 4:
        act_fp32 = fp32_trainables & ~autocast
    else:
        act_fp32 = np.zeros(n, dtype=bool)
    act = sh.activation_figures(m, setup, a, seq, kernels, act_fp32)
    hybrid = hybrid_degree(a, gpus_per_node)
    persistent = (a.grad_accum > 1) | (a.pp > 1) | (~fsdp & (dense_deg > 1))
    distributed = n_gpus > 1
    ranks_per_node = np.minimum(n_gpus, gpus_per_node)
    fixed = np.where(distributed, setup.overheads.fixed_bytes(True), setup.overheads.fixed_bytes(False))
    dropout_embed = a.micro_batch * (seq // a.cp) * m.d_model if m.hidden_dropout > 0 else np.zeros(n, np.int64)

    # ---- every stage that can be the most loaded: (slot, batch) arrays
    st = sh.stage_figures(m, pc, setup, a)
    valid = st.valid
    stage, n_layers, n_act = st.stage, st.n_layers, st.n_act_layers
    rp, split = st.rank_params, st.split
    last = stage == a.pp - 1
    pad = expert_padding(m, a, hybrid)
    ms = model_state_bytes(split.trainable_dense, split.trainable_expert, state_prec, opt_pp, a, hybrid,
                           amp=amp_states, expert_padding=pad)
    grad_unit = rp.block_unit     # a block's gradients have its parameters' shapes: never padded
    if m.is_moe:
        # gathered blocks carry the padded experts too
        padded = (pad > 1) & (n_layers > 0)
        extra = (rp.expert / np.maximum(n_layers, 1) * (pad - 1)).astype(np.int64)
        rp = rp.replace(block_unit=np.where(padded, rp.block_unit + extra, rp.block_unit))
    held = sh.in_flight_microbatches(a, stage)
    block_acts = (n_act * act.layer_act * held).astype(np.int64)
    embed_acts = ((dropout_embed * held).astype(np.int64) * (stage == 0)) if ft.is_full else np.zeros_like(stage)
    vocab_shard = -(-(m.vocab_size * m.d_model) // a.tp)
    amp_copies = np.zeros_like(stage)
    if ft.is_full:
        # autocast's 16-bit copies of every matmul weight, kept for backward
        amp_copies = np.where(kernels == sh.AMP, 2 * (rp.total - np.where(stage == 0, vocab_shard, 0)
                                                      - n_layers * pc.norms_per_layer), 0)
    else:
        amp_copies = np.where(autocast & amp_states, 2 * split.trainable, 0)   # copies of the fp32 trainables
    acts = block_acts + embed_acts + amp_copies
    has_act = n_act > 0
    # inside the last block's backward: its recomputed tensors and its gradients' working
    # set (the eager attention's fp32 score gradients)
    working = np.where(has_act, (act.full_layer - act.layer_act) + act.score_grad, 0)
    logits = np.where(last, act.logits, 0)
    buffers = buffer_bytes(m, setup, a, seq, rp, prec, split)
    off = offload_bytes(setup, a, ms, sharded_frozen_bytes(split, a, hybrid), split, prec, hybrid)
    # FSDP2 keeps the root unit gathered
    root_gathered = np.where(full_shard, rp.root_unit * prec.weight_bytes, 0)
    weights = off.weights + ms.unsharded_weights + root_gathered
    step_transient = np.where(off.step_on_host, 0,
                              optimizer_step_transient_bytes(m, setup, a, kern, rp, hybrid, split))
    g_held = np.where(persistent, off.gradients, 0)
    end_w, end_a, end_b = (np.where(has_act, x, 0) for x in fsdp_backward_end_bytes(a, rp, prec, split, grad_unit))
    last_block = np.where(has_act, act.full_layer, 0)
    # FSDP2 reduce-scatters the root unit (embedding, final norm, LM head) in its own
    # post-backward, after every block: the LM head's unsharded gradient, made first in
    # backward, is held to the end of it (FSDPMemTracker on Llama-3-8B cut to 4 blocks,
    # fp32, 8 ranks: 3.10 GiB of temporaries in every block's backward, 1.47 GiB less
    # with a quarter of the vocabulary: (128,256 - 32,064) x 4096 x 4 B)
    head_grad = (np.where(fsdp & last & has_act, vocab_shard * prec.weight_bytes, 0) if ft.is_full
                 else np.zeros_like(stage))
    # FSDP2 reshards every unit after its backward, the root and shard-grad-op's blocks
    # too (reshard_after_backward): no gathered weights are left at the optimizer step
    step_freed = np.where(fsdp, ms.unsharded_weights + root_gathered, 0)
    # FSDP2's moment is inside one block's backward (fsdp_blocks_done): the blocks done
    # have freed their activations, and only they have reduced (sharded) gradients
    fsdp_moment = fsdp & has_act
    done = np.where(fsdp_moment, fsdp_blocks_done(a, n_act), 0)
    end_acts = np.where(fsdp_moment, acts - done * act.layer_act + working + end_a + head_grad, last_block + end_a)
    end_grads = off.gradients
    end_dense = end_expert = np.full_like(stage, -1)
    if ft.is_full:
        counted = fsdp_moment & ~persistent & (off.gradients != 0)
        n_l = np.maximum(n_layers, 1)
        end_dense = np.where(counted, done * ((rp.dense - rp.root_unit) // n_l), -1)
        end_expert = np.where(counted, done * (rp.expert // n_l), -1)
        done_grads = model_state_bytes(np.maximum(end_dense, 0), np.maximum(end_expert, 0), state_prec, opt_pp, a,
                                       hybrid, expert_padding=pad).gradients
        end_grads = np.where(counted, done_grads, off.gradients)
    fwd_w, fwd_b = fsdp_forward_bytes(a, rp, prec, split)
    moments = {
        "backward-start": Moment(np.zeros_like(stage), g_held, acts, logits, buffers, np.zeros_like(stage)),
        "block-backward": Moment(np.zeros_like(stage), g_held, acts + working + head_grad, np.zeros_like(stage),
                                 buffers, np.zeros_like(stage)),
        "backward-end": Moment(end_w, end_grads, end_acts, np.zeros_like(stage), np.maximum(buffers, end_b),
                               np.zeros_like(stage)),
        "optimizer-step": Moment(-step_freed, off.gradients, np.zeros_like(stage), np.zeros_like(stage),
                                 np.zeros_like(stage), step_transient),
        "forward-end": Moment(np.where(fsdp_moment, fwd_w, 0), np.where(fsdp_moment, g_held, ABSENT),
                              acts - act.layer_act, np.zeros_like(stage), np.maximum(buffers, fwd_b),
                              np.zeros_like(stage)),
    }
    sums = np.stack([moments[k].sum() for k in MOMENTS])                  # (moment, slot, batch)
    phase = sums.argmax(axis=0)                                           # the first of equals
    best = np.take_along_axis(sums, phase[None], axis=0)[0]
    tracked = weights + off.optimizer + best
    frag = (tracked * setup.overheads.fragmentation).astype(np.int64)
    total = np.where(valid, tracked + fixed + frag, ABSENT)
    slots = StageMemory(
        stage=stage, n_layers=n_layers, n_act_layers=n_act, rank_params=rp, split=split, states=ms, offload=off,
        expert_padding=pad, grad_unit=grad_unit, held=held, layer_act=act.layer_act, full_layer=act.full_layer,
        score_grad=act.score_grad, dropout_embed=dropout_embed, block_acts=block_acts, embed_acts=embed_acts,
        amp_copies=amp_copies, working=working, last_block=last_block, logits=logits, buffers=buffers,
        root_gathered=root_gathered, step_transient=step_transient, fsdp_end=(end_w, end_a, end_b),
        fsdp_forward=(np.where(fsdp_moment, fwd_w, 0), np.where(fsdp_moment, fwd_b, 0)), fsdp_done=done,
        head_grad=head_grad, step_freed=step_freed, end_grad_params=(end_dense, end_expert), moments=moments,
        weights=weights, phase=phase, tracked=tracked, fragmentation=frag, total=total)
    # the most loaded stage: the first of equals, in stage order
    pick = total.argmax(axis=0)
    cols = np.arange(n)
    return MemoryBatch(slots=slots, pick=pick, total=total[pick, cols], kernels=kernels, act_fp32=act_fp32, amp_states=amp_states, hybrid=hybrid,
                       persistent_grads=persistent, distributed=distributed, ranks_per_node=ranks_per_node,
                       fixed_overhead=fixed, state_precision=state_prec, optimizer_bytes_per_param=opt_pp)


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
      to prefetch, and each block done adds only its sharded gradients;
    - shard-grad-op (ZeRO-2): the second block in backward (block n - 2): 1 done. Every
      block done frees its gathered 16-bit weights (2 bytes per parameter, or 4 in fp32)
      and adds sharded gradients of 4/dp bytes or less, so the total only falls after.

    Measured with FSDPMemTracker on Mixtral-8x7B (bf16-mixed): full shard on 64 ranks peaks
    in block 1's experts' backward with 30 of 32 blocks' sharded gradients; shard-grad-op
    on 8 ranks in block 30's with one block's gradients and one block's gathered weights
    freed.
    """
    return np.where(a.zero_stage == 3, np.maximum(0, n_blocks - 2), np.where(n_blocks >= 2, 1, 0))


__all__ = ["MOMENTS", "MOMENTS_IN_STEP_ORDER", "MOMENT_PARTS", "Moment", "StageMemory", "MemoryBatch",
           "memory_batch", "fsdp_blocks_done", "SHARDINGS"]
