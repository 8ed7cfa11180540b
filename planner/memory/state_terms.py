"""The terms of the memory model that depend only on a layout's state (its degrees and
sharding, peak.STATE_FIELDS), computed once per distinct state of a batch: the stage slots,
the rank's parameters and their fine-tuning split, the model states and where offload puts
them, the weights every moment holds, the engine's buffers, the optimizer step's
temporaries, and FSDP2's pieces of its end-of-backward and end-of-forward moments.

Every array is (slot, state) or (state,): planner.memory.peak reads them per layout
(through the batch's state index) and sums them into the moments of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.memory import shapes as sh
from planner.memory.buffers import (
    buffer_bytes,
    fsdp_backward_end_bytes,
    fsdp_block_backward_bytes,
    fsdp_forward_bytes,
    fsdp_post_backward_bytes,
)
from planner.memory.fp8 import fp8_weight_bytes
from planner.memory.params import block_units, optimizer_state_bytes
from planner.memory.states import (
    ModelStates,
    OffloadSplit,
    expert_padding,
    fp32_accumulated_gradients,
    gradient_bytes,
    model_state_bytes,
    offload_bytes,
    optimizer_step_transient_bytes,
    shard_degrees,
    sharded_frozen_bytes,
)
from planner.models.spec import ModelSpec, ParamCount
from planner.training.kernels import block_kernel_codes, replicated_ranks
from planner.training.layer_precision import stage_bf16_layers
from planner.training.setup import Precision, TrainingSetup


@dataclass(frozen=True, slots=True)
class FsdpStateTerms:
    """FSDP2's pieces of the end of backward and the end of forward, per state (bytes; 0
    where a layout is not FSDP or its stage keeps no activations). ``done``: the blocks whose
    backward is over at the moment (fsdp_blocks_done), with their sharded gradients
    (``done_grads``) and parameters (``done_dense``, ``done_expert``); ``block_*``: one
    block's; ``end_*``: the moment inside a block's backward (buffers.fsdp_backward_end_bytes),
    ``post_*``: the first block's post-backward, the other candidate for mixed block kinds
    (buffers.fsdp_post_backward_bytes); ``forward_*``: the last block's all-gather in forward;
    ``last_*``: inside the last block's backward, none done (buffers.fsdp_block_backward_bytes)."""

    moment: np.ndarray              # bool: FSDP and the stage keeps activations
    head_grad: np.ndarray | int     # the LM head's unsharded gradient, held through backward
    done: np.ndarray
    done_grads: np.ndarray
    done_dense: np.ndarray
    done_expert: np.ndarray
    may_be_early: np.ndarray        # bool: full shard over three blocks or more
    block_sharded_grads: np.ndarray
    block_dense: np.ndarray
    block_expert: np.ndarray
    end_weights: np.ndarray
    end_activations: np.ndarray
    end_buffers: np.ndarray
    post_ok: np.ndarray             # bool
    post_weights: np.ndarray
    post_activations: np.ndarray
    post_buffers: np.ndarray
    forward_weights: np.ndarray
    forward_buffers: np.ndarray
    last_weights: np.ndarray
    last_activations: np.ndarray


@dataclass(frozen=True, slots=True)
class StateTerms:
    """The per-state terms of a batch ((slot, state) arrays, or (state,) for the facts that do
    not depend on the stage), in bytes unless named otherwise."""

    valid: np.ndarray               # bool: the pipeline has this stage slot
    stage: np.ndarray
    n_layers: np.ndarray
    n_act_layers: np.ndarray
    last: np.ndarray                # bool: the last pipeline stage
    has_act: np.ndarray             # bool: the stage keeps activations
    rank_params: sh.ParamsArrays    # gathered blocks with their padded experts
    split: sh.SplitArrays
    states: ModelStates
    offload: OffloadSplit
    expert_padding: np.ndarray      # float
    grad_unit: np.ndarray           # a block's parameters, unpadded (its gradients' shapes)
    amp_copies: np.ndarray
    engine_buffers: np.ndarray
    root_gathered: np.ndarray
    fp8_weights: np.ndarray
    weights: np.ndarray             # every moment's weights (before a moment's extra)
    base: np.ndarray                # weights and optimizer states: what every moment holds
    step_transient: np.ndarray
    step_freed: np.ndarray          # FSDP2's gathered weights, resharded before the step
    fsdp: FsdpStateTerms
    # the facts that do not depend on the stage, (state,)
    is_fsdp: np.ndarray             # bool
    dense_shard_degree: np.ndarray
    kernels: np.ndarray             # shapes.KERNELS codes of the blocks' kernels
    act_fp32: np.ndarray            # bool
    amp_states: np.ndarray          # bool
    hybrid: np.ndarray
    distributed: np.ndarray         # bool
    ranks_per_node: np.ndarray
    fixed_overhead: np.ndarray
    state_precision: Precision
    optimizer_bytes_per_param: float


def state_terms(m: ModelSpec, setup: TrainingSetup, sa: LayoutArrays, pc: ParamCount,
                gpus_per_node: int) -> StateTerms:
    """The terms of the distinct states ``sa`` (one layout per state: its micro-batch,
    accumulation, virtual stages and recomputation are not read)."""
    prec = setup.precision_spec
    ft = setup.finetune
    lora16 = ft.has_16_bit_adapters
    fsdp = sa.sharding > 0
    full_shard = fsdp & (sa.zero_stage == 3)
    dense_deg = sa.dense_shard_degree
    n_gpus = sa.n_gpus
    # the kernels each layout's blocks run: the stack's, or --kernels' (training.kernels, the
    # rule the step time reads too)
    whole = replicated_ranks(sa.zero_stage, fsdp)
    kern = block_kernel_codes(setup, sa.tp, sa.pp, sa.cp, whole)
    autocast = kern == sh.AMP
    # trainable parameters kept in fp32 with fp32 gradients: everything under autocast; and
    # with a frozen base on replicated ranks, PEFT's adapters (autocast_adapter_dtype) and
    # freeze's trainable blocks (upcast, as LLaMA-Factory does) whatever the precision.
    # QLoRA's adapters are 16-bit. A frozen base loaded in 16 bits gives a 16-bit residual
    # stream, so its activations are those of eager kernels.
    replicated = whole & (kern != sh.FUSED)
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

    # every stage that can be the most loaded: (slot, state) arrays
    st = sh.stage_figures(m, pc, setup, sa)
    stage, n_layers, n_act = st.stage, st.n_layers, st.n_act_layers
    rp, split = st.rank_params, st.split
    last = stage == sa.pp - 1
    pad = expert_padding(m, sa, hybrid)
    # Megatron FSDP over distributed-optimizer instances holds its model weights in 16 bits, or as
    # the FP8 copies of fp8_param_gather (fp8_w below)
    ms = model_state_bytes(split.trainable_dense, split.trainable_expert, state_prec, opt_pp, sa, hybrid,
                           amp=amp_states, expert_padding=pad, grad_sync=setup.fsdp_pipeline_grad_sync,
                           instance_weight_bytes=0 if setup.fp8_param_gather else prec.weight_bytes)
    fp32_grads = fp32_accumulated_gradients(setup, sa)
    if fp32_grads.any():    # DeepSpeed's BF16_Optimizer: 4-byte gradients, unsharded (ZeRO-0/1)
        ms = replace(ms, gradients=np.where(fp32_grads, ms.gradients * 4 // max(state_prec.grad_bytes, 1),
                                            ms.gradients))
    grad_unit = rp.block_unit     # a block's gradients have its parameters' shapes: never padded
    if m.is_moe:
        # gathered blocks carry the padded experts too
        padded = (pad > 1) & (n_layers > 0)
        extra = (rp.expert / np.maximum(block_units(m, n_layers), 1) * (pad - 1)).astype(np.int64)
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
    fp8_w = fp8_weight_bytes(m, prec, rp.total - rp.root_unit, n_layers, sa.ep, setup.fp8_param_gather,
                             stage_bf16_layers(stage, sa.pp, n_layers, setup.bf16_layers))
    if setup.stack == "megatron":
        # Megatron FSDP (ZeRO-3 sharding) keeps the low-precision weights in its sharded buffer
        # and gathers them per module (Megatron-Bridge's FP8/MXFP8 recipes set fp8_param_gather,
        # training/mixed_precision.py): the copies are sharded like the weights, not cached whole; over several
        # distributed-optimizer instances, over one instance's ranks (LayoutArrays.hybrid_shard)
        over = np.where(sa.instances > 1, hybrid, dense_deg)
        fp8_w = np.where(sa.zero_stage == 3, -(-fp8_w // np.maximum(over, 1)), fp8_w)
    weights = off.weights + ms.unsharded_weights + root_gathered + fp8_w
    step_transient = np.where(off.step_on_host, 0,
                              optimizer_step_transient_bytes(m, setup, sa, kern, rp, hybrid, split))
    # FSDP2 reshards every unit after its backward, the root and shard-grad-op's blocks
    # too (reshard_after_backward): no gathered weights are left at the optimizer step
    step_freed = np.where(fsdp, ms.unsharded_weights + root_gathered, 0)
    fsdp_terms = _fsdp_state_terms(m, setup, sa, pc, st, rp, split, grad_unit, has_act, last, vocab_shard,
                                   state_prec, hybrid, pad)
    return StateTerms(
        valid=st.valid, stage=stage, n_layers=n_layers, n_act_layers=n_act, last=last, has_act=has_act,
        rank_params=rp, split=split, states=ms, offload=off, expert_padding=pad, grad_unit=grad_unit,
        amp_copies=amp_copies, engine_buffers=engine_buffers, root_gathered=root_gathered, fp8_weights=fp8_w,
        weights=weights, base=weights + off.optimizer, step_transient=step_transient, step_freed=step_freed,
        fsdp=fsdp_terms, is_fsdp=fsdp, dense_shard_degree=dense_deg, kernels=kernels, act_fp32=act_fp32,
        amp_states=amp_states, hybrid=hybrid, distributed=distributed,
        ranks_per_node=np.minimum(n_gpus, gpus_per_node), fixed_overhead=setup.overheads.fixed_bytes(distributed),
        state_precision=state_prec, optimizer_bytes_per_param=opt_pp)


def _fsdp_state_terms(m: ModelSpec, setup: TrainingSetup, sa: LayoutArrays, pc: ParamCount, st: sh.StageFigures,
                      rp: sh.ParamsArrays, split: sh.SplitArrays, grad_unit: np.ndarray, has_act: np.ndarray,
                      last: np.ndarray, vocab_shard: np.ndarray, state_prec: Precision,
                      hybrid: np.ndarray, pad: np.ndarray) -> FsdpStateTerms:
    """FSDP2's pieces of its end-of-backward and end-of-forward moments (FsdpStateTerms)."""
    prec = setup.precision_spec
    ft = setup.finetune
    fsdp = sa.sharding > 0
    n_layers, n_act = st.n_layers, st.n_act_layers
    # FSDP2 reduce-scatters the root unit (embedding, final norm, LM head) in its own
    # post-backward, after every block: the LM head's unsharded gradient, made first in
    # backward, is held to the end of it (FSDPMemTracker on Llama-3-8B cut to 4 blocks,
    # fp32, 8 ranks: 3.10 GiB of temporaries in every block's backward, 1.47 GiB less
    # with a quarter of the vocabulary: (128,256 - 32,064) x 4096 x 4 B)
    head_grad = np.where(fsdp & last & has_act, vocab_shard * prec.weight_bytes, 0) if ft.is_full else 0 * st.stage
    # FSDP2's moment is inside one block's backward (fsdp_blocks_done): the blocks done
    # have freed their activations, and only they have reduced (sharded) gradients
    fsdp_moment = fsdp & has_act
    # counted in the blocks FSDP2 wraps, not in the pattern's letters (params.block_units: a
    # Qwen3-Next or Kimi Linear decoder layer is two letters)
    n_units, n_l = block_units(m, n_act), np.maximum(block_units(m, n_layers), 1)
    done = np.where(fsdp_moment, fsdp_blocks_done(sa, n_units), 0)
    block_dense, block_expert = (rp.dense - rp.root_unit) // n_l, rp.expert // n_l
    # (two-block stages: the moment's blocks by kind, buffers.fsdp_two_block_bytes)
    share = largest_block_share(pc, m)
    end_w, end_a, end_b, done_share = fsdp_backward_end_bytes(sa, rp, prec, split, grad_unit, n_units, share)
    end_w, end_a, end_b = (np.where(has_act, x, 0) for x in (end_w, end_a, end_b))
    # the first block's post-backward, the other candidate for the backward-end moment
    post_w, post_a, post_b, post_ok = fsdp_post_backward_bytes(sa, rp, prec, split, grad_unit, n_units, share)
    # (with blocks alike it holds less than the moment above: a gathered block and one block's
    # sharded gradients less, buffers.fsdp_post_backward_bytes; so only for mixed block kinds)
    post_ok = post_ok & fsdp_moment & (share != 1.0) if ft.is_full else post_ok & False
    # one block's sharded gradients: a later block's backward holds more where they outweigh its
    # activations (fsdp_blocks_done), an early one otherwise
    degrees = shard_degrees(sa, hybrid)
    block_sharded = gradient_bytes(block_dense, block_expert, state_prec, sa, hybrid, expert_padding=pad,
                                   degrees=degrees)
    may_be_early = fsdp_moment & (sa.zero_stage == 3) & (n_units >= 3)
    done_dense = (done * block_dense * done_share).astype(np.int64)
    done_expert = (done * block_expert * done_share).astype(np.int64)
    done_grads = gradient_bytes(done_dense, done_expert, state_prec, sa, hybrid, expert_padding=pad,
                                degrees=degrees)
    fwd_w, fwd_b = (np.where(fsdp_moment, x, 0) for x in fsdp_forward_bytes(sa, rp, prec, split))
    last_w, last_a = (np.where(fsdp_moment, x, 0) for x in fsdp_block_backward_bytes(sa, rp, prec, split, grad_unit))
    return FsdpStateTerms(
        moment=fsdp_moment, head_grad=head_grad, done=done, done_grads=done_grads, done_dense=done_dense,
        done_expert=done_expert, may_be_early=may_be_early, block_sharded_grads=block_sharded,
        block_dense=block_dense, block_expert=block_expert, end_weights=end_w, end_activations=end_a,
        end_buffers=end_b, post_ok=post_ok, post_weights=post_w, post_activations=post_a, post_buffers=post_b,
        forward_weights=fwd_w, forward_buffers=fwd_b, last_weights=last_w, last_activations=last_a)


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
