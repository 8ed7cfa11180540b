"""Compute time of one block and of the LM head on one rank: GEMMs at the achievable matmul
rate, attention at a fused-kernel or batched-GEMM rate, element-wise kernels at HBM bandwidth;
LoRA/QLoRA adapters and dequantization; which blocks run a backward pass."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import Layout, seq_len_per_rank
from planner.models.dsa import indexer_score_flops_per_token, sparse_attention_share
from planner.models.matmuls import Matmul, block_matmuls, mean_block_share
from planner.models.spec import ModelSpec
from planner.timing.deltanet import deltanet_scan_time_s
from planner.timing.efficiency import (
    FLASH_FRACTION,
    FLASH_FRACTION_DEFAULT,
    GEMM_TILE,
    MATMUL_FRACTION,
    MATMUL_FRACTION_DEFAULT,
    TENSOR_FLOPS_PER_EXP,
    Efficiency,
    GemmTile,
    sustained_clock_share,
)
from planner.timing.flops import block_adapters
from planner.timing.mamba import (
    attention_share,
    dispatch_width,
    mamba_scan_time_s,
)
from planner.training.finetune import (
    FinetuneSpec,
    activation_layers,
    linear_weight_bytes,
)
from planner.training.fp8 import Fp8Recipe
from planner.training.images import image_flops_per_sequence
from planner.training.kernels import runs_fused_elementwise
from planner.training.linears import block_linears
from planner.training.moe_runtime import host_sync_per_moe_block
from planner.training.setup import (
    Precision,
    TrainingSetup,
)


def gemm_time_s(m_rows: Any, n_cols: Any, k_inner: Any, flops_per_s: Any, bytes_per_s: float,
                elem_bytes: Any, batch: Any = 1.0, tiles: Tiles | None = None) -> Any:
    """Time of ``batch`` (m x k) @ (k x n) matrix multiplies (floats, or arrays of them): the math at the achievable
    matmul rate (times gemm_tile_share under ``tiles``) plus one pass of the operands and the
    result through HBM.

    A tiled GEMM reads A and B and writes C at least once (NVIDIA, "Matrix Multiplication
    Background User's Guide", Math and Memory Bounds); the two are added rather than
    overlapped because the load of the first tiles and the store of the last ones do not
    hide under math, which is what makes narrow GEMMs (small k or n, as tensor
    parallelism makes them) slower per FLOP (Anthony et al. 2024, "The Case for
    Co-Designing Model Architectures with Hardware", arXiv:2401.14489, Sec. 3).
    """
    flops = 2 * batch * m_rows * n_cols * k_inner
    traffic = elem_bytes * batch * (m_rows * k_inner + k_inner * n_cols + m_rows * n_cols)
    math_s = flops / flops_per_s
    if tiles is not None:
        math_s = math_s / gemm_tile_share(m_rows, n_cols, k_inner, batch, tiles)
    return math_s + traffic / bytes_per_s


class Tiles(NamedTuple):
    """A GPU's SMs and its GEMM kernel's tile (GpuSpec.sms, efficiency.GEMM_TILE); fill: whether each
    tile waits for its pipeline's fill (Efficiency.gemm_tile_model "waves+fill")."""

    sms: int
    tile: GemmTile
    fill: bool = True


def gemm_tile_share(m_rows: Any, n_cols: Any, k_inner: Any, batch: Any, tiles: Tiles) -> Any:
    """The share of the matmul rate ``batch`` (m x k) @ (k x n) GEMMs reach on their tiles: the
    useful share of the padded output tiles (tile quantisation), of the SM slots of the last wave
    (wave quantisation: ceil(m / tm) ceil(n / tn) batch tiles run in waves of one tile per SM) and
    of the K loop (k / tk slices after the stages - 1 slices of each tile's pipeline fill, where
    tiles.fill) (NVIDIA, "Matrix Multiplication Background User's Guide", Tile and Wave
    Quantization). Floats or arrays."""
    t = tiles.tile
    m_tiles, n_tiles = np.ceil(m_rows / t.tile_m), np.ceil(n_cols / t.tile_n)
    padded = m_rows * n_cols / (m_tiles * t.tile_m * n_tiles * t.tile_n)
    n_out = batch * m_tiles * n_tiles
    waves = n_out / (np.ceil(n_out / tiles.sms) * tiles.sms)
    k_slices = k_inner / t.tile_k
    return padded * waves * k_slices / (np.ceil(k_slices) + (t.stages - 1 if tiles.fill else 0))


def gemm_tiles(gpu: GpuSpec, eff: Efficiency) -> Tiles | None:
    """The tile model of ``gpu``'s GEMMs where eff.gemm_tile_model asks for it and the GPU's SMs
    (GpuSpec.sms, from its catalog entry or file) and tile are known; else None."""
    tile = GEMM_TILE.get(gpu.name)
    if not eff.gemm_tile_model or tile is None or gpu.sms is None:
        return None
    return Tiles(sms=gpu.sms, tile=tile, fill=eff.gemm_tile_model == "waves+fill")


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    matmul_flops_per_s: float
    flash_flops_per_s: float
    hbm_bytes_per_s: float
    tiles: Tiles | None = None      # the GEMMs' tile model (gemm_tiles), None: off


def matmul_fraction_of(gpu: GpuSpec, eff: Efficiency) -> float:
    """The 16-bit GEMM rate's share of the dense peak: eff's, else the GPU's measured one
    (efficiency.MATMUL_FRACTION)."""
    if eff.matmul_fraction is not None:
        return eff.matmul_fraction
    return MATMUL_FRACTION.get(gpu.name, MATMUL_FRACTION_DEFAULT)


def fp8_fraction_of(gpu: GpuSpec, eff: Efficiency, recipe: Fp8Recipe | None = None) -> float | None:
    """The FP8 GEMM rate's share of the FP8 dense peak under ``eff``: its fp8_matmul_ratio times
    the GPU's 16-bit matmul fraction (an FP8 GEMM held to the same share of its own peak as the
    BF16 one, scaled by one fitted ratio), times eff.block_scaled_gemm_penalty for a microscaling
    ``recipe`` (MXFP8, NVFP4: Fp8Recipe.block_scaled); None for training.fp8.FP8_MATMUL_FRACTION's."""
    if eff.fp8_matmul_ratio is None:
        return None
    penalty = eff.block_scaled_gemm_penalty if recipe is not None and recipe.block_scaled else 1.0
    return eff.fp8_matmul_ratio * matmul_fraction_of(gpu, eff) * penalty


# rates' last answer with its arguments: a block table asks for the same GPU, dtype and
# efficiencies once per block row (issue 32: 53,406 times in the 256-job `plan buy`); matched by
# identity (both are frozen, and held here), which costs less than hashing them
_LAST_RATES: tuple[GpuSpec, str, Efficiency, Rates] | None = None


def rates(gpu: GpuSpec, dtype: str, eff: Efficiency) -> Rates:
    """Achievable rates: dense peak (at the GPU's sustained clock, efficiency.sustained_clock_share)
    x matmul fraction, x flash fraction, HBM x hbm fraction."""
    global _LAST_RATES
    last = _LAST_RATES
    if last is not None and last[0] is gpu and last[2] is eff and last[1] == dtype:
        return last[3]
    out = _rates(gpu, dtype, eff)
    _LAST_RATES = (gpu, dtype, eff, out)
    return out


def _rates(gpu: GpuSpec, dtype: str, eff: Efficiency) -> Rates:
    peak = gpu.peak_flops_per_s(dtype) * sustained_clock_share(gpu)
    mm = matmul_fraction_of(gpu, eff)
    fl = eff.flash_fraction if eff.flash_fraction is not None else FLASH_FRACTION.get(
        gpu.name, FLASH_FRACTION_DEFAULT)
    return Rates(matmul_flops_per_s=peak * mm, flash_flops_per_s=peak * fl,
                 hbm_bytes_per_s=gpu.hbm_bytes_per_s * eff.hbm_fraction, tiles=gemm_tiles(gpu, eff))


def image_time_s(m: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, eff: Efficiency) -> tuple[float, float]:
    """(forward, backward) seconds of the image side per sequence on one rank of the first
    stage (training.images: replicated over tp, so each rank runs all of it): its measured
    FLOPs at the matmul rate (rates). ASSUMPTION: the encoder's GEMMs reach the text
    blocks' matmul fraction; a vision encoder's widths (1,024-1,664) are smaller than a text
    tower's, so this leans fast."""
    fwd, bwd = image_flops_per_sequence(m, setup.finetune, setup.images_per_sample)
    if not fwd:
        return 0.0, 0.0
    rate = rates(gpu, setup.precision_spec.compute_dtype, eff).matmul_flops_per_s
    return fwd / rate, bwd / rate


@dataclass(frozen=True, kw_only=True, slots=True)
class ElementwiseBytes:
    """HBM bytes of one block's element-wise kernels per token on one rank."""

    fwd: float
    bwd: float


def elementwise_bytes_per_token(m: ModelSpec, lay: Layout | BlockShapes, setup: TrainingSetup) -> ElementwiseBytes:
    """HBM bytes the element-wise kernels of one block move per token, on one rank, for
    fused kernels (Megatron-LM / Apex / Transformer Engine); a = activation bytes.

    Each kernel reads its inputs and writes its outputs once:

    ==========================  ==========================  ===============================
    kernel                      forward                     backward
    ==========================  ==========================  ===============================
    norm (each)                 read x, write y: 2h a       read x, dy, write dx: 3h a
    residual add (+bias,        read 2h, write h: 3h a,     read dy and mask, write dx:
    dropout)                    + h mask bytes              2h a + h
    GeLU (bias fused)           read, write f: 2f a         read x, dy, write dx: 3f a
    SwiGLU                      read gate, up, write: 3f a  read gate, up, dy; write 2: 5f a
    RoPE on q and k             2 (q + kv) a                2 (q + kv) a
    MoE permute + unpermute     4 k h a                     4 k h a
    eager softmax (scores S)    read, write: 2 S a          read y, dy, write dx: 3 S a
    eager attention dropout     read, write, mask: S(2a+1)  read dy, mask, write dx: S(2a+1)
    ==========================  ==========================  ===============================

    S = n_heads x seq_len scores per token. Norms, residuals and their dropout run on the
    full sequence on every tp rank unless sequence parallelism splits them (Korthikanti et
    al. 2022, Sec. 4.2.2); the rest is split by tp.
    """
    a = setup.precision_spec.activation_bytes
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    tp = lay.tp
    h_div = sp_divisor(tp, lay.sp)
    k = m.n_experts_per_token if m.is_moe else 1
    mask = h if m.hidden_dropout > 0 else 0
    n_residual = 1 if m.parallel_block or m.layer_pattern else 2
    if m.layer_pattern:
        return _hybrid_elementwise(m, lay, setup, a, h_div, mask)
    rep_f = m.norms_per_layer * 2 * h * a + n_residual * (3 * h * a + mask)
    rep_b = m.norms_per_layer * 3 * h * a + n_residual * (2 * h * a + mask)
    if m.is_moe:
        rep_f += 4 * k * h * a
        rep_b += 4 * k * h * a
    split_f = k * (3 if m.gated_mlp else 2) * f * a
    split_b = k * (5 if m.gated_mlp else 3) * f * a
    if m.position == "rope":
        split_f += 2 * (q + kv) * a
        split_b += 2 * (q + kv) * a
    if setup.attention == "eager":
        scores = m.n_heads * lay.seq_len
        split_f += 2 * scores * a
        split_b += 3 * scores * a
        if m.attention_dropout > 0:
            split_f += scores * (2 * a + 1)
            split_b += scores * (2 * a + 1)
    return ElementwiseBytes(fwd=rep_f / h_div + split_f / tp, bwd=rep_b / h_div + split_b / tp)


def _hybrid_elementwise(m: ModelSpec, lay: Layout | BlockShapes, setup: TrainingSetup, a: int, h_div: Any,
                        mask: int) -> ElementwiseBytes:
    """elementwise_bytes_per_token's table for a hybrid's mean layer: one norm and one residual
    per layer; the MLP activation (relu2: read, write f; backward read x, dy, write dx; a gated
    MLP's as the transformer block's: 3 f forward, 5 f backward) on the k routed experts and the
    shared expert of the MoE layers and on the MLP layers; the MoE permute in the MoE layers;
    eager softmax in the attention layers. The Mamba and gated DeltaNet layers' element-wise
    work (conv, gated norm) is in timing.mamba's and timing.deltanet's traffic. Not counted:
    Qwen3-Next's attention output gate and partial rotary embedding (a few q-wide passes)."""
    tp, n = lay.tp, m.n_layers
    rep_f = float(2 * m.d_model * a + 3 * m.d_model * a + mask)
    rep_b = float(3 * m.d_model * a + 2 * m.d_model * a + mask)
    moe, mlp = m.n_moe_layers / n, m.n_mlp_layers / n
    widths = moe * (m.n_experts_per_token * m.d_ff + m.shared_d_ff) + mlp * m.dense_d_ff
    rep_f += moe * 4 * m.n_experts_per_token * dispatch_width(m) * a
    rep_b += moe * 4 * m.n_experts_per_token * dispatch_width(m) * a
    split_f, split_b = (3 if m.gated_mlp else 2) * widths * a, (5 if m.gated_mlp else 3) * widths * a
    if setup.attention == "eager":
        scores = m.n_heads * lay.seq_len * attention_share(m)
        split_f += 2 * scores * a
        split_b += 3 * scores * a
    return ElementwiseBytes(fwd=rep_f / h_div + split_f / tp, bwd=rep_b / h_div + split_b / tp)


@lru_cache(maxsize=64)
def _block_gemms(m: ModelSpec) -> tuple[tuple[Matmul, float], ...]:
    """models.matmuls.block_matmuls(m), each with its mean_block_share: the same for every block
    shape of ``m``, kept per model (issue 32: 14,677 block shapes in the 256-job `plan buy`, at
    up to 20 us a list for DeepSeek-V3)."""
    return tuple((mat, mean_block_share(m, mat)) for mat in block_matmuls(m))


class BlockShapes(NamedTuple):
    """Block shapes as int64 arrays (sp 0 or 1; one sequence length), named as the Layout
    fields and properties a block's compute time reads, so that the per-block functions below
    take a Layout (one shape) or these (many)."""

    tp: np.ndarray
    sp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    micro_batch: np.ndarray
    seq_len: int
    expert_tp: np.ndarray

    @property
    def tokens_per_rank(self) -> np.ndarray:
        """Layout.tokens_per_rank of each shape."""
        return self.micro_batch * seq_len_per_rank(self.seq_len, self.cp)


def sp_divisor(tp: Any, sp: Any) -> Any:
    """What an h-wide tensor is split by: tp under sequence parallelism, else 1 (sp 0 or 1;
    ints or arrays)."""
    return tp * sp + (1 - sp)


def block_compute_s(m: ModelSpec, setup: TrainingSetup, key: BlockShapes, kernels: str, gpu: GpuSpec,
                    eff: Efficiency) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float, int]:
    """layer_time's (forward, backward before recomputation, attention forward, element-wise
    forward seconds) of each block shape of ``key`` (arrays), and the block GEMMs' FLOP/s, HBM
    bytes/s and operand bytes (one each); what the recomputation adds follows in
    timing.layer.layer_time_table (layer_time's docstring says what these hold)."""
    r = rates(gpu, setup.precision_spec.compute_dtype, eff)
    prec = setup.precision_spec
    e = prec.weight_bytes
    tp, cp, ep, etp = key.tp, key.cp, key.ep, key.expert_tp
    s = key.seq_len
    tokens = key.micro_batch * s / cp
    d = m.head_dim
    mm, hbm = r.matmul_flops_per_s, r.hbm_bytes_per_s

    mm8, e8 = fp8_matmul(gpu, prec, mm, e, fp8_fraction_of(gpu, eff, prec.fp8))

    def gemm(rows: Any, cols: Any, inner: Any, batch: Any = 1.0) -> Any:
        """A block linear layer's GEMM: at the FP8 rate under an FP8 recipe (timing.kernels.fp8_matmul)."""
        return gemm_time_s(rows, cols, inner, mm8, hbm, e8, batch, r.tiles)

    dense: Any = 0.0
    mlp: Any = 0.0
    for mat, share in _block_gemms(m):
        if mat.kind == "expert":
            k = m.n_experts_per_token
            local = m.n_experts / ep
            rows = tokens * k / local * etp / tp     # tokens routed to each local expert (balanced)
            # the most loaded ep rank's experts, which the others wait for (setup.moe_imbalance)
            rows = np.where(ep > 1, rows * setup.moe_imbalance, rows)
            cols, inner = (mat.d_out / etp, mat.d_in) if mat.split == "column" else (mat.d_out, mat.d_in / etp)
            # a grouped GEMM with few rows per expert runs below the dense rate (Efficiency.expert_gemm_half_rows)
            mlp = mlp + share * gemm(rows, cols, inner, local) * (1 + eff.expert_gemm_half_rows / rows)
            continue
        if mat.kind == "router":        # the router stays 16-bit
            dense = dense + share * gemm_time_s(tokens, mat.d_out, mat.d_in, mm, hbm, e, tiles=r.tiles)
            continue
        splits: dict[str, tuple[Any, Any]] = {"column": (tp, 1), "row": (1, tp), "none": (1, 1)}
        div_out, div_in = splits[mat.split]
        t = share * gemm(tokens, mat.d_out / div_out, mat.d_in / div_in)
        if mat.kind == "attention":
            dense = dense + t
        else:
            mlp = mlp + t
    dv = m.value_head_dim
    heads = m.n_heads / tp
    if setup.attention == "flash":
        causal = local_attention_share(m, s) if (m.local_attention or m.index_topk) else (0.5 if m.causal else 1.0)
        attn_flops = 2 * key.micro_batch * (s / cp) * s * (d + dv) * heads * causal
        fp8_att = fp8_attention_speedup(gpu, setup)
        attn_bwd = 2.5 * attn_flops / (r.flash_flops_per_s * fp8_att)
        attn_fwd = attn_flops / attention_rate(gpu, r, d, dv, fp8_att)
    else:
        batch = key.micro_batch * heads
        attn_fwd = gemm(s / cp, s, d, batch) + gemm(s / cp, dv, s, batch)
        attn_bwd = 2 * attn_fwd
    if m.index_n_heads:     # DSA's indexer scores over the causal prefix, unsplit by tp (planner.models.dsa)
        index_fwd = key.micro_batch * (s / cp) * 0.5 * indexer_score_flops_per_token(m, s) / mm
        attn_fwd, attn_bwd = attn_fwd + index_fwd, attn_bwd + 2 * index_fwd
    attn_fwd, attn_bwd = attn_fwd * attention_share(m), attn_bwd * attention_share(m)
    a_bytes = prec.activation_bytes
    factor = 1.0 if runs_fused_elementwise(setup, kernels) else eff.unfused_elementwise_factor
    elem = elementwise_bytes_per_token(m, key, setup)
    elem_fwd, elem_bwd = (tokens * factor / hbm * x for x in (elem.fwd, elem.bwd))
    if prec.fp8 is not None:
        cast = fp8_cast_bytes(m, key, prec.fp8, tokens)
        elem_fwd = elem_fwd + cast[0] / hbm
        elem_bwd = elem_bwd + cast[1] / hbm
    gemm_fwd = dense + mlp
    if m.is_moe and eff.moe_token_passes:       # the dispatcher's unfused passes (Efficiency.moe_token_passes)
        routed = (tokens * eff.moe_token_passes * m.n_experts_per_token * dispatch_width(m) * a_bytes
                  / sp_divisor(tp, key.sp))
        elem_fwd = elem_fwd + routed * m.n_moe_layers / m.n_layers / hbm
        elem_bwd = elem_bwd + 2 * routed * m.n_moe_layers / m.n_layers / hbm
    if m.is_moe and host_sync_per_moe_block(setup.cuda_graphs):
        # the mean block's share of the MoE blocks' fixed cost: the block's (host sync, router,
        # permutation) and its local experts' (Efficiency.moe_expert_launch_s)
        fixed = eff.moe_block_overhead_s + eff.moe_expert_launch_s * m.n_experts / ep
        elem_fwd = elem_fwd + fixed * m.n_moe_layers / m.n_layers
        elem_bwd = elem_bwd + 2 * fixed * m.n_moe_layers / m.n_layers
    if m.n_deltanet_layers:     # the mean block's share of the gated DeltaNet layers' rule and conv
        rule_f, rule_b = deltanet_scan_time_s(m, tokens, tp, mm, hbm, prec.activation_bytes)   # type: ignore[arg-type]
        elem_fwd = elem_fwd + rule_f * m.n_deltanet_layers / m.n_layers
        elem_bwd = elem_bwd + rule_b * m.n_deltanet_layers / m.n_layers
    if m.n_mamba_layers:        # the mean block's share of the Mamba layers' scan and conv (timing.mamba)
        scan_f, scan_b = mamba_scan_time_s(m, tokens, s, tp, mm, hbm, prec.activation_bytes)   # type: ignore[arg-type]
        elem_fwd = elem_fwd + scan_f * m.n_mamba_layers / m.n_layers
        elem_bwd = elem_bwd + scan_b * m.n_mamba_layers / m.n_layers
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + elem_bwd
    if setup.finetune.freezes_base:
        adapter_fwd, dequant = frozen_block_extra_s(m, setup.finetune, key, r, e)
        fwd = gemm_fwd + attn_fwd + elem_fwd + adapter_fwd + dequant
        bwd = gemm_fwd + attn_bwd + elem_bwd + 2 * adapter_fwd + dequant
    n = len(tp)
    return (np.broadcast_to(fwd, n), np.broadcast_to(bwd, n), np.broadcast_to(attn_fwd, n),
            np.broadcast_to(elem_fwd, n), mm8, hbm, e8)


def attention_rate(gpu: GpuSpec, r: Rates, d_qk: int, d_v: int, tensor_speedup: float = 1.0) -> float:
    """FLOP/s of a fused attention forward: the flash rate (x ``tensor_speedup`` for FP8
    attention, fp8_attention_speedup), or where the GPU's exponential unit bounds it
    (efficiency.TENSOR_FLOPS_PER_EXP: one exp per score against 2 (d_qk + d_v) FLOPs of the
    16-bit tensor cores) the same share of that bound, which FP8 does not raise:
    flash rate x min(speedup, 2 (d_qk + d_v) / FLOPs per exp). The backward recomputes one exp
    per score for 2.5x the FLOPs, and is left at the flash rate (x speedup)."""
    per_exp = TENSOR_FLOPS_PER_EXP.get(gpu.name)
    if per_exp is None:
        return r.flash_flops_per_s * tensor_speedup
    return r.flash_flops_per_s * min(tensor_speedup, 2 * (d_qk + d_v) / per_exp)


def fp8_attention_speedup(gpu: GpuSpec, setup: TrainingSetup) -> float:
    """The tensor-core speed-up of Transformer Engine's FP8 attention (TrainingSetup.fp8_attention)
    over the 16-bit one: the GPU's FP8 dense peak over its BF16 dense peak (data sheets: 2 on
    Hopper and Blackwell), 1 without it. ASSUMED: the fused kernel keeps the same share of either
    peak (FlashAttention-3 reports 1.2 PFLOP/s FP8 against 0.74 BF16 forward on H100, Shah et al.
    2024, arXiv:2407.08608, Sec. 4.1: a speed-up of 1.6, below the peaks' 2)."""
    if not setup.fp8_attention or gpu.fp8_flops_per_s is None:
        return 1.0
    return gpu.fp8_flops_per_s / gpu.peak_flops_per_s("bf16")


def local_attention_share(m: ModelSpec, seq_len: int) -> float:
    """The share of the s x s scores a fused attention kernel computes, averaged over the
    blocks: causal full attention half of them; a sliding window of w keys (Gemma 3,
    gpt-oss; FlashAttention's window_size) w - w (w - 1) / (2 s) per query for w <= s; a
    causal chunk of c tokens (Llama 4's chunked attention) (c + 1) / 2 per query; DeepSeek
    Sparse Attention's min(p, index_topk) selected keys per query p (dsa.sparse_attention_share,
    every block). Each query's key count over s gives the share. Eager attention computes every
    score and masks the rest (transformers' eager path), so only fused kernels skip them."""
    if m.index_topk:
        return sparse_attention_share(m, seq_len)
    s, w = seq_len, min(m.attention_window, seq_len)
    full = 0.5
    if m.local_attention == "sliding":
        local = (w - w * (w - 1) / (2 * s)) / s
    elif m.local_attention == "chunked":
        local = (w + 1) / 2 / s
    else:
        local = full
    local = min(local, full)     # a window or chunk as long as the sequence is full causal attention
    n_local = min(m.n_local_layers, m.n_layers)
    return (n_local * local + (m.n_layers - n_local) * full) / m.n_layers


def fp8_matmul(gpu: GpuSpec, prec: Precision, mm_flops_per_s: float, elem_bytes: int,
               fraction: float | None = None) -> tuple[float, int]:
    """(GEMM FLOP/s, operand bytes) of a block's linear layers: the 16-bit ones, or under an
    FP8 recipe the GPU's FP8 dense peak (gpus.toml, data sheets; at its sustained clock,
    efficiency.sustained_clock_share) x the recipe's ASSUMED matmul fraction
    (training.fp8.FP8_MATMUL_FRACTION, or ``fraction``: fp8_fraction_of) with 1-byte operands."""
    r = prec.fp8
    if r is None or gpu.fp8_flops_per_s is None:
        return mm_flops_per_s, elem_bytes
    return gpu.fp8_flops_per_s * sustained_clock_share(gpu) * r.matmul_fraction(gpu.name, fraction), 1


def fp8_cast_bytes(m: ModelSpec, key: Layout | BlockShapes, r: Fp8Recipe, tokens: Any) -> tuple[Any, Any]:
    """HBM bytes (forward, backward) of one block's casts to FP8, for one micro-batch on one rank.

    Per token, each FP8 linear layer casts its input (forward: the attention input h, the
    output projection's q/tp, the MLP's k h, the down projection's k f/tp; one cast per
    distinct input), in backward its output gradient ((q + 2 kv)/tp, h, k x (2 or 1) f/tp,
    k h) cast_passes_bwd_out times and its input again cast_passes_bwd_in times (torchao
    recasts the saved 16-bit input along the other axis for the weight gradient); each cast
    moves Fp8Recipe.cast_bytes per element. Recipes that keep no fp8 weight copy
    (Fp8Recipe.fp8_weight_copy_bytes 0: torchao's tensorwise and rowwise) also cast each local
    weight once in forward and once in backward per micro-batch (torchao float8_linear.py);
    Transformer Engine's recipes (delayed, current scaling under Megatron, MXFP8, NVFP4) cache
    their fp8 weights across the micro-batches of a step (not counted). h-wide
    tensors are split by tp under sequence parallelism."""
    tp = key.tp
    h_div = sp_divisor(tp, key.sp)
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    k = m.n_experts_per_token if m.is_moe else 1
    mats_in = 2 if m.gated_mlp else 1
    inputs = h / h_div + q / tp + k * h / h_div + k * f / tp
    outputs = (q + 2 * kv) / tp + h / h_div + k * mats_in * f / tp + k * h / h_div
    fwd = tokens * r.cast_passes_fwd * inputs * r.cast_bytes
    bwd = tokens * (r.cast_passes_bwd_out * outputs + r.cast_passes_bwd_in * inputs) * r.cast_bytes
    if not r.fp8_weight_copy_bytes:     # no fp8 weight cached across micro-batches
        local_experts = m.n_experts / key.ep if m.is_moe else 1
        weights = (h * (q + 2 * kv) + q * h + local_experts * (mats_in + 1) * h * f) / tp
        fwd += weights * r.cast_bytes
        bwd += weights * r.cast_bytes
    return fwd, bwd


def frozen_block_extra_s(m: ModelSpec, ft: FinetuneSpec, key: Layout | BlockShapes, r: Rates, elem_bytes: int
                         ) -> tuple[Any, Any]:
    """(adapter GEMMs' forward, one dequantization pass) of one block under LoRA/QLoRA, for
    one micro-batch on one rank, in seconds.

    Adapters (flops.block_adapters, the list the step's FLOPs read): every adapted linear
    layer d_in -> d_out runs x A (T x d_in x r) then (x A) B (T x r x d_out), r the rank
    (times PEFT's factor on fused expert projections), expert layers on the tokens routed to
    each local expert (Hu et al. 2021, arXiv:2106.09685, Sec. 4.1); a layer that only some
    blocks hold (an MoE model's dense MLP, its experts) counts in the share of blocks that
    hold it, as the FLOPs count it. Adapters split by tp as the layers they adapt (finetune.rank_split), here as
    d_in / tp into A and d_out / tp out of B. Backward runs both gradients of A and B: twice
    the forward (layer_time). Adapters outside the blocks (BERT's MLM transform) and dropout
    on the adapter path are not counted.

    Dequantization: a quantized base (QLoRA's NF4, Dettmers et al. 2023, arXiv:2305.14314,
    Sec. 3: bitsandbytes dequantizes each NF4 block, double-dequantizing its 8-bit absmax
    constant first, to a 16-bit weight and runs a 16-bit GEMM) reads the stored weight
    (finetune.linear_weight_bytes) and writes the 16-bit copy before every GEMM call that
    uses it: forward, backward (the input gradient needs W) and a recomputed forward. The
    GEMM's read of the 16-bit copy is already in gemm_time_s. One memory-bound pass at the
    HBM rate per call, on the rank's share (1/tp, experts 1/ep); the same pass is assumed
    for int8 and int4 bases.
    """
    tp, ep = key.tp, key.ep
    tokens = key.tokens_per_rank
    mm, hbm = r.matmul_flops_per_s, r.hbm_bytes_per_s
    k = m.n_experts_per_token if m.is_moe else 1
    adapters: Any = 0.0
    for ad in block_adapters(m, ft):
        local = ad.n_copies / ep if ad.expert else 1
        rows = tokens * k / (m.n_experts / ep) if ad.expert else tokens
        share = ad.n_blocks / m.n_layers       # the average block: a layer some blocks hold only
        adapters += share * (gemm_time_s(rows, ad.rank, ad.d_in / tp, mm, hbm, elem_bytes, local, r.tiles)
                             + gemm_time_s(rows, ad.d_out / tp, ad.rank, mm, hbm, elem_bytes, local, r.tiles))
    dequant: Any = 0.0
    if ft.quant != "none":
        for lin in block_linears(m):
            if lin.group == "router":       # not quantized (finetune.frozen_block_bytes)
                continue
            stored = linear_weight_bytes(lin, ft.quant, elem_bytes, ft.double_quant)
            split = tp * (ep if lin.expert else 1)
            dequant += (stored + lin.weight_numel * elem_bytes) / split / hbm
    return adapters, dequant


def head_backward_gemms(ft: FinetuneSpec) -> int:
    """Backward GEMMs per forward GEMM of the LM head: 2 (input and weight gradients), 1
    when it is frozen (LoRA, QLoRA, freeze: only the input gradient)."""
    return 2 if ft.is_full else 1


def backward_layers(ft: FinetuneSpec, n_layers_total: int, first_layer: int, n_layers: int) -> int:
    """Blocks of a stage (layers first_layer ..) that run a backward pass. Under freeze
    (the last blocks train, finetune.FinetuneSpec) autograd stops at the first trainable
    block: the frozen blocks before it, and the embedding, need no gradient, and keep no
    activations either (finetune.activation_layers, which this is). LoRA adapters sit in
    every block, so every block runs backward."""
    return activation_layers(ft, n_layers_total, first_layer, n_layers)
