"""Step time: FLOPs, compute time, communication over the cluster graph, pipeline bubble.

A step is the optimizer step of one global batch. Its time on one pipeline is

    (m + (p-1)/v) x t_mb  +  exposed data-parallel communication  +  optimizer update

where m is the micro-batches per step, p the pipeline stages, v the virtual stages per rank
and t_mb the time of one micro-batch (forward and backward) on the slowest stage, including
the tensor-, context- and expert-parallel communication it cannot hide and its pipeline
sends (Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2). t_mb is built operation by
operation: matrix multiplies at an achievable matmul rate, attention at a fused-kernel or
batched-GEMM rate, element-wise kernels at HBM bandwidth, collectives with the alpha-beta
model and each group's bus bandwidth read off the topology graph.

FLOPs follow the papers' convention: a multiply-add is 2 FLOPs, attention scores count the
full s x s (no causal halving), norms and element-wise work are not counted. "Model" FLOPs
exclude recomputation (MFU, Chowdhery et al. 2022, PaLM, App. B; Korthikanti et al. 2022);
"hardware" FLOPs include it (the convention of Narayanan et al.'s Table 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import (  # noqa: F401 - re-exported
    FALLBACK_INTRA_LATENCY_S,
    AxisLink,
    Cluster,
    axis_links,
    cluster_for,
    scale_up_domain_gpus,
)
from planner.hardware.topology import AXES
from planner.layouts.layout import Layout
from planner.memory.model import rank_params, stage_layers
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.finetune import (
    FinetuneSpec,
    RankSplit,
    activation_layers,
    block_linears,
    linear_weight_bytes,
    rank_split,
    resolve_targets,
)
from planner.training.setup import (
    Precision,
    TrainingSetup,
    optimizer_state_bytes_per_param,
)

# ------------------------------------------------------------------------- FLOPs


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerFlops:
    """Forward FLOPs of one transformer block, per token (2 FLOPs per multiply-add).

    qkv: 2 h (q + 2 kv), GQA narrows K and V to n_kv_heads; scores: Q K^T and the
    attention-weighted V, 2 s q each over the full s x s (Megatron's convention);
    out: 2 q h; mlp: 2 h f per d_model x d_ff matrix, three for a gated MLP, two
    otherwise, times the k experts each token visits, plus the router's 2 h E.
    """

    qkv: float
    scores: float
    out: float
    mlp: float

    @property
    def total(self) -> float:
        return self.qkv + self.scores + self.out + self.mlp


def layer_flops(m: ModelSpec, seq_len: int) -> LayerFlops:
    """Forward FLOPs per token of one block (see LayerFlops)."""
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    k = m.n_experts_per_token if m.is_moe else 1
    mats = 3 if m.gated_mlp else 2
    router = 2 * h * m.n_experts if m.is_moe else 0
    return LayerFlops(qkv=2 * h * (q + 2 * kv), scores=4 * seq_len * q, out=2 * q * h,
                      mlp=k * mats * 2 * h * f + router)


def head_flops(m: ModelSpec) -> float:
    """Forward FLOPs per token of the LM head (2 h V; BERT's MLM transform adds 2 h^2)."""
    return 2 * m.d_model * m.vocab_size + (2 * m.d_model**2 if m.mlm_head else 0)


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token without recomputation: backward is twice forward.

    For a GPT block (ffn 4h, no GQA) this is 72 l h^2 (1 + s/6h + V/12lh) per token,
    Korthikanti et al. 2022, arXiv:2205.05198, Eq. 7 ("model FLOPs").
    """
    return 3 * (m.n_layers * layer_flops(m, seq_len).total + head_flops(m))


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str) -> float:
    """Training FLOPs per token the GPUs execute, recomputation included.

    full: every block runs its forward twice. For a GPT block that gives
    96 l h^2 (1 + s/6h + V/16lh) per token, Narayanan et al. 2021, arXiv:2104.04473, Eq. 3.
    selective: the attention scores (Q K^T and scores x V) are recomputed, Korthikanti et
    al. 2022, Sec. 4.2, i.e. 4 s q more forward FLOPs per block.
    """
    lf = layer_flops(m, seq_len)
    extra = {"none": 0.0, "selective": lf.scores, "full": lf.total}[recompute]
    return model_flops_per_token(m, seq_len) + m.n_layers * extra


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFlops:
    model_flops: float        # no recomputation (for MFU)
    hardware_flops: float     # with recomputation


def flops_per_step(m: ModelSpec, seq_len: int, n_sequences: int, recompute: str = "none") -> StepFlops:
    """FLOPs of one optimizer step over ``n_sequences`` sequences of ``seq_len`` tokens.

    Whatever trains, these count full training's FLOPs (6N per token for the weights, as
    Kaplan's and PaLM's MFU do): under LoRA, QLoRA and freeze the GPUs skip the frozen
    weights' gradients (layer_time), so MFU and HFU there compare the step with full
    training's work, not with the work the GPUs did."""
    tokens = n_sequences * seq_len
    return StepFlops(model_flops=tokens * model_flops_per_token(m, seq_len),
                     hardware_flops=tokens * hardware_flops_per_token(m, seq_len, recompute))


# ------------------------------------------------------------------ efficiencies

# Sustained matmul FLOP/s of large BF16/FP16 GEMMs, as a fraction of the dense peak.
# H100/H200: 0.711 = MSMF (maximum *sustainable* matmul FLOPS, power-saturated near TDP)
# 702.9/989 measured on H200, the same GH100 die at the same 700 W (stas00/ml-engineering,
# compute/accelerator/benchmarks/README.md, "What we measured"); their burst MAMF is
# 792.1-828/989 but training runs saturated. B200: MSMF 1455.7/2250 = 0.647 (same table).
# A100: its MAMF is 267.9/312 = 0.859 (ml-engineering, compute/accelerator/README.md,
# "Maximum Achievable Matmul FLOPS comparison table") and no sustained figure is published;
# 0.80 is the rate at which this model reproduces the measured per-layer forward and
# backward times of Korthikanti et al. 2022, Table 4 (22B, A100) within 10%
# (tests/test_timing.py). MI300X: MAMF 781.9/1300 = 0.601 (same table).
MATMUL_FRACTION = {
    "a100": 0.80, "a100-40gb": 0.80, "h100": 0.711, "h200": 0.711, "b200": 0.647,
    "gb200": 0.647, "mi300x": 0.601,
}
MATMUL_FRACTION_DEFAULT = 0.75      # ASSUMPTION for GPUs not measured there (PCIe cards, V100)

# Fused (FlashAttention-style) attention, forward and backward, as a fraction of the dense
# peak on the FLOPs the kernel does (causal: half the s x s; backward 2.5x forward).
# A100: FlashAttention-2 reaches 50-73% of peak (Dao 2023, arXiv:2307.08691, Sec. 4);
# 0.60 for causal, head dim 128, forward and backward. Hopper and later: FlashAttention-2
# reaches 35% of the H100's peak (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608,
# Sec. 1); FlashAttention-3 and cuDNN reach more, forward most of all, so 0.35 is the rate
# of the kernels the published H100 runs (2024) used, and a floor for newer stacks.
FLASH_FRACTION = {"a100": 0.60, "a100-40gb": 0.60, "h100": 0.35, "h200": 0.35, "b200": 0.35,
                  "gb200": 0.35}
FLASH_FRACTION_DEFAULT = 0.40       # ASSUMPTION: FlashAttention-2 on other GPUs


@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """The named efficiency and overlap parameters of the step-time model.

    matmul_fraction / flash_fraction: None takes the GPU's measured value from
    MATMUL_FRACTION / FLASH_FRACTION (sources there).
    hbm_fraction: share of the HBM bandwidth that training's element-wise, normalisation
    and loss kernels reach. Streaming copies reach 85-90% (BabelStream, Deakin et al.
    2018); the kernels of transformer training, with reductions and short rows, run well
    below that (Ivanov et al. 2021, "Data Movement Is All You Need", MLSys, Sec. 4-5); 0.70.
    bus_fraction: NCCL bus bandwidth over the link bandwidth the graph gives; nccl-tests
    all_reduce_perf on DGX A100 / H100 NVLink reports about 230/300 and 360-370/450 GB/s
    busbw, on 8x HDR/NDR about 185/200 and 370/400 (NVIDIA/nccl-tests doc/PERFORMANCE.md
    defines busbw; the DGX figures are NVIDIA's published nccl-tests results).
    *_overlap: fraction of a communication that runs under compute. tp: Megatron-LM before
    Transformer Engine ran tp collectives on the critical path (0); TE's userbuffer
    comm-GEMM overlap (Megatron-Core --tp-comm-overlap) splits each GEMM into chunks
    (typically 4) and sends one chunk while the next computes, so about one chunk in four
    stays exposed: 0.75 (Wang et al. 2023, ASPLOS, "Overlap communication with dependent
    computation via decomposition in large deep learning models"). dp: the share of the last micro-batch's backward
    that gradient buckets overlap (PyTorch DDP, Li et al. 2020, VLDB, Sec. 3.2.3);
    param_gather: ZeRO-1/2's parameter all-gather under the next forward (Megatron-Core
    --overlap-param-gather); zero3: ZeRO-3/FSDP prefetch of the next unit's gather; cp:
    ring attention sends the next K/V chunk while the current one computes (Liu et al.
    2023, arXiv:2310.01889); pp: the pipeline sends under compute (Megatron-Core
    --overlap-p2p-communication); ep: all-to-all under compute (0: on the critical path).
    unfused_elementwise_factor: HBM traffic of eager PyTorch element-wise ops relative to
    fused kernels (a Hugging Face RMSNorm runs six kernels, fp32 upcast included, where
    Megatron/Apex run one; SiLU and multiply run as two).
    grad_reduce_bytes: bytes per gradient element the data-parallel reduction moves; None
    takes the precision's gradient bytes. Megatron-LM keeps fp32 main gradients and reduces
    them in fp32 under bf16 (--accumulate-allreduce-grads-in-fp32, set by --bf16).
    overlap_slowdown: compute time lost per second of communication hidden under it. NCCL
    runs one thread block per channel on its own SM and moves data through HBM; with 16-32
    channels on 108-132 SMs a collective takes roughly 15-25% of the SMs while it runs
    (NCCL environment variables NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS; Rashidi et al.
    2021, ISCA, "Enabling Compute-Communication Overlap in Distributed Deep Learning
    Training Platforms", Sec. 2: overlapped collectives slow the compute kernels they share
    the GPU with).
    """

    matmul_fraction: float | None = None
    flash_fraction: float | None = None
    hbm_fraction: float = 0.70
    bus_fraction: float = 0.80
    tp_overlap: float = 0.0
    cp_overlap: float = 1.0
    ep_overlap: float = 0.0
    pp_overlap: float = 0.0
    dp_overlap: float = 1.0
    param_gather_overlap: float = 0.0
    zero3_overlap: float = 1.0
    unfused_elementwise_factor: float = 3.0
    grad_reduce_bytes: int | None = None
    overlap_slowdown: float = 0.2
    name: str = "default"


DEFAULT_EFFICIENCY = Efficiency()      # the defaults above, as the default argument of the models


# Engines whose overlap settings the published runs document (bench/published_runs.py).
MEGATRON_2021 = Efficiency(dp_overlap=0.0, name="megatron-lm 2021 (no comm overlap)")
MEGATRON_CORE = Efficiency(tp_overlap=0.75, pp_overlap=1.0, dp_overlap=1.0, param_gather_overlap=1.0,
                           grad_reduce_bytes=4,
                           name="megatron-core (tp, dp, param-gather and p2p overlap)")


# Megatron-LM's vocab-parallel cross entropy on fp32 logits, per logit (unfused, as in
# Megatron-LM through Megatron-Core 0.8 and in Hugging Face's loss): forward casts the 16-bit
# logits to fp32 (read 2, write 4), takes the max (read 4), subtracts it (read 4, write 4),
# exponentiates (read 4, write 4), sums (read 4) and normalises (read 4, write 4): 38 bytes;
# backward scales the saved softmax by the incoming gradient (read 4, write 4) and casts it
# back (read 4, write 2): 14 bytes.
CROSS_ENTROPY_BYTES_PER_LOGIT = 52
CROSS_ENTROPY_FORWARD_SHARE = 38 / 52


# The placements step_time() tries for each layout, keeping the faster (innermost axis first).
PLACEMENT_ORDERS: tuple[tuple[str, ...], ...] = (
    AXES,                                   # tp, cp, ep, dp, pp: Megatron-LM's default
    ("tp", "cp", "ep", "pp", "dp"),         # pipeline neighbours closer than data replicas
)


# ------------------------------------------------------------------ operation costs


def gemm_time_s(m_rows: float, n_cols: float, k_inner: float, flops_per_s: float, bytes_per_s: float,
                elem_bytes: int, batch: float = 1.0) -> float:
    """Time of ``batch`` (m x k) @ (k x n) matrix multiplies: the math at the achievable
    matmul rate plus one pass of the operands and the result through HBM.

    A tiled GEMM reads A and B and writes C at least once (NVIDIA, "Matrix Multiplication
    Background User's Guide", Math and Memory Bounds); the two are added rather than
    overlapped because the load of the first tiles and the store of the last ones do not
    hide under math, which is what makes narrow GEMMs (small k or n, as tensor
    parallelism makes them) slower per FLOP (Anthony et al. 2024, "The Case for
    Co-Designing Model Architectures with Hardware", arXiv:2401.14489, Sec. 3).
    """
    flops = 2 * batch * m_rows * n_cols * k_inner
    traffic = elem_bytes * batch * (m_rows * k_inner + k_inner * n_cols + m_rows * n_cols)
    return flops / flops_per_s + traffic / bytes_per_s


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    matmul_flops_per_s: float
    flash_flops_per_s: float
    hbm_bytes_per_s: float


def rates(gpu: GpuSpec, dtype: str, eff: Efficiency) -> Rates:
    """Achievable rates: dense peak x matmul fraction, x flash fraction, HBM x hbm fraction."""
    peak = gpu.peak_flops_per_s(dtype)
    mm = eff.matmul_fraction if eff.matmul_fraction is not None else MATMUL_FRACTION.get(
        gpu.name, MATMUL_FRACTION_DEFAULT)
    fl = eff.flash_fraction if eff.flash_fraction is not None else FLASH_FRACTION.get(
        gpu.name, FLASH_FRACTION_DEFAULT)
    return Rates(matmul_flops_per_s=peak * mm, flash_flops_per_s=peak * fl,
                 hbm_bytes_per_s=gpu.hbm_bytes_per_s * eff.hbm_fraction)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class ElementwiseBytes:
    """HBM bytes of one block's element-wise kernels per token on one rank."""

    fwd: float
    bwd: float


def elementwise_bytes_per_token(m: ModelSpec, lay: Layout, setup: TrainingSetup) -> ElementwiseBytes:
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
    h_div = tp if lay.sp else 1
    k = m.n_experts_per_token if m.is_moe else 1
    mask = h if m.hidden_dropout > 0 else 0
    n_residual = 1 if m.parallel_block else 2
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


@lru_cache(maxsize=8192)
def layer_time(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str, gpu: GpuSpec,
               eff: Efficiency) -> LayerTime:
    """Compute time of one block for one micro-batch on one rank, and its collective volumes.

    GEMMs (per rank, T = micro-batch x seq/cp tokens): QKV T x h x (q+2kv)/tp, output
    T x q/tp x h, MLP T x h x f/tp (x2 gated) and T x f/tp x h; MoE experts see T k ep / E
    tokens each, E/ep of them per rank. Backward runs two GEMMs per forward GEMM (input and
    weight gradients). Attention: fused (flash) at the flash rate on the causal half, backward
    2.5x forward (Dao 2023, Sec. 3.1: backward recomputes the scores); eager as two batched
    GEMMs per head with k = head_dim and k = s. Element-wise kernels at HBM bandwidth
    (elementwise_bytes_per_token; eager kernels x Efficiency.unfused_elementwise_factor).
    Recomputation adds forward work: full the whole block, selective the
    attention core (Korthikanti et al. 2022, Sec. 4.2-4.3).

    Fine-tuning (setup.finetune, see frozen_block_extra_s): under LoRA and QLoRA the base
    weights are frozen, so each base GEMM runs one backward GEMM (the input gradient)
    instead of two, and the adapters add their own GEMMs (forward, and twice that in
    backward). Under freeze a block either trains in full or runs no backward at all
    (pipeline_part counts which: backward_layers()), so its times are full training's.
    """
    r = rates(gpu, setup.precision_spec.compute_dtype, eff)
    prec = setup.precision_spec
    e = prec.weight_bytes
    tp, cp, ep = key.tp, key.cp, key.ep
    s = key.seq_len
    tokens = key.micro_batch * s / cp
    h, q, kv, f, d = m.d_model, m.q_dim, m.kv_dim, m.d_ff, m.head_dim
    mm, hbm = r.matmul_flops_per_s, r.hbm_bytes_per_s

    def gemm(rows: float, cols: float, inner: float, batch: float = 1.0) -> float:
        return gemm_time_s(rows, cols, inner, mm, hbm, e, batch)

    dense = gemm(tokens, (q + 2 * kv) / tp, h) + gemm(tokens, h, q / tp)
    mats_in = 2 if m.gated_mlp else 1
    if m.is_moe:
        k = m.n_experts_per_token
        local = m.n_experts / ep
        rows = tokens * k / local        # tokens routed to each local expert (balanced)
        dense += gemm(tokens, m.n_experts, h)
        mlp = gemm(rows, mats_in * f / tp, h, local) + gemm(rows, h, f / tp, local)
    else:
        mlp = gemm(tokens, mats_in * f / tp, h) + gemm(tokens, h, f / tp)
    heads = m.n_heads / tp
    if setup.attention == "flash":
        causal = 0.5 if m.causal else 1.0
        attn_flops = 4 * key.micro_batch * (s / cp) * s * d * heads * causal
        attn_fwd = attn_flops / r.flash_flops_per_s
        attn_bwd = 2.5 * attn_fwd
    else:
        batch = key.micro_batch * heads
        attn_fwd = gemm(s / cp, s, d, batch) + gemm(s / cp, d, s, batch)
        attn_bwd = 2 * attn_fwd
    factor = 1.0 if kernels == "fused" else eff.unfused_elementwise_factor
    elem = elementwise_bytes_per_token(m, key, setup)
    elem_fwd, elem_bwd = (tokens * factor / hbm * x for x in (elem.fwd, elem.bwd))
    gemm_fwd = dense + mlp
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + elem_bwd
    if setup.finetune.freezes_base:
        adapter_fwd, dequant = frozen_block_extra_s(m, setup.finetune, key, r, e)
        fwd = gemm_fwd + attn_fwd + elem_fwd + adapter_fwd + dequant
        bwd = gemm_fwd + attn_bwd + elem_bwd + 2 * adapter_fwd + dequant
    if key.recompute == "full":
        bwd += fwd
    elif key.recompute == "selective":
        bwd += attn_fwd
    # tp: 2 all-reduces (or all-gather + reduce-scatter pairs with sp) in forward, 2 in
    # backward, 2 more when full recomputation reruns the forward (Shoeybi et al. 2019, Sec. 3).
    tp_coll = (4 + (2 if key.recompute == "full" else 0)) if tp > 1 else 0
    a = prec.activation_bytes
    cp_bytes = tokens * 2 * kv * a / tp if cp > 1 else 0.0
    k_ = m.n_experts_per_token if m.is_moe else 1
    ep_bytes = tokens * k_ * h * a / (tp if key.sp else 1) if (m.is_moe and ep > 1) else 0.0
    return LayerTime(fwd_s=fwd, bwd_s=bwd, attention_fwd_s=attn_fwd,
                     tp_bytes=tokens * h * a, tp_collectives=tp_coll,
                     cp_bytes=cp_bytes, cp_passes=(3 + (1 if key.recompute == "full" else 0)) if cp > 1 else 0,
                     ep_bytes=ep_bytes,
                     ep_all_to_alls=(4 + (2 if key.recompute == "full" else 0)) if ep_bytes else 0)


def frozen_block_extra_s(m: ModelSpec, ft: FinetuneSpec, key: Layout, r: Rates, elem_bytes: int
                         ) -> tuple[float, float]:
    """(adapter GEMMs' forward, one dequantization pass) of one block under LoRA/QLoRA, for
    one micro-batch on one rank, in seconds.

    Adapters: every adapted linear layer d_in -> d_out runs x A (T x d_in x r) then (x A) B
    (T x r x d_out), r the rank (times PEFT's factor on fused expert projections), expert
    layers on the tokens routed to each local expert (Hu et al. 2021, arXiv:2106.09685,
    Sec. 4.1). Adapters split by tp as the layers they adapt (finetune.rank_split), here as
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
    tokens = key.micro_batch * key.seq_len / key.cp
    mm, hbm = r.matmul_flops_per_s, r.hbm_bytes_per_s
    k = m.n_experts_per_token if m.is_moe else 1
    adapters = 0.0
    for lin in resolve_targets(m, ft):
        if lin.group == "outside":
            continue
        rank = ft.lora_rank * lin.rank_factor
        local = lin.n_copies / ep if lin.expert else 1
        rows = tokens * k / (m.n_experts / ep) if lin.expert else tokens
        adapters += (gemm_time_s(rows, rank, lin.d_in / tp, mm, hbm, elem_bytes, local)
                     + gemm_time_s(rows, lin.d_out / tp, rank, mm, hbm, elem_bytes, local))
    dequant = 0.0
    if ft.quant != "none":
        for lin in block_linears(m):
            if lin.group == "router":       # not quantized (finetune.frozen_block_bytes)
                continue
            stored = linear_weight_bytes(lin, ft.quant, elem_bytes, ft.double_quant)
            share = tp * (ep if lin.expert else 1)
            dequant += (stored + lin.weight_numel * elem_bytes) / share / hbm
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


@lru_cache(maxsize=4096)
def _rank_split(m: ModelSpec, pc: ParamCount, ft: FinetuneSpec, tp: int, ep: int, pp: int, stage: int,
                n_layers: int, weight_bytes: int) -> RankSplit:
    rp = rank_params(m, pc, Layout(tp=tp, ep=ep, pp=pp), stage, n_layers)
    first = sum(stage_layers(m.n_layers, pp)[:stage])
    return rank_split(m, pc, ft, Layout(tp=tp, ep=ep, pp=pp), rp.dense, rp.expert, rp.root_unit, n_layers,
                      backward_layers(ft, m.n_layers, first, n_layers), stage == pp - 1, weight_bytes, 0)


def trained_split(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, lay: Layout, stage: int,
                  n_layers: int) -> RankSplit:
    """The parameters of one rank of ``stage`` split into those that train and the frozen
    base (finetune.rank_split, as memory.per_rank_memory splits them): the data-parallel
    gradient reductions and the optimizer update cover the trainable ones; ZeRO-3/FSDP
    gathers the frozen base too, at its stored bytes (4-bit under QLoRA). Full training:
    every parameter trains, nothing is frozen."""
    return _rank_split(m, pc, setup.finetune, lay.tp, lay.ep, lay.pp, stage, n_layers,
                       setup.precision_spec.weight_bytes)


def all_reduce_s(n_bytes: float, n: int, link: AxisLink, eff: Efficiency) -> float:
    """Ring all-reduce: 2(n-1) steps of latency plus 2(n-1)/n x S over the bus bandwidth
    (Patarasuk & Yuan 2009; nccl-tests' busbw definition)."""
    if n <= 1 or n_bytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * n_bytes / (link.bus_bytes_per_s * eff.bus_fraction)


def gather_s(n_bytes: float, n: int, link: AxisLink, eff: Efficiency) -> float:
    """Ring all-gather or reduce-scatter of S bytes in all: (n-1) steps, (n-1)/n x S."""
    if n <= 1 or n_bytes <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * n_bytes / (link.bus_bytes_per_s * eff.bus_fraction)


def send_s(n_bytes: float, link: AxisLink, eff: Efficiency) -> float:
    """One point-to-point send: latency plus bytes over the per-direction bandwidth."""
    if n_bytes <= 0 or math.isinf(link.latency_s):
        return 0.0
    return link.latency_s + n_bytes / (link.bus_bytes_per_s * eff.bus_fraction)


# ------------------------------------------------------------------ the step


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTime:
    """The predicted time of one optimizer step and what it is made of (seconds).

    compute_s: matmuls, attention and element-wise kernels of every micro-batch on the
    slowest stage; comm_s: the exposed (not overlapped) communication per axis; bubble_s:
    pipeline fill and drain, (p-1)/v micro-batch times (Narayanan et al. 2021, Sec. 2.2:
    the bubble fraction of 1F1B is (p-1)/m, of the interleaved schedule (p-1)/(v m));
    optimizer_s: the optimizer update.
    """

    compute_s: float
    comm_s: dict[str, float] = field(default_factory=dict)
    bubble_s: float
    optimizer_s: float
    micro_batch_s: float          # one micro-batch, forward and backward, on the slowest stage
    step_time_s: float
    tokens_per_step: int
    n_gpus: int
    model_flops: float
    hardware_flops: float
    peak_flops_per_s: float
    placement: tuple[str, ...] = AXES

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def model_flops_per_s_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.n_gpus

    @property
    def hardware_flops_per_s_per_gpu(self) -> float:
        return self.hardware_flops / self.step_time_s / self.n_gpus

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, App. B)."""
        return self.model_flops_per_s_per_gpu / self.peak_flops_per_s

    @property
    def hfu(self) -> float:
        return self.hardware_flops_per_s_per_gpu / self.peak_flops_per_s

    def train_time_s(self, tokens: float) -> float:
        """Time to train on ``tokens`` tokens at this step time (Narayanan et al. Eq. 4)."""
        return tokens / self.tokens_per_s


def layer_key(lay: Layout) -> Layout:
    """The fields of ``lay`` a block's time depends on (layer_time's cache key)."""
    return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, ep=lay.ep, micro_batch=lay.micro_batch,
                  seq_len=lay.seq_len, recompute=lay.recompute)


def block_kernels(setup: TrainingSetup, lay: Layout) -> str:
    """The kernels a block runs: the set-up's, or under "auto" fused kernels (Megatron-LM,
    Transformer Engine) where tp, pp or cp exceeds 1 and eager PyTorch otherwise."""
    if setup.kernels != "auto":
        return setup.kernels
    return "fused" if (lay.tp > 1 or lay.pp > 1 or lay.cp > 1) else "eager"


def distinct_orders(lay: Layout, orders: Sequence[tuple[str, ...]]) -> Iterator[tuple[str, ...]]:
    """The placement ``orders`` that differ for ``lay``: two orders that differ only in
    axes of size 1 place its groups alike, so only the first of them is kept."""
    sizes = {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp, "pp": lay.pp}
    seen: set[tuple[str, ...]] = set()
    for order in orders:
        used = tuple(ax for ax in order if sizes[ax] > 1)
        if used not in seen:
            seen.add(used)
            yield tuple(order)


def step_time(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster,
              eff: Efficiency = Efficiency(), pc: ParamCount | None = None,
              orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS) -> StepTime:
    """The step time of ``lay``, on the best of the placement ``orders`` (orders that
    differ only in axes of size 1 are tried once)."""
    best: StepTime | None = None
    for order in distinct_orders(lay, orders):
        t = _step_time(m, setup, lay, cluster, eff, pc, order)
        if best is None or t.step_time_s < best.step_time_s:
            best = t
    assert best is not None
    return best


def _hide(comm_s: float, window_s: float, overlap: float) -> tuple[float, float]:
    """(exposed, hidden) seconds of a communication that may run under ``overlap`` x window_s
    of compute."""
    hidden = min(comm_s, max(0.0, overlap * window_s))
    return comm_s - hidden, hidden


def _block_comm(lt: LayerTime, lay: Layout, links: dict[str, AxisLink], eff: Efficiency) -> tuple[float, ...]:
    """The tp, cp and ep communication of one block for one micro-batch: (tp exposed, tp
    hidden, cp exposed, cp hidden, ep exposed, ep hidden) seconds.
    (With sp each all-reduce is an all-gather plus a reduce-scatter: the same bytes.)"""
    tp_all = lt.tp_collectives * all_reduce_s(lt.tp_bytes, lay.tp, links["tp"], eff)
    cp_all = lt.cp_passes * (lay.cp - 1) * send_s(lt.cp_bytes, links["cp"], eff)
    cp_block, cp_hidden = _hide(cp_all, lt.attention_fwd_s * lt.cp_passes, eff.cp_overlap)
    ep_all = lt.ep_all_to_alls * gather_s(lt.ep_bytes, lay.ep, links["ep"], eff)
    return (tp_all * (1 - eff.tp_overlap), tp_all * eff.tp_overlap, cp_block, cp_hidden,
            ep_all * (1 - eff.ep_overlap), ep_all * eff.ep_overlap)


def _p2p_s(m: ModelSpec, setup: TrainingSetup, lay: Layout, links: dict[str, AxisLink],
           eff: Efficiency) -> tuple[float, float]:
    """(exposed, hidden) seconds of one micro-batch's pipeline sends on a rank."""
    if lay.pp == 1:
        return 0.0, 0.0
    tokens = lay.micro_batch * lay.seq_len / lay.cp
    p2p_bytes = tokens * m.d_model * setup.precision_spec.activation_bytes / lay.tp   # sp, or Megatron's scatter-gather
    p2p_all = 2 * lay.vp * send_s(p2p_bytes, links["pp"], eff)
    return p2p_all * (1 - eff.pp_overlap), p2p_all * eff.pp_overlap


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelinePart:
    """What a step's time on one placement owes to everything but the sharding: one
    micro-batch on the slowest stage, the bubble, and the tp/cp/ep/pp communication."""

    links: dict[str, AxisLink]
    rates: Rates
    t_mb: float
    fwd_mb: float
    bwd_mb: float
    bubble_s: float
    comm_s: dict[str, float]
    slow_stage: int
    n_slow: int
    n_slow_bwd: int = -1      # blocks of the slowest stage with a backward pass (backward_layers)


def pipeline_part(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency,
              order: tuple[str, ...]) -> PipelinePart:
    gpu = cluster.gpu
    prec: Precision = setup.precision_spec
    kernels = block_kernels(setup, lay)
    links = axis_links(cluster, (lay.tp, lay.cp, lay.ep, lay.dp, lay.pp), order)
    lt = layer_time(m, setup, layer_key(lay), kernels, gpu, eff)
    r = rates(gpu, prec.compute_dtype, eff)
    a = prec.activation_bytes
    tokens = lay.micro_batch * lay.seq_len / lay.cp

    # tp / cp / ep communication of one block, exposed and hidden
    tp_block, tp_hidden, cp_block, cp_hidden, ep_block, ep_hidden = _block_comm(lt, lay, links, eff)

    # per stage: blocks, embedding (first), LM head and loss (last)
    counts = stage_layers(m.n_layers, lay.pp)
    head_fwd = gemm_time_s(tokens, m.vocab_size / lay.tp, m.d_model, r.matmul_flops_per_s,
                           r.hbm_bytes_per_s, prec.weight_bytes)
    loss_s = tokens * m.vocab_size / lay.tp * CROSS_ENTROPY_BYTES_PER_LOGIT / r.hbm_bytes_per_s
    edge_all = all_reduce_s(tokens * m.d_model * a, lay.tp, links["tp"], eff)
    edge_tp = edge_all * (1 - eff.tp_overlap)
    ft = setup.finetune
    head_bwd = head_backward_gemms(ft)
    stage_times = []
    for stage in sorted({0, len(counts) - 1, counts.index(max(counts))}):
        n = counts[stage]
        n_bwd = backward_layers(ft, m.n_layers, sum(counts[:stage]), n)
        fwd, bwd = n * lt.fwd_s, n_bwd * lt.bwd_s
        stage_comm = n * (tp_block + cp_block + ep_block)
        hidden = n * (tp_hidden + cp_hidden + ep_hidden)
        edges = (stage == 0) + (stage == lay.pp - 1)
        stage_comm += edges * edge_tp
        hidden += edges * edge_all * eff.tp_overlap
        if stage == lay.pp - 1:
            fwd += head_fwd + loss_s * CROSS_ENTROPY_FORWARD_SHARE
            bwd += head_bwd * head_fwd + loss_s * (1 - CROSS_ENTROPY_FORWARD_SHARE)
        stage_times.append((fwd + bwd + stage_comm, fwd, bwd, stage_comm, hidden, stage))
    t_mb, fwd_mb, bwd_mb, comm_mb, hidden_mb, slow_stage = max(stage_times)
    n_slow = counts[slow_stage]
    n_slow_bwd = backward_layers(ft, m.n_layers, sum(counts[:slow_stage]), n_slow)

    comm: dict[str, float] = {ax: 0.0 for ax in AXES}
    n_mb = lay.grad_accum
    comm["tp"] = n_mb * (comm_mb - n_slow * (cp_block + ep_block))
    comm["cp"] = n_mb * n_slow * cp_block
    comm["ep"] = n_mb * n_slow * ep_block
    if lay.pp > 1:
        p2p, p2p_hidden = _p2p_s(m, setup, lay, links, eff)
        hidden_mb += p2p_hidden
        t_mb += p2p
        comm["pp"] = n_mb * p2p
    # hidden communication still takes the SMs and HBM bandwidth its kernels use
    t_mb += eff.overlap_slowdown * hidden_mb
    bubble = (lay.pp - 1) / lay.vp * t_mb if lay.pp > 1 else 0.0
    return PipelinePart(links=links, rates=r, t_mb=t_mb, fwd_mb=fwd_mb, bwd_mb=bwd_mb, bubble_s=bubble,
                        comm_s=comm, slow_stage=slow_stage, n_slow=n_slow, n_slow_bwd=n_slow_bwd)


def _step_time(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency,
               pc: ParamCount | None, order: tuple[str, ...]) -> StepTime:
    return step_parts(m, setup, lay, cluster, eff, pc, order).step_time()


@lru_cache(maxsize=4096)
def _flops_per_step(m: ModelSpec, seq_len: int, n_sequences: int, recompute: str) -> StepFlops:
    return flops_per_step(m, seq_len, n_sequences, recompute)


@dataclass(frozen=True, kw_only=True, slots=True)
class DpCollective:
    """One data-parallel collective of a step (dp_collectives), and what of it the compute
    window hides (_hide): seconds per occurrence; once per micro-batch or once per step."""

    seconds: float           # the collective alone
    window: str              # the compute it may hide under: "fwd" or "bwd" of a micro-batch
    overlap: float           # the share of that window it may use
    per_micro_batch: bool
    exposed_s: float
    hidden_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StepParts:
    """The named parts of one layout's step on one placement (seconds unless named), from
    which StepTime is read and which `plan explain` prints as they are:

    step = m t_mb + bubble + dp exposed + dp slowdown + optimizer, with t_mb the slowest
    stage's micro-batch (pipeline: compute, exposed tp/cp/ep/pp communication and the
    slowdown of what is hidden; Narayanan et al. 2021, Sec. 2.2)."""

    placement: tuple[str, ...]
    pipeline: PipelinePart
    block: LayerTime            # one block, one micro-batch (layer_time)
    trained: RankSplit          # the slowest stage's rank: trainable and frozen parameters
    dp: tuple[DpCollective, ...]
    grad_accum: int
    optimizer_s: float
    flops: StepFlops
    tokens_per_step: int
    n_gpus: int
    peak_flops_per_s: float
    dp_slowdown_factor: float   # Efficiency.overlap_slowdown

    def occurrences(self, c: DpCollective) -> int:
        """How often ``c`` runs in a step: every micro-batch, or once."""
        return self.grad_accum if c.per_micro_batch else 1

    @property
    def compute_s(self) -> float:
        return self.grad_accum * (self.pipeline.fwd_mb + self.pipeline.bwd_mb)

    @property
    def dp_exposed_s(self) -> float:
        return sum(c.exposed_s * self.occurrences(c) for c in self.dp)

    @property
    def dp_hidden_s(self) -> float:
        return sum(c.hidden_s * self.occurrences(c) for c in self.dp)

    def step_time(self) -> StepTime:
        p, n_mb = self.pipeline, self.grad_accum
        dp_exposed = self.dp_exposed_s
        dp_slowdown = self.dp_slowdown_s
        comm = dict(p.comm_s)
        comm["dp"] = dp_exposed
        step = n_mb * p.t_mb + p.bubble_s + dp_exposed + dp_slowdown + self.optimizer_s
        return StepTime(compute_s=self.compute_s, comm_s=comm, bubble_s=p.bubble_s, optimizer_s=self.optimizer_s,
                        micro_batch_s=p.t_mb, step_time_s=step, tokens_per_step=self.tokens_per_step,
                        n_gpus=self.n_gpus, model_flops=self.flops.model_flops,
                        hardware_flops=self.flops.hardware_flops, peak_flops_per_s=self.peak_flops_per_s,
                        placement=self.placement)

    @property
    def dp_slowdown_s(self) -> float:
        """Efficiency.overlap_slowdown x the data-parallel seconds hidden under compute."""
        return self.dp_slowdown_factor * self.dp_hidden_s


def step_parts(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency = Efficiency(),
               pc: ParamCount | None = None, order: tuple[str, ...] = AXES) -> StepParts:
    """The parts of the step of ``lay`` with its groups placed along ``order``: the
    pipeline part (pipeline_part), then the data-parallel communication and the optimizer
    update, which depend on the sharding."""
    pc = pc or count_params(m)
    p = pipeline_part(m, setup, lay, cluster, eff, order)
    gpu = cluster.gpu
    prec: Precision = setup.precision_spec
    # data parallel: gradients and (ZeRO/FSDP) parameters of the most loaded rank
    rp = trained_split(m, pc, setup, lay, p.slow_stage, p.n_slow)
    dp = tuple(DpCollective(seconds=comm, window=window, overlap=overlap, per_micro_batch=per_mb,
                            exposed_s=exposed, hidden_s=hidden)
               for (comm, window, overlap, per_mb), (exposed, hidden, _) in
               zip(dp_collectives(lay, rp, p.links, eff, gpu, prec),
                   _dp_parts(lay, rp, p.links, eff, gpu, prec, p.fwd_mb, p.bwd_mb)))
    total_sequences = lay.micro_batch * lay.grad_accum * lay.dp * lay.ep
    return StepParts(placement=order, pipeline=p, block=layer_time(m, setup, layer_key(lay),
                                                                    block_kernels(setup, lay), gpu, eff),
                     trained=rp, dp=dp, grad_accum=lay.grad_accum,
                     optimizer_s=optimizer_time_s(rp.trainable_dense, rp.trainable_expert, lay, setup, p.rates),
                     flops=_flops_per_step(m, lay.seq_len, total_sequences, lay.recompute),
                     tokens_per_step=total_sequences * lay.seq_len, n_gpus=lay.n_gpus,
                     peak_flops_per_s=gpu.peak_flops_per_s(prec.compute_dtype),
                     dp_slowdown_factor=eff.overlap_slowdown)


def _dp_parts(lay: Layout, rp: RankSplit, links: dict[str, AxisLink], eff: Efficiency, gpu: GpuSpec,
              prec: Precision, fwd_mb: float, bwd_mb: float) -> list[tuple[float, float, bool]]:
    """The data-parallel communication of a step as (exposed, hidden, once per micro-batch
    rather than once per step) parts, for the rank's parameters ``rp``."""
    return [(*_hide(comm, fwd_mb if window == "fwd" else bwd_mb, overlap), per_mb)
            for comm, window, overlap, per_mb in dp_collectives(lay, rp, links, eff, gpu, prec)]


def dp_collectives(lay: Layout, rp: RankSplit, links: dict[str, AxisLink], eff: Efficiency, gpu: GpuSpec,
              prec: Precision) -> list[tuple[float, str, float, bool]]:
    """The data-parallel collectives of a step as (seconds, the compute they may hide
    under: "fwd" or "bwd" of a micro-batch, the overlap fraction, once per micro-batch).

    ``rp`` splits the rank's parameters into trainable and frozen (trained_split):
    gradients are reduced, and ZeRO-1/2 gathers updated weights, for the trainable ones
    only; ZeRO-3/FSDP also gathers the frozen base, at its stored bytes (QLoRA: NF4 with
    its constants, finetune.linear_weight_bytes), before the forward and again before the
    backward (frozen weights still give the input gradient). Under freeze the frozen
    blocks that run no backward are counted in the backward gather too (an overestimate).
    Full training: every parameter trains, so weights and gradients cover them all."""
    n_dense, n_expert = lay.dense_shard_degree, lay.expert_shard_degree
    link = links["dp"] if lay.dp > 1 else (links["cp"] if lay.cp > 1 else links["ep"])
    g_b, w_b = eff.grad_reduce_bytes or prec.grad_bytes, prec.weight_bytes
    grads = (rp.trainable_dense * g_b, rp.trainable_expert * g_b)
    trained = (rp.trainable_dense * w_b, rp.trainable_expert * w_b)
    weights = (rp.frozen_dense_bytes + rp.trainable_dense * w_b, rp.frozen_expert_bytes + rp.trainable_expert * w_b)

    def over_dp(fn, n_bytes: tuple[int, int]) -> float:
        return fn(n_bytes[0], n_dense, link, eff) + fn(n_bytes[1], n_expert, link, eff)

    comms: list[tuple[float, str, float, bool]] = []
    if lay.zero_stage == 3:
        if lay.sharding == "fsdp-hybrid":
            inside = _hybrid_shard(lay, gpu.gpus_per_node)
            intra = AxisLink(bus_bytes_per_s=gpu.intra_node_bytes_per_s, latency_s=FALLBACK_INTRA_LATENCY_S)
            ag = gather_s(rp.frozen_bytes + rp.trainable * w_b, inside, intra, eff)
            rs = gather_s(rp.trainable * g_b, inside, intra, eff)
            across = all_reduce_s(rp.trainable * g_b / inside, max(1, n_dense // inside), link, eff)
            comms.append((across, "bwd", eff.dp_overlap, False))
        else:
            ag, rs = over_dp(gather_s, weights), over_dp(gather_s, grads)
        comms += [(ag, "fwd", eff.zero3_overlap, True), (ag + rs, "bwd", eff.zero3_overlap, True)]
    elif lay.zero_stage == 2 and lay.is_fsdp:
        ag, rs = over_dp(gather_s, weights), over_dp(gather_s, grads)
        comms += [(ag, "fwd", eff.zero3_overlap, True), (rs, "bwd", eff.zero3_overlap, True)]
    elif lay.zero_stage in (1, 2):
        rs, ag = over_dp(gather_s, grads), over_dp(gather_s, trained)
        comms += [(rs, "bwd", eff.dp_overlap, False), (ag, "fwd", eff.param_gather_overlap, False)]
    else:
        comms.append((over_dp(all_reduce_s, grads), "bwd", eff.dp_overlap, False))
    return comms


def optimizer_bytes_per_param(setup: TrainingSetup) -> float:
    """HBM bytes the optimizer update moves per trainable parameter: it reads and writes
    the fp32 master copy and the optimizer states, reads the gradient and writes the
    16-bit weight (AdamW mixed precision: 2 x (4 + 8) + 2 + 2 = 28 bytes). QLoRA's 16-bit
    adapters keep no master copy and its paged 8-bit AdamW two int8 states (Dettmers et al.
    2023, arXiv:2305.14314, Sec. 3), as memory.per_rank_memory counts them:
    2 x (2 + 8/2048) + 2 + 2 = 8.0 bytes."""
    ft = setup.finetune
    prec = setup.precision_spec
    if ft.is_lora and ft.adapter_bits == 16:
        prec = Precision.named("bf16")
    optimizer = "adam8bit" if ft.paged_8bit_optimizer else setup.optimizer
    state = prec.master_bytes + optimizer_state_bytes_per_param(optimizer)
    return 2 * state + prec.grad_bytes + prec.weight_bytes


def optimizer_time_s(n_dense: int, n_expert: int, lay: Layout, setup: TrainingSetup, r: Rates) -> float:
    """The optimizer update is memory bound: optimizer_bytes_per_param() per trainable
    parameter (``n_dense``, ``n_expert``: trained_split's, all of them in full training;
    LoRA's adapters, freeze's trainable blocks) on the rank's shard, at the HBM rate."""
    per_param = optimizer_bytes_per_param(setup)
    shard_dense = lay.dense_shard_degree if lay.zero_stage >= 1 else 1
    shard_expert = lay.expert_shard_degree if lay.zero_stage >= 1 else 1
    params = n_dense / shard_dense + n_expert / shard_expert
    return params * per_param / r.hbm_bytes_per_s


def _hybrid_shard(lay: Layout, gpus_per_node: int) -> int:
    inside = max(1, gpus_per_node // lay.tp)
    d = lay.dense_shard_degree
    while d > inside or lay.dense_shard_degree % d:
        d -= 1
    return max(d, 1)
