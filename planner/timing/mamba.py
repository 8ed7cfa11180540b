"""Time of a hybrid model's Mamba-2 scan and conv (planner.models.hybrid), and the shares of
a hybrid's layers that the mean block's attention, MoE and collectives stand for.

The in_proj and out_proj GEMMs run through the GEMM path with every other block GEMM
(models.matmuls: their split by tp is megatron-core's MambaMixer's). What is not a GEMM:

* the SSD scan (Dao & Gu 2024, arXiv:2405.21060, Sec. 6; mamba_ssm ops/triton/ssd_combined.py):
  its chunked matmuls (hybrid.ssd_scan_flops_per_token) at the GPU's 16-bit GEMM rate, ASSUMED
  (the Triton kernels run them on tensor cores in bf16 with fp32 accumulation; no kernel
  measurement here), plus its HBM traffic, ASSUMED one pass of each tensor: forward reads the
  in_proj output (a (2 d + 2 G N + H)) and writes the conv output (a (d + 2 G N)), the scan
  reads it and dt and writes its output (a d) and the chunk states (fp32, 4 H P N per chunk,
  written and read: 8 H P N / Q per token), the gated norm reads the output and z and writes
  its result (3 a d);
* the depthwise conv1d (2 K FLOPs per channel and token) is inside that traffic.

Backward: ASSUMED twice the forward's FLOPs and bytes (the scan's backward kernels compute the
gradients of x, dt, B and C: about two forward passes of chunked matmuls, Dao & Gu Sec. 6),
plus the conv and dt recomputed (one more read and write of the conv channels), as
MambaSplitConv1dScanCombinedFn's backward does.
"""

from __future__ import annotations

from planner.models.hybrid import conv_flops_per_token, ssd_scan_flops_per_token
from planner.models.spec import ModelSpec


def mamba_scan_time_s(m: ModelSpec, tokens: float, seq_len: int, tp: int, flops_per_s: float,
                      hbm_bytes_per_s: float, a: int) -> tuple[float, float]:
    """(forward, backward) seconds of one Mamba-2 layer's scan and conv on one rank for
    ``tokens`` tokens (module docstring); every d_inner-wide tensor is split by tp."""
    d, hh, p, g, n, q = m.mamba_inner, m.mamba_heads, m.mamba_head_dim, m.ssm_groups, m.ssm_state, m.ssm_chunk
    flops = tokens * (ssd_scan_flops_per_token(m, seq_len) + conv_flops_per_token(m)) / tp
    conv = a * m.mamba_conv_dim
    traffic = tokens * (a * (2 * d + 2 * g * n + hh) + 2 * conv + a * (d + hh) + 8 * hh * p * n / q
                        + 3 * a * d) / tp
    fwd = flops / flops_per_s + traffic / hbm_bytes_per_s
    bwd = 2 * fwd + tokens * 2 * conv / tp / hbm_bytes_per_s
    return fwd, bwd


def attention_share(m: ModelSpec) -> float:
    """The share of layers with self-attention (1 unless a hybrid)."""
    return m.n_attention_layers / m.n_layers


def moe_share(m: ModelSpec) -> float:
    """The share of layers whose tokens an expert-parallel all-to-all dispatches: 1 for the
    classic MoE families (their dense blocks counted as the MoE ones, as before), a hybrid's
    MoE layers' share."""
    return m.n_moe_layers / m.n_layers if m.layer_pattern else 1.0


def tp_collectives_per_layer(m: ModelSpec) -> int:
    """Tensor-parallel all-reduce equivalents of one layer's forward and backward: 4 for a
    transformer block (attention and MLP, one each way: Shoeybi et al. 2019, Sec. 3), 2 for a
    hybrid's layer, which holds one mixer (megatron-core's MambaMixer: a column-parallel in_proj
    and a row-parallel out_proj, as one attention or MLP sub-layer)."""
    return 2 if m.layer_pattern else 4


def dispatch_width(m: ModelSpec) -> int:
    """The width of the tokens an MoE all-to-all moves: h, or the latent width under latent MoE
    (Nemotron 3 Super's fc1_latent_proj runs before the dispatch)."""
    return m.moe_latent or m.d_model
