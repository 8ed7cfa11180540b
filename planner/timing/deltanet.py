"""Time of a gated DeltaNet layer's chunked delta rule and conv (planner.models.deltanet), the
part of the layer that is not a GEMM; its in_proj and out_proj run through the GEMM path with
every other block GEMM (models.matmuls, split by tp as megatron-core's GatedDeltaNet splits them).

* the delta rule (fla/ops/gated_delta_rule/chunk.py, which megatron-core 0.16.1's GatedDeltaNet
  calls): its chunked matmuls (deltanet.delta_rule_flops_per_token) at the GPU's 16-bit GEMM
  rate, ASSUMED (fla's Triton kernels run them on tensor cores in bf16 with fp32 accumulation; no
  kernel measurement here), plus its HBM traffic, ASSUMED one pass of each tensor: forward reads
  the in_proj output (a (2K + 2V + 2 Hv)) and writes the conv output (a D, D = 2K + V), the rule
  reads q, k, v (a D) and writes its output (a V), g in fp32 (4 Hv; Kimi Delta Attention's
  per-channel decay 4 K, ModelSpec.gdn_decay_width), and writes and reads the
  chunk states (fp32, 4 Hv dk dv per chunk of C: 8 Hv dk dv / C per token); the gated norm reads
  the output and z and writes its result (3 a V);
* the depthwise conv1d (2 W FLOPs per channel and token) is inside that traffic.

Backward: ASSUMED twice the forward's FLOPs and bytes (fla's backward recomputes the states and
forms the gradients of q, k, v, g and beta: about two forward passes of chunked matmuls), plus
the conv recomputed (one more read and write of its channels), as timing.mamba assumes for the
SSD scan.
"""

from __future__ import annotations

from planner.models.deltanet import delta_rule_flops_per_token, deltanet_conv_flops_per_token
from planner.models.spec import ModelSpec


def deltanet_scan_time_s(m: ModelSpec, tokens: float, tp: int, flops_per_s: float, hbm_bytes_per_s: float,
                         a: int) -> tuple[float, float]:
    """(forward, backward) seconds of one gated DeltaNet layer's delta rule and conv on one rank
    for ``tokens`` tokens (module docstring); every head-wide tensor is split by tp."""
    hv, k, v, d = m.gdn_value_heads, m.gdn_key_width, m.gdn_value_width, m.gdn_conv_dim
    flops = tokens * (delta_rule_flops_per_token(m) + deltanet_conv_flops_per_token(m)) / tp
    traffic = tokens * (a * (2 * k + 2 * v + 2 * hv) + 2 * a * d + a * v + 4 * m.gdn_decay_width
                        + 8 * hv * m.gdn_key_dim * m.gdn_value_dim / m.ssm_chunk + 3 * a * v) / tp
    fwd = flops / flops_per_s + traffic / hbm_bytes_per_s
    bwd = 2 * fwd + tokens * 2 * a * d / tp / hbm_bytes_per_s
    return fwd, bwd
