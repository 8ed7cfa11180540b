"""Per-rank memory from first principles: model states, activations, logits, buffers.

Everything is bytes on one GPU (int). The most loaded rank is found by evaluating every
pipeline stage. Categories line up with PyTorch's memory trackers: everything a tensor
tracker can see is outside ``overhead``; ``overhead`` holds only what no tracker sees
(CUDA context, library workspaces, NCCL buffers, allocator fragmentation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from planner.layouts.layout import Layout
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.finetune import FinetuneSpec, RankSplit, activation_layers, lora_activation_terms, rank_split
from planner.training.setup import Precision, TrainingSetup, optimizer_state_bytes_per_param
from planner.units import ceil_div

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on one rank at its peak, by category (see module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    buffers: int
    overhead: int

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.logits + self.buffers + self.overhead)

    @property
    def tracked(self) -> int:
        """What a tensor tracker can see: the total less ``overhead``."""
        return self.total - self.overhead

    def as_dict(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CATEGORIES} | {"total": self.total}


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationTerm:
    """One saved tensor of a transformer block, per micro-batch, on one rank.

    ``selective``: True when selective recomputation drops it (the attention scores,
    Korthikanti et al. 2022 Sec. 4.2).
    """

    name: str
    bytes: int
    selective: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class RankMemory:
    """The memory of the most loaded rank, and where the figure comes from."""

    breakdown: MemoryBreakdown
    stage: int                  # which pipeline stage is the most loaded
    phase: str                  # when the peak happens: backward-start | backward-end
    n_layers_on_stage: int
    in_flight: float            # micro-batches whose activations the stage holds
    kernels: str
    # offload (ZeRO-Offload, ZeRO-Infinity, FSDP CPU offload): what this rank keeps in CPU
    # memory and on NVMe, and how many ranks share a node's CPU memory and drives
    host_bytes: int = 0
    nvme_bytes: int = 0
    ranks_per_node: int = 1

    @property
    def total(self) -> int:
        return self.breakdown.total

    @property
    def host_bytes_per_node(self) -> int:
        return self.host_bytes * self.ranks_per_node

    @property
    def nvme_bytes_per_node(self) -> int:
        return self.nvme_bytes * self.ranks_per_node


# --------------------------------------------------------------------------- params

def stage_layers(n_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage. Uneven splits put the extra layers on the middle
    stages first: the first stage holds the most in-flight activations and the
    embedding, the last one the LM head (picotron and torchtitan split unevenly too)."""
    base, extra = divmod(n_layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i == 0, i == pp - 1, -i))
    for i in order[:extra]:
        counts[i] += 1
    return counts


@dataclass(frozen=True, kw_only=True, slots=True)
class RankParams:
    """Parameters held by one rank of a stage, before ZeRO/FSDP sharding over data ranks."""

    dense: int
    expert: int
    block_unit: int       # one transformer block: the unit FSDP and ZeRO-3 gather
    root_unit: int        # embedding + final norm + LM head: FSDP2's root unit
    largest_module: int   # the largest single module DeepSpeed ZeRO-3 gathers at once

    @property
    def total(self) -> int:
        return self.dense + self.expert


def rank_params(m: ModelSpec, pc: ParamCount, lay: Layout, stage: int, n_layers: int) -> RankParams:
    """Parameters on one rank of ``stage``.

    Tensor parallelism splits every matrix of a block by tp and replicates the norms
    (Shoeybi et al. 2019, Megatron-LM Sec. 3); the word embedding and the LM head are
    split over the vocabulary. Expert weights are split over ep (and tp). With tied
    embeddings and pp > 1, the last stage keeps its own copy of the embedding for the
    LM head (Megatron-LM). Biases of row-parallel layers are replicated; they are
    counted as split, an error of at most d_model parameters per layer.
    """
    tp, ep = lay.tp, lay.ep
    norms = pc.norms_per_layer
    expert_all = pc.expert_per_layer * pc.n_experts
    router = pc.mlp_per_layer - expert_all if m.is_moe else 0
    dense_layer = ceil_div(pc.per_layer - norms - expert_all - router, tp) + norms + router
    expert_layer = ceil_div(expert_all, ep * tp) if m.is_moe else 0
    dense = n_layers * dense_layer
    root = 0
    h = m.d_model
    first, last = stage == 0, stage == lay.pp - 1
    if first:
        word = m.vocab_size * h
        root += ceil_div(word, tp) + (pc.embedding - word)
    if last:
        head = pc.final - pc.lm_head
        head += ceil_div(pc.lm_head, tp)
        if m.tied_embeddings and lay.pp > 1:
            head += ceil_div(m.vocab_size * h, tp)
        root += head
    dense += root
    block = dense_layer + expert_layer if n_layers else 0
    largest_module = max(block, ceil_div(m.vocab_size * h, tp) if (first or last) else 0)
    return RankParams(dense=dense, expert=n_layers * expert_layer, block_unit=block,
                      root_unit=root, largest_module=largest_module)


# ---------------------------------------------------------------------- model states

@dataclass(frozen=True, kw_only=True, slots=True)
class ModelStates:
    weights: int
    gradients: int
    optimizer: int
    unsharded_weights: int = 0   # FSDP shard-grad-op keeps gathered weights through backward

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.unsharded_weights


def adafactor_bytes_per_param(m: ModelSpec) -> float:
    """Adafactor's factored second moment, per parameter: one fp32 row and one column
    vector per matrix, a full fp32 vector for each 1-D parameter, no first moment
    (Shazeer & Stern 2018, arXiv:1804.04235, Alg. 4; torch.optim.Adafactor's default
    beta1=None)."""
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    mats = [(h, q), (h, kv), (h, kv), (q, h)]
    mats += [(h, f)] * (2 if m.gated_mlp else 1) + [(f, h)]
    experts = max(m.n_experts, 1)
    state = sum(4 * (a + b) for a, b in mats[:4])
    state += experts * sum(4 * (a + b) for a, b in mats[4:])
    params = sum(a * b for a, b in mats[:4]) + experts * sum(a * b for a, b in mats[4:])
    return state / params


def model_state_bytes(
    n_dense: int, n_expert: int, precision: Precision, optimizer_bytes_per_param: float,
    lay: Layout, shard_degree_dense: int | None = None, amp: bool = False,
    expert_padding: float = 1.0,
) -> ModelStates:
    """Weights, gradients and optimizer state of one rank (ZeRO paper, Sec. 5).

    ZeRO-1 shards the optimizer states (with the fp32 master copy) over the data ranks,
    ZeRO-2 also the gradients, ZeRO-3 also the weights: with Psi parameters, K=12 and
    N_d ranks, (2+2+K)Psi, 2Psi+2Psi+K Psi/N_d, 2Psi+(2+K)Psi/N_d, (2+2+K)Psi/N_d
    (Rajbhandari et al. 2019, arXiv:1910.02054, Fig. 1). FSDP2 with a mixed-precision
    policy keeps the sharded parameters in fp32 (they are the master copy) and fp32
    gradients, and gathers 16-bit copies for compute (PyTorch FSDP2 docs,
    MixedPrecisionPolicy); shard-grad-op keeps the gathered copies from forward to
    backward. ``expert_padding`` (see fsdp_expert_padding) scales the expert shards FSDP2
    stores when it cannot split the experts' first dimension evenly.
    """
    d_dense = shard_degree_dense or lay.dense_shard_degree
    d_expert = max(1, lay.expert_shard_degree if shard_degree_dense is None
                   else min(lay.expert_shard_degree, shard_degree_dense))
    stage = lay.zero_stage

    def shard(n_dense_bytes: float, n_expert_bytes: float, sharded: bool) -> int:
        if not sharded:
            return int(n_dense_bytes + n_expert_bytes)
        return ceil_div(int(n_dense_bytes), d_dense) + ceil_div(int(n_expert_bytes), d_expert)

    if lay.is_fsdp:
        # the sharded parameter keeps the dtype it was built in: fp32 under mixed precision
        stored = 4 if precision.is_mixed else precision.weight_bytes
        grad = 4 if precision.is_mixed else precision.grad_bytes
        opt = optimizer_bytes_per_param
        unsharded = (int((n_dense + n_expert * expert_padding) * precision.weight_bytes)
                     if lay.sharding == "fsdp-grad-op" else 0)
        n_expert = int(n_expert * expert_padding)
        return ModelStates(
            weights=shard(n_dense * stored, n_expert * stored, True),
            gradients=shard(n_dense * grad, n_expert * grad, True),
            optimizer=shard(n_dense * opt, n_expert * opt, True),
            unsharded_weights=unsharded,
        )
    if amp:
        # torch.autocast: the parameters stay fp32 (they are the master copy), gradients
        # are fp32, and 16-bit copies of the weights are made per forward (activations)
        return ModelStates(weights=(n_dense + n_expert) * 4, gradients=(n_dense + n_expert) * 4,
                           optimizer=int((n_dense + n_expert) * optimizer_bytes_per_param))
    opt = precision.master_bytes + optimizer_bytes_per_param
    return ModelStates(
        weights=shard(n_dense * precision.weight_bytes, n_expert * precision.weight_bytes, stage >= 3),
        gradients=shard(n_dense * precision.grad_bytes, n_expert * precision.grad_bytes, stage >= 2),
        optimizer=shard(n_dense * opt, n_expert * opt, stage >= 1),
    )


# ----------------------------------------------------------------------- activations

def resolve_kernels(setup: TrainingSetup, lay: Layout) -> str:
    """fused (Megatron-style), eager (PyTorch ops in the compute dtype, as under FSDP's or
    DeepSpeed's 16-bit parameters) or amp (eager ops under torch.autocast with fp32
    parameters: what DDP and the Hugging Face Trainer run for replicated mixed precision)."""
    kernels = setup.kernels
    if kernels == "auto":
        kernels = "fused" if (lay.tp > 1 or lay.pp > 1 or lay.cp > 1) else "eager"
    if (kernels == "eager" and lay.sharding == "zero" and lay.zero_stage == 0
            and setup.precision_spec.is_mixed):
        return "amp"
    return kernels


def layer_activation_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> list[ActivationTerm]:
    """Tensors one transformer block saves for backward, per micro-batch, on one rank.

    Derived operation by operation; for the GPT block of Korthikanti et al. 2022
    (arXiv:2205.05198, Sec. 4.1: 16-bit activations, LayerNorm, GeLU MLP of width 4h,
    dropout, attention scores materialised) the terms add up to their
    sbh(34 + 5as/h) per layer, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, and
    sbh/t (34 + 5as/h) with sequence parallelism (their Eqs. 1-4). Tensors inside the
    tensor-parallel region are split by tp; the rest (norm inputs, dropout masks, the
    inputs of the first linear layers) only when sequence parallelism is on. Context
    parallelism splits the sequence.

    Beyond the paper: grouped-query attention (K and V are n_kv_heads wide, or
    expanded to n_heads by the eager kernel's repeat_kv), FlashAttention (Dao et al.
    2022: saves Q, K, V, the output and a fp32 log-sum-exp per head and row, never the
    s x s scores, and regenerates its dropout mask), gated MLPs (three d_ff-wide tensors
    with a fused SwiGLU, four with eager PyTorch ops: gate, up, act(gate), product), MoE
    (each token visits k experts, so the expert-side tensors are k times larger; the
    router keeps fp32 probabilities), eager RMSNorm (Hugging Face upcasts to fp32 and
    keeps both the fp32 input and the normalised 16-bit output).
    """
    b, s = lay.micro_batch, lay.seq_len // lay.cp
    tokens = b * s
    a = setup.precision_spec.activation_bytes
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    tp = lay.tp
    sp_div = tp if lay.sp else 1
    eager = kernels != "fused"
    terms: list[ActivationTerm] = []
    # LoRA/QLoRA freeze the base: autograd keeps an operand only for a gradient it computes,
    # so the inputs that only the frozen weights' gradients need are not kept (Hu et al. 2021)
    frozen = setup.finetune.freezes_base

    def add(name: str, width_bytes: float, divisor: int, selective: bool = False) -> None:
        terms.append(ActivationTerm(name=name, bytes=ceil_div(int(tokens * width_bytes), divisor),
                                    selective=selective))

    # norms: every norm keeps its input; eager RMSNorm keeps an fp32 copy of it and the
    # normalised tensor it multiplies by the weight; under autocast the residual stream
    # between blocks stays fp32 (its parameters are fp32), so norms see fp32 tensors
    add("norm inputs" + (" (fp32 copy) and normalised outputs" if m.norm == "rmsnorm" and eager else ""),
        m.norms_per_layer * h * norm_saved_bytes(m, a, kernels, frozen), sp_div)
    if not frozen:
        add("attention input (norm output)", h * a, sp_div)
    if not m.parallel_block and not frozen:
        add("MLP input (norm output)", h * a, sp_div)

    # attention core, inside the tensor-parallel region
    if setup.attention == "eager":
        add("Q, K, V (K, V expanded to all heads)", 3 * q * a, tp)
        s_kv = lay.seq_len
        # Hugging Face's eager attention runs softmax in fp32 and casts it back: both kept
        score_bytes = (4 + (a if a < 4 else 0)) if eager else a
        add("softmax output (b x heads x s x s)", m.n_heads * s_kv * score_bytes, tp, selective=True)
        if m.attention_dropout > 0:
            add("attention dropout mask and output", m.n_heads * s_kv * (1 + a), tp, selective=True)
        if not frozen:
            add("attention output (input of the output projection)", q * a, tp)
    else:
        add("Q, K, V", (q + 2 * kv) * a, tp)
        add("attention output (flash output, projection input)", q * a, tp)
        add("log-sum-exp per head and row (fp32)", m.n_heads * 4, tp)
    if m.hidden_dropout > 0:
        add("dropout mask after attention", h * 1, sp_div)

    # MLP: dense, or k experts per token
    k = m.n_experts_per_token if m.is_moe else 1
    if m.gated_mlp:
        add("MLP gate, up, activation and product" if eager else "MLP [gate, up] and product",
            k * ((4 if eager else 3) - frozen) * f * a, tp)   # frozen: the product is not kept
    else:
        add("MLP activation input and second linear input", k * (2 - frozen) * f * a, tp)
        extra = PYTHON_ACTIVATION_SAVES.get(m.activation, 0) if eager else 0
        if extra:
            add(f"{m.activation} written in Python ops: its saved intermediates", k * extra * f * a, tp)
    if m.is_moe and not frozen:
        add("tokens permuted to their experts", k * h * a, sp_div)
        add("router probabilities (fp32)", m.n_experts * 4, 1)
    if m.hidden_dropout > 0:
        add("dropout mask after the MLP", h * 1, sp_div)
    if setup.finetune.is_lora:
        for t in lora_activation_terms(m, setup.finetune, a, lora_cast_bytes(setup, lay, kernels)):
            add(t.name, t.bytes_per_token, tp)
    return terms


def lora_cast_bytes(setup: TrainingSetup, lay: Layout, kernels: str) -> int | None:
    """Bytes per element of the copy of its input each adapted layer keeps, or None when
    the adapters compute in the activations' dtype and layers reading one tensor share it.

    PEFT keeps adapters in fp32 (LoraConfig's autocast_adapter_dtype) and casts each
    layer's input to them (peft/tuners/tuners_utils.py, _cast_input_dtype): under autocast
    (replicated mixed precision) the matmul then keeps a 16-bit copy, in pure 16-bit
    training an fp32 copy. DeepSpeed ZeRO >= 1, FSDP's mixed precision and Megatron run the
    whole model in 16 bits, QLoRA's adapters are 16-bit, and fp32 needs no cast: no copy.
    """
    ft, p = setup.finetune, setup.precision_spec
    if ft.adapter_bits == 16 or lay.zero_stage > 0 or lay.is_fsdp or kernels == "fused":
        return None
    if p.activation_bytes == 4:
        return None
    return 2 if p.is_mixed else 4


# Activations written as several PyTorch ops save intermediates a fused kernel would
# not. transformers' NewGELUActivation ("gelu_new", GPT-2) computes
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): beyond its input, autograd keeps the
# tanh output, 0.5 x and (1 + tanh), three d_ff-wide tensors.
PYTHON_ACTIVATION_SAVES = {"gelu_new": 3}


def norm_saved_bytes(m: ModelSpec, a: int, kernels: str, frozen: bool = False) -> int:
    """Bytes per element a norm keeps: its input (fused kernels, LayerNorm), or for
    Hugging Face's RMSNorm the fp32 upcast of its input and the normalised tensor.
    Under autocast ("amp") the residual stream is fp32 (measured with MemTracker on a
    Llama model: replicated bf16 autocast keeps 4 more bytes per element per norm).
    A frozen RMSNorm weight needs no gradient, so the normalised tensor is not kept."""
    stream = 4 if kernels == "amp" else a
    if kernels == "fused":
        return a
    if m.norm == "rmsnorm":
        return 4 + (0 if frozen else stream)
    return stream


def layer_activation_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one block keeps for backward, per micro-batch, under ``lay.recompute``.

    selective drops the attention-score terms (Korthikanti et al. Sec. 4.2); full keeps
    only the block's input, split by tp under sequence parallelism (their Sec. 4.3:
    2sbh per layer, 2sbh/t with sp).
    """
    if lay.recompute == "full":
        a = setup.precision_spec.activation_bytes
        return ceil_div(lay.micro_batch * (lay.seq_len // lay.cp) * m.d_model * a,
                        lay.tp if lay.sp else 1)
    terms = layer_activation_terms(m, setup, lay, kernels)
    return sum(t.bytes for t in terms if not (lay.recompute == "selective" and t.selective))


def in_flight_microbatches(lay: Layout, stage: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at once.

    1F1B: stage i (from 0) holds min(pp - i, m) (Narayanan et al. 2021, Sec. 2.2.1).
    Interleaved with v chunks: the first stage holds (1 + (p-1)/(p v)) times more
    (Korthikanti et al. 2022, Sec. 4.2.3); applied to every stage, which can only
    overestimate the later ones.
    """
    if lay.pp == 1:
        return 1.0
    held = float(min(lay.pp - stage, lay.grad_accum))
    if lay.vp > 1:
        held *= 1 + (lay.pp - 1) / (lay.pp * lay.vp)
    return held


def logits_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """The output layer and loss on the last stage, for one micro-batch, at the start
    of backward.

    Fused (Megatron-LM's vocab-parallel cross entropy): the final norm input and the LM
    head input, sbh each (split under sp), and the logits in fp32, 4sbv/t (Korthikanti
    et al. Sec. 4.3). Eager (Hugging Face loss on PyTorch ops): the final norm as in the
    blocks, the fp32 logits the loss keeps for backward, and the two fp32 logit-sized
    gradients the loss's backward creates, 12 bytes per token and vocabulary entry.
    Measured with FSDPMemTracker on Llama-3-8B (s=2048): 1.05e9 B kept plus 2.10e9 B of
    temporaries, 4sv and 8sv. The 16-bit logits the model returns are freed before
    backward, as the Hugging Face Trainer and torchtitan do. Fine-tuning methods other than
    full freeze the final norm and the LM head: their inputs are kept only for the input
    gradients (the normalised tensor and the head's input are not).
    """
    b, s = lay.micro_batch, lay.seq_len // lay.cp
    a = setup.precision_spec.activation_bytes
    tokens = b * s
    sp_div = lay.tp if lay.sp else 1
    eager = kernels != "fused"
    frozen_head = not setup.finetune.is_full
    norm_width = norm_saved_bytes(m, a, kernels, frozen_head)
    norm_in = 0 if not m.final_norm else ceil_div(tokens * m.d_model * norm_width, sp_div)
    head_in = 0 if frozen_head else ceil_div(tokens * m.d_model * a, sp_div)
    v = ceil_div(m.vocab_size, lay.tp)
    per_vocab = 12 if eager else 4
    return norm_in + head_in + tokens * v * per_vocab


# --------------------------------------------------------------------------- buffers

def buffer_bytes(
    m: ModelSpec, setup: TrainingSetup, lay: Layout, rp: RankParams, precision: Precision,
    split: RankSplit | None = None,
) -> int:
    """Communication buffers the engine allocates beside the model states.

    ZeRO-1/2 (DeepSpeed): the gradient reduce bucket, min(bucket, params) 16-bit
    elements (DeepSpeed config "reduce_bucket_size"). DeepSpeed ZeRO-3: the gathered
    16-bit copy of the module being computed and of the one prefetched (the largest
    module: a block, or the word embedding; "stage3_prefetch_bucket_size") and the
    reduce bucket. FSDP2 full/hybrid at the start of backward: the last block, gathered
    again for its backward (FSDPMemTracker's "all-gather" at the peak of a Llama-3-8B
    step: 436,224,512 B, one block in bf16). The root unit FSDP2 keeps gathered is
    counted with the weights, where the tracker puts it. The unsharded gradients of a
    unit before its reduce-scatter come later in backward, when most activations are
    freed.
    Pipeline stages: send and receive buffers of one activation tensor each.
    With a frozen base (``split`` from planner.training.finetune) only trainable parameters have
    gradients to bucket, gathered blocks are as large as their stored (maybe quantized)
    weights, and bitsandbytes dequantizes one quantized weight at a time to 16 bits
    (its matmul's forward and backward: ``dequantize_4bit`` then a 16-bit matmul).
    """
    out = 0
    wb = precision.weight_bytes
    stage = lay.zero_stage
    grads = rp.total if split is None else split.trainable
    block_bytes = rp.block_unit * wb
    module_bytes = rp.largest_module * wb
    if split is not None and setup.finetune.method != "full":
        block_bytes = split.block_frozen_bytes + split.block_trainable * wb
        module_bytes = max(block_bytes, module_bytes if rp.largest_module > rp.block_unit else 0)
        out += split.dequant_bytes
    if lay.sharding == "zero" and stage in (1, 2):
        out += min(setup.buffers.zero_bucket_numel, grads) * precision.grad_bytes
    if stage == 3:
        if lay.is_fsdp:
            out += block_bytes
        else:
            out += 2 * module_bytes + min(setup.buffers.zero_bucket_numel, grads) * precision.grad_bytes
    if lay.pp > 1:
        act = lay.micro_batch * (lay.seq_len // lay.cp) * m.d_model * precision.activation_bytes
        out += 2 * ceil_div(act, lay.tp if lay.sp else 1)
    return out


# ------------------------------------------------------------------------ the rank

def per_rank_memory(m: ModelSpec, setup: TrainingSetup, lay: Layout,
                    pc: ParamCount | None = None, gpus_per_node: int = 8,
                    trace: dict[str, Any] | None = None) -> RankMemory:
    """The peak memory of the most loaded rank of ``lay``, by category.

    Three moments can be the peak, and the largest is taken: the start of backward (all
    in-flight activations and the loss held; gradients only if they persist, i.e. with
    gradient accumulation, pipelining, or DDP/ZeRO gradient buffers), the end of
    backward (all gradients, one block's activations), and the optimizer step (all
    gradients and the step's temporaries, no activations). The categories are those
    of that moment, as a memory tracker reports them at its peak. Overhead adds the
    fixed CUDA/NCCL costs and the allocator's fragmentation on top of the tracked bytes.

    FSDP2 frees as it goes, so its moments differ (each checked with FSDPMemTracker on
    Mixtral-8x7B and Llama-3-8B, docs/accuracy.md): "backward-end" is inside the backward
    of one block (fsdp_blocks_done: near the end under full shard, the second block under
    shard-grad-op), with the gradients of the blocks done only; "forward-end" is the last
    block's all-gather in forward, two all-gather buffers at once (fsdp_forward_bytes);
    at the optimizer step every unit is resharded, so no gathered weights are left; and
    the LM head's unsharded gradient is held through backward (the root unit is reduced
    last).

    ``trace``, when given, is filled with the parts each category of the peak is summed
    from and their inputs (planner.report.explain prints them; its tests check they add up).
    """
    pc = pc or count_params(m)
    prec = setup.precision_spec
    ft = setup.finetune
    kernels = resolve_kernels(setup, lay)
    autocast = kernels == "amp"      # replicated mixed precision runs under torch.autocast
    # trainable parameters kept in fp32 with fp32 gradients: everything under autocast; and
    # with a frozen base on replicated ranks, PEFT's adapters (autocast_adapter_dtype) and
    # freeze's trainable blocks (upcast, as LLaMA-Factory does) whatever the precision.
    # QLoRA's adapters are 16-bit. A frozen base loaded in 16 bits gives a 16-bit residual
    # stream, so its activations are those of eager kernels.
    replicated = lay.sharding == "zero" and lay.zero_stage == 0 and kernels != "fused"
    fp32_trainables = not ft.is_full and not (ft.is_lora and ft.adapter_bits == 16) and replicated
    amp_states = (autocast and not (ft.is_lora and ft.adapter_bits == 16)) or fp32_trainables
    if autocast and not ft.is_full:
        kernels = "eager"
    # QLoRA: 16-bit adapters with no master copy, updated by paged 8-bit AdamW
    state_prec = Precision.named("bf16") if ft.is_lora and ft.adapter_bits == 16 else prec
    opt_pp = _optimizer_bytes_per_param(m, "adam8bit" if ft.paged_8bit_optimizer else setup.optimizer)
    if setup.optimizer_state_bytes is not None:
        opt_pp = setup.optimizer_state_bytes
    # freeze on replicated ranks upcasts the trainable blocks to fp32: in pure 16-bit
    # training (no autocast) their activations are fp32 too
    act_setup = setup
    if ft.method == "freeze" and fp32_trainables and not autocast and prec.activation_bytes < 4:
        act_setup = replace(setup, precision="fp32")
    layer_act, full_layer = _block_activations(m, act_setup, _activation_key(lay, ft.is_lora), kernels)
    score_grad = eager_score_gradient_bytes(m, setup, lay, kernels)
    dropout_embed = (lay.micro_batch * (lay.seq_len // lay.cp) * m.d_model
                     if m.hidden_dropout > 0 else 0)
    hybrid = _hybrid_degree(lay, gpus_per_node)
    persistent_grads = lay.grad_accum > 1 or lay.pp > 1 or (
        not lay.is_fsdp and lay.dense_shard_degree > 1)
    distributed = lay.n_gpus > 1
    ranks_per_node = min(lay.n_gpus, gpus_per_node)

    best: RankMemory | None = None
    counts = stage_layers(m.n_layers, lay.pp)
    for stage in _stages_to_check(counts):
        n_layers = counts[stage]
        rp = rank_params(m, pc, lay, stage, n_layers)
        # blocks that keep activations: all of them, but with ``freeze`` the frozen blocks
        # before the first trainable one keep none (nothing there needs a gradient)
        n_act_layers = activation_layers(ft, m.n_layers, sum(counts[:stage]), n_layers)
        split = rank_split(m, pc, ft, lay, rp.dense, rp.expert, rp.root_unit, n_layers, n_act_layers,
                           stage == lay.pp - 1, prec.weight_bytes, _largest_tensor(m, lay))
        pad = fsdp_expert_padding(m, lay, hybrid)
        ms = model_state_bytes(split.trainable_dense, split.trainable_expert, state_prec, opt_pp, lay,
                               hybrid, amp=amp_states, expert_padding=pad)
        grad_unit = rp.block_unit     # a block's gradients have its parameters' shapes: never padded
        if pad > 1 and n_layers:
            # gathered blocks carry the padded experts too
            rp = replace(rp, block_unit=rp.block_unit + int(rp.expert / n_layers * (pad - 1)))
        held = in_flight_microbatches(lay, stage)
        block_acts = int(n_act_layers * layer_act * held)
        embed_acts = int(dropout_embed * held) if stage == 0 and ft.is_full else 0
        amp_copies = 0
        if kernels == "amp":
            # autocast's 16-bit copies of every matmul weight, kept for backward
            amp_copies = 2 * (rp.total - (ceil_div(m.vocab_size * m.d_model, lay.tp) if stage == 0 else 0)
                              - n_layers * pc.norms_per_layer)
        elif autocast and amp_states:
            amp_copies = 2 * split.trainable    # autocast's copies of the fp32 trainable weights
        acts = block_acts + embed_acts + amp_copies
        # inside the last block's backward: its recomputed tensors and its gradients'
        # working set (the eager attention's fp32 score gradients)
        working = (full_layer - layer_act) + score_grad if n_act_layers else 0
        logits = logits_bytes(m, setup, lay, kernels) if stage == lay.pp - 1 else 0
        buffers = buffer_bytes(m, setup, lay, rp, prec, split)
        off = offload_bytes(setup, lay, ms, _sharded_frozen_bytes(split, lay, hybrid), split, prec, hybrid)
        # FSDP2 keeps the root unit gathered
        root_gathered = rp.root_unit * prec.weight_bytes if lay.is_fsdp and lay.zero_stage == 3 else 0
        weights = off.weights + ms.unsharded_weights + root_gathered
        step_transient = 0 if off.step_on_host else optimizer_step_transient_bytes(m, setup, lay, rp, hybrid, split)

        g_held = off.gradients if persistent_grads else 0
        end_w, end_a, end_b = (fsdp_backward_end_bytes(lay, rp, prec, split, grad_unit) if n_act_layers
                               else (0, 0, 0))
        last_block = full_layer if n_act_layers else 0
        # FSDP2 reduce-scatters the root unit (embedding, final norm, LM head) in its own
        # post-backward, after every block: the LM head's unsharded gradient, made first in
        # backward, is held to the end of it (FSDPMemTracker on Llama-3-8B cut to 4 blocks,
        # fp32, 8 ranks: 3.10 GiB of temporaries in every block's backward, 1.47 GiB less
        # with a quarter of the vocabulary: (128,256 - 32,064) x 4096 x 4 B)
        head_grad = (ceil_div(m.vocab_size * m.d_model, lay.tp) * prec.weight_bytes
                     if lay.is_fsdp and ft.is_full and stage == lay.pp - 1 and n_act_layers else 0)
        end_grads, end_acts = off.gradients, last_block + end_a
        # FSDP2 reshards every unit after its backward, the root and shard-grad-op's blocks
        # too (reshard_after_backward): no gathered weights are left at the optimizer step
        step_freed = ms.unsharded_weights + root_gathered if lay.is_fsdp else 0
        end_grad_params = None     # (dense, expert) parameters whose sharded gradients exist at backward-end
        if lay.is_fsdp and n_act_layers:
            # FSDP2's moment is inside one block's backward (fsdp_blocks_done): the blocks done
            # have freed their activations, and only they have reduced (sharded) gradients
            done = fsdp_blocks_done(lay, n_act_layers)
            end_acts = acts - done * layer_act + working + end_a + head_grad
            if not persistent_grads and ft.is_full and off.gradients:
                block_dense, block_expert = (rp.dense - rp.root_unit) // n_layers, rp.expert // n_layers
                end_grad_params = (done * block_dense, done * block_expert)
                end_grads = model_state_bytes(*end_grad_params, state_prec, opt_pp, lay,
                                              hybrid, expert_padding=pad).gradients
        # phase: (extra weights, gradients, activations, logits, buffers, optimizer transient)
        phases = {
            "backward-start": (0, g_held, acts, logits, buffers, 0),
            "block-backward": (0, g_held, acts + working + head_grad, 0, buffers, 0),
            "backward-end": (end_w, end_grads, end_acts, 0, max(buffers, end_b), 0),
            "optimizer-step": (-step_freed, off.gradients, 0, 0, 0, step_transient),
        }
        if lay.is_fsdp and n_act_layers:
            fwd_w, fwd_b = fsdp_forward_bytes(lay, rp, prec, split)
            phases["forward-end"] = (fwd_w, g_held, acts - layer_act, 0, max(buffers, fwd_b), 0)
        phase = max(phases, key=lambda k: sum(phases[k]))
        w_extra, grads, act_at, logits_at, buf_at, transient = phases[phase]
        weights += w_extra
        tracked = weights + grads + off.optimizer + transient + act_at + logits_at + buf_at
        fixed, fragmentation = setup.overheads.fixed_bytes(distributed), int(tracked * setup.overheads.fragmentation)
        overhead = fixed + fragmentation
        bd = MemoryBreakdown(weights=weights, gradients=grads, optimizer=off.optimizer + transient,
                             activations=act_at, logits=logits_at, buffers=buf_at, overhead=overhead)
        if best is None or bd.total > best.total:
            best = RankMemory(breakdown=bd, stage=stage, phase=phase, n_layers_on_stage=n_layers,
                              in_flight=held, kernels=kernels, host_bytes=off.host_bytes,
                              nvme_bytes=off.nvme_bytes, ranks_per_node=ranks_per_node)
            if trace is not None:
                trace.clear()
                trace.update(
                    stage=stage, phase=phase, phases=phases, rank_params=rp, split=split, states=ms,
                    offload=off, root_gathered=root_gathered, held=held, n_act_layers=n_act_layers,
                    layer_act=layer_act, full_layer=full_layer, block_acts=block_acts, embed_acts=embed_acts,
                    dropout_embed=dropout_embed, amp_copies=amp_copies, working=working, score_grad=score_grad,
                    last_block=last_block, fsdp_end=(end_w, end_a, end_b), step_transient=step_transient,
                    end_acts=end_acts, end_grads=end_grads, end_grad_params=end_grad_params, grad_unit=grad_unit,
                    head_grad=head_grad, step_freed=step_freed,
                    fsdp_done=fsdp_blocks_done(lay, n_act_layers) if lay.is_fsdp and n_act_layers else 0,
                    fsdp_forward=(fsdp_forward_bytes(lay, rp, prec, split) if lay.is_fsdp and n_act_layers
                                  else (0, 0)),
                    persistent_grads=persistent_grads, logits=logits, buffers=buffers, tracked=tracked,
                    fixed_overhead=fixed, fragmentation=fragmentation, distributed=distributed,
                    kernels=kernels, act_setup=act_setup, state_precision=state_prec,
                    optimizer_bytes_per_param=opt_pp, amp_states=amp_states, hybrid=hybrid,
                    expert_padding=pad)
    assert best is not None
    return best


def fsdp_expert_padding(m: ModelSpec, lay: Layout, hybrid: int | None) -> float:
    """How much larger FSDP2's expert shards and gathers are than an even split.

    FSDP2 shards every parameter on dim 0 and pads it to a multiple of the shard degree
    D (PyTorch FSDP2 docs, fully_shard: "dim-0 per-parameter sharding"). transformers
    stores an MoE layer's experts as one (E, ...) tensor, so with D > E each rank holds
    ceil(E/D) whole experts and an all-gather returns D x ceil(E/D) of them: a factor
    D ceil(E/D) / E. Measured with FSDPMemTracker on Mixtral-8x7B (E = 8) at D = 64:
    sharded fp32 parameters 22.6 GB per rank, one eighth of the model, not 1/64. The
    padding is in FSDP2's own buffers (shards, all-gather outputs and the unsharded
    parameters' storage, which views them, and reduce-scatter inputs); the gradients
    autograd makes have the parameters' shapes, E experts (fsdp_backward_end_bytes).
    """
    if not (lay.is_fsdp and m.is_moe and lay.ep == 1):
        return 1.0
    d = hybrid or lay.expert_shard_degree
    e = m.n_experts
    return d * ceil_div(e, d) / e


def fsdp_blocks_done(lay: Layout, n_blocks: int) -> int:
    """Blocks whose backward is over at FSDP2's backward peak (the "backward-end" moment).

    PyTorch FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, post_backward)
    reshards a block as soon as its backward is over (reshard_after_backward defaults to
    True, whatever reshard_after_forward is), then copies its gradients into a
    reduce-scatter input that stays allocated until the next block's post-backward
    (reduce_scatter_max_input_buffers = 1). So the peak is inside the backward of the
    block after the first one that is reduced:

    - full shard (ZeRO-3): the second-to-last block in backward (block 1), with block 0
      prefetched and every later block reduced: n_blocks - 2 done. Block 0 has nothing
      to prefetch, and each block done adds only its sharded gradients;
    - shard-grad-op (ZeRO-2): the second block in backward (block n - 2): 1 done. Every
      block done frees its gathered 16-bit weights (2 bytes per parameter, or 4 in fp32)
      and adds sharded gradients of 4/dp bytes or less, so the total only falls after.

    Measured with FSDPMemTracker on Mixtral-8x7B (bf16-mixed): full shard on 64 ranks peaks
    in block 1's experts' backward with 30 of 32 blocks' sharded gradients; shard-grad-op
    on 8 ranks in block 30's with one block's gradients and one block's gathered weights
    freed.
    """
    if lay.zero_stage == 3:
        return max(0, n_blocks - 2)
    return 1 if n_blocks >= 2 else 0


def fsdp_backward_end_bytes(lay: Layout, rp: RankParams, prec: Precision,
                            split: RankSplit | None = None, grad_unit: int | None = None) -> tuple[int, int, int]:
    """FSDP2 at its backward peak (fsdp_blocks_done): (weights, activations, buffers) beyond
    the states.

    Full shard: the block in backward is gathered (weights, 16-bit), the next one is
    prefetched (all-gather buffer). Shard-grad-op: one block (the first in backward) is
    resharded already (weights below the states: negative), nothing is prefetched. Both:
    the block's full 16-bit gradients exist before its reduce-scatter (a working set,
    counted with activations), and the previous block's reduce-scatter input is held, in
    fp32 under mixed precision (PyTorch FSDP2 MixedPrecisionPolicy, reduce_dtype).

    Gathered, prefetched and reduce-scatter buffers are FSDP2's padded flat buffers (``rp``
    with the expert padding, see fsdp_expert_padding); the gradients autograd makes have
    the parameters' own shapes, ``grad_unit`` parameters (the block unpadded; default
    ``rp.block_unit``). Measured with FSDPMemTracker on Mixtral-8x7B (64 ranks, each
    holding one of the 8 experts: padding 8): 21.1 GiB gathered, 21.1 GiB prefetched,
    42.2 GiB reduce-scatter input, but 2.7 GiB of block gradients (1.45B parameters in
    bf16), where counting them padded gave 21.1 GiB and a total 11.5% too high.
    With a frozen base the gathered block holds its stored (maybe quantized) weights and
    only the trainable parameters have gradients.
    """
    if not lay.is_fsdp:
        return 0, 0, 0
    unit = rp.block_unit
    grads = rp.block_unit if grad_unit is None else grad_unit
    wb = prec.weight_bytes
    reduce_bytes = 4 if prec.is_mixed else prec.grad_bytes
    block_bytes = unit * wb
    if split is not None and split.frozen_bytes:
        block_bytes = split.block_frozen_bytes + split.block_trainable * wb
        unit = grads = split.block_trainable
    gathered = block_bytes if lay.zero_stage == 3 else -block_bytes   # grad-op: resharded after its backward
    prefetch = block_bytes if lay.zero_stage == 3 else 0
    return gathered, grads * wb, prefetch + unit * reduce_bytes


def fsdp_forward_bytes(lay: Layout, rp: RankParams, prec: Precision,
                       split: RankSplit | None = None) -> tuple[int, int]:
    """FSDP2 in forward, at the last block's all-gather: (weights, buffers) beyond the states.

    In forward FSDP2 keeps a block's all-gather output until the next block's all-gather
    has been copied out (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py,
    wait_for_unshard, all_gather_state: it lets the copy-out overlap the next all-gather),
    so two padded all-gather buffers exist at once. Under full shard the block before is
    gathered too (weights); under shard-grad-op every block gathered so far stays
    gathered, which the states already count. Measured with FSDPMemTracker on
    Mixtral-8x7B, 64 ranks, shard-grad-op, micro-batch 2: the peak is in the last block's
    forward, with two 21.1 GiB all-gather buffers beside every gathered block.
    """
    if not lay.is_fsdp:
        return 0, 0
    block_bytes = rp.block_unit * prec.weight_bytes
    if split is not None and split.frozen_bytes:
        block_bytes = split.block_frozen_bytes + split.block_trainable * prec.weight_bytes
    return (block_bytes if lay.zero_stage == 3 else 0), 2 * block_bytes


def eager_score_gradient_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Extra bytes while eager attention's backward runs: the fp32 gradients of the
    softmax output and of the scores, 8 bytes per score element, less the scores the
    block keeps (or recomputes), which backward frees as it goes (measured with MemTracker on a
    Llama model: 8.4 bytes per element of
    temporaries at the peak)."""
    if setup.attention != "eager":
        return 0
    a = setup.precision_spec.activation_bytes
    kept = (4 + (a if a < 4 else 0)) if kernels != "fused" else a
    elems = lay.micro_batch * (lay.seq_len // lay.cp) * lay.seq_len * m.n_heads
    return ceil_div(elems * max(0, 8 - kept), lay.tp)


def optimizer_step_transient_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout,
                                   rp: RankParams, hybrid: int | None, split: RankSplit | None = None) -> int:
    """Temporaries inside optimizer.step(), beside the states.

    Only PyTorch's own optimizers (under FSDP or DDP) count here. PyTorch's multi-tensor
    ("foreach", the default on CUDA) Adam/AdamW builds the
    square root of the second moments for every local parameter at once: one fp32 copy
    of the local parameters (torch/optim/adamw.py, _multi_tensor_adamw: _foreach_sqrt).
    The single-tensor path needs two fp32 temporaries of the largest local tensor (the
    word embedding or LM head): measured 4.2e9 B on Llama-3-8B (2 x 525M x 4 B) with
    MemTracker. SGD and Adafactor are counted like the single-tensor path. Only
    trainable parameters (``split``) take part in the step. bitsandbytes' paged 8-bit
    AdamW (QLoRA) updates its blocks in place with fused kernels: no temporaries counted.
    """
    if setup.finetune.paged_8bit_optimizer:
        return 0     # bitsandbytes' 8-bit step updates each block of states in place
    if not (lay.is_fsdp or resolve_kernels(setup, lay) == "amp"):
        # DeepSpeed and Megatron-LM step with fused multi-tensor kernels that work in
        # small chunks (DeepSpeed/apex FusedAdam, multi_tensor_applier): no full copy
        return 0
    sharded = lay.zero_stage >= 1
    d = (hybrid or lay.dense_shard_degree) if sharded else 1
    n = rp.total if split is None else split.trainable
    if setup.optimizer_foreach and setup.optimizer in ("adamw", "adam8bit"):
        return 4 * ceil_div(n, d)
    largest = _largest_tensor(m, lay) if split is None else split.largest_trainable
    return 2 * 4 * ceil_div(largest, d)


def _largest_tensor(m: ModelSpec, lay: Layout) -> int:
    """Elements of the largest local tensor: the word embedding (or LM head) or an MLP matrix."""
    return max(ceil_div(m.vocab_size * m.d_model, lay.tp), ceil_div(m.d_ff * m.d_model, lay.tp))


def _sharded_frozen_bytes(split: RankSplit, lay: Layout, hybrid: int | None) -> int:
    """The frozen base's weights on one rank: sharded over the data ranks under ZeRO-3 and
    FSDP (as the trainable weights are; FSDP shard-grad-op also keeps the gathered weights
    from forward to backward), replicated otherwise."""
    if lay.zero_stage < 3 and not lay.is_fsdp:
        return split.frozen_bytes
    d_dense = hybrid or lay.dense_shard_degree
    d_expert = max(1, lay.expert_shard_degree if hybrid is None else min(lay.expert_shard_degree, hybrid))
    sharded = ceil_div(split.frozen_dense_bytes, d_dense) + ceil_div(split.frozen_expert_bytes, d_expert)
    if lay.sharding == "fsdp-grad-op":
        sharded += split.frozen_bytes     # FSDP shards, and keeps the gathered copy through backward
    return sharded


# ------------------------------------------------------------------------ offload

# DeepSpeed's NVMe offload defaults (DeepSpeed configuration docs, "Parameter offloading"
# and "Optimizer offloading"; deepspeed/runtime/zero/offload_config.py): parameters swap
# through buffer_count = 5 pinned buffers of buffer_size = 1e8 elements; optimizer states
# through buffer_count = 4 pinned fp32 buffers, each one sub-group (sub_group_size = 1e9
# elements, zero_optimization) or the rank's partition when smaller.
NVME_PARAM_BUFFERS = 5
NVME_PARAM_BUFFER_NUMEL = 100_000_000
NVME_OPTIMIZER_BUFFERS = 4
ZERO_SUB_GROUP_NUMEL = 1_000_000_000


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadSplit:
    """Model states left on the GPU, and what went to CPU memory and NVMe (bytes, per rank)."""

    weights: int
    gradients: int
    optimizer: int
    host_bytes: int
    nvme_bytes: int
    step_on_host: bool      # the optimizer step runs on the CPU: no GPU temporaries


def offload_bytes(setup: TrainingSetup, lay: Layout, ms: ModelStates, frozen_weight_bytes: int,
                  split: RankSplit, prec: Precision, hybrid: int | None) -> OffloadSplit:
    """Where the model states of one rank live under ``setup.offload_*``.

    ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, Sec. 4.1): the optimizer partition
    (fp32 master weights and Adam's moments) lives in CPU memory and CPU Adam updates it; the
    reduced gradients go to the CPU as fp32 (4 B per parameter of the partition). Under
    ZeRO-2 and ZeRO-3 the GPU keeps only the reduce buckets; under ZeRO-1 it still
    accumulates the 16-bit gradients. ZeRO-Infinity (Rajbhandari et al. 2021,
    arXiv:2104.07857, Sec. 5): with ZeRO-3 the 16-bit parameter shards move too, to CPU
    memory or NVMe, and the GPU holds only the gathered working set (the buffers); NVMe
    offload keeps pinned CPU buffers (NVME_* above). FSDP2's CPUOffloadPolicy: sharded
    parameters, sharded gradients and the optimizer states all live in CPU memory and the
    optimizer step runs there (PyTorch FSDP2 docs, fully_shard(offload_policy=...)).
    """
    weights = ms.weights + frozen_weight_bytes
    grads, opt = ms.gradients, ms.optimizer
    host = nvme = 0
    step_on_host = False
    if lay.is_fsdp:
        if setup.offload_params == "cpu":
            host, weights, grads, opt, step_on_host = weights + grads + opt, 0, 0, 0, True
        return OffloadSplit(weights=weights, gradients=grads, optimizer=opt, host_bytes=host,
                            nvme_bytes=0, step_on_host=step_on_host)
    d = (hybrid or lay.dense_shard_degree) if lay.zero_stage >= 1 else 1
    if setup.offload_optimizer != "none":
        partition = ceil_div(split.trainable, d)
        host += 4 * partition                     # CPU Adam's fp32 gradient partition
        if setup.offload_optimizer == "cpu":
            host += opt
        else:
            nvme += opt
            host += NVME_OPTIMIZER_BUFFERS * min(ZERO_SUB_GROUP_NUMEL, partition) * 4
        if lay.zero_stage >= 2:
            grads = 0
        opt, step_on_host = 0, True
    if setup.offload_params != "none":
        if setup.offload_params == "cpu":
            host += weights
        else:
            nvme += weights
            host += NVME_PARAM_BUFFERS * NVME_PARAM_BUFFER_NUMEL * prec.weight_bytes
        weights = 0
    return OffloadSplit(weights=weights, gradients=grads, optimizer=opt, host_bytes=host,
                        nvme_bytes=nvme, step_on_host=step_on_host)


def _stages_to_check(counts: list[int]) -> list[int]:
    """The stages that can be the most loaded: the first, the last, and the earliest
    middle stage of each layer count (later ones hold fewer in-flight micro-batches)."""
    last = len(counts) - 1
    picked = {0, last}
    seen: set[int] = set()
    for i in range(1, last):
        if counts[i] not in seen:
            seen.add(counts[i])
            picked.add(i)
    return sorted(picked)


def _activation_key(lay: Layout, sharded_dtype: bool = False) -> Layout:
    """The fields of a layout that block activations depend on (a cache key). With
    ``sharded_dtype`` (LoRA: whether the engine casts the adapters to 16 bits) also the
    sharding (planner.memory.model.lora_cast_bytes)."""
    if sharded_dtype:
        return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, micro_batch=lay.micro_batch, seq_len=lay.seq_len,
                      recompute=lay.recompute, zero_stage=lay.zero_stage, sharding=lay.sharding)
    return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, micro_batch=lay.micro_batch,
                  seq_len=lay.seq_len, recompute=lay.recompute)


@lru_cache(maxsize=4096)
def _block_activations(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str) -> tuple[int, int]:
    """(bytes a block keeps under the layout's recomputation, bytes without recomputation)."""
    kept = layer_activation_bytes(m, setup, key, kernels)
    full = kept if key.recompute == "none" else layer_activation_bytes(
        m, setup, replace(key, recompute="none"), kernels)
    return kept, full


@lru_cache(maxsize=256)
def _optimizer_bytes_per_param(m: ModelSpec, optimizer: str) -> float:
    if optimizer == "adafactor":
        return adafactor_bytes_per_param(m)
    return optimizer_state_bytes_per_param(optimizer)


def min_model_state_bytes_per_param(setup: TrainingSetup) -> float:
    """The fewest bytes per parameter that weights, gradients and optimizer states take
    summed over all ranks, under any sharding: each state exists at least once. What is
    offloaded leaves the GPUs; a frozen base (LoRA, QLoRA, freeze) keeps only its weights,
    quantized or in 16 bits, a lower bound that ignores the adapters."""
    p = setup.precision_spec
    if setup.offload_params != "none":
        return 0.0
    ft = setup.finetune
    if not ft.is_full:
        return {"nf4": 0.5, "int4": 0.5, "int8": 1.0}.get(ft.quant, float(p.weight_bytes))
    opt = optimizer_state_bytes_per_param(setup.optimizer) if setup.optimizer != "adafactor" else 0.0
    if setup.optimizer_state_bytes is not None:
        opt = setup.optimizer_state_bytes
    if setup.offload_optimizer != "none":
        return float(p.weight_bytes)
    zero = p.weight_bytes + p.grad_bytes + p.master_bytes + opt
    fsdp = (8 if p.is_mixed else p.weight_bytes + p.grad_bytes) + opt
    return min(zero, fsdp)


def _hybrid_degree(lay: Layout, gpus_per_node: int) -> int | None:
    """FSDP hybrid shards over the data ranks inside one node (HSDP) and replicates
    across nodes: the shard group is the largest divisor of dp*cp*ep that fits in
    gpus_per_node // tp (PyTorch FSDP HYBRID_SHARD docs)."""
    if lay.sharding != "fsdp-hybrid":
        return None
    inside = max(1, gpus_per_node // lay.tp)
    d = lay.dense_shard_degree
    while d > inside or lay.dense_shard_degree % d:
        d -= 1
    return max(d, 1)


def activation_floor_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """A lower bound on per_rank_memory(m, setup, lay).total whatever the sharding: at the
    start of backward a stage holds its blocks' activations for every in-flight
    micro-batch, and the overhead adds the fixed costs and fragmentation on at least those
    bytes. A search can drop a layout shape whose floor exceeds the GPU without sizing it."""
    return overhead_floor_bytes(setup, lay, held_activation_floor_bytes(m, setup, lay))


def overhead_floor_bytes(setup: TrainingSetup, lay: Layout, tracked_bytes: int) -> int:
    """The total per_rank_memory() reports when the tracked tensors come to at least
    ``tracked_bytes``: fixed costs plus fragmentation on top."""
    fixed = setup.overheads.fixed_bytes(lay.n_gpus > 1)
    return fixed + tracked_bytes + int(tracked_bytes * setup.overheads.fragmentation)


def held_activation_floor_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """The block activations the most loaded stage holds at the start of backward (the
    largest over the stages per_rank_memory checks), a part of its tracked bytes then."""
    ft = setup.finetune
    kernels = resolve_kernels(setup, lay)
    if kernels == "amp" and not ft.is_full:
        kernels = "eager"
    layer_act, _ = _block_activations(m, setup, _activation_key(lay), kernels)
    return max(int(n_act * layer_act * in_flight_microbatches(lay, s))
               for s, n_act in _activation_stages(m.n_layers, lay.pp, ft))


@lru_cache(maxsize=1024)
def _activation_stages(n_layers: int, pp: int, ft: FinetuneSpec) -> tuple[tuple[int, int], ...]:
    """(stage, blocks that keep activations) of the stages per_rank_memory checks."""
    counts = stage_layers(n_layers, pp)
    return tuple((s, activation_layers(ft, n_layers, sum(counts[:s]), counts[s])) for s in _stages_to_check(counts))


@dataclass(frozen=True, kw_only=True, slots=True)
class StateFloor:
    """Lower bounds on the model states a rank of a layout holds, read from its degrees and
    sharding alone (bytes): at the optimizer step (weights, gradients and optimizer states
    of the most loaded stage), and at the start of backward on whichever stage peaks there
    (weights and optimizer states; the gradients, held then when they persist)."""

    at_step: int
    weights_and_optimizer: int = 0
    gradients: int = 0
    fsdp: bool = False           # the sharding is FSDP's (gradients persist under DDP/ZeRO only)

    def tracked_floor_bytes(self, lay: Layout, held_activations: int) -> int:
        """Tracked bytes at the peak of a layout with ``lay``'s degrees, micro-batches and this
        floor's sharding (``lay``'s own sharding is not read) are at least this."""
        persistent = lay.grad_accum > 1 or lay.pp > 1 or (not self.fsdp and lay.dense_shard_degree > 1)
        start = held_activations + self.weights_and_optimizer + (self.gradients if persistent else 0)
        return max(self.at_step, start)


def model_state_floor(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount | None = None,
                      gpus_per_node: int = 8) -> StateFloor:
    """StateFloor of ``lay``. For full training without offload or autocast the states are
    model_state_bytes() of each stage's parameters, as per_rank_memory counts them;
    otherwise each state exists at least once over the ranks that share the rank's
    parameters (min_model_state_bytes_per_param), which bounds the optimizer step only."""
    pc = pc or count_params(m)
    plain = (setup.finetune.is_full and setup.offload_optimizer == "none" and setup.offload_params == "none"
             and resolve_kernels(setup, lay) != "amp")
    hybrid = _hybrid_degree(lay, gpus_per_node)
    opt_pp = (setup.optimizer_state_bytes if setup.optimizer_state_bytes is not None
              else _optimizer_bytes_per_param(m, setup.optimizer))
    per_param = min_model_state_bytes_per_param(setup)
    counts = stage_layers(m.n_layers, lay.pp)
    at_step, w_o, grads = 0, [], []
    for stage in _stages_to_check(counts):
        rp = rank_params(m, pc, lay, stage, counts[stage])
        if plain:
            ms = model_state_bytes(rp.dense, rp.expert, setup.precision_spec, opt_pp, lay, hybrid,
                                   expert_padding=fsdp_expert_padding(m, lay, hybrid))
            at_step = max(at_step, ms.total)
            w_o.append(ms.weights + ms.unsharded_weights + ms.optimizer)
            grads.append(ms.gradients)
        else:
            at_step = max(at_step, int(rp.dense * per_param / lay.dense_shard_degree
                                       + rp.expert * per_param / lay.expert_shard_degree))
    return StateFloor(at_step=at_step, weights_and_optimizer=min(w_o, default=0), gradients=min(grads, default=0),
                      fsdp=lay.is_fsdp)


def memory_floor_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount | None = None,
                       gpus_per_node: int = 8) -> int:
    """A lower bound on per_rank_memory(m, setup, lay, pc, gpus_per_node).total from the
    model states (model_state_floor) and the held activations, without the phases,
    buffers, logits and temporaries."""
    floor = model_state_floor(m, setup, lay, pc, gpus_per_node)
    return overhead_floor_bytes(setup, lay, floor.tracked_floor_bytes(lay, held_activation_floor_bytes(m, setup, lay)))
