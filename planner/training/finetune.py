"""Fine-tuning methods: which parameters train, and what the frozen ones cost.

    full     every parameter trains (the planner's pretraining accounting)
    lora     the base is frozen in 16 bits; low-rank adapters B·A train beside chosen linear
             layers (Hu et al. 2021, "LoRA", arXiv:2106.09685, Sec. 4.1)
    qlora    LoRA over a 4-bit NormalFloat base with double-quantized block constants,
             16-bit adapters and paged 8-bit AdamW (Dettmers et al. 2023, "QLoRA",
             arXiv:2305.14314, Sec. 3)
    freeze   only the last blocks train, every other weight is frozen (LLaMA-Factory's
             "freeze" tuning: freeze_trainable_layers, default 2)

Adapter counts equal PEFT's for the same configuration (tests/test_finetune.py builds the
transformers model on the meta device, wraps it with ``peft.get_peft_model`` and counts the
parameters that require gradients): each adapted linear layer ``d_in -> d_out`` gains
``lora_A`` (d_in x r) and ``lora_B`` (r x d_out), no biases, r (d_in + d_out) parameters.
Target names are the module names transformers gives; a target matches a layer whose
qualified name equals it or ends with "." + it, as PEFT's ``target_modules`` does.

Quantized base weights (frozen, weight-only) follow the storage formats of the libraries
that run them:

    nf4   4-bit NormalFloat, 0.5 B per weight, one absmax constant per block of 64 weights:
          fp32 (32/64 = 0.5 bit per weight), or with double quantization an 8-bit constant
          per block plus an fp32 constant per 256 blocks (8/64 + 32/(64*256) = 0.127 bit)
          (QLoRA Sec. 3, "Double Quantization"; bitsandbytes' Linear4bit)
    int8  LLM.int8(): int8 weights and one fp32 scale per output row (Dettmers et al. 2022,
          arXiv:2208.07339, Sec. 3.1, vector-wise quantization; bitsandbytes' Linear8bitLt)
    int4  weight-only 4-bit with an fp16 scale and a 4-bit zero point per group of 128 input
          weights, the GPTQ/AWQ storage format (Frantar et al. 2022, arXiv:2210.17323;
          Lin et al. 2023, arXiv:2306.00978)

Only the linear layers inside the blocks are quantized; embeddings, the LM head, norms and
biases stay in 16 bits (bitsandbytes' integration in transformers skips the output
embedding and quantizes only ``nn.Linear`` modules).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.linears import QWEN2_MOE_CONVERSION_TYPES, Linear, block_linears, blocks_with, outside_linears
from planner.units import ceil_div

if TYPE_CHECKING:
    from planner.layouts.layout import Layout

METHODS = ("full", "lora", "qlora", "freeze")
QUANTS = ("none", "int8", "int4", "nf4")
TARGET_GROUPS = ("attention", "mlp", "all-linear")

# PEFT's default target modules per model type (peft/utils/constants.py,
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"), "mixtral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"), "gemma": ("q_proj", "v_proj"), "gemma2": ("q_proj", "v_proj"),
    "gpt2": ("c_attn",), "bert": ("query", "value"), "falcon": ("query_key_value",),
    "bloom": ("query_key_value",), "gpt_neox": ("query_key_value",),
    "qwen3": ("q_proj", "v_proj"), "gemma3_text": ("q_proj", "v_proj"),
    # PEFT 0.21 has no default for qwen3_moe, deepseek_v3, llama4_text, gpt_oss, phi3, olmo2, glm4_moe:
    # get_peft_model asks for target_modules, and so does the planner
}

NF4_BLOCK = 64                  # weights per absmax constant (QLoRA Sec. 3; bitsandbytes blocksize)
NF4_DOUBLE_QUANT_BLOCK = 256    # first-level constants per second-level fp32 constant
INT4_GROUP = 128                # GPTQ/AWQ group size
FREEZE_TRAINABLE_LAYERS = 2     # LLaMA-Factory's freeze_trainable_layers default
LORA_RANK = 8                   # PEFT LoraConfig's default r
LORA_ALPHA = 8                  # PEFT LoraConfig's default lora_alpha
QLORA_RANK = 64                 # QLoRA's Guanaco adapters (FinetuneSpec.named)
QLORA_ALPHA = 16


@dataclass(frozen=True, kw_only=True, slots=True)
class FinetuneSpec:
    """What trains and how the frozen base is stored. The default is full training.

    ``lora_targets`` empty means PEFT's default for the architecture (q_proj and v_proj on
    Llama-family models); groups "attention", "mlp" and "all-linear" (PEFT's: every linear
    layer except the LM head) expand per architecture. ``quant`` stores the frozen base's
    linear weights quantized (lora and qlora only). ``paged_8bit_optimizer``: the adapters'
    AdamW states in 8 bits (bitsandbytes' paged AdamW, QLoRA Sec. 3), 2 B per parameter
    plus an fp32 absmax per 2,048; paging lets them spill to CPU memory under pressure, which
    the planner does not count on: it keeps them on the GPU.
    """

    method: str = "full"
    lora_rank: int = LORA_RANK
    lora_alpha: int = LORA_ALPHA    # scales the update, costs no memory
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0       # PEFT default; > 0 keeps a dropout mask and output per target
    quant: str = "none"
    double_quant: bool = True
    adapter_bits: int = 32          # PEFT keeps adapters in fp32 (autocast_adapter_dtype); QLoRA 16
    paged_8bit_optimizer: bool = False
    trainable_layers: int = FREEZE_TRAINABLE_LAYERS
    # a vision-language model's image side (encoder and projector) frozen, as LLaMA-Factory's
    # defaults freeze it (hparams/finetuning_args.py: freeze_vision_tower=True,
    # freeze_multi_modal_projector=True); False trains it (full training only)
    freeze_vision: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.quant not in QUANTS:
            raise UserError(f"unknown quantization {self.quant!r}; choose one of {', '.join(QUANTS)}")
        if not self.freeze_vision and self.method != "full":
            raise UserError(f"--train-vision trains the image side with the whole model: use it with --method full "
                            f"(--method {self.method} keeps the image side frozen)")
        if self.quant != "none" and self.method not in ("lora", "qlora"):
            raise UserError(f"--quant {self.quant} stores a frozen base: use it with --method lora "
                            f"(or qlora), or with --task load")
        if not 1 <= self.lora_rank <= 65536:
            raise UserError(f"--lora-rank must be between 1 and 65536, got {self.lora_rank}")
        if not 0 <= self.lora_dropout < 1:
            raise UserError(f"--lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.trainable_layers < 1:
            raise UserError(f"--trainable-layers must be >= 1, got {self.trainable_layers}")
        if self.adapter_bits not in (16, 32):
            raise UserError(f"adapter_bits must be 16 or 32, got {self.adapter_bits}")

    @staticmethod
    def named(method: str, *, rank: int | None = None, alpha: int | None = None,
              targets: tuple[str, ...] | None = None, dropout: float | None = None,
              quant: str | None = None, trainable_layers: int | None = None,
              freeze_vision: bool = True) -> FinetuneSpec:
        """A method with its published defaults, each overridable.

        qlora: NF4 with double quantization, 16-bit adapters, paged 8-bit AdamW, and the
        adapter settings QLoRA trained Guanaco with: r = 64, alpha = 16 on every linear layer
        (Dettmers et al. 2023, arXiv:2305.14314; dropout 0.1 up to 13B, 0.05 for 33B and 65B).
        """
        if method == "qlora":
            return FinetuneSpec(method="qlora", lora_rank=rank or QLORA_RANK, lora_alpha=alpha or QLORA_ALPHA,
                                lora_targets=targets or ("all-linear",), lora_dropout=dropout or 0.0,
                                quant=quant or "nf4", double_quant=True, adapter_bits=16,
                                paged_8bit_optimizer=True, freeze_vision=freeze_vision)
        return FinetuneSpec(method=method, lora_rank=rank or LORA_RANK, lora_alpha=alpha or LORA_ALPHA,
                            lora_targets=targets or (), lora_dropout=dropout or 0.0,
                            quant=quant or "none",
                            trainable_layers=trainable_layers or FREEZE_TRAINABLE_LAYERS,
                            freeze_vision=freeze_vision)

    @property
    def is_full(self) -> bool:
        return self.method == "full"

    @property
    def is_lora(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def has_16_bit_adapters(self) -> bool:
        """LoRA adapters kept in 16 bits (QLoRA's, adapter_bits 16): no fp32 master copy, no
        cast of their input (Dettmers et al. 2023, arXiv:2305.14314, Sec. 3)."""
        return self.is_lora and self.adapter_bits == 16

    @property
    def freezes_base(self) -> bool:
        """Every block's base weights are frozen (LoRA, QLoRA)."""
        return self.is_lora

    def as_dict(self, m: ModelSpec | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.method}
        if self.is_lora:
            out |= {"lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                    "lora_targets": list(self.lora_targets) or ["peft-default"],
                    "lora_dropout": self.lora_dropout, "adapter_bits": self.adapter_bits,
                    "paged_8bit_optimizer": self.paged_8bit_optimizer}
            if m is not None:
                out["lora_modules"] = [lin.name for lin in resolve_targets(m, self)]
        if self.method == "freeze":
            out["trainable_layers"] = self.trainable_layers
        if self.quant != "none":
            out |= {"quant": self.quant, "double_quant": self.double_quant and self.quant == "nf4"}
        return out

    def describe(self, m: ModelSpec) -> str:
        if self.method == "full":
            return "full fine-tuning (every parameter trains)"
        if self.method == "freeze":
            return f"freeze: the last {min(self.trainable_layers, m.n_layers)} blocks train, the rest is frozen"
        names = ", ".join(lin.name.rsplit(".", 1)[-1] if not lin.expert else lin.name.split(".", 1)[-1]
                          for lin in resolve_targets(m, self))
        base = {"none": "unquantized", "nf4": "NF4 (4-bit, double-quantized constants)" if self.double_quant
                else "NF4 (4-bit)", "int8": "int8", "int4": "int4"}[self.quant]
        opt = ", paged 8-bit AdamW" if self.paged_8bit_optimizer else ""
        return (f"{self.method}: rank {self.lora_rank}, alpha {self.lora_alpha} on {names}; "
                f"{base} frozen base, {self.adapter_bits}-bit adapters{opt}")


# ------------------------------------------------------------------------------ targets

@lru_cache(maxsize=1024)      # pure on frozen inputs; the sweeps ask it per layout batch (issue 32, H1)
def resolve_targets(m: ModelSpec, spec: FinetuneSpec, option: str = "--lora-targets") -> tuple[Linear, ...]:
    """The linear layers (block and outside) the adapters attach to; UserError for a name
    that matches none of the architecture's layers (naming ``option``, where the user gives them)."""
    if not spec.is_lora:
        return ()
    targets = spec.lora_targets or PEFT_DEFAULT_TARGETS.get(m.model_type, ())
    if not targets:
        raise UserError(f"{m.name}: PEFT has no default LoRA targets for model_type {m.model_type!r}; "
                        f"give {option} (attention, mlp, all-linear or module names)")
    block = tuple(lin for lin in block_linears(m) if lin.adaptable)
    outside = outside_linears(m)
    layers = block + outside
    picked: list[Linear] = []
    for t in targets:
        if t == "all-linear":
            hit = list(layers)
        elif t == "attention":
            hit = [lin for lin in block if lin.group == "attention"]
        elif t == "mlp":
            hit = [lin for lin in block if lin.group == "mlp"]
        else:
            hit = [lin for lin in layers if lin.matches(t)]
        if not hit:
            names = sorted({lin.name.rsplit(".", 1)[-1] for lin in layers} | {a for lin in layers for a in lin.aliases})
            raise UserError(f"--lora-targets {t!r} matches no linear layer of {m.name} ({m.model_type}); "
                            f"use {', '.join(TARGET_GROUPS)} or module names: {', '.join(names)}")
        picked += [lin for lin in hit if lin not in picked]
    _check_fused(m, targets, picked)
    return tuple(lin for lin in layers if lin in picked)


def _check_fused(m: ModelSpec, targets: tuple[str, ...], picked: list[Linear]) -> None:
    """PEFT refuses w1 without w3 (or the reverse), and on the qwen2_moe pattern gate_proj
    without up_proj: transformers 5 fuses them."""
    pair = ("gate_proj", "up_proj") if m.model_type in QWEN2_MOE_CONVERSION_TYPES and m.is_moe else ("w1", "w3")
    named = {t for t in targets if t in pair}
    if len(named) == 1:
        missing = (set(pair) - named).pop()
        raise UserError(f"{m.name}: {pair[0]} and {pair[1]} are one fused gate_up_proj in transformers 5; "
                        f"target {missing} too (PEFT requires both)")


def lora_layer_params(lin: Linear, rank: int) -> int:
    """LoRA parameters on one linear layer: A (d_in x r') and B (r' x d_out) per copy, r' the
    rank times PEFT's factor for fused projections (Hu et al. 2021, Sec. 4.1)."""
    r = rank * lin.rank_factor
    if lin.n_copies > 1:
        # PEFT's ParamWrapper on a 3-D expert weight: lora_A is (r E) x d_in, lora_B d_out x (r E)
        return r * lin.n_copies * (lin.d_in + lin.d_out)
    return r * (lin.d_in + lin.d_out)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainableCount:
    """Trainable parameters by where they sit: per block (dense part and expert part) and
    outside the blocks (first stage: embedding; last: final norm, LM head, MLM head)."""

    dense_per_layer: int
    expert_per_layer: int
    n_layers: int               # blocks that hold trainable parameters
    outside: int
    remainder: int = 0          # blocks unlike each other: total - the mean block x n_layers (< n_layers)

    @property
    def total(self) -> int:
        return (self.dense_per_layer + self.expert_per_layer) * self.n_layers + self.outside + self.remainder


def trainable_count(m: ModelSpec, spec: FinetuneSpec, pc: ParamCount | None = None) -> TrainableCount:
    """How many parameters train under ``spec``: all of them (full), the adapters (LoRA,
    QLoRA: equal to PEFT's ``print_trainable_parameters``), or the last blocks (freeze). Kept
    per arguments (none is a layout's: rank_split asks it per stage shape, 2,167 times in the
    256-job `plan buy`, issue 32)."""
    return _trainable_count(m, spec, pc or count_params(m))


@lru_cache(maxsize=1024)
def _trainable_count(m: ModelSpec, spec: FinetuneSpec, pc: ParamCount) -> TrainableCount:
    """trainable_count() with its parameter count given, kept per arguments."""
    if spec.method == "full":
        expert = pc.expert_per_layer * pc.n_experts
        return TrainableCount(dense_per_layer=pc.per_layer - expert, expert_per_layer=expert,
                              n_layers=m.n_layers, outside=pc.embedding + pc.final - frozen_vision_params(m, spec))
    if spec.method == "freeze":
        expert = pc.expert_per_layer * pc.n_experts
        return TrainableCount(dense_per_layer=pc.per_layer - expert, expert_per_layer=expert,
                              n_layers=min(spec.trainable_layers, m.n_layers), outside=0)
    dense = expert = outside = 0          # summed over every block
    for lin in resolve_targets(m, spec):
        n = lora_layer_params(lin, spec.lora_rank)
        if lin.group == "outside":
            outside += n
        elif lin.expert:
            expert += n * blocks_with(m, lin)
        else:
            dense += n * blocks_with(m, lin)
    n_l = m.n_layers
    return TrainableCount(dense_per_layer=dense // n_l, expert_per_layer=expert // n_l, n_layers=n_l,
                          outside=outside, remainder=dense % n_l + expert % n_l)


def frozen_vision_params(m: ModelSpec, spec: FinetuneSpec) -> int:
    """The image side's parameters (vision encoder and projector) that full training leaves
    frozen: all of them under ``spec.freeze_vision`` (the default), else 0; 0 for a text model.
    (LoRA, QLoRA and freeze keep every parameter outside their adapters or blocks frozen.)"""
    return m.vision.params if m.vision is not None and spec.freeze_vision else 0


def n_trainable_params(m: ModelSpec, spec: FinetuneSpec, pc: ParamCount | None = None) -> int:
    return trainable_count(m, spec, pc).total


# ------------------------------------------------------------------------ quantization

def linear_weight_bytes(lin: Linear, quant: str, weight_bytes: int, double_quant: bool = True) -> float:
    """Bytes of one linear layer's weight (all copies, no bias) stored as ``quant``.

    nf4: 0.5 B per weight plus its absmax constants, 4 B per 64 weights, or with double
    quantization 1 B per 64 weights and 4 B per 64 x 256 (QLoRA Sec. 3: 0.5 and 0.127 bit
    per parameter). int8: 1 B per weight and a 4-byte scale per output row (LLM.int8()).
    int4: 0.5 B per weight, and per group of 128 an fp16 scale and a 4-bit zero point.
    """
    n = lin.weight_numel
    if quant == "none":
        return float(n * weight_bytes)
    if quant == "nf4":
        blocks = ceil_div(n, NF4_BLOCK)
        consts = blocks + 4 * ceil_div(blocks, NF4_DOUBLE_QUANT_BLOCK) if double_quant else 4 * blocks
        return n / 2 + consts
    if quant == "int8":
        return float(n + 4 * lin.d_out * lin.n_copies)
    return n / 2 + ceil_div(n, INT4_GROUP) * 2.5     # int4


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockBytes:
    """One block's weights stored frozen: bytes per parameter of its dense and expert parts,
    and its largest linear weight (the one bitsandbytes dequantizes at a time)."""

    dense_bytes_per_param: float
    expert_bytes_per_param: float
    largest_linear_numel: int


def frozen_block_bytes(m: ModelSpec, spec: FinetuneSpec, weight_bytes: int, pc: ParamCount | None = None) -> BlockBytes:
    """Bytes per parameter of a frozen block: quantized linear weights where ``spec.quant``
    says so, everything else (norms, biases, the router) at ``weight_bytes``. Kept per
    arguments (none is a layout's: rank_split asked 4,000 times per stage shape in the
    256-job `plan buy`, issue 32)."""
    return _frozen_block_bytes(m, spec, weight_bytes, pc or count_params(m))


@lru_cache(maxsize=1024)
def _frozen_block_bytes(m: ModelSpec, spec: FinetuneSpec, weight_bytes: int, pc: ParamCount) -> BlockBytes:
    expert_params = pc.expert_per_layer * pc.n_experts
    dense_params = pc.per_layer - expert_params
    dense_b = float(dense_params * weight_bytes)
    expert_b = float(expert_params * weight_bytes)
    quantizable = [lin for lin in block_linears(m) if lin.group != "router"]
    if spec.quant != "none":
        for lin in quantizable:
            saved = lin.weight_numel * weight_bytes - linear_weight_bytes(lin, spec.quant, weight_bytes,
                                                                          spec.double_quant)
            saved = saved * blocks_with(m, lin) / m.n_layers     # per mean block
            if lin.expert:
                expert_b -= saved
            else:
                dense_b -= saved
    largest = max(lin.d_in * lin.d_out for lin in quantizable)
    return BlockBytes(dense_bytes_per_param=dense_b / max(dense_params, 1),
                      expert_bytes_per_param=expert_b / max(expert_params, 1),
                      largest_linear_numel=largest)


# ---------------------------------------------------------------------------- per rank

@dataclass(frozen=True, kw_only=True, slots=True)
class RankSplit:
    """Parameters of one rank split into those that train and the frozen base (bytes).

    ``trainable_*`` get weights, gradients and optimizer states; ``frozen_*_bytes`` only
    weights, at their storage dtype (LoRA: Hu et al. 2021 Sec. 4.2, "we do not need to store
    the optimizer states for the frozen parameters"). ``block_trainable`` and
    ``block_frozen_bytes`` describe one block on this rank (the unit ZeRO-3/FSDP gathers).
    """

    trainable_dense: int
    trainable_expert: int
    frozen_dense_bytes: int
    frozen_expert_bytes: int
    block_trainable: int
    block_frozen_bytes: int
    largest_trainable: int       # elements of the largest trainable tensor on the rank
    dequant_bytes: int = 0       # a dequantized 16-bit copy of the largest quantized weight

    @property
    def trainable(self) -> int:
        return self.trainable_dense + self.trainable_expert

    @property
    def frozen_bytes(self) -> int:
        return self.frozen_dense_bytes + self.frozen_expert_bytes


def rank_split(m: ModelSpec, pc: ParamCount, spec: FinetuneSpec, lay: Layout, dense: int, expert: int,
               root: int, n_layers: int, n_trainable_layers: int, last_stage: bool,
               weight_bytes: int, full_largest: int, first_stage: bool = False) -> RankSplit:
    """Split one rank's parameters (``dense`` incl. ``root`` = embedding/head, ``expert``;
    after tensor, pipeline and expert splitting, before ZeRO sharding) by ``spec``.

    Adapters split like the layers they adapt (by tp; experts by ep x etp, as memory.params
    splits their weights). ``freeze`` trains ``n_trainable_layers`` of the stage's ``n_layers``
    blocks. A vision-language model's frozen image side (frozen_vision_params) sits in the
    first stage's ``root``: there it keeps weights only under full training too.
    """
    tp, ep, etp = lay.tp, lay.ep, lay.expert_tp
    layer_dense = (dense - root) // n_layers if n_layers else 0
    layer_expert = expert // n_layers if n_layers else 0
    block = layer_dense + layer_expert
    if spec.method == "full":
        frozen = frozen_vision_params(m, spec) if first_stage else 0
        return RankSplit(trainable_dense=dense - frozen, trainable_expert=expert,
                         frozen_dense_bytes=frozen * weight_bytes, frozen_expert_bytes=0,
                         block_trainable=block, block_frozen_bytes=0, largest_trainable=full_largest)
    if spec.method == "freeze":
        k = n_trainable_layers
        frozen_dense = dense - k * layer_dense
        frozen_expert = expert - k * layer_expert
        return RankSplit(trainable_dense=k * layer_dense, trainable_expert=k * layer_expert,
                         frozen_dense_bytes=frozen_dense * weight_bytes,
                         frozen_expert_bytes=frozen_expert * weight_bytes,
                         # the block in backward first is the stage's last: trainable when any is
                         block_trainable=block if k else 0,
                         block_frozen_bytes=0 if k else block * weight_bytes,
                         largest_trainable=ceil_div(m.d_ff * m.d_model, tp) if k else 0)
    count = trainable_count(m, spec, pc)
    bb = frozen_block_bytes(m, spec, weight_bytes, pc)
    a_dense = ceil_div(count.dense_per_layer, tp)
    a_expert = ceil_div(count.expert_per_layer, ep * etp)
    outside = count.outside if last_stage else 0
    frozen_dense = int((dense - root) * bb.dense_bytes_per_param) + root * weight_bytes
    frozen_expert = int(expert * bb.expert_bytes_per_param)
    largest = largest_adapter_numel(m, spec)
    dequant = ceil_div(bb.largest_linear_numel, tp) * 2 if spec.quant != "none" and n_layers else 0
    return RankSplit(trainable_dense=n_layers * a_dense + outside, trainable_expert=n_layers * a_expert,
                     frozen_dense_bytes=frozen_dense, frozen_expert_bytes=frozen_expert,
                     block_trainable=a_dense + a_expert,
                     block_frozen_bytes=int(layer_dense * bb.dense_bytes_per_param
                                            + layer_expert * bb.expert_bytes_per_param),
                     largest_trainable=ceil_div(largest, tp), dequant_bytes=dequant)


@lru_cache(maxsize=1024)
def largest_adapter_numel(m: ModelSpec, spec: FinetuneSpec) -> int:
    """Elements of the largest adapter tensor of one block, before tp (r x the wider side of
    its linear, every copy); kept per arguments (rank_split asks it per stage shape)."""
    return max((spec.lora_rank * lin.rank_factor * lin.n_copies * max(lin.d_in, lin.d_out)
                for lin in resolve_targets(m, spec)), default=0)


# ------------------------------------------------------------------------- activations

@dataclass(frozen=True, kw_only=True, slots=True)
class AdapterActivation:
    """What one block's adapters keep for backward, in bytes per token (before tp)."""

    name: str
    bytes_per_token: float


@lru_cache(maxsize=256)
def lora_activation_terms(m: ModelSpec, spec: FinetuneSpec, act_bytes: int,
                          cast_bytes: int | None) -> tuple[AdapterActivation, ...]:
    """Tensors the LoRA path of one block keeps for backward, per token.

    PEFT computes ``base(x) + B(A(dropout(x))) * alpha / r`` (peft/tuners/lora/layer.py,
    Linear.forward). ``A``'s weight gradient needs its input and ``B``'s needs ``A(x)``
    (r wide). When the adapters run in another dtype than the activations (PEFT keeps them
    in fp32; under autocast the matmul casts back to 16 bits) every adapted layer keeps its
    own cast copy of ``x``, ``cast_bytes`` per element; otherwise layers that read the same
    tensor (q, k and v; gate and up) share it, at ``act_bytes``. Dropout > 0 adds, per
    adapted layer, a 1-byte mask and a dropped copy of the input (measured with MemTracker
    on a Llama model: 5.0 B per input element in fp32, 3.0 B under bf16 autocast).
    Kept per arguments (none is the layout's: the 256-job `plan buy` asked 6,222 times for
    a few dozen)."""
    out: list[AdapterActivation] = []
    targets = [lin for lin in resolve_targets(m, spec) if lin.group != "outside"]
    k = m.n_experts_per_token if m.is_moe else 1
    inner = cast_bytes or act_bytes
    shared_inputs: dict[int, int] = {}
    for lin in targets:
        visits = k if lin.expert else 1      # a token visits k experts
        r = spec.lora_rank * lin.rank_factor
        out.append(AdapterActivation(name=f"{lin.name}: A(x), rank {r}", bytes_per_token=visits * r * inner))
        if spec.lora_dropout > 0:
            out.append(AdapterActivation(name=f"{lin.name}: dropout mask and output",
                                         bytes_per_token=visits * lin.d_in * (1 + inner)))
        if cast_bytes is not None:
            out.append(AdapterActivation(name=f"{lin.name}: input cast to the adapter dtype",
                                         bytes_per_token=visits * lin.d_in * cast_bytes))
        else:
            key = _input_key(lin)
            shared_inputs[key] = max(shared_inputs.get(key, 0), visits * lin.d_in * act_bytes)
    if shared_inputs:
        out.append(AdapterActivation(name="inputs of the adapted layers (shared)",
                                     bytes_per_token=sum(shared_inputs.values())))
    return tuple(out)


def _input_key(lin: Linear) -> int:
    """Layers reading the same tensor: q/k/v (and fused qkv), gate/up, each other one alone."""
    name = lin.name.rsplit(".", 1)[-1]
    groups = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "query": 1, "key": 1, "value": 1,
              "c_attn": 1, "query_key_value": 1, "gate_proj": 2, "up_proj": 2, "gate": 2,
              "gate_up_proj": 2, "c_fc": 2, "dense_h_to_4h": 2}
    return groups.get(name, hash(lin.name))


def activation_layers(spec: FinetuneSpec, n_layers_total: int, first_layer: int, n_layers: int) -> int:
    """Blocks of a stage (layers first_layer .. first_layer + n_layers - 1) that keep
    activations. Autograd saves nothing for operations whose inputs and weights need no
    gradient, so with ``freeze`` the frozen blocks before the first trainable one keep none;
    LoRA adapters sit in every block."""
    if spec.method != "freeze":
        return n_layers
    first_trainable = n_layers_total - min(spec.trainable_layers, n_layers_total)
    return max(0, first_layer + n_layers - max(first_layer, first_trainable))

