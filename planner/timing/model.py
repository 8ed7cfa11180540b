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

The model lives in planner/timing/ by concern: flops.py, efficiency.py, kernels.py (block and
head times per shape), dp.py (what a rank trains, the optimizer's bytes), degrees.py (the tables per
distinct degrees and block shape), stage.py (the slowest stage of a micro-batch), terms.py (the
time terms of a micro-batch and their combination), dp_overlap.py (the data-parallel collectives
exposed and hidden), fast.py (the step of a batch of layouts: each layout's fastest placement),
parts.py (its named terms as arrays, StepArrays) and step.py (StepTime, a row of them);
step_time() is the batch of one. This module gathers their public names, the ones the rest
of the planner imports.
"""

from planner.hardware.placement import (
    FALLBACK_INTRA_LATENCY_S,
    AxisLink,
    Cluster,
    axis_links,
    cluster_for,
    scale_up_domain_gpus,
)
from planner.timing.collectives import all_reduce_s, gather_s
from planner.timing.dp import (
    optimizer_update_bytes_per_param,
    trained_split,
)
from planner.timing.efficiency import (
    CROSS_ENTROPY_BYTES_PER_LOGIT,
    CROSS_ENTROPY_FORWARD_SHARE,
    DEFAULT_EFFICIENCY,
    FLASH_FRACTION,
    FLASH_FRACTION_DEFAULT,
    MATMUL_FRACTION,
    MATMUL_FRACTION_DEFAULT,
    MEGATRON_2021,
    MEGATRON_CORE,
    NO_MFU_CEILING,
    PLACEMENT_ORDERS,
    TRAINING_MFU_CEILING,
    Efficiency,
    ceiling_floor_s,
    mfu_ceiling,
)
from planner.timing.fast import step_arrays, step_time, step_times
from planner.timing.flops import (
    LayerFlops,
    StepFlops,
    flops_per_step,
    hardware_flops_per_token,
    head_flops,
    layer_flops,
    model_flops_per_token,
)
from planner.timing.kernels import (
    ElementwiseBytes,
    Rates,
    backward_layers,
    elementwise_bytes_per_token,
    frozen_block_extra_s,
    gemm_time_s,
    head_backward_gemms,
    rates,
)
from planner.timing.layer import LayerTime, layer_key, layer_time
from planner.timing.parts import DpCollective, StepArrays
from planner.timing.step import StepTime

__all__ = [
    "CROSS_ENTROPY_BYTES_PER_LOGIT",
    "CROSS_ENTROPY_FORWARD_SHARE",
    "DEFAULT_EFFICIENCY",
    "FALLBACK_INTRA_LATENCY_S",
    "FLASH_FRACTION",
    "FLASH_FRACTION_DEFAULT",
    "MATMUL_FRACTION",
    "MATMUL_FRACTION_DEFAULT",
    "NO_MFU_CEILING",
    "TRAINING_MFU_CEILING",
    "ceiling_floor_s",
    "mfu_ceiling",
    "MEGATRON_2021",
    "MEGATRON_CORE",
    "PLACEMENT_ORDERS",
    "AxisLink",
    "Cluster",
    "DpCollective",
    "Efficiency",
    "ElementwiseBytes",
    "LayerFlops",
    "LayerTime",
    "Rates",
    "StepArrays",
    "StepFlops",
    "StepTime",
    "all_reduce_s",
    "axis_links",
    "backward_layers",
    "cluster_for",
    "elementwise_bytes_per_token",
    "flops_per_step",
    "frozen_block_extra_s",
    "gather_s",
    "gemm_time_s",
    "hardware_flops_per_token",
    "head_backward_gemms",
    "head_flops",
    "layer_flops",
    "layer_key",
    "layer_time",
    "model_flops_per_token",
    "optimizer_update_bytes_per_param",
    "rates",
    "scale_up_domain_gpus",
    "step_arrays",
    "step_time",
    "step_times",
    "trained_split",
]
