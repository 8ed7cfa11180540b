"""Shape-dependent figures of the memory model, computed once per distinct shape of a batch
and gathered over it: a block's saved tensors, the eager score gradients and the loss per
(tp, sp, cp, micro-batch, recomputation, kernels); the stages that can be the most loaded,
their parameters and their fine-tuning split per (tp, ep, pp). Tables are kept across calls
for the same model and set-up (a search asks for the same shapes on every GPU count)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from planner.layouts import distinct
from planner.layouts.batch import RECOMPUTES, LayoutArrays
from planner.layouts.layout import Layout
from planner.memory.activations import (
    activation_key,
    adapters_in_16_bits,
    backward_working_bytes,
    block_activations,
    recompute_unit_bytes,
)
from planner.memory.attention import attention_saved_delta_bytes, sink_eager_delta_bytes
from planner.memory.buffers import pipeline_buffer_bytes
from planner.memory.fp8 import saved_input_delta_bytes
from planner.memory.loss import logits_bytes
from planner.memory.moe import imbalance_extra_bytes, moe_block_delta_bytes
from planner.memory.norms import block_norm_delta_bytes
from planner.memory.params import (
    largest_tensor,
    optimizer_bytes_per_param,
    rank_params,
    stage_layers,
    stages_to_check,
    with_mtp_params,
)
from planner.memory.pipeline import held_layer_micro_batches
from planner.memory.recompute import module_recompute_delta_bytes
from planner.models.spec import ModelSpec, ParamCount
from planner.training.finetune import activation_layers, rank_split
from planner.training.kernels import AMP, EAGER, FUSED, KERNELS, TITAN
from planner.training.setup import TrainingSetup, block_table_setup
from planner.units import ceil_div

MAX_SLOTS = 4   # the first and last stage, and the earliest middle one of each of two layer counts

__all__ = [
    "AMP",
    "EAGER",
    "FUSED",
    "TITAN",
    "KERNELS",
    "ActivationFigures",
    "ParamsArrays",
    "SplitArrays",
    "StageFigures",
    "activation_figures",
    "in_flight_microbatches",
    "optimizer_bytes_per_param",
    "stage_figures",
]


@dataclass(frozen=True, slots=True)
class ParamsArrays:
    """params.RankParams as arrays: parameters on one rank of a stage, before ZeRO/FSDP."""

    dense: np.ndarray
    expert: np.ndarray
    block_unit: np.ndarray
    root_unit: np.ndarray
    largest_module: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.dense + self.expert

    def replace(self, **kw: np.ndarray) -> ParamsArrays:
        return replace(self, **kw)


@dataclass(frozen=True, slots=True)
class SplitArrays:
    """finetune.RankSplit as arrays: a rank's parameters split into trainable and frozen."""

    trainable_dense: np.ndarray
    trainable_expert: np.ndarray
    frozen_dense_bytes: np.ndarray
    frozen_expert_bytes: np.ndarray
    block_trainable: np.ndarray
    block_frozen_bytes: np.ndarray
    largest_trainable: np.ndarray
    dequant_bytes: np.ndarray

    @property
    def trainable(self) -> np.ndarray:
        return self.trainable_dense + self.trainable_expert

    @property
    def frozen_bytes(self) -> np.ndarray:
        return self.frozen_dense_bytes + self.frozen_expert_bytes


_TABLES: dict[tuple[object, ...], dict[tuple[int, ...], tuple[int, ...]]] = {}


def forget_tables() -> None:
    """Drop the per-shape tables kept across calls (a benchmark's cold start)."""
    _TABLES.clear()


def _table(*key: object) -> dict[tuple[int, ...], tuple[int, ...]]:
    if len(_TABLES) > 256:
        _TABLES.clear()
    return _TABLES.setdefault(key, {})


def _gather(columns: list[np.ndarray], fn: object, memo: dict[tuple[int, ...], tuple[int, ...]],
            width: int) -> np.ndarray:
    """fn(*row) for each distinct row of ``columns``, as a (width, batch) int64 array."""
    inv, first = distinct.group(columns)
    rows = []
    for key in zip(*(c[first].tolist() for c in columns)):
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = fn(*key)      # type: ignore[operator]
        rows.append(hit)
    table = np.array(rows, dtype=np.int64).reshape(len(rows), width)
    return np.take(np.ascontiguousarray(table.T), inv, axis=1)     # (width, batch), each row contiguous


@dataclass(frozen=True, slots=True)
class ActivationFigures:
    """Per layout: bytes a block keeps under its recomputation (``layer_act``) and without
    (``full_layer``), the eager attention's score gradients, and the loss on the last stage."""

    layer_act: np.ndarray
    full_layer: np.ndarray
    score_grad: np.ndarray
    logits: np.ndarray
    pipeline_buffers: np.ndarray


def activation_figures(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, seq_len: int, kernels: np.ndarray,
                       act_fp32: np.ndarray) -> ActivationFigures:
    """activations.block_activations, backward_working_bytes and loss.logits_bytes per distinct
    block shape, and buffers.pipeline_buffer_bytes per layout; ``act_fp32``: where the trainable
    blocks run in fp32 (freeze on replicated ranks), which sizes the blocks' activations in fp32. LoRA's blocks also
    depend on whether the engine runs the adapters in 16 bits (activations.adapters_in_16_bits, of the
    ZeRO stage and sharding; 23,883 -> 10,599 shapes in the 256-job `plan buy`). A block shape leaves out the
    pipeline: no function of the block's bytes, its backward's working set or the loss reads
    the pipeline's degree (tests/test_shape_caches.py asks each with pp 1 and 4), so a shape
    with and without a pipeline is sized once (issue 32: 36,963 -> 23,883 shapes in the
    256-job `plan buy`)."""
    lora = setup.finetune.is_lora
    fp32 = replace(setup, precision="fp32") if act_fp32.any() else setup
    fp8 = setup.precision_spec.fp8 is not None
    imbalanced = m.is_moe and setup.moe_imbalance != 1.0

    # a block's bytes without recomputation, per block shape but its recomputation: the same for
    # the shape under none, selective and full (three rows of the table for one of these); beside
    # them the loss's bytes, which do not read the recomputation (tests/test_shape_caches.py)
    table_setup = block_table_setup(setup)
    unrecomputed_bytes = _table("act-none", m, table_setup, seq_len)

    def full_bytes(lay: Layout, s_: TrainingSetup, kern: str, full: int) -> int:
        """The block's bytes without recomputation: block_activations' ``full`` and the
        families' additions on the unrecomputed layout."""
        unrecomputed = lay if lay.recompute == "none" else replace(lay, recompute="none")
        if m.is_mla or m.qk_norm:   # MLA's latents and narrower values, QK norms' saved tensors (memory.attention)
            full += attention_saved_delta_bytes(m, s_, unrecomputed, kern)
        if m.attention_sinks:       # gpt-oss's eager sink softmax in place of the generic fp32 one
            full += sink_eager_delta_bytes(m, s_, unrecomputed, kern)
        # Gemma 3's and OLMo 2's RMSNorms keep an fp32 normalised tensor (memory.norms)
        full += block_norm_delta_bytes(m, s_, unrecomputed, kern)
        if m.is_moe:    # dense blocks, shared experts, transformers' MoE tensors (memory.moe)
            full += moe_block_delta_bytes(m, s_, unrecomputed, kern)
        if fp8:     # the FP8 recipe's saved linear inputs (memory.fp8)
            full += saved_input_delta_bytes(m, setup, unrecomputed)
        if imbalanced:  # the most loaded expert-parallel rank's extra routed tokens (memory.moe)
            full += imbalance_extra_bytes(m, s_, unrecomputed, kern)
        return full

    def figures(tp: int, sp: int, cp: int, mb: int, rc: int, k: int, f32: int, *more: int) -> tuple[int, ...]:
        # LoRA: whether the adapters run in 16 bits (activations.adapters_in_16_bits), the one thing a
        # block's tensors read of the ZeRO stage and sharding: a shape stands for every stage and
        # sharding that agree there, sized at ZeRO-1 (in 16 bits) or ZeRO-0 without sharding (not)
        in_16_bits = more[0] if lora else 0
        ep = more[-1] if imbalanced else 1
        lay = Layout(tp=tp, sp=bool(sp), cp=cp, micro_batch=mb, seq_len=seq_len, recompute=RECOMPUTES[rc],
                     zero_stage=in_16_bits, ep=ep)
        kern = KERNELS[k]
        s_ = fp32 if f32 else setup
        kept, full = block_activations(m, s_, activation_key(lay, lora), kern)
        shape = (tp, sp, cp, mb, k, f32, in_16_bits, ep)
        hit = unrecomputed_bytes.get(shape)
        if hit is None:
            hit = unrecomputed_bytes[shape] = (full_bytes(lay, s_, kern, full), logits_bytes(m, setup, lay, kern))
        full, logits = hit
        # the same additions on the layout itself (integers: in any order, the same sum)
        if lay.recompute == "none":     # every addition is full's
            kept = full
        else:
            if m.is_mla or m.qk_norm:
                kept += attention_saved_delta_bytes(m, s_, lay, kern)
            kept += block_norm_delta_bytes(m, s_, lay, kern)
            if m.is_moe:
                kept += moe_block_delta_bytes(m, s_, lay, kern)
            if fp8:
                kept += saved_input_delta_bytes(m, setup, lay)
            if imbalanced:
                kept += imbalance_extra_bytes(m, s_, lay, kern)
        if setup.recompute_modules:     # Megatron-Core's selective recomputation by module
            kept += module_recompute_delta_bytes(m, s_, lay, kern)
        return (kept, recompute_unit_bytes(m, s_, lay, kern, full), backward_working_bytes(m, setup, lay, kern),
                logits)

    cols = [a.tp, a.sp, a.cp, a.micro_batch, a.recompute, kernels, act_fp32.astype(np.int64)]
    if lora:
        cols += [adapters_in_16_bits(setup, a.zero_stage, a.sharding > 0).astype(np.int64)]
    if imbalanced:
        cols += [a.ep]
    out = _gather(cols, figures, _table("act", m, table_setup, seq_len), 4)
    return ActivationFigures(layer_act=out[0], full_layer=out[1], score_grad=out[2], logits=out[3],
                             pipeline_buffers=pipeline_buffer_bytes(m, setup, a, seq_len))


@dataclass(frozen=True, slots=True)
class StageFigures:
    """Per stage slot and layout ((slot, batch) arrays): whether the pipeline has the slot,
    the stage, its layers, the layers that keep activations, the rank's parameters and their
    fine-tuning split."""

    valid: np.ndarray
    stage: np.ndarray
    n_layers: np.ndarray
    n_act_layers: np.ndarray
    rank_params: ParamsArrays
    split: SplitArrays


_N_PARAMS, _N_SPLIT = len(fields(ParamsArrays)), len(fields(SplitArrays))
_WIDTH = 4 + _N_PARAMS + _N_SPLIT


def stage_figures(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, a: LayoutArrays) -> StageFigures:
    """The stages that can be the most loaded (params.stages_to_check) with their parameters
    (params.rank_params) and fine-tuning split (finetune.rank_split), once per distinct
    (tp, ep, pp, etp)."""
    ft = setup.finetune
    wb = setup.precision_spec.weight_bytes

    # torchtitan 0.3.0 ties the embedding and the LM head by sharing one Parameter
    # (models/common/decoder.py, Decoder.__init__); tensor parallelism replaces each module's
    # parameter by its own DTensor (parallelize_module), which unties them: measured with
    # FSDPMemTracker on Llama 3.2 1B (tied), tp 2: AdamW states for 1.499e9 parameters
    # against 1.236e9 at tp 1 (docs/accuracy-torchtitan.json)
    untie = setup.stack == "torchtitan" and m.tied_embeddings

    def figures(tp: int, ep: int, pp: int, etp: int) -> tuple[int, ...]:
        lay = Layout(tp=tp, ep=ep, pp=pp, etp=etp)
        mtp = setup.mtp_layers
        counts = stage_layers(m.n_layers, pp, setup.pp_balance, mtp)
        if mtp:     # the MTP modules' blocks live on the last stage (TrainingSetup.mtp_layers)
            counts = [*counts[:-1], counts[-1] + mtp]
        row: tuple[int, ...] = ()
        for s in stages_to_check(counts):
            n_layers = counts[s]
            rp = with_mtp_params(m, rank_params(m, pc, lay, s, n_layers), tp, mtp if s == pp - 1 else 0)
            if untie and tp > 1 and s == pp - 1 and pp == 1:
                head = ceil_div(m.vocab_size * m.d_model, tp)
                rp = replace(rp, dense=rp.dense + head, root_unit=rp.root_unit + head)
            n_act = activation_layers(ft, m.n_layers, sum(counts[:s]), n_layers)
            split = rank_split(m, pc, ft, lay, rp.dense, rp.expert, rp.root_unit, n_layers, n_act, s == pp - 1,
                               wb, largest_tensor(m, lay), first_stage=s == 0)
            row += (1, s, n_layers, n_act, rp.dense, rp.expert, rp.block_unit, rp.root_unit, rp.largest_module,
                    split.trainable_dense, split.trainable_expert, split.frozen_dense_bytes,
                    split.frozen_expert_bytes, split.block_trainable, split.block_frozen_bytes,
                    split.largest_trainable, split.dequant_bytes)
        return row + (0,) * (_WIDTH * MAX_SLOTS - len(row))

    out = _gather([a.tp, a.ep, a.pp, a.expert_tp], figures, _table("stage", m, pc, ft, wb, untie, setup.pp_balance,
                                                                       setup.mtp_layers),
                  _WIDTH * MAX_SLOTS)
    n_slots = max(1, int(out.reshape(MAX_SLOTS, _WIDTH, -1)[:, 0].any(axis=1).sum()))
    t = out.reshape(MAX_SLOTS, _WIDTH, -1)[:n_slots]           # (slot, field, batch)
    rp = ParamsArrays(*(t[:, 4 + i] for i in range(_N_PARAMS)))
    split = SplitArrays(*(t[:, 4 + _N_PARAMS + i] for i in range(_N_SPLIT)))
    return StageFigures(valid=t[:, 0] > 0, stage=t[:, 1], n_layers=t[:, 2], n_act_layers=t[:, 3], rank_params=rp,
                        split=split)


def memory_grad_accum(a: LayoutArrays, setup: TrainingSetup) -> np.ndarray:
    """The accumulation count of each layout as the memory model tells it apart: a layout's
    memory is the same with this count as with its own. The model reads the count in two
    places: whether gradients persist between micro-batches (peak.step_terms: more than one)
    and the micro-batches a stage holds (in_flight_microbatches: min(pp - stage, count), the
    stages 0 to pp - 1), except where it reads the exact interleaved schedule (vp > 1 and pp >
    1 under --pp-balance embedding-loss, or a micro-batch group other than pp), whose warm-up
    and last group depend on the count. So min(count, max(pp, 2)), and the count itself where
    the schedule is read (tests/test_sweep_shared.py checks every term of both)."""
    ga = a.grad_accum
    group = setup.pp_microbatch_group
    saturated = np.minimum(ga, np.maximum(a.pp, 2))
    if setup.pp_balance == "none" and group <= 0:      # no layout reads the exact schedule
        return saturated
    exact = (a.vp > 1) & (a.pp > 1) & ((setup.pp_balance != "none") | ((group > 0) & (a.pp != group)))
    return np.where(exact, ga, saturated)


def in_flight_microbatches(a: LayoutArrays, stage: np.ndarray, n_layers: int = 0, balance: str = "none",
                           stage_layer_counts: np.ndarray | None = None, group: int = 0, mtp: int = 0) -> np.ndarray:
    """Micro-batches whose activations a pipeline stage holds at once (float).

    1F1B: stage i (from 0) holds min(pp - i, m) (Narayanan et al. 2021, Sec. 2.2.1).
    Interleaved with v chunks: the first stage holds (1 + (p-1)/(p v)) times more
    (Korthikanti et al. 2022, Sec. 4.2.3); applied to every stage, which overestimates the
    later stages of an even split; with a stage 0 lighter than stage 1 (an uneven split) it
    underestimates stage 1 (exact: memory.pipeline.held_layer_micro_batches; 22.5 against
    22.03 micro-batches for 126 layers on pp 16 at vp 2), kept as it was for balance "none".
    Under ``balance`` "embedding-loss" (TrainingSetup.pp_balance), with vp > 1, each stage holds
    what Megatron's interleaved schedule keeps of its chunks (pipeline.held_layer_micro_batches,
    its layer-micro-batches over the stage's ``stage_layer_counts``): the embedding-only and
    loss-only chunks keep no block.
    A micro-batch group ``group`` N (TrainingSetup.pp_microbatch_group; 0: pp, megatron-core's
    default) other than pp is read off the exact schedule for every balance, its warm-up
    (pp - stage - 1) x 2 + (vp - 1) x N chunk forwards (pipeline.warmup_chunks).
    """
    held = np.minimum(a.pp - stage, a.grad_accum).astype(np.float64)   # 1 without a pipeline (stage 0)
    if np.any(a.vp > 1):
        held *= np.where(a.vp > 1, 1 + (a.pp - 1) / (a.pp * a.vp), 1.0)
        if balance != "none" and stage_layer_counts is not None:
            held = _interleaved_held(a, stage, n_layers, balance, stage_layer_counts, held, group, mtp)
        elif group > 0 and stage_layer_counts is not None:   # N = pp keeps the default's closed form
            exact = _interleaved_held(a, stage, n_layers, balance, stage_layer_counts, held, group, mtp)
            held = np.where(a.pp == group, held, exact)
    return held


def _interleaved_held(a: LayoutArrays, stage: np.ndarray, n_layers: int, balance: str, counts: np.ndarray,
                      held: np.ndarray, group: int = 0, mtp: int = 0) -> np.ndarray:
    """held, with the interleaved layouts' (vp > 1, pp > 1) elements replaced by the exact
    schedule's layer-micro-batches over the stage's layers, once per distinct shape."""
    shape = np.broadcast_shapes(np.shape(stage), np.shape(a.vp))
    cols = [np.broadcast_to(x, shape).ravel() for x in (a.pp, a.vp, a.grad_accum, stage, counts)]
    out = np.array(np.broadcast_to(held, shape), dtype=np.float64).ravel()
    pick = (cols[1] > 1) & (cols[0] > 1) & (cols[3] >= 0) & (cols[3] < cols[0]) & (cols[4] > 0)
    if not pick.any():
        return held
    keys = [c[pick] for c in cols[:4]]
    inv, first = distinct.group(keys)
    vals = np.array([held_layer_micro_batches(n_layers, p, v, m, s, balance, group, mtp)
                     for p, v, m, s in zip(*(k[first].tolist() for k in keys))], dtype=np.float64)
    out[pick] = vals[inv] / cols[4][pick]
    return out.reshape(shape)
