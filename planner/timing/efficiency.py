"""The named efficiency and overlap parameters of the step-time model, each with its source,
the engines whose settings the published runs document, and the placement orders tried."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from planner.hardware.axes import AXES
from planner.hardware.gpus import GpuSpec, list_gpus, sustained_rate

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

# The tensor-core clock a GPU sustains, as a share of the clock its data-sheet peaks assume, where
# its die's sustained rate was measured on another product. GB200: the Blackwell GPU of a GB200
# superchip is the B200's die (148 SMs); NVIDIA's GB200 NVL72 sheet gives it 2.5 PFLOP/s dense
# BF16 and 5 FP8 per GPU against HGX B200's 2.25 and 4.5 (presets/gpus.toml): a 10/9 higher boost
# clock on paper. No sustained GB200 GEMM rate is published; the matmul fractions above are
# measured on power-saturated cards (MSMF), whose clock the power limit sets, not the boost
# clock. ASSUMED: GB200 sustains B200's measured tensor-core clock, so its rates are B200's
# (MATMUL_FRACTION's 0.647 of the GB200 peak x 2250/2500). Checked against NVIDIA's published
# Megatron-Bridge runs (tests/data/megatron_bridge_runs.json), where the same release trained the
# same layout on 8 GB200 and on 8 B200 (one NVLink domain either way): GB200 over B200 tokens/s
# per GPU 0.96-1.05, median 1.01 over 8 pairs (tests/test_megatron_bridge.py), not 1.11.
SUSTAINED_CLOCK_SHARE = {"gb200": 2250.0 / 2500.0}

# The highest matmul fraction a GPU was MEASURED to sustain, from the same tables: MSMF (the
# rate held once the card is power-saturated) where it is published, else MAMF (the burst
# maximum, which is higher still, so it bounds the sustained rate from above): H100/H200 MSMF
# 702.9/989 = 0.711, B200 MSMF 0.647, A100 MAMF 267.9/312 = 0.859, MI300X MAMF 0.601. No step of
# a training run multiplies faster than this; bench/out_of_sample.py keeps its fitted matmul
# fractions at or below it, so that a fold cannot buy back what another term misses with a
# rate the hardware does not reach.
MATMUL_FRACTION_MAX = {
    "a100": 0.859, "a100-40gb": 0.859, "h100": 0.711, "h200": 0.711, "b200": 0.647,
    "gb200": 0.647, "mi300x": 0.601,
}

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

# Tensor-core FLOPs per exponential the GPU can issue in the same time: dense BF16 FLOPs per SM
# per clock over the 16 exp2 per SM per clock of the special-function units (CUDA C++ Programming
# Guide, "Arithmetic Instructions" throughput table, compute capability 9.0 and 10.0). H100: 989.4
# TFLOP/s / (132 SMs x 1.83 GHz) = 4096 per SM per clock, so 256 FLOPs per exp; B200/GB200: 8192
# per SM per clock, 512 (Zadouri et al. 2026, FlashAttention-4, Sec. 2: Blackwell doubled the
# tensor cores, not the exponential unit). A fused attention computes one exp per score and
# 2 (d_qk + d_v) FLOPs per score forward, so its forward cannot run faster than
# peak x 2 (d_qk + d_v) / this ratio: on Blackwell, head dim 128 is bound at the peak and head
# dim 64 (gpt-oss) at half of it (timing.kernels.attention_rate). GPUs not listed: no bound.
TENSOR_FLOPS_PER_EXP = {"h100": 256, "h200": 256, "h100-nvl": 256, "gh200": 256, "b200": 512, "gb200": 512}


# The GEMM tile model (Efficiency.gemm_tile_model; off in every shipped engine: measured as a row
# of bench/ceiling_alternatives.py, docs/mfu-ceiling-alternatives.md, and not kept). The streaming
# multiprocessors a GEMM's output tiles are spread over are the GPU's own data (presets/gpus.toml
# `sms`, each with its source; GpuSpec.sms); a GPU without them, or without a tile here, has none.


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmTile:
    """The output tile (tile_m x tile_n) one SM computes at a time, the K slice (tile_k) of each
    main-loop step and the pipeline's stages, of which stages - 1 K slices are loaded before the
    first multiply of each tile (the prologue of CUTLASS's multistage main loop,
    include/cutlass/gemm/threadblock/mma_multistage.h)."""

    tile_m: int
    tile_n: int
    tile_k: int
    stages: int


GEMM_TILE_MODELS = ("", "waves", "waves+fill")      # Efficiency.gemm_tile_model: off, quantisation, and fill
# CUTLASS's default tensor-op GEMM on Ampere: threadblock 128 x 256 x 64, 3 stages
# (include/cutlass/gemm/device/default_gemm_configuration.h, DefaultGemmConfiguration<OpClassTensorOp,
# Sm80, ...>). Hopper and Blackwell: ASSUMED the same 128 x 256 x 64 tile (one of cuBLAS's large
# BF16 tiles; CUTLASS 3's collective builder takes the tile from its caller) with 4 stages, what
# CUTLASS 3's StageCountAuto fits in 227 KB of shared memory at (128 + 256) x 64 x 2 bytes a stage.
GEMM_TILE = {
    "a100": GemmTile(tile_m=128, tile_n=256, tile_k=64, stages=3),
    "a100-40gb": GemmTile(tile_m=128, tile_n=256, tile_k=64, stages=3),
    **{g: GemmTile(tile_m=128, tile_n=256, tile_k=64, stages=4) for g in ("h100", "h200", "b200", "gb200")},
}


def sustained_clock_share(gpu: GpuSpec) -> float:
    """The share of its data-sheet peaks a GPU's tensor cores run at before any kernel fraction
    (SUSTAINED_CLOCK_SHARE, source there); 1 where the GPU's own sustained rate was measured or
    none differs."""
    return SUSTAINED_CLOCK_SHARE.get(gpu.name, 1.0)

# Sustained training rate per GPU type: the highest model-FLOPs utilisation (MFU, executed
# model FLOPs over the dense BF16 peak) a published training run reached on it. No step is
# predicted faster than its model FLOPs at this rate (timing.fast.step_arrays): data-sheet
# peaks times kernel fractions add up to more than whole training steps sustain (an 8B full
# fine-tune on 8 x A100 came out at 72% MFU, MI300X above H100 per GPU). The rate is data of
# the GPU (presets/gpus.toml training_mfu_ceiling, with its source and whether it is measured
# or ASSUMED), inherited by architecture where a GPU has none (hardware.gpus.sustained_rate), so
# a user's GPU file and every catalog GPU have one. Measured: A100 0.641 (llm-foundry MPT-7B),
# H100 0.465 (Megatron-Core r0.8 462B); the rest are ASSUMED and the plan says so.
# Fitted on published runs, so bench/out_of_sample.py sets it per fold from the training
# sources only (the held-out source's runs never set their own ceiling).
NO_MFU_CEILING = math.inf     # a calibration measured on the user's own cluster replaces the ceiling
# every catalog GPU's ceiling by name (the resolved sustained_rate; a GPU file's: sustained_rate)
TRAINING_MFU_CEILING = {g.name: sustained_rate(g).mfu for g in list_gpus()}


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
    selective_policy: what recompute "selective" reruns. "megatron": the attention core
    (Korthikanti et al. 2022, Sec. 4.2); "torchtitan-op": torchtitan's per-op selective AC,
    which saves every compute op's output except every second mm/linear of a block (and
    recomputes the element-wise ops), attention included in what it saves
    (torchtitan 0.3.0 torchtitan/distributed/activation_checkpoint.py, SelectiveAC's
    _get_custom_policy: "Save all compute/comm ops, except every second mm/linear"): in a
    Llama block wq wk wv wo w1 w3 w2 that reruns wk, wo and w3.
    expert_gemm_half_rows: the rows (tokens) per local expert at which a grouped expert GEMM
    runs at half its rate: each expert's GEMM takes (1 + expert_gemm_half_rows / rows) times
    its dense-rate time, a fixed cost per expert and tile that few tokens per expert cannot
    amortise (NVIDIA, "Matrix Multiplication Background User's Guide", tile and wave
    quantization; grouped GEMMs of MoE layers, Gale et al. 2023, MegaBlocks, MLSys, Sec. 5).
    0: expert GEMMs at the dense rate.
    moe_block_overhead_s: fixed time of one MoE block's forward per micro-batch beyond its GEMMs
    and element-wise bytes (backward twice it): the router's top-k, the token counts each rank
    syncs to the host to size a dropless dispatch, permutation index building and the launches
    of the grouped kernels (megatron-core transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher
    preprocess: the tokens_per_expert device-to-host copy; moe_utils.py permute / unpermute).
    moe_expert_launch_s: fixed time per local expert of one MoE block's forward per micro-batch
    (backward twice it), paid where the block syncs its token counts to the host
    (training.moe_runtime.host_sync_per_moe_block): Transformer Engine's GroupedLinear takes the
    per-expert token counts as a host list (m_splits) and runs one GEMM per local expert on its
    multi-stream cuBLAS workspace, with a quantization per expert under FP8
    (transformer_engine/pytorch/module/grouped_linear.py, general_grouped_gemm): launches and
    per-expert setup that grow with the experts a rank holds (n_experts / ep), not with the tokens.
    A full-iteration CUDA graph with the fused grouped MLP of the 26.x recipes
    (NVTE_CUTEDSL_FUSED_GROUPED_MLP) replaces them. 0: none.
    moe_token_passes: HBM passes over each routed token copy (k x d_model activations per token)
    in an MoE block's forward beyond the fused permute and unpermute that
    timing.kernels.elementwise_bytes_per_token counts (backward twice as many): the token
    dispatcher's unfused steps as megatron-core 0.16.1 runs them (transformer/moe/moe_utils.py
    permute: index building, the gather into expert order and padding to the GEMM's row
    alignment under FP8; unpermute: the probability weighting and the scatter-add back;
    token_dispatcher.py: the all-to-all's send and receive buffers). 0: none beyond the fused pair.
    fp8_matmul_ratio: the FP8 (and NVFP4, at its doubled peak) GEMM rate's share of the FP8
    dense peak over the 16-bit GEMM's share of the BF16 peak (matmul_fraction) on the same GPU
    (timing.kernels.fp8_fraction_of); None takes training.fp8.FP8_MATMUL_FRACTION (ASSUMED).
    block_scaled_gemm_penalty: the rate of a microscaling GEMM (MXFP8, NVFP4: a scale per 32 or
    16 elements, Fp8Recipe.block_scaled) over a per-tensor-scaled FP8 GEMM's, under
    fp8_matmul_ratio: the scale factors are loaded with each tile and applied in the MMA
    (Blackwell's block-scaled tcgen05.mma; OCP Microscaling Formats spec v1.0, Sec. 5).
    gemm_tile_model: each GEMM's math at the matmul rate times its tile share
    (timing.kernels.gemm_tile_share): "waves", tile and wave quantisation of its output tiles
    over the GPU's SMs (GpuSpec.sms, GEMM_TILE); "waves+fill", and the K loop's pipeline fill;
    "" (every shipped engine): the matmul rate alone (GEMM_TILE_MODELS).
    mfu_ceiling: the highest MFU a step may reach (None: the GPU's sustained rate,
    hardware.gpus.sustained_rate, measured or ASSUMED).
    grad_accum_bytes_per_param: HBM bytes per trainable parameter of a stage that a pass after
    each micro-batch's backward moves to accumulate the gradients (0: accumulated inside the
    backward, as autograd does into .grad and Megatron-LM into its fp32 main_grad). DeepSpeed's
    pipeline engine under bf16 (BF16_Optimizer) adds each micro-batch's bf16 gradients into
    full fp32 copies after the backward (deepspeed 0.19.8 runtime/pipe/engine.py,
    _exec_backward_pass: optimizer.update_hp_grads unless immediate_grad_update, which
    defaults to false in runtime/precision_config.py; runtime/bf16_optimizer.py,
    _update_hp_grad: hp_grad.add_(lp.grad.to(fp32))): read 2 and write 4 for the cast, read
    4 + 4 and write 4 for the add: 18 bytes, with fp32 accumulation buffers
    (data_types.grad_accum_dtype "fp32", which ZeRO-1 with bf16 needs to take this optimizer:
    engine.py _do_optimizer_sanity_check; 0.19.8's default accumulates in the model's bf16,
    read 2 + 2 and write 2: 6 bytes).
    step_time_factor: every step time multiplied by it (1: the prediction itself); plan --time-
    confidence sets it to the upper end of the step-time interval (timing.intervals.upper_factor),
    so that deadlines and costs are met with that confidence out of sample.
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
    grad_accum_bytes_per_param: float = 0.0
    overlap_slowdown: float = 0.2
    expert_gemm_half_rows: float = 0.0
    moe_block_overhead_s: float = 0.0
    moe_expert_launch_s: float = 0.0
    moe_token_passes: float = 0.0
    fp8_matmul_ratio: float | None = None
    block_scaled_gemm_penalty: float = 1.0
    gemm_tile_model: str = ""
    mfu_ceiling: float | None = None
    step_time_factor: float = 1.0
    selective_policy: str = "megatron"
    name: str = "default"


DEFAULT_EFFICIENCY = Efficiency()      # the defaults above, as the default argument of the models


def mfu_ceiling(eff: Efficiency, gpu: GpuSpec, fp8: bool) -> float | None:
    """The highest MFU a step may reach: Efficiency.mfu_ceiling when set, else the GPU's
    sustained training rate (hardware.gpus.sustained_rate, measured or ASSUMED). None (no
    ceiling) for an FP8 step without a set ceiling: the ceilings are BF16 runs' MFU and no
    FP8 run is in the project's data, so an FP8 step is bounded by its own FP8 GEMM
    efficiency (training.fp8), not by a BF16 rate. The rate is at the GPU's sustained clock
    (sustained_clock_share: GB200 runs B200's die at B200's sustained rate, so it inherits
    B200's MFU of the B200 peak, not of its own higher data-sheet peak)."""
    if eff.mfu_ceiling is not None:
        return eff.mfu_ceiling
    return None if fp8 else sustained_rate(gpu).mfu * sustained_clock_share(gpu)


def ceiling_floor_s(model_flops: Any, n_gpus: Any, peak_flops_per_s: float, ceiling: float | None) -> Any:
    """The shortest step the MFU ceiling allows, in seconds: model FLOPs / (GPUs x peak x
    ceiling) (MFU as Chowdhery et al. 2022, PaLM, App. B); 0 without a ceiling. Floats or
    arrays."""
    if ceiling is None:
        return 0.0
    return model_flops / (n_gpus * (peak_flops_per_s * ceiling))


# Engines whose overlap settings the published runs document (bench/published_runs.py).
MEGATRON_2021 = Efficiency(dp_overlap=0.0, name="megatron-lm 2021 (no comm overlap)")
# Megatron-DeepSpeed on DeepSpeed's PipelineEngine (BLOOM, MT-NLG): Megatron-LM 2021's kernels
# and overlap (none: p2p is blocking, deepspeed 0.19.8 runtime/pipe/p2p.py send/recv assert
# async_op False; the gradient reduce runs after the flush, engine.py _exec_reduce_grads), its
# schedule 1F1B without interleaving (runtime/pipe/schedule.py TrainSchedule), the bf16
# gradient accumulation pass of each micro-batch (grad_accum_bytes_per_param above), and the
# reduce of the fp32 accumulated gradients (engine.py _bf16_reduce_grads ->
# buffered_allreduce_fallback(grads=None) -> BF16_Optimizer.get_grads_for_reduction, its fp32
# flat buffers)
DEEPSPEED_PIPE_BF16 = Efficiency(dp_overlap=0.0, grad_accum_bytes_per_param=18.0, grad_reduce_bytes=4,
                                 name="megatron-deepspeed (deepspeed pipeline engine, bf16)")
# PyTorch FSDP1 (FullyShardedDataParallel, flat parameters), as fms-fsdp and llm-foundry's
# Composer ran it: after each FSDP unit's backward, every micro-batch, two memory-bound passes
# over the unit's unsharded gradient that no collective term counts. The module's parameters are
# views of the unsharded flat parameter (torch 2.13.0 torch/distributed/fsdp/_flat_param.py,
# torch.split then view), so autograd assembles the flat gradient in SplitWithSizesBackward, a
# concatenation (tests/test_fsdp1_grad_pass.py): read 2 and write 2 bytes in bf16; then
# _runtime_utils.py _reduce_grad divides it in place by the pre-divide factor, > 1 for any
# data-parallel size above 1 (algorithms/_comm_hooks/default_hooks.py
# DefaultState._get_gradient_predivide_factor), before the reduce-scatter: read 2 and write 2.
# 8 bytes per parameter with bf16 parameters and bf16 reduction (fms-fsdp's bfSixteen policy;
# Composer's mixed_precision PURE, and DEFAULT in composer/trainer/mosaic_fsdp_utils.py
# get_mixed_precision at commit 0099561, reduce_dtype None). Other Composer versions' DEFAULT
# reduce in fp32 (a cast and an fp32 division on top: 18 bytes) or keep fp32 parameters (an fp32
# concatenation and a cast: 18); no benchmark names its Composer version, so 8 is the floor used.
# Counted as exposed (ASSUMPTION: the division runs on FSDP's post-backward stream beside the
# backward's kernels, which share the HBM with it).
PYTORCH_FSDP1_BF16 = Efficiency(grad_accum_bytes_per_param=8.0,
                                name="pytorch fsdp1 (prefetch, overlapped reduce, flat-gradient passes)")
MEGATRON_CORE = Efficiency(tp_overlap=0.75, pp_overlap=1.0, dp_overlap=1.0, param_gather_overlap=1.0,
                           grad_reduce_bytes=4,
                           name="megatron-core (tp, dp, param-gather and p2p overlap)")

# Megatron-Core as NVIDIA's Megatron-Bridge runs it in 2025-2026 (plan --stack megatron): its
# overlaps (MEGATRON_CORE), Transformer Engine's cuDNN fused attention at FlashAttention-3's rate
# and seven efficiencies fitted on the latest release of each published Megatron-Bridge run
# (bench/megatron_bridge.py, docs/megatron-bridge.md: in sample and out of fold).
# flash_fraction 0.55: FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608, Sec. 4.1) reaches 75%
# of the H100 peak forward and runs its backward 1.5-1.75x faster than FlashAttention-2's 0.30-0.35:
# about 0.5; forward 1 and backward 2.5 units of work at 0.75 and 0.5 give 3.5 / (1/0.75 + 2.5/0.5)
# = 0.55. FlashAttention-4 on B200 reports a similar share (Zadouri et al. 2026), bounded by the
# exponential unit at small head dims (TENSOR_FLOPS_PER_EXP).
# Gradients reduced in bf16 (2 bytes): Megatron-Bridge's performance runs set grad_reduce_in_fp32
# False (scripts/performance/utils/helpers.py), and `plan --out` writes --grad-reduce-in-bf16 for it
MEGATRON_BRIDGE = Efficiency(tp_overlap=0.75, pp_overlap=1.0, dp_overlap=1.0, param_gather_overlap=1.0,
                             grad_reduce_bytes=2, flash_fraction=0.55,
                             # fitted, in sample (docs/megatron-bridge.md, "Fitted values")
                             fp8_matmul_ratio=0.85, ep_overlap=0.75, expert_gemm_half_rows=256.0,
                             moe_block_overhead_s=0.001, moe_expert_launch_s=2e-5, moe_token_passes=0.0,
                             block_scaled_gemm_penalty=0.95,
                             name="megatron-core 2025-2026 (Megatron-Bridge runs: overlaps, FA3-rate attention, "
                                  "fitted FP8 and MoE efficiencies)")



def stack_efficiency(stack: str | None) -> Efficiency:
    """The step-time parameters of the named stack's kernels and overlaps: MEGATRON_BRIDGE for
    --stack megatron (Megatron-Core as Megatron-Bridge runs it), else the defaults."""
    return MEGATRON_BRIDGE if stack == "megatron" else DEFAULT_EFFICIENCY


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
