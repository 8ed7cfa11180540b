"""Communication buffers beside the model states, and FSDP2's gathered blocks and reduce
buffers at its own moments, over a batch of layouts (arrays; (slot, batch) for the
stage-dependent parameter counts ``rp`` and ``split``, shapes.ParamsArrays and SplitArrays)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout
from planner.models.spec import ModelSpec
from planner.training.setup import Precision, TrainingSetup

if TYPE_CHECKING:
    from planner.memory.shapes import ParamsArrays, SplitArrays


def buffer_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, rp: ParamsArrays,
                 precision: Precision, split: SplitArrays) -> np.ndarray:
    """Communication buffers the engine allocates beside the model states.

    ZeRO-1/2 (DeepSpeed): the gradient reduce bucket, min(bucket, params) 16-bit
    elements (DeepSpeed config "reduce_bucket_size"). DeepSpeed ZeRO-3: the gathered
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
    out = out + np.where((a.sharding == 0) & ((stage == 1) | (stage == 2)), bucket, 0)
    return out + np.where(stage == 3, np.where(a.sharding > 0, block_bytes, 2 * module_bytes + bucket), 0)


def gathered_block_bytes(rp: ParamsArrays, prec: Precision, split: SplitArrays) -> np.ndarray:
    """One block as FSDP2 gathers it: its (padded) parameters in 16 bits (in fp8 under an FP8
    recipe with float8 all-gather, Precision.gather_bytes: torchao fsdp_utils casts the shard
    before the gather; the norms' few parameters are counted at that width too), or with a
    frozen base its stored (maybe quantized) frozen bytes and its trainable parameters."""
    frozen = split.frozen_bytes != 0
    return np.where(frozen, split.block_frozen_bytes + split.block_trainable * prec.weight_bytes,
                    rp.block_unit * prec.gather_bytes)


def fsdp_backward_end_bytes(a: LayoutArrays, rp: ParamsArrays, prec: Precision, split: SplitArrays,
                            grad_unit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    grads = np.where(frozen, split.block_trainable, grad_unit)
    reduce_bytes = 4 if prec.is_mixed else prec.grad_bytes
    block_bytes = gathered_block_bytes(rp, prec, split)
    z3 = a.zero_stage == 3
    gathered = np.where(z3, block_bytes, -block_bytes)     # grad-op: resharded after its backward
    prefetch = np.where(z3, block_bytes, 0)
    return (np.where(fsdp, gathered, 0), np.where(fsdp, grads * prec.weight_bytes, 0),
            np.where(fsdp, prefetch + unit * reduce_bytes, 0))


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


def pipeline_buffer_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """Pipeline stages' send and receive buffers: one activation tensor each (one
    micro-batch, b s h a), split by tp under sequence parallelism; 0 without a pipeline
    (per shape: planner.memory.shapes)."""
    if lay.pp == 1:
        return 0
    act = lay.micro_batch * (lay.seq_len // lay.cp) * m.d_model * setup.precision_spec.activation_bytes
    return 2 * -(-act // (lay.tp if lay.sp else 1))
