"""What an FP8 recipe adds to or takes from a rank's memory (planner.training.fp8 holds the
recipes and their sources): the persistent fp8 weight copies and amax histories of the
blocks' linear layers (a state term, arrays over stage slots and states), and the bytes the
recipe saves on the linear layers' inputs kept for backward (per shape, gathered in
memory.shapes)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from planner.layouts.batch import RECOMPUTES, LayoutArrays
from planner.layouts.layout import Layout
from planner.models.matmuls import block_matmuls, mean_block_share
from planner.models.spec import ModelSpec
from planner.training.finetune import block_linears
from planner.training.layer_precision import stage_bf16_layers
from planner.training.setup import Precision, TrainingSetup


@lru_cache(maxsize=64)
def fp8_linears_per_block(m: ModelSpec, ep: int) -> float:
    """Linear layers of one block that run in FP8 on one rank (the router stays 16-bit):
    each expert's GEMM counts once per local expert (TE's grouped linear keeps fp8
    metadata per GEMM)."""
    n = 0.0
    for lin in block_linears(m):
        if lin.group in ("router", "outside"):
            continue
        n += lin.n_copies / ep if lin.expert else 1
    return n


def fp8_weight_bytes(m: ModelSpec, prec: Precision, block_params: np.ndarray, n_layers: np.ndarray,
                     ep: np.ndarray, param_gather: bool = False, n_bf16_layers: np.ndarray | int = 0) -> np.ndarray:
    """Persistent FP8 state of a rank's blocks: ``block_params`` (the rank's block
    parameters, after tp, pp and ep; not sharded by ZeRO, as te.Linear caches its fp8
    weights in each module) x the recipe's fp8 weight-copy bytes, plus the amax histories
    of its linear layers (training.fp8.Fp8Recipe.amax_bytes_per_linear). Zero without FP8.

    With ``param_gather`` (Megatron-LM --fp8-param-gather, TrainingSetup.fp8_param_gather) the
    low-precision copies replace the 16-bit weights the state holds (megatron-core
    TransformerConfig.fp8_param: "keep the parameters in fp8 precision"), so the term is the
    copies less prec.weight_bytes per parameter (<= 0 where they take less).

    ``n_bf16_layers`` of the rank's ``n_layers`` layers are kept in BF16 (TrainingSetup.bf16_layers,
    training.layer_precision.stage_bf16_layers): they run outside the recipe's context
    (megatron-core fp8_utils.get_fp8_context / fp4_utils.get_fp4_context give them a null
    context), so they keep neither low-precision copies nor amax histories, and their 16-bit
    weights stay under --fp8-param-gather: the term covers the other layers' share of
    ``block_params``, each layer taken as the stage's mean."""
    r = prec.fp8
    if r is None:
        return np.zeros(np.broadcast_shapes(block_params.shape, ep.shape), dtype=np.int64)
    per_param = r.fp8_weight_copy_bytes - (prec.weight_bytes if param_gather else 0)
    if np.any(n_bf16_layers):
        low = n_layers - n_bf16_layers      # the layers the recipe runs
        block_params = np.where(n_layers > 0, block_params * low / np.maximum(n_layers, 1), block_params)
        n_layers = low
    copies = (block_params * per_param).astype(np.int64)
    if not r.amax_bytes_per_linear:
        return copies
    per_ep = {int(e): fp8_linears_per_block(m, int(e)) for e in np.unique(ep)}
    linears = np.vectorize(lambda e: per_ep[int(e)], otypes=[np.float64])(ep) if len(per_ep) > 1 \
        else next(iter(per_ep.values()), 0.0)
    return copies + (n_layers * linears * r.amax_bytes_per_linear).astype(np.int64)


def saved_input_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """Bytes one block's saved linear-layer inputs change by under the FP8 recipe, per
    micro-batch on one rank (<= 0): recipes that keep the input cast to FP8 for backward
    (TE delayed scaling, DeepSeek-V3's block-wise recipe, Sec. 3.3.4) store
    ``saved_input_bytes`` per element where 16-bit training stores 2.

    The saved linear inputs of the mean block (Korthikanti et al. 2022, Sec. 4.1), read off its
    GEMMs (saved_input_widths): for a GPT block the attention input (the norm's output, h wide,
    shared by Q, K and V), the output projection's input (q wide, split by tp), the MLP input (h
    wide; under MoE the k routed copies, k h) and the down projection's input (k d_ff wide, split
    by tp); h-wide tensors are split by tp only under sequence parallelism. MLA's low-rank
    projections, the dense first layers of a MoE model and a hybrid's kinds of layer (Mamba,
    DeltaNet, attention, MoE, MLP) each count their own inputs, weighted by their share of the
    layers. Full recomputation keeps only the block's input, so nothing changes."""
    if lay.recompute == "full":
        return 0
    return int(_saved_input_delta_bytes(m, setup, lay.tokens_per_rank, lay.tp, lay.sp))


def _saved_input_delta_bytes(m: ModelSpec, setup: TrainingSetup, tokens: Any, tp: Any, sp: Any) -> Any:
    """saved_input_delta_bytes' figure before its recomputation check, as a float (or an array of
    them over layouts: ``tokens``, ``tp``, ``sp`` arrays); 0 where the recipe saves no fewer bytes."""
    r = setup.precision_spec.fp8
    if r is None:
        return 0
    delta = r.saved_input_bytes - setup.precision_spec.activation_bytes
    if delta >= 0:
        return 0
    h_div = np.where(sp, tp, 1)
    split_by_sp, split_by_tp = saved_input_widths(m)
    return tokens * (split_by_sp / h_div + split_by_tp / tp) * delta


# GEMMs of a MoE layer that read the layer's norm output, which its router (kept in 16 bits by
# every recipe) also saves: models.matmuls names them; the 16-bit tensor stays
_ROUTER_HELD_INPUTS = ("shared_in", "latent_in")


@lru_cache(maxsize=64)
def saved_input_widths(m: ModelSpec) -> tuple[float, float]:
    """Elements per token of the linear inputs the mean block saves for backward, read off its
    GEMMs (models.matmuls.block_matmuls, each weighted by mean_block_share: a hybrid's per kind of
    layer, a MoE model's dense first layers by their share): (those
    split by tp only under sequence parallelism: a column-parallel or unsplit GEMM's input; those
    split by tp: a row-parallel GEMM's input, the other side of the tensor-parallel region).

    Each GEMM keeps its input once per visit (k for the routed experts, in the latent width under
    latent MoE); GEMMs of one kind of layer reading the same tensor (MLA's two down-projections)
    count it once. Left out: the routers' inputs (16 bits under every recipe, as
    fp8_linears_per_block) and the MoE layer's shared-expert and latent fc1 inputs, the norm output
    the router keeps in 16 bits. MODELLED: Transformer Engine's linears save their quantized input
    for the weight gradient, one per module (megatron-core 0.16.1 builds the Mamba in_proj/out_proj,
    attention linear_qkv/linear_proj, MLP and grouped-expert fc1/fc2 from TE modules in its hybrid
    layer specs). Not counted: the low-precision copies TE keeps of the router-held input beside the
    16-bit one (about a d_model per MoE layer)."""
    if m.profile is not None:
        # a generic model's GEMMs are not known one by one (block_matmuls gives one GEMM of its
        # measured FLOPs): ASSUMED a GPT block's, the attention and MLP inputs (h wide, split by tp
        # under sp) and the output and down projections' (q and k d_ff wide, split by tp)
        k = m.n_experts_per_token if m.is_moe else 1
        return float(m.d_model + k * m.d_model), float(m.q_dim + k * m.d_ff)
    seen: set[tuple[str, int, int, bool, int]] = set()
    split_by_sp = split_by_tp = 0.0
    for mm in block_matmuls(m):
        if mm.kind == "router" or mm.name in _ROUTER_HELD_INPUTS:
            continue
        row = mm.split == "row"
        key = (mm.kind, mm.n_blocks, mm.d_in, row, mm.visits)
        if key in seen:
            continue
        seen.add(key)
        width = mm.d_in * mm.visits * mean_block_share(m, mm)
        if row:
            split_by_tp += width
        else:
            split_by_sp += width
    return split_by_sp, split_by_tp


def bf16_layer_input_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, seq_len: int, stage: np.ndarray,
                           n_layers: np.ndarray) -> np.ndarray | int:
    """Bytes per micro-batch the layers a stage keeps in BF16 (TrainingSetup.bf16_layers,
    training.layer_precision.stage_bf16_layers) save beyond the recipe's figure, per layout (float;
    0 without them): they run outside the FP8/FP4 context, so their linear inputs are kept in 16
    bits, the bytes saved_input_delta_bytes takes off a low-precision block (none under full
    recomputation, which keeps only the block's input)."""
    n_bf16 = stage_bf16_layers(stage, a.pp, n_layers, setup.bf16_layers)
    if not np.any(n_bf16):
        return 0
    tokens = a.micro_batch * a.seq_len_per_rank(seq_len)
    per_layer_bytes = -_saved_input_delta_bytes(m, setup, tokens, a.tp, a.sp)
    return np.where(a.recompute == RECOMPUTES.index("full"), 0.0, n_bf16 * per_layer_bytes)
