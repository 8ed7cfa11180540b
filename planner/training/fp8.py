"""FP8 training recipes: what each keeps in memory, what it sends, and how fast its GEMMs run.

A recipe says, per parameter of a block's linear layers and per element of a linear
layer's input, how many bytes each copy takes; the memory model (memory.states,
memory.buffers, memory.fp8) and the step-time model (timing.kernels, timing.degrees) read
these fields. Every recipe keeps attention, norms, the router, the embedding and the LM
head in 16 bits (torchao's Float8Linear converts nn.Linear modules only, and torchtitan's
Float8LinearConverter skips the output head by its filter; Transformer Engine's te.Linear
layers; DeepSeek-V3 report, arXiv:2412.19437, Sec. 3.3.1: "the embedding module, the
output head, MoE gating modules, normalization operators, and attention operators" keep
their original precision).

Sources, per recipe:

* ``tensorwise`` (torchao float8, ``Float8LinearConfig.from_recipe_name("tensorwise")``,
  with FSDP2 float8 all-gather, ``enable_fsdp_float8_all_gather``): one dynamic scale per
  tensor; FSDP2 casts each weight shard to fp8 before the all-gather, so the gather moves
  1 byte per parameter and the gathered block is fp8 (torchao/float8/fsdp_utils.py,
  WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather). The forward saves the 16-bit
  input for backward (torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args:
  ``ctx.save_for_backward(input_hp, weight_hp_t)``) and recasts it there. No amax history.
* ``rowwise`` (torchao ``from_recipe_name("rowwise")``; torchtitan 0.3.0's
  Float8LinearConverter default, ``recipe_name: Literal["rowwise", "rowwise_with_gw_hp"] =
  "rowwise"`` in torchtitan/components/quantization/float8.py): one scale per row of
  each operand, so each operand is cast per GEMM along its own axis (the gradient twice,
  for dgrad and wgrad); the FSDP2 all-gather stays 16-bit (torchao: float8 all-gather is
  for tensorwise scaling only). Saves the 16-bit input, no amax history.
* ``delayed`` (Transformer Engine DelayedScaling, as Megatron-LM runs it: megatron-core
  0.16.1 TransformerConfig ``fp8_recipe = "delayed"`` by default with ``--fp8-format
  hybrid``, ``fp8_amax_history_len = 1``, ``fp8_param = False``): te.Linear keeps an fp8
  copy of each weight and its transpose across the micro-batches of a step (TE docs,
  "Using FP8 with Transformer Engine": ``is_first_microbatch`` caches the fp8 weights;
  ``fp8_model_init`` exists to drop the 16-bit copy); it saves its input cast to fp8 for
  the weight gradient; each GEMM's fp8 metadata holds an amax history of
  ``amax_history_len`` fp32 values plus a scale and an inverse scale for three forward
  tensors (input, weight, output) and two backward ones (grad output, grad input) (TE
  ``FP8GlobalStateManager`` / ``fp8_meta["scaling_fwd"|"scaling_bwd"]``). The distributed
  optimizer gathers 16-bit parameters unless ``--fp8-param-gather``.
* ``blockwise`` (DeepSeek-V3 report, arXiv:2412.19437, Sec. 3.3.2-3.3.4): activations
  scaled per 1x128 tile, weights per 128x128 block (one fp32 scale each); the inputs of
  Linear layers are cached in FP8 for backward (Sec. 3.3.4); master weights and
  gradients in FP32 (Sec. 3.3: "the master weights ... and gradients ... are still
  retained in FP32"); the activations before the MoE up-projections (and their gradients
  before the down-projections) are dispatched in FP8, the combine stays BF16 (Sec. 3.3.4).
  FP8 weights and their transposes are kept for Fprop and Dgrad (Sec. 3.5.2 describes the
  transposed re-quantization the Hopper layout needs).

The FP8 GEMM efficiency is ASSUMED, not measured (no FP8 matmul benchmark for these
GPUs is in the planner's sources): ``FP8_MATMUL_FRACTION`` of the data-sheet FP8 dense
peak. torchao's float8 README (Performance, "Derivation") states the FP8 GEMM speedup
over BF16 approaches 2x for large shapes and measures 1.39x for a 4096x8192x16384
linear with casting overhead; 0.55 of the FP8 peak is 1.55x the sustained BF16 rate
the planner uses on H100 (0.711 of the BF16 peak). Rowwise-scaled GEMMs run slower than
tensorwise ones (CUTLASS rowwise ``_scaled_mm`` against cuBLAS tensorwise);
``ROWWISE_GEMM_PENALTY`` is ASSUMED as well. The check against an outside referee is
torchao's torchtitan benchmark (tests/test_fp8.py).
"""

from __future__ import annotations

from dataclasses import dataclass

RECIPES = ("tensorwise", "rowwise", "delayed", "blockwise", "mxfp8")
FP8_RECIPE_CHOICES = ("auto", *RECIPES)

# the default recipe of each stack (--stack; None: no stack named)
STACK_DEFAULT = {
    "torchtitan": "rowwise",     # torchtitan 0.3.0 Float8LinearConverter.Config.recipe_name default
    "megatron": "delayed",       # megatron-core 0.16.1 TransformerConfig.fp8_recipe default
    # Hugging Face accelerate and DeepSpeed run FP8 through Transformer Engine
    # (accelerate "Low precision training methods": FP8RecipeKwargs(backend="te"), delayed scaling)
    "hf": "delayed",
    "deepspeed": "delayed",
    None: "rowwise",
}

# ASSUMED (see the module docstring): achievable FP8 GEMM rate as a share of the FP8 dense peak
FP8_MATMUL_FRACTION = {"h100": 0.55, "h200": 0.55, "h100-pcie": 0.55, "h100-nvl": 0.55, "b200": 0.55,
                       "gb200": 0.55}
FP8_MATMUL_FRACTION_DEFAULT = 0.55
ROWWISE_GEMM_PENALTY = 0.85      # ASSUMED: rowwise-scaled GEMMs at 85% of the tensorwise rate

# HBM bytes of one dynamic cast of a 16-bit element to fp8: the amax pass reads it (2 B),
# the cast reads it again and writes 1 B (torchao float8_scaling_utils.hp_tensor_to_float8_dynamic:
# tensor_to_amax, then the scaled cast); modelled.
DYNAMIC_CAST_BYTES = 5.0
# delayed scaling knows the scale before the cast: one read and one write (TE cast kernels)
DELAYED_CAST_BYTES = 3.0

TILE = 128      # DeepSeek-V3 Sec. 3.3.2: 1x128 activation tiles, 128x128 weight blocks
# Transformer Engine's microscaling blocks (transformer_engine/common/recipe/__init__.py,
# MXFP8BlockScaling: 1x32 blocks of E4M3 with one E8M0 (1-byte) scale; NVFP4BlockScaling: 1x16
# blocks of E2M1 (two per byte) with one E4M3 (1-byte) scale, plus one fp32 scale per tensor)
MX_BLOCK = 32
NVFP4_BLOCK = 16
# NVFP4 GEMMs on Blackwell run at twice the FP8 dense rate (NVIDIA B200 / GB200 data sheets:
# FP4 dense 9 / 10 PFLOPS against FP8 4.5 / 5 PFLOPS); GPUs with FP4 tensor cores
NVFP4_PEAK_RATIO = 2.0
FP4_GPUS = ("b200", "gb200", "b300", "gb300", "rtx-pro-6000", "5090")


@dataclass(frozen=True, kw_only=True, slots=True)
class Fp8Recipe:
    """One FP8 recipe's memory, communication and compute figures (sources: module docstring).

    fp8_weight_copy_bytes: persistent fp8 weight bytes per linear-layer parameter of the blocks,
    beside the 16-bit weights and the fp32 master (TE's cached weight and transpose; DeepSeek's).
    gather_bytes: bytes per parameter a ZeRO-3/FSDP all-gather moves and a gathered block holds.
    saved_input_bytes: bytes per element of a linear layer's input kept for backward.
    amax_history_len: fp32 amax values kept per scaled tensor (0: dynamic scaling keeps none).
    cast_passes_fwd / cast_passes_bwd: casts per linear layer per token, in elements of its input
    (forward) and of its output gradient and input (backward), each costing cast_bytes.
    ep_dispatch_bytes: bytes per element of the MoE all-to-alls, averaged over dispatch and combine.
    """

    name: str
    stack: str
    scaling: str
    grad_bytes: int
    fp8_weight_copy_bytes: float
    gather_bytes: int
    saved_input_bytes: float
    amax_history_len: int
    cast_bytes: float
    cast_passes_fwd: float
    cast_passes_bwd_out: float
    cast_passes_bwd_in: float
    gemm_penalty: float
    ep_dispatch_bytes: float
    peak_ratio: float = 1.0      # the recipe's dense GEMM peak over the GPU's FP8 peak (NVFP4: 2)

    @property
    def block_scaled(self) -> bool:
        """Microscaling: one scale per block of 32 (MXFP8) or 16 (NVFP4) elements, applied inside
        the tensor-core MMA (Blackwell's block-scaled MMA), not once per tensor or tile."""
        return self.name in ("mxfp8", "nvfp4")

    @property
    def amax_bytes_per_linear(self) -> int:
        """fp8 metadata of one linear layer: 5 scaled tensors (3 forward, 2 backward), each with
        its amax history and a scale and an inverse scale, in fp32 (TE fp8_meta)."""
        if not self.amax_history_len:
            return 0
        return 5 * (self.amax_history_len + 2) * 4

    def matmul_fraction(self, gpu_name: str, fraction: float | None = None) -> float:
        """The GEMM rate as a share of the FP8 dense peak: ``fraction`` (a fitted value,
        timing.efficiency.Efficiency.fp8_matmul_fraction) or FP8_MATMUL_FRACTION's, times the
        recipe's scaling penalty and its peak over the FP8 peak (NVFP4: 2)."""
        base = fraction if fraction is not None else FP8_MATMUL_FRACTION.get(gpu_name, FP8_MATMUL_FRACTION_DEFAULT)
        return base * self.gemm_penalty * self.peak_ratio


def recipe(name: str, stack: str | None = None) -> Fp8Recipe:
    """The named recipe (one of RECIPES, or "nvfp4" for --precision nvfp4) as ``stack`` runs it;
    ValueError for another name.

    Under --stack megatron, ``tensorwise`` is megatron-core 0.16.1's ``--fp8-recipe tensorwise``,
    Transformer Engine's Float8CurrentScaling (megatron/core/fp8_utils.py maps Fp8Recipe.tensorwise
    to it), not torchao's: te.Linear caches the fp8 weight and its transpose over the micro-batches
    of a step and saves its input cast to fp8 for the weight gradient, as under delayed scaling,
    with a dynamic scale per tensor (no amax history). ``mxfp8`` (TE MXFP8BlockScaling,
    transformer_engine/pytorch/tensor/mxfp8_tensor.py: row-wise and column-wise E4M3 data, each
    with one E8M0 scale per 32 elements): weights keep both usages (2 x (1 + 1/32) B per
    parameter); a linear input is saved in its column-wise usage for the weight gradient
    (1 + 1/32 B per element). ``nvfp4`` (TE NVFP4BlockScaling, tensor/nvfp4_tensor.py: E2M1 data
    packed two per byte, one E4M3 scale per 16 elements, an fp32 scale per tensor): weights keep
    both usages (2 x (1/2 + 1/16) B), a saved input its column-wise usage (1/2 + 1/16 B), GEMMs at
    twice the FP8 rate (NVFP4_PEAK_RATIO). The 16-bit weights stay beside these copies (the
    planner does not model --fp8-param-gather, which drops them: conservative by 2 B per
    parameter)."""
    tile_scale = 4 / TILE              # one fp32 scale per 128 elements
    block_scale = 4 / (TILE * TILE)    # one fp32 scale per 128x128 block
    if name == "tensorwise" and stack == "megatron":
        return Fp8Recipe(name=name, stack="Transformer Engine Float8CurrentScaling (megatron-core --fp8-recipe "
                         "tensorwise)", scaling="dynamic, one scale per tensor", grad_bytes=2,
                         fp8_weight_copy_bytes=2.0, gather_bytes=2, saved_input_bytes=1.0, amax_history_len=0,
                         cast_bytes=DYNAMIC_CAST_BYTES, cast_passes_fwd=1.0, cast_passes_bwd_out=1.0,
                         cast_passes_bwd_in=0.0, gemm_penalty=1.0, ep_dispatch_bytes=2.0)
    if name == "mxfp8":
        mx = 1 + 1 / MX_BLOCK
        return Fp8Recipe(name=name, stack="Transformer Engine MXFP8BlockScaling (1x32 blocks, E8M0 scales)",
                         scaling="1x32 blocks, scale per block", grad_bytes=2, fp8_weight_copy_bytes=2 * mx,
                         gather_bytes=2, saved_input_bytes=mx, amax_history_len=0,
                         cast_bytes=DELAYED_CAST_BYTES + 1, cast_passes_fwd=1.0, cast_passes_bwd_out=1.0,
                         cast_passes_bwd_in=0.0, gemm_penalty=1.0, ep_dispatch_bytes=2.0)
    if name == "nvfp4":
        fp4 = 0.5 + 1 / NVFP4_BLOCK
        return Fp8Recipe(name=name, stack="Transformer Engine NVFP4BlockScaling (1x16 blocks, E4M3 scales)",
                         scaling="1x16 blocks, E4M3 scale per block and fp32 per tensor", grad_bytes=2,
                         fp8_weight_copy_bytes=2 * fp4, gather_bytes=2, saved_input_bytes=fp4,
                         amax_history_len=0, cast_bytes=DYNAMIC_CAST_BYTES, cast_passes_fwd=1.0,
                         cast_passes_bwd_out=1.0, cast_passes_bwd_in=0.0, gemm_penalty=1.0,
                         ep_dispatch_bytes=2.0, peak_ratio=NVFP4_PEAK_RATIO)
    if name == "tensorwise":
        return Fp8Recipe(name=name, stack="torchao float8 (torchtitan), FSDP2 float8 all-gather",
                         scaling="dynamic, one scale per tensor", grad_bytes=2, fp8_weight_copy_bytes=0.0,
                         gather_bytes=1, saved_input_bytes=2.0, amax_history_len=0,
                         cast_bytes=DYNAMIC_CAST_BYTES, cast_passes_fwd=1.0, cast_passes_bwd_out=1.0,
                         cast_passes_bwd_in=1.0, gemm_penalty=1.0, ep_dispatch_bytes=2.0)
    if name == "rowwise":
        return Fp8Recipe(name=name, stack="torchao float8 (torchtitan 0.3.0 default), bf16 all-gather",
                         scaling="dynamic, one scale per row", grad_bytes=2, fp8_weight_copy_bytes=0.0,
                         gather_bytes=2, saved_input_bytes=2.0, amax_history_len=0,
                         cast_bytes=DYNAMIC_CAST_BYTES, cast_passes_fwd=1.0, cast_passes_bwd_out=2.0,
                         cast_passes_bwd_in=1.0, gemm_penalty=ROWWISE_GEMM_PENALTY, ep_dispatch_bytes=2.0)
    if name == "delayed":
        return Fp8Recipe(name=name, stack="Transformer Engine DelayedScaling (Megatron-LM default)",
                         scaling="delayed, scale from the amax history", grad_bytes=2,
                         fp8_weight_copy_bytes=2.0, gather_bytes=2, saved_input_bytes=1.0, amax_history_len=1,
                         cast_bytes=DELAYED_CAST_BYTES, cast_passes_fwd=1.0, cast_passes_bwd_out=1.0,
                         cast_passes_bwd_in=0.0, gemm_penalty=1.0, ep_dispatch_bytes=2.0)
    if name == "blockwise":
        return Fp8Recipe(name=name, stack="DeepSeek-V3 block-wise FP8 (1x128 activations, 128x128 weights)",
                         scaling="dynamic, 1x128 tiles and 128x128 blocks", grad_bytes=4,
                         fp8_weight_copy_bytes=2 * (1 + block_scale), gather_bytes=2,
                         saved_input_bytes=1 + tile_scale, amax_history_len=0,
                         cast_bytes=DELAYED_CAST_BYTES, cast_passes_fwd=1.0, cast_passes_bwd_out=2.0,
                         cast_passes_bwd_in=0.0, gemm_penalty=ROWWISE_GEMM_PENALTY,
                         ep_dispatch_bytes=((1 + tile_scale) + 2) / 2)
    raise ValueError(f"unknown FP8 recipe {name!r}; choose one of {', '.join(RECIPES)}")


def resolve_recipe(name: str, stack: str | None) -> str:
    """The recipe ``--fp8-recipe`` names, or under "auto" the stack's default (STACK_DEFAULT)."""
    if name != "auto":
        recipe(name)
        return name
    return STACK_DEFAULT.get(stack, STACK_DEFAULT[None])
