"""Communication buffers beside the model states, and FSDP2's gathered blocks and reduce
buffers at its own moments, over a batch of layouts (arrays; (slot, batch) for the
stage-dependent parameter counts ``rp`` and ``split``, shapes.ParamsArrays and SplitArrays)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.models.spec import ModelSpec
from planner.training.kernels import megatron_core_profile
from planner.training.setup import Precision, TrainingSetup

if TYPE_CHECKING:
    from planner.memory.shapes import ParamsArrays, SplitArrays


def has_reduce_bucket(setup: TrainingSetup, a: LayoutArrays, kernels: np.ndarray | int | None = None) -> np.ndarray:
    """Where the engine keeps a gradient reduce bucket of its own beside the gradients (bool per
    layout): DeepSpeed's ZeRO-1/2 (reduce_bucket_size; stage_1_and_2.py copies gradients into
    its ipg bucket before reducing), not Megatron-Core's distributed optimizer (ZeRO-1 under
    Megatron-Core's profile, kernels.megatron_core_profile; ``kernels`` None: not Megatron's).

    megatron-core 0.16.1 distributed/param_and_grad_buffer.py: _ParamAndGradBuffer allocates one
    grad_data per dtype (``self.grad_data = torch.zeros(self.numel, ...)``), each bucket's
    grad_data is a view of it (_new_bucket: ``self._get(..., buffer_type=BufferType.GRAD)``), and
    start_grad_sync reduce-scatters a bucket in place into its own shard (``local_data_view`` of
    ``shard_buffer(bucket.grad_data, ...)``, ``dist_reduce_scatter_func(local_data_view,
    bucket.grad_data)``); without the distributed optimizer it all-reduces bucket.grad_data in
    place. Measured (bench/megatron_core_memory.py): the buffers' grad_data is the whole gradient
    memory. Megatron FSDP (ZeRO-2/3 under --stack megatron) keeps the bucket term: not checked."""
    zero_12 = (a.sharding == 0) & ((a.zero_stage == 1) | (a.zero_stage == 2))
    if kernels is None:
        return zero_12
    return zero_12 & ~((a.zero_stage == 1) & megatron_core_profile(setup, kernels))


def buffer_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, rp: ParamsArrays,
                 precision: Precision, split: SplitArrays, kernels: np.ndarray | int | None = None) -> np.ndarray:
    """Communication buffers the engine allocates beside the model states.

    ZeRO-1/2 (DeepSpeed): the gradient reduce bucket, min(bucket, params) 16-bit
    elements (DeepSpeed config "reduce_bucket_size"); none under Megatron-Core's distributed
    optimizer, whose buckets are views of its grad buffer (has_reduce_bucket; ``kernels``, the
    layouts' KERNELS codes, says where its profile applies). DeepSpeed ZeRO-3: the gathered
    16-bit copy of the module being computed and of the one prefetched (the largest
    module: a block, or the word embedding; "stage3_prefetch_bucket_size") and the
    reduce bucket. FSDP2 full/hybrid at the start of backward: the last block, gathered
    again for its backward (FSDPMemTracker's "all-gather" at the peak of a Llama-3-8B
    step: 436,224,512 B, one block in bf16). The root unit FSDP2 keeps gathered is
    counted with the weights, where the tracker puts it. The unsharded gradients of a
    unit before its reduce-scatter come later in backward, when most activations are
    freed.
    (Pipeline stages' send and receive buffers depend on the micro-batch:
    peak.pipeline_buffer_bytes.)
    With a frozen base (``split``, planner.training.finetune.rank_split) only trainable
    parameters have gradients to bucket, gathered blocks are as large as their stored (maybe
    quantized) weights, and bitsandbytes dequantizes one quantized weight at a time to 16
    bits (its matmul's forward and backward: ``dequantize_4bit`` then a 16-bit matmul).
    """
    wb = precision.weight_bytes
    stage = a.zero_stage
    grads = split.trainable
    block_bytes = rp.block_unit * wb
    module_bytes = rp.largest_module * wb
    out = np.zeros(np.broadcast_shapes(block_bytes.shape, stage.shape), dtype=np.int64)
    if setup.finetune.method != "full":
        block_bytes = split.block_frozen_bytes + split.block_trainable * wb
        module_bytes = np.maximum(block_bytes, np.where(rp.largest_module > rp.block_unit, module_bytes, 0))
        out = out + split.dequant_bytes
    bucket = np.minimum(setup.buffers.zero_bucket_numel, grads) * precision.grad_bytes
    out = out + np.where(has_reduce_bucket(setup, a, kernels), bucket, 0)
    return out + np.where(stage == 3, np.where(a.sharding > 0, block_bytes, 2 * module_bytes + bucket), 0)


def gathered_block_bytes(rp: ParamsArrays, prec: Precision, split: SplitArrays) -> np.ndarray:
    """One block as FSDP2 gathers it: its (padded) parameters in 16 bits (in fp8 under an FP8
    recipe with float8 all-gather, Precision.gather_bytes: torchao fsdp_utils casts the shard
    before the gather; the norms' few parameters are counted at that width too), or with a
    frozen base its stored (maybe quantized) frozen bytes and its trainable parameters."""
    frozen = split.frozen_bytes != 0
    return np.where(frozen, split.block_frozen_bytes + split.block_trainable * prec.weight_bytes,
                    rp.block_unit * prec.gather_bytes)


def block_gradient_bytes(prec: Precision, split: SplitArrays, grad_unit: np.ndarray) -> np.ndarray:
    """One block's unsharded 16-bit gradients inside its backward under FSDP2, before its
    reduce-scatter: ``grad_unit`` parameters (the block unpadded: autograd makes gradients of
    the parameters' own shapes), or with a frozen base its trainable ones only."""
    return np.where(split.frozen_bytes != 0, split.block_trainable, grad_unit) * prec.weight_bytes


def fsdp_block_backward_bytes(a: LayoutArrays, rp: ParamsArrays, prec: Precision, split: SplitArrays,
                              grad_unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2 inside the last block's backward, no block done yet (peak.block_backward_moment):
    (weights, activations) beyond the states; zeros where the sharding is not FSDP's.

    Full shard: the block is gathered again for its backward (FSDP2's pre-backward hook
    unshards it; torch 2.13 _fsdp_state.py _pre_backward -> FSDPParamGroup.pre_backward ->
    unshard), in 16 bits; the block before it is prefetched, the all-gather buffer
    buffer_bytes already counts. Shard-grad-op: every block stays gathered from forward,
    which the states count. Both: the block's unsharded 16-bit gradients (counted with
    activations, as fsdp_backward_end_bytes does); no reduce-scatter input yet (no block is
    reduced). Measured with FSDPMemTracker on bench/configs/tiny-kimi-linear.json (8 ranks,
    bf16-mixed): in every block's backward "Unsharded Param" is the root unit and that block
    in bf16 (the MLA block's 4,412,544 parameters in block 3's, 8,825,088 B beyond the root's
    16,778,240), where this moment had counted the root unit only (weights -24.4%).
    """
    fsdp = a.sharding > 0
    gathered = np.where(a.zero_stage == 3, gathered_block_bytes(rp, prec, split), 0)
    grads = block_gradient_bytes(prec, split, grad_unit)
    return np.where(fsdp, gathered, 0), np.where(fsdp, grads, 0)


def fsdp_backward_end_bytes(a: LayoutArrays, rp: ParamsArrays, prec: Precision, split: SplitArrays,
                            grad_unit: np.ndarray, n_blocks: np.ndarray | None = None,
                            largest_share: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """FSDP2 at its backward peak (peak.fsdp_blocks_done): (weights, activations, buffers)
    beyond the states; zeros where the sharding is not FSDP's.

    Full shard: the block in backward is gathered (weights, 16-bit), the next one is
    prefetched (all-gather buffer). Shard-grad-op: one block (the first in backward) is
    resharded already (weights below the states: negative), nothing is prefetched. Both:
    the block's full 16-bit gradients exist before its reduce-scatter (a working set,
    counted with activations), and the previous block's reduce-scatter input is held, in
    fp32 under mixed precision (PyTorch FSDP2 MixedPrecisionPolicy, reduce_dtype).

    Gathered, prefetched and reduce-scatter buffers are FSDP2's padded flat buffers (``rp``
    with the expert padding, see states.expert_padding); the gradients autograd makes have
    the parameters' own shapes, ``grad_unit`` parameters (the block unpadded). Measured with
    FSDPMemTracker on Mixtral-8x7B (64 ranks, each holding one of the 8 experts: padding
    8): 21.1 GiB gathered, 21.1 GiB prefetched, 42.2 GiB reduce-scatter input, but 2.7 GiB
    of block gradients (1.45B parameters in bf16), where counting them padded gave 21.1 GiB
    and a total 11.5% too high. With a frozen base the gathered block holds its stored
    (maybe quantized) weights and only the trainable parameters have gradients.
    """
    fsdp = a.sharding > 0
    frozen = split.frozen_bytes != 0
    unit = np.where(frozen, split.block_trainable, rp.block_unit)
    grads = block_gradient_bytes(prec, split, grad_unit)
    reduce_bytes = prec.fsdp_grad_bytes
    block_bytes = gathered_block_bytes(rp, prec, split)
    z3 = a.zero_stage == 3
    gathered = np.where(z3, block_bytes, -block_bytes)     # grad-op: resharded after its backward
    prefetch = np.where(z3, block_bytes, 0)
    weights, acts, bufs = gathered, grads, prefetch + unit * reduce_bytes
    share = np.ones(np.broadcast_shapes(np.shape(weights), np.shape(z3)))
    if n_blocks is not None:
        # full shard over two blocks: block 0 in backward, block 1 reduced (fsdp_two_block_bytes)
        two = fsdp & z3 & (n_blocks == 2)
        w2, a2, b2 = fsdp_two_block_bytes(block_bytes, grads, unit * reduce_bytes, largest_share)
        weights, acts, bufs = (np.where(two, x2, x) for x, x2 in ((weights, w2), (acts, a2), (bufs, b2)))
        share = np.where(two, largest_share, share)
    return (np.where(fsdp, weights, 0), np.where(fsdp, acts, 0), np.where(fsdp, bufs, 0), share)


def fsdp_two_block_bytes(block_bytes: np.ndarray, grad_bytes: np.ndarray, reduce_input_bytes: np.ndarray,
                         largest_share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FSDP2 full shard over a stage of two blocks, in block 0's backward (one block done):
    (weights, activations, buffers). Arguments are one mean block's (gathered, unsharded
    gradients, reduce-scatter input); ``largest_share`` is the largest block kind over the
    mean block (peak.largest_block_share): block 1, reduced first, is the largest kind (every
    family the planner has ends with an MoE block), block 0 the other one (2 - largest_share).

    Block 0 gathered, nothing left to prefetch, its 16-bit gradients (counted with
    activations, as backward-end does), block 1's reduce-scatter input held
    (reduce_scatter_max_input_buffers = 1), and, counted by the caller, block 1's sharded
    gradients. With blocks alike its total equals block 0's pre-backward, where its
    all-gather output is copied out beside its gathered weights: the peak of FSDPMemTracker on
    qwen3-235b-a22b-2l (32.23 GiB) and llama4-scout-2l (33.77 GiB). The other moment of two
    blocks, block 1's post-backward, is fsdp_post_backward_bytes.
    """
    fo = 2.0 - largest_share
    return ((block_bytes * fo).astype(np.int64), (grad_bytes * fo).astype(np.int64),
            (reduce_input_bytes * largest_share).astype(np.int64))


def fsdp_post_backward_bytes(a: LayoutArrays, rp: ParamsArrays, prec: Precision, split: SplitArrays,
                             grad_unit: np.ndarray, n_blocks: np.ndarray, largest_share: float = 1.0,
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """FSDP2 full shard in the first block's post-backward (the stage's last block, its
    backward over): (weights, activations, buffers, where the moment exists). The block is
    resharded before its reduce (torch 2.13 _fsdp_param_group.py post_backward: reshard()
    before foreach_reduce), so no gathered weights beyond the root; its unsharded 16-bit
    gradients (counted with activations) are copied into its fp32 reduce-scatter input, both
    held; the next block is prefetched; no block has sharded gradients yet, and the blocks
    not yet in backward keep their activations (the caller's). The last block is the
    largest kind (``largest_share``, peak.largest_block_share), the prefetched one the mean of
    the others. Measured with FSDPMemTracker on deepseek-v3-2l: the peak, 90.55 GiB, with the
    MoE block's 21.43 GiB of gradients and 42.87 GiB of reduce-scatter input beside the dense
    block's 1.09 GiB all-gather and block 0's activations. It exceeds the moment inside a later
    block's backward (fsdp_backward_end_bytes) where a block's activations outweigh a gathered
    block and the sharded gradients of the blocks done since; with a frozen base it is not
    counted (only the trainable parameters' small gradients are reduced).
    """
    frozen = split.frozen_bytes != 0
    ok = (a.sharding > 0) & (a.zero_stage == 3) & (n_blocks >= 2) & ~frozen
    reduce_bytes = prec.fsdp_grad_bytes
    fo = (n_blocks - largest_share) / np.maximum(n_blocks - 1, 1)
    block_bytes = gathered_block_bytes(rp, prec, split)
    grads = (grad_unit * prec.weight_bytes * largest_share).astype(np.int64)
    bufs = (block_bytes * fo).astype(np.int64) + (rp.block_unit * reduce_bytes * largest_share).astype(np.int64)
    zero = np.zeros(np.broadcast_shapes(np.shape(grads), np.shape(ok)), dtype=np.int64)
    return zero, np.where(ok, grads, 0), np.where(ok, bufs, 0), ok & (zero == 0)


def fsdp_forward_bytes(a: LayoutArrays, rp: ParamsArrays, prec: Precision,
                       split: SplitArrays) -> tuple[np.ndarray, np.ndarray]:
    """FSDP2 in forward, at the last block's all-gather: (weights, buffers) beyond the states.

    In forward FSDP2 keeps a block's all-gather output until the next block's all-gather
    has been copied out (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py,
    wait_for_unshard, all_gather_state: it lets the copy-out overlap the next all-gather),
    so two padded all-gather buffers exist at once. Under full shard the block before is
    gathered too (weights); under shard-grad-op every block gathered so far stays
    gathered, which the states already count. Measured with FSDPMemTracker on
    Mixtral-8x7B, 64 ranks, shard-grad-op, micro-batch 2: the peak is in the last block's
    forward, with two 21.1 GiB all-gather buffers beside every gathered block.
    """
    fsdp = a.sharding > 0
    block_bytes = gathered_block_bytes(rp, prec, split)
    return np.where(fsdp & (a.zero_stage == 3), block_bytes, 0), np.where(fsdp, 2 * block_bytes, 0)


def pipeline_buffer_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, seq_len: int) -> np.ndarray:
    """Pipeline stages' send and receive buffers, per layout of ``a`` (sequence ``seq_len``):
    one activation tensor each (one micro-batch, b s h a), split by tp under sequence
    parallelism; 0 without a pipeline. In int64, exact at the input limits: 2 x 4,096 x 4M
    positions x 10^7 wide x 4 bytes (training.setup.MAX_MICRO_BATCH, MAX_SEQ_LEN; limits.MAX_MODEL_DIM) is
    1.4e18 < 2^63."""
    act = a.micro_batch * a.seq_len_per_rank(seq_len) * m.d_model * setup.precision_spec.activation_bytes
    return np.where(a.pp > 1, 2 * -(-act // np.where(a.sp, a.tp, 1)), 0)
