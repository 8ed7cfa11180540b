"""One block's step-time figures per block shape: its compute seconds with its recomputation
and its collective volumes (LayerTime), over arrays of block shapes (layer_time_table, which
the block tables of timing.stage read once per batch of new shapes, block_table) and for one
shape (layer_time, layer_time_values: a column of the same table). The part of a block's time
that its recomputation does not change is kernels.block_compute_s's, once per shape."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import Cluster
from planner.layouts.batch import RECOMPUTES
from planner.layouts.groups import group
from planner.layouts.layout import Layout, expert_tp_size
from planner.models.hybrid import mtp_depth
from planner.models.matmuls import mtp_eh_proj
from planner.models.spec import ModelSpec
from planner.timing.efficiency import CROSS_ENTROPY_BYTES_PER_LOGIT, CROSS_ENTROPY_FORWARD_SHARE, Efficiency
from planner.timing.flops import with_mtp
from planner.timing.host_link import activation_offload_exposed_s
from planner.timing.kernels import BlockShapes, block_compute_s, gemm_time_s, head_backward_gemms, rates
from planner.timing.mamba import attention_share, dispatch_width, moe_share, tp_collectives_per_layer
from planner.training.kernels import selective_policy
from planner.training.layer_precision import bf16_layer_setup
from planner.training.moe_runtime import a2a_overlapped
from planner.training.setup import TrainingSetup

FULL, SELECTIVE = RECOMPUTES.index("full"), RECOMPUTES.index("selective")


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerTime:
    """One block, one micro-batch, one rank: compute seconds (forward, backward with its
    recomputation) and the bytes each tensor-, context- and expert-parallel collective moves."""

    fwd_s: float
    bwd_s: float
    attention_fwd_s: float         # the part of fwd_s that ring attention can hide K/V sends under
    tp_bytes: float                # one activation (tokens x d_model) the tp collectives move
    tp_collectives: float          # all-reduce equivalents per micro-batch, forward+backward+recompute
    cp_bytes: float                # K and V of the local chunk, sent cp-1 times per pass
    cp_passes: float
    ep_bytes: float                # tokens routed out by one all-to-all
    ep_all_to_alls: float
    ep_hidden_share: float         # the share of them hidden under compute (training.moe_runtime)


LAYER_TIME_FIELDS = tuple(f.name for f in fields(LayerTime))


@lru_cache(maxsize=8192)
def layer_time(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str, gpu: GpuSpec,
               eff: Efficiency) -> LayerTime:
    """Compute time of one block for one micro-batch on one rank, and its collective volumes.

    GEMMs (per rank, T = micro-batch x seq/cp tokens): QKV T x h x (q+2kv)/tp, output
    T x q/tp x h, MLP T x h x f/tp (x2 gated) and T x f/tp x h; MoE experts see T k ep / E
    tokens each, E/ep of them per rank. With expert tensor parallelism etp (Layout.expert_tp,
    tp by default) megatron-core 0.16.1's MoEAlltoAllTokenDispatcher all-to-alls each rank's
    T/tp sequence-parallel tokens over ep and all-gathers them over the etp group only
    (transformer/moe/token_dispatcher.py: token_dispatch's all_to_all on ep_group, line 666,
    then dispatch_postprocess's gather_from_sequence_parallel_region on self.tp_group, line
    696, which is pg_collection.expt_tp, line 73); the all-to-all bytes do not change with
    etp. Each local expert sees
    T k ep etp / (E tp) tokens with f/etp columns, the same FLOPs per rank at any etp, in
    wider GEMMs. Backward runs two GEMMs per forward GEMM (input and
    weight gradients). Attention: fused (flash) at the flash rate on the causal half, backward
    2.5x forward (Dao 2023, Sec. 3.1: backward recomputes the scores); eager as two batched
    GEMMs per head with k = head_dim and k = s. Element-wise kernels at HBM bandwidth
    (elementwise_bytes_per_token; eager kernels x Efficiency.unfused_elementwise_factor).
    ``kernels``: what the block runs (training.kernels.block_kernel_codes, the rule the memory
    model reads too): fused, eager, amp or torchtitan (its per-op SelectiveAC under selective).
    Recomputation adds forward work: full the whole block, selective the
    attention core (Korthikanti et al. 2022, Sec. 4.2-4.3).

    Fine-tuning (setup.finetune, see frozen_block_extra_s): under LoRA and QLoRA the base
    weights are frozen, so each base GEMM runs one backward GEMM (the input gradient)
    instead of two, and the adapters add their own GEMMs (forward, and twice that in
    backward). Under freeze a block either trains in full or runs no backward at all
    (timing.fast counts which: backward_layers()), so its times are full training's.
    """
    return LayerTime(**dict(zip(LAYER_TIME_FIELDS, layer_time_values(m, setup, key, kernels, gpu, eff))))


def layer_time_values(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str, gpu: GpuSpec,
                      eff: Efficiency) -> tuple[float, ...]:
    """layer_time's fields, in LayerTime's order (LAYER_TIME_FIELDS): layer_time_table's column
    of ``key``, with the counts (tp collectives, cp passes, ep all-to-alls) as ints where they
    are whole numbers (the types the per-shape code gave, but for a recomputed share that makes
    the tp collectives whole: an int now, a float before; the same value)."""
    one = [np.array([x], dtype=np.int64) for x in (key.tp, key.sp, key.cp, key.ep, key.micro_batch,
                                                   RECOMPUTES.index(key.recompute))]
    vals = layer_time_table(m, setup, kernels, gpu, eff, key.seq_len, key.etp, *one)[:, 0].tolist()
    for i in (4, 6, 8):
        if vals[i].is_integer():
            vals[i] = int(vals[i])
    return tuple(vals)


def layer_time_table(m: ModelSpec, setup: TrainingSetup, kernels: str, gpu: GpuSpec, eff: Efficiency, seq_len: int,
                     etp: int, tp: np.ndarray, sp: np.ndarray, cp: np.ndarray, ep: np.ndarray, mb: np.ndarray,
                     rc: np.ndarray) -> np.ndarray:
    """layer_time's fields (LAYER_TIME_FIELDS rows) of each block shape (int64 arrays: tp, sp,
    cp, ep, micro-batch, recomputation as RECOMPUTES' index; one sequence length and etp), as a
    (10, N) float array: the block's time without recomputation from kernels.block_compute_s
    (once per distinct shape), then what the recomputation adds and the collectives' volumes,
    element by element in the order of layer_time's formulas (layer_time says what they are)."""
    # the block's time without recomputation, once per distinct shape but its recomputation
    inverse, first = group([tp, sp, cp, ep, mb])
    shapes = BlockShapes(tp=tp[first], sp=sp[first], cp=cp[first], ep=ep[first], micro_batch=mb[first],
                         seq_len=seq_len, expert_tp=expert_tp_size(etp, tp[first]))
    fwd, bwd, attn_fwd, elem_fwd, mm8, hbm, e8 = block_compute_s(m, setup, shapes, kernels, gpu, eff)
    tiles = rates(gpu, setup.precision_spec.compute_dtype, eff).tiles
    fwd, bwd, attn_fwd, elem_fwd = fwd[inverse], bwd[inverse], attn_fwd[inverse], elem_fwd[inverse]
    prec = setup.precision_spec
    tokens = mb * seq_len / cp
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    full, selective = rc == FULL, rc == SELECTIVE

    def gemm(rows: np.ndarray, cols: np.ndarray | int, inner: np.ndarray | int) -> np.ndarray:
        """A block linear layer's GEMM: at the FP8 rate under an FP8 recipe (timing.kernels.fp8_matmul)."""
        return gemm_time_s(rows, cols, inner, mm8, hbm, e8, tiles=tiles)

    # Megatron's block method reruns N layers of each stage under full recomputation
    bwd = np.where(full, bwd + fwd * setup.recomputed_share, bwd)
    if selective.any():
        if selective_policy(kernels, eff.selective_policy) == "torchtitan-op" and not m.is_moe:
            # every second mm of the block's forward order (wq wk wv wo, then w1 w3 w2 or fc1 fc2)
            # and the element-wise ops (Efficiency.selective_policy)
            second = gemm(tokens, kv / tp, h) + gemm(tokens, h, q / tp)
            second = second + (gemm(tokens, f / tp, h) if m.gated_mlp else gemm(tokens, h, f / tp))
            bwd = np.where(selective, bwd + (second + elem_fwd), bwd)
        else:
            bwd = np.where(selective, bwd + attn_fwd, bwd)
    # tp: 2 all-reduces (or all-gather + reduce-scatter pairs with sp) in forward, 2 in
    # backward, 2 more when full recomputation reruns the forward (Shoeybi et al. 2019, Sec. 3).
    n_tp = tp_collectives_per_layer(m)      # a hybrid's layer holds one mixer: half a block's
    tp_coll = np.where(tp > 1, np.where(full, n_tp + n_tp / 2 * setup.recomputed_share, n_tp), 0).astype(np.float64)
    if m.is_moe:
        # half of them are the MLP's (Shoeybi et al. 2019, Sec. 3): under etp they run on the
        # expert tensor-parallel group, inside the tp group (layouts.rules: etp divides tp) and so
        # on its links, counted in tp-ring equivalents: a ring's time is (n-1)/n of the bytes
        # over the bus rate (timing.collectives.Ring), (etp-1)/etp against (tp-1)/tp
        e_tp = expert_tp_size(etp, tp)
        with np.errstate(divide="ignore", invalid="ignore"):
            tp_coll = np.where((e_tp != tp) & (tp > 1), tp_coll * ((1 + ((e_tp - 1) / e_tp) / ((tp - 1) / tp)) / 2),
                               tp_coll)
    a = prec.activation_bytes
    cp_bytes = np.where(cp > 1, tokens * 2 * kv * a / tp * attention_share(m), 0.0)
    if m.is_moe:
        k_ = m.n_experts_per_token
        ep_a = prec.fp8.ep_dispatch_bytes if prec.fp8 is not None else a    # DeepSeek-V3: FP8 dispatch
        # the all-to-all ends when the most loaded rank has received its tokens (setup.moe_imbalance)
        ep_bytes = np.where(ep > 1, tokens * k_ * dispatch_width(m) * ep_a * setup.moe_imbalance
                            / np.where(sp != 0, tp, 1) * moe_share(m), 0.0)
    else:
        ep_bytes = np.zeros(len(tp))
    hidden = np.array([eff.ep_overlap if a2a_overlapped(setup.moe_a2a_overlap, r, setup.mtp_layers) else 0.0
                       for r in RECOMPUTES])
    return np.stack([fwd, bwd, attn_fwd, tokens * h * a, tp_coll,
                     cp_bytes, np.where(cp > 1, np.where(full, 4.0, 3.0), 0.0),
                     ep_bytes, np.where(ep_bytes != 0, np.where(full, 6.0, 4.0), 0.0), hidden[rc]])


BLOCK_ROWS = 18     # a block row: LAYER_TIME_FIELDS, then the last stage's forward and backward additions,
                    # the bytes of the tp all-reduce at each pipeline edge and of a pipeline send, what a
                    # layer kept in BF16 adds to the block's forward and backward, and the MTP modules'
                    # forward and backward, which the last stage adds


def block_table(m: ModelSpec, setup: TrainingSetup, cluster: Cluster, eff: Efficiency, kernels: str, etp: int,
                tp: np.ndarray, sp: np.ndarray, cp: np.ndarray, ep: np.ndarray, mb: np.ndarray,
                rc: np.ndarray) -> np.ndarray:
    """Each block shape's LayerTime fields (layer_time_table, at the set-up's sequence length),
    then what the pipeline derives from the micro-batch alone: what the last stage adds to its
    forward and backward, the bytes of the tp all-reduce at each pipeline edge and of a pipeline
    send, as a (BLOCK_ROWS, N) array.

    The last stage adds the LM head and loss. Under Megatron-Core's CPU activation offload,
    which needs pp = 1 (layouts.rules), the one stage also adds the copies compute does not
    hide (host_link.activation_offload_exposed_s).

    MTP modules (TrainingSetup.mtp_layers; megatron-core's MultiTokenPredictionBlock on the last
    stage): the last two rows are their forward and backward, each module its eh_proj (2h -> h),
    its layers and the shared head and loss, which the last stage adds (timing.stage). A hybrid's
    layers are its MTP pattern's (models.hybrid.mtp_depth) in BF16, as the Nemotron 3 recipes keep
    them (keep_mtp_spec_in_bf16); a DeepSeek-V3 module's the mean block at the run's precision.
    With pp > 1 the last stage holds them on top of its layers (megatron-core's placement without a
    pipeline layout), or in place of 1 + mtp of them under --pp-balance embedding-loss-mtp, as
    Megatron-Bridge's DeepSeek-V3 layouts place them ("Et|(tt|)*30mL": layouts.stages.stage_layers).
    Their FLOPs count (timing.flops.with_mtp); their layers' tp, cp and ep communication is the
    stage's (timing.flops.mtp_blocks, timing.degrees' per-slot communicating blocks).

    A layer kept in BF16 under the low-precision recipe (TrainingSetup.bf16_layers,
    training.layer_precision) runs the block at bf16 mixed precision: the last two rows are its
    forward and backward less the low-precision block's (its GEMMs at the BF16 rate, without the
    recipe's casts), which the stages holding such layers add per layer (timing.stage); 0.0
    without them."""
    gpu, prec = cluster.gpu, setup.precision_spec
    seq, h, a = setup.seq_len, m.d_model, prec.activation_bytes
    lt = layer_time_table(m, setup, kernels, gpu, eff, seq, etp, tp, sp, cp, ep, mb, rc)
    r = rates(gpu, prec.compute_dtype, eff)
    tokens = mb * seq / cp
    head_fwd = gemm_time_s(tokens, m.vocab_size / tp, h, r.matmul_flops_per_s, r.hbm_bytes_per_s,
                           prec.weight_bytes, tiles=r.tiles)
    loss_s = tokens * m.vocab_size / tp * CROSS_ENTROPY_BYTES_PER_LOGIT / r.hbm_bytes_per_s
    head_bwd = head_backward_gemms(setup.finetune)
    last_fwd = head_fwd + loss_s * CROSS_ENTROPY_FORWARD_SHARE
    last_bwd = head_bwd * head_fwd + loss_s * (1 - CROSS_ENTROPY_FORWARD_SHARE)
    if setup.offload_activations:
        for i, shape in enumerate(zip(tp.tolist(), sp.tolist(), cp.tolist(), ep.tolist(), mb.tolist(), rc.tolist())):
            tp_, sp_, cp_, ep_, mb_, rc_ = shape
            key = Layout(tp=tp_, sp=bool(sp_), cp=cp_, ep=ep_, micro_batch=mb_, seq_len=seq,
                         recompute=RECOMPUTES[rc_], etp=etp)
            off_fwd, off_bwd = activation_offload_exposed_s(m, setup, key, kernels, gpu, float(lt[0, i]),
                                                            float(lt[1, i]), m.n_layers)
            last_fwd[i], last_bwd[i] = last_fwd[i] + off_fwd, last_bwd[i] + off_bwd
    extra_fwd = extra_bwd = np.zeros(len(tp))
    if setup.bf16_layers != (0, 0):
        bf16 = layer_time_table(m, bf16_layer_setup(setup), kernels, gpu, eff, seq, etp, tp, sp, cp, ep, mb, rc)
        extra_fwd, extra_bwd = bf16[0] - lt[0], bf16[1] - lt[1]
    mtp_fwd, mtp_bwd = _mtp_s(m, setup, kernels, gpu, eff, etp, lt, tp, sp, cp, ep, mb, rc, head_fwd, head_bwd,
                              loss_s)
    return np.concatenate([lt, np.stack([last_fwd, last_bwd, tokens * h * a, tokens * h * a / tp, extra_fwd,
                                         extra_bwd, mtp_fwd, mtp_bwd])])


def _mtp_s(m: ModelSpec, setup: TrainingSetup, kernels: str, gpu: GpuSpec, eff: Efficiency, etp: int,
           lt: np.ndarray, tp: np.ndarray, sp: np.ndarray, cp: np.ndarray, ep: np.ndarray, mb: np.ndarray,
           rc: np.ndarray, head_fwd: np.ndarray, head_bwd: float, loss_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The MTP modules' forward and backward seconds per micro-batch (block_table's docstring):
    per module the eh_proj GEMM (tokens x 2h -> h, split by tp), its layers and the shared head
    and loss, as the last stage runs its own; zeros without MTP modules."""
    n_mtp = with_mtp(m, setup.mtp_layers).n_mtp_modules
    if not n_mtp:
        zero = np.zeros(len(tp))
        return zero, zero
    depth = mtp_depth(m)
    if depth is not None:
        rows = layer_time_table(depth, bf16_layer_setup(setup), kernels, gpu, eff, setup.seq_len, etp, tp, sp, cp,
                                ep, mb, rc)
        layers_fwd, layers_bwd = depth.n_layers * rows[0], depth.n_layers * rows[1]
        r = rates(gpu, "bf16", eff)
    else:
        layers_fwd, layers_bwd = lt[0], lt[1]
        r = rates(gpu, setup.precision_spec.compute_dtype, eff)
    tokens = mb * setup.seq_len / cp
    proj = mtp_eh_proj(m)
    eh = gemm_time_s(tokens, proj.d_out / tp, proj.d_in, r.matmul_flops_per_s, r.hbm_bytes_per_s,
                     setup.precision_spec.weight_bytes, tiles=r.tiles)
    fwd = eh + layers_fwd + head_fwd + loss_s * CROSS_ENTROPY_FORWARD_SHARE
    bwd = 2 * eh + layers_bwd + head_bwd * head_fwd + loss_s * (1 - CROSS_ENTROPY_FORWARD_SHARE)
    return n_mtp * fwd, n_mtp * bwd


def layer_key(lay: Layout) -> Layout:
    """The fields of ``lay`` a block's time depends on (layer_time's cache key)."""
    return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, ep=lay.ep, micro_batch=lay.micro_batch,
                  seq_len=lay.seq_len, recompute=lay.recompute, etp=lay.etp)

