"""What one transformer block keeps for backward, per micro-batch, on one rank (per shape:
the batched model computes it once per distinct block shape and kernels)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from planner.layouts.layout import Layout
from planner.models.dsa import indexer_working_bytes_per_token
from planner.models.kimi import kda_torch_backward_working_bytes
from planner.models.spec import ModelSpec
from planner.training.finetune import lora_activation_terms
from planner.training.kernels import replicated_ranks
from planner.training.setup import TrainingSetup
from planner.units import ceil_div

# the name every term of a block's routed tokens starts with: memory.moe and memory.hybrid tell the
# expert side and the latent width by it
PERMUTED_TOKENS = "tokens permuted"


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationTerm:
    """One saved tensor of a transformer block, per micro-batch, on one rank.

    ``selective``: True when selective recomputation drops it (the attention scores,
    Korthikanti et al. 2022 Sec. 4.2; under torchtitan every tensor its SelectiveAC policy
    recomputes). ``selective_only``: saved only under selective recomputation (torchtitan's
    policy saves matmul and reduce-scatter outputs that a block without it does not keep).
    """

    name: str
    bytes: int
    selective: bool = False
    selective_only: bool = False

    def kept(self, recompute: str) -> bool:
        """Whether the block keeps this tensor under ``recompute`` (none or selective)."""
        return (not self.selective) if recompute == "selective" else not self.selective_only


def generic_block_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> list[ActivationTerm]:
    """What a generic model's mean block keeps, measured (planner.models.generic.probe): the
    storages autograd saves in one forward of transformers' model under fake tensors, in
    bf16 with eager attention, read at two sequence lengths and split into a per-token part
    and a part growing with the sequence (the materialised s x s scores). Scaled by the
    activation bytes over bf16's 2. Under flash attention (any ``setup.attention`` but
    eager) the scores are not kept (Dao et al. 2022), so the growing part is left out; the
    per-token part already holds Q, K, V and the attention output. No tensor or context
    parallelism on this path (rules: generic-layouts)."""
    assert m.profile is not None
    tokens = lay.micro_batch * lay.seq_len
    scale = setup.precision_spec.activation_bytes / 2
    terms = [ActivationTerm(name="saved tensors of the mean block, measured on transformers' model",
                            bytes=int(tokens * m.profile.mean_block("saved_bytes_per_token") * scale))]
    per_seq = m.profile.mean_block("saved_bytes_per_token_per_seq")
    if setup.attention == "eager" and per_seq > 0:
        terms.append(ActivationTerm(name="saved tensors growing with the sequence (attention scores), measured",
                                    bytes=int(tokens * lay.seq_len * per_seq * scale), selective=True))
    return terms


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
    keeps both the fp32 input and the normalised 16-bit output). torchtitan's Llama 3 block
    (``kernels == "torchtitan"``) is titan_block_terms.
    """
    if m.profile is not None:
        return generic_block_terms(m, setup, lay)
    if m.layer_pattern:     # a hybrid's mean layer, each letter's own tensors (memory.hybrid)
        from planner.memory.hybrid import hybrid_block_terms

        return hybrid_block_terms(m, setup, lay, "eager" if kernels == "torchtitan" else kernels,
                                  layer_activation_terms)
    if kernels == "torchtitan":
        return titan_block_terms(m, setup, lay)
    b, s = lay.micro_batch, lay.seq_len_per_rank
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
        add(f"{PERMUTED_TOKENS} to their experts", k * h * a, sp_div)
        add("router probabilities (fp32)", m.n_experts * 4, 1)
    if m.hidden_dropout > 0:
        add("dropout mask after the MLP", h * 1, sp_div)
    if setup.finetune.is_lora:
        for t in lora_activation_terms(m, setup.finetune, a, lora_cast_bytes(setup, lay, kernels)):
            add(t.name, t.bytes_per_token, tp)
    return terms


def titan_block_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> list[ActivationTerm]:
    """What one block of torchtitan 0.3.0's Llama 3 keeps for backward, per micro-batch, on one rank.

    The block (torchtitan/models/common/decoder.py, attention.py, feed_forward.py; built by
    torchtitan/models/llama3/__init__.py ``_build_llama3_layers`` with ``fuse_qkv=True``):
    x + wo(SDPA(rope(wqkv(attention_norm(x))))), then h + w2(silu(w1(n)) * w3(n)) with
    n = ffn_norm(h); the norms are torch.nn.RMSNorm (models/common/nn_modules.py), whose
    composite kernel keeps an fp32 copy of its input, the fp32 normalised tensor and an fp32
    rstd per token. Without recomputation: both norms' fp32 tensors, the norm outputs that
    feed wqkv and w1/w3 (all-gathered to the full sequence under sequence parallelism), Q, K
    and V after RoPE, the attention output and its fp32 log-sum-exp per head, the MLP's w1,
    silu, w3 and product outputs.

    ``selective``: SelectiveAC's per-op policy (torchtitan/distributed/activation_checkpoint.py,
    0.3.0): the outputs of the save ops (compute-intensive aten ops incl. mm and the attention
    ops, reduce_scatter_tensor) are kept, except every second mm of the block, and every other
    op is recomputed. The block's mms run wqkv (1st, kept), wo (2nd, recomputed), w1 (3rd,
    kept), w3 (4th, recomputed), w2 (5th, kept): it keeps the wqkv output, the attention output
    and log-sum-exp, w1's output, w2's output (the partial sums before the reduce-scatter under
    tp), the reduce-scatter outputs after wo and w2 (tp > 1), and the block's input.
    ``compile`` (per-block torch.compile, torchtitan's compile.components): the partitioner
    (torch/_functorch/partitioners.py, min_cut_rematerialization_partition) recomputes the
    pointwise ops: no fp32 norm copies (the block's input and two fp32 rstd instead), silu's
    output recomputed, a copy of the attention output for wo. Measured with saved-tensor hooks
    on torchtitan's block compiled by inductor on the CPU (torch 2.13, h 256, f 768, 4 heads,
    2 KV heads): 8,280 B per token, as modelled (tests/test_memory_stacks.py). Under SelectiveAC
    compiled the same way (the checkpoint-wrapped block, torch.compile'd as torchtitan's
    apply_compile does) the policy is honoured (no PREFER_RECOMPUTE output is kept), but the
    partitioner saves only what the backward graph reads: w2's output and, by the same rule at
    tp > 1 (modelled, not measured), the reduce-scatter outputs, MUST_SAVE outputs no backward
    op reads, are not kept, while the RoPE table rows are: measured 3,664 B per token (the
    block input, wqkv's output, the attention output and log-sum-exp, w1's output, the RoPE
    rows) against eager SelectiveAC's 4,112 (tests/test_memory_stacks.py).
    Checked against torchtitan's own block under PyTorch's MemTracker on CPU (tests/
    test_memory_stacks.py and docs/accuracy-torchtitan.md).
    """
    tokens = lay.tokens_per_rank
    a = setup.precision_spec.activation_bytes
    h, q, kv, f, nh = m.d_model, m.q_dim, m.kv_dim, m.d_ff, m.n_heads
    # torchtitan's tensor parallelism is always sequence-parallel too (models/llama3/sharding.py:
    # SequenceParallel on the norms, the blocks' inputs and outputs split over the sequence)
    tp = sp_div = lay.tp
    terms: list[ActivationTerm] = []

    def add(name: str, per_token: float, divisor: int, selective: bool = False, selective_only: bool = False) -> None:
        terms.append(ActivationTerm(name=name, bytes=ceil_div(int(tokens * per_token), divisor),
                                    selective=selective, selective_only=selective_only))

    rope = a * (m.head_dim // 2)      # the RoPE table's rows for the block's positions
    if setup.compile:
        add("block input and the norms' fp32 rstd (compiled)", a * h + 8, sp_div, selective=True)
        add("RoPE table rows (kept under SelectiveAC too, compiled)", rope, 1)
        add("norm outputs (wqkv and w1/w3 inputs, the full sequence under sp)", 2 * a * h, 1, selective=True)
        add("Q, K, V after RoPE (SDPA inputs)", a * (q + 2 * kv), tp, selective=True)
        add("wo input (a copy of the attention output, compiled)", a * q, tp, selective=True)
    else:
        add("norms' fp32 input copies, fp32 normalised tensors and rstd", 2 * (8 * h + 4), sp_div, selective=True)
        add("RoPE table rows", rope, 1, selective=True)
        add("norm outputs (wqkv and w1/w3 inputs, the full sequence under sp)", 2 * a * h, 1, selective=True)
        add("Q, K, V after RoPE (SDPA inputs)", a * (q + 2 * kv), tp, selective=True)
    add("wqkv output (saved by SelectiveAC)", a * (q + 2 * kv), tp, selective_only=True)
    add("attention output and fp32 log-sum-exp per head", a * q + 4 * nh, tp)
    if setup.compile:
        add("MLP w1, w3 and product outputs (compiled)", 3 * a * f, tp, selective=True)
    else:
        add("MLP w1, silu, w3 and product outputs", 4 * a * f, tp, selective=True)
    add("w1 output (saved by SelectiveAC)", a * f, tp, selective_only=True)
    if not setup.compile:
        # MUST_SAVE outputs that backward never reads: eager SAC stores them anyway; the compiled
        # partitioner saves only what the backward graph reads (measured at tp 1, see above)
        add("w2 output (partial sums before the reduce-scatter; saved by SelectiveAC)", a * h,
            1 if tp > 1 else sp_div, selective_only=True)
        if tp > 1:
            add("reduce-scatter outputs after wo and w2 (saved by SelectiveAC)", 2 * a * h, tp, selective_only=True)
    # the block's input, which the checkpoint wrapper keeps (the previous block's output;
    # without recomputation no op of the block saves it: the norm keeps its fp32 copy)
    add("block input (kept by the checkpoint wrapper)", a * h, sp_div, selective_only=True)
    return terms


def adapters_in_16_bits(setup: TrainingSetup, zero_stage: Any, fsdp: Any) -> Any:
    """Where the adapters compute in 16 bits whatever the kernels (lora_cast_bytes: no cast copy):
    QLoRA's 16-bit adapters, and the engines that run the whole model in 16 bits, DeepSpeed ZeRO >= 1
    and FSDP's mixed precision. The only fields of a layout a LoRA block's saved tensors read beyond
    its shape (memory.shapes sizes a LoRA shape once for the ZeRO stages and shardings that agree
    here). Scalars or arrays (numpy bools)."""
    return np.logical_not(replicated_ranks(zero_stage, fsdp)) | setup.finetune.has_16_bit_adapters


def lora_cast_bytes(setup: TrainingSetup, lay: Layout, kernels: str) -> int | None:
    """Bytes per element of the copy of its input each adapted layer keeps, or None when
    the adapters compute in the activations' dtype and layers reading one tensor share it.

    PEFT keeps adapters in fp32 (LoraConfig's autocast_adapter_dtype) and casts each
    layer's input to them (peft/tuners/tuners_utils.py, _cast_input_dtype): under autocast
    (replicated mixed precision) the matmul then keeps a 16-bit copy, in pure 16-bit
    training an fp32 copy. DeepSpeed ZeRO >= 1, FSDP's mixed precision and Megatron run the
    whole model in 16 bits, QLoRA's adapters are 16-bit, and fp32 needs no cast: no copy.
    """
    p = setup.precision_spec
    if adapters_in_16_bits(setup, lay.zero_stage, lay.is_fsdp) or kernels == "fused":
        return None
    if p.activation_bytes == 4:
        return None
    return 2 if p.is_mixed else 4


# Activations written as several PyTorch ops save intermediates a fused kernel would
# not. transformers' NewGELUActivation ("gelu_new", GPT-2) computes
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): beyond its input, autograd keeps the
# tanh output, 0.5 x and (1 + tanh), three d_ff-wide tensors.
PYTHON_ACTIVATION_SAVES = {"gelu_new": 3}


# RMSNorms that multiply by their weight in fp32 and cast the product back (transformers 5.x
# NemotronHRMSNorm: ``(self.weight.to(torch.float32) * hidden_states).to(input_dtype)``), so
# the normalised tensor the weight's gradient reads is kept in fp32
FP32_NORM_WEIGHT_TYPES = ("nemotron_h",)


def norm_saved_bytes(m: ModelSpec, a: int, kernels: str, frozen: bool = False) -> int:
    """Bytes per element a norm keeps: its input (fused kernels, LayerNorm), or for
    Hugging Face's RMSNorm the fp32 upcast of its input and the normalised tensor.
    Under autocast ("amp") the residual stream is fp32 (measured with MemTracker on a
    Llama model: replicated bf16 autocast keeps 4 more bytes per element per norm).
    A frozen RMSNorm weight needs no gradient, so the normalised tensor is not kept. Nemotron-H's
    norm keeps it in fp32 (FP32_NORM_WEIGHT_TYPES)."""
    stream = 4 if kernels == "amp" else a
    if kernels == "fused":
        return a
    if m.norm == "rmsnorm":
        normalised = 4 if m.model_type in FP32_NORM_WEIGHT_TYPES else stream
        return 4 + (0 if frozen else normalised)
    return stream


def block_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> tuple[ActivationTerm, ...]:
    """layer_activation_terms, kept per distinct model, set-up, terms_key(lay) and kernels for the
    per-shape sizing: a block's bytes under each recomputation and the MoE deltas (memory.moe)
    read the same block's terms (issue 32: 53,393 calls in the 256-job `plan buy`)."""
    return _block_terms(m, setup, terms_key(lay), kernels)


@lru_cache(maxsize=16384)
def _block_terms(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str) -> tuple[ActivationTerm, ...]:
    return tuple(layer_activation_terms(m, setup, key, kernels))


def terms_key(lay: Layout) -> Layout:
    """The fields of ``lay`` that layer_activation_terms reads (tp, sp, cp, micro-batch, sequence,
    and for LoRA's cast copies the ZeRO stage and sharding: lora_cast_bytes; memory.hybrid's
    mean layer the same), recomputation left out: it picks which terms a block keeps
    (ActivationTerm.kept), not the terms."""
    return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, micro_batch=lay.micro_batch, seq_len=lay.seq_len,
                  zero_stage=lay.zero_stage, sharding=lay.sharding)


def layer_activation_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one block keeps for backward, per micro-batch, under ``lay.recompute``.

    selective drops the attention-score terms (Korthikanti et al. Sec. 4.2); full keeps
    only the block's input, split by tp under sequence parallelism (their Sec. 4.3:
    2sbh per layer, 2sbh/t with sp).
    """
    if lay.recompute == "full":
        a = setup.precision_spec.activation_bytes
        # torchtitan's tensor parallelism is always sequence-parallel (models/llama3/sharding.py,
        # 0.3.0: the blocks' inputs Shard(1)), so FullAC keeps the input's sequence shard
        split = lay.tp if lay.sp or setup.stack == "torchtitan" else 1
        if setup.stack == "deepspeed" and setup.ds_checkpointing != "none":
            # DeepSpeed's CheckpointFunction (deepspeed/runtime/activation_checkpointing/
            # checkpointing.py, 0.19.8): with CPU_CHECKPOINT the saved inputs are copied to the
            # host (`inputs = copy_to_device(..., "cpu")` or partition.cpu()); with
            # PARTITION_ACTIVATIONS each is split over the model-parallel group (mp_size = tp)
            if "cpu" in setup.ds_checkpointing:
                return 0
            split = lay.tp
        # one checkpointed input per layer module: a Qwen3-Next decoder layer holds two letters
        # of the mean block (ModelSpec.letters_per_block), so each letter keeps half an input
        return ceil_div(lay.tokens_per_rank * m.d_model * a, split * m.letters_per_block)
    return sum(t.bytes for t in block_terms(m, setup, lay, kernels) if t.kept(lay.recompute))


def eager_score_gradient_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Extra bytes while eager attention's backward runs: the fp32 gradients of the
    softmax output and of the scores, 8 bytes per score element, less the scores the
    block keeps (or recomputes), which backward frees as it goes (measured with MemTracker
    on a Llama model: 8.4 bytes per element of
    temporaries at the peak)."""
    if setup.attention != "eager":
        return 0
    a = setup.precision_spec.activation_bytes
    kept = (4 + (a if a < 4 else 0)) if kernels != "fused" else a
    elems = lay.tokens_per_rank * lay.seq_len * m.n_heads
    return ceil_div(elems * max(0, 8 - kept), lay.tp)


def titan_backward_working_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """What torchtitan 0.3.0's recomputed last block holds in its backward beyond its recomputed
    tensors, per micro-batch, on one rank, under tensor (+ sequence) parallelism: 0 at tp 1 and
    without recomputation (not measured there).

    Measured with FSDPMemTracker under fake tensors (bench/loss_peak_tensors.py --dump: a TorchDispatchMode
    naming each live storage's op; Llama 3.1 70B's width, 2 blocks, dp 2, tp 8, micro-batch 16 x 8192,
    the peak inside the last block's backward, torch 2.13.0). w2 is RowwiseParallel with a Shard(1)
    output (models/llama3/sharding.py), so its forward reduce-scatters partial sums along the sequence
    and its backward all-gathers the incoming gradient (DTensor redistribute Shard(1) -> Replicate,
    torch/distributed/tensor/_redistribute.py). The first backward op of the block is w2's, so its
    unpack starts the recomputation (torch.utils.checkpoint, non-reentrant) with the gathered gradient
    alive, and the replay runs to the block's end:

    - the all-gathered gradient of the block's output, b s h x a (``cat``, (b, s, h));
    - the reordering copy before the replayed reduce-scatter after w2 (``cat`` of the sequence chunks
      along dim 0, (tp b, s / tp, h): b s h x a), which SelectiveAC replays too (cat is not a save op);
    - under FullAC, w2's replayed output, the partial sums b s h x a (``mm``, (b s, h)); SelectiveAC
      saves it (titan_block_terms);
    - on the sequence shard, the incoming gradient and the replayed residual stream x + attention(x)
      (b s h x a / tp each).

    At that width: 3 x 2.0 + 2 x 0.25 GiB under FullAC, 2 x 2.0 + 2 x 0.25 under SelectiveAC, each
    tensor named by its op and shape in docs/published-memory.md. Under per-block torch.compile the same
    collectives are assumed (not measured: compiled steps do not run under fake tensors).
    """
    if lay.tp == 1 or lay.recompute == "none":
        return 0
    tokens = lay.tokens_per_rank
    full_sequence = tokens * m.d_model * setup.precision_spec.activation_bytes
    n_full = 3 if lay.recompute == "full" else 2
    return n_full * full_sequence + 2 * ceil_div(full_sequence, lay.tp)


def backward_working_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """The last block's backward working set beyond its recomputed tensors: eager attention's score
    gradients (eager_score_gradient_bytes) and, for torchtitan's block, its sequence-parallel
    gradient and reduce-scatter copies (titan_backward_working_bytes); under transformers' torch
    path a Kimi Delta Attention layer's decay gradients (kimi.kda_torch_backward_working_bytes)."""
    titan = titan_backward_working_bytes(m, setup, lay) if kernels == "torchtitan" else 0
    # Kimi Delta Attention's torch path (models.kimi); fla's kernels (fused) hold no such tensor
    kda = 0 if kernels == "fused" else ceil_div(kda_torch_backward_working_bytes(m, lay.micro_batch,
                                                                                 lay.seq_len_per_rank), lay.tp)
    return eager_score_gradient_bytes(m, setup, lay, kernels) + titan + indexer_working_bytes(m, lay, kernels) + kda


def indexer_working_bytes(m: ModelSpec, lay: Layout, kernels: str) -> int:
    """DeepSeek-V3.2's indexer scores while its block runs (models.dsa.indexer_working_bytes_per_token),
    per micro-batch on one rank, unsplit by tp; 0 without DSA. They live in the block's forward (and
    in its recomputation under recompute full); placed here, in the last block's working set, they
    sit on top of nearly every activation, as in the last block's forward (APPROXIMATION: the two
    moments differ by part of one block's activations)."""
    if not m.index_n_heads:
        return 0
    return int(lay.tokens_per_rank * indexer_working_bytes_per_token(m, lay.seq_len, fused=kernels == "fused"))


def activation_key(lay: Layout, sharded_dtype: bool = False, recompute: str | None = None) -> Layout:
    """The fields of a layout that block activations depend on (a cache key). With
    ``sharded_dtype`` (LoRA: whether the engine casts the adapters to 16 bits) also the
    sharding (planner.memory.model.lora_cast_bytes). ``recompute``: in place of the layout's."""
    rc = lay.recompute if recompute is None else recompute
    if sharded_dtype:
        return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, micro_batch=lay.micro_batch, seq_len=lay.seq_len,
                      recompute=rc, zero_stage=lay.zero_stage, sharding=lay.sharding)
    return Layout(tp=lay.tp, sp=lay.sp, cp=lay.cp, micro_batch=lay.micro_batch, seq_len=lay.seq_len, recompute=rc)


@lru_cache(maxsize=4096)
def block_activations(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str) -> tuple[int, int]:
    """(bytes a block keeps under the layout's recomputation, bytes without recomputation: of
    the mean block; memory.shapes scales the latter to the unit a recomputation reruns,
    recompute_unit_bytes)."""
    kept = layer_activation_bytes(m, setup, key, kernels)
    # without recomputation: this function's own answer for that key, whose first figure is its
    # layer_activation_bytes (kept in the cache: a sweep asks for each shape under each recomputation)
    # (the key without recomputation: an activation_key keeps the ZeRO stage and sharding it was
    # given, the defaults unless LoRA's; built directly, dataclasses.replace costs twice as much)
    full = kept if key.recompute == "none" else block_activations(
        m, setup, activation_key(key, sharded_dtype=True, recompute="none"), kernels)[0]
    every = setup.recompute_every
    if every > 1 and key.recompute != "none":
        # one block in ``every`` checkpointed, the others keep everything (torchtitan <= 0.2
        # ``_apply_ac_to_transformer_block``: layer_id % ac_freq == 0; Megatron-LM's block
        # method over n / every layers): the average block, rounded up
        kept = ceil_div(kept + (every - 1) * full, every)
    return kept, full


def recompute_unit_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str, full: int) -> int:
    """What one layer module rerun by full recomputation holds in its backward, from the mean
    block's unrecomputed bytes ``full``: a hybrid's largest module (memory.hybrid.largest_unit_share:
    a Qwen3NextDecoderLayer, the unit transformers' and megatron-core's checkpointing reruns, holds
    two letters of the pattern). The mean block's for every other model and recomputation."""
    if lay.recompute != "full" or not m.layer_pattern:
        return full
    from planner.memory.hybrid import largest_unit_share

    share = largest_unit_share(m, setup, lay, "eager" if kernels == "torchtitan" else kernels,
                               layer_activation_terms)
    return int(full * m.letters_per_block * share)


def stage_block_bytes(setup: TrainingSetup, n_act: np.ndarray, vp: np.ndarray, full_recompute: np.ndarray,
                      kept: np.ndarray, full: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a stage's blocks keep per micro-batch, float; bytes the blocks being recomputed
    hold at once in backward), per layout, for ``n_act`` blocks over ``vp`` virtual stages.

    Everywhere but Megatron's full recomputation by method: n_act x kept and one block
    (``full``). Megatron-LM (megatron-core 0.16.1, transformer/transformer_block.py,
    TransformerBlock._checkpointed_forward, per model chunk = virtual stage of L layers):
    ``uniform`` N checkpoints layers [0, N), [N, 2N), ...: each group keeps only its input
    (ceil(L / N) inputs), and its backward reruns the whole group's forward, so N blocks'
    tensors are held at once; ``block`` N checkpoints layers 0..N-1 one by one and runs the
    other L - N without checkpointing, which keep everything; backward frees those before it
    reaches a checkpointed layer.
    """
    n = n_act.astype(np.float64)
    if setup.stack != "megatron" or (setup.recompute_method == "uniform" and setup.recompute_num_layers == 1):
        return n * kept, full
    chunk = np.ceil(n / np.maximum(vp, 1))          # layers per virtual stage
    n_rc = float(setup.recompute_num_layers)
    if setup.recompute_method == "uniform":
        groups = np.maximum(vp, 1) * np.ceil(chunk / n_rc)
        held = np.where(full_recompute, groups * kept, n * kept)
        group = np.where(full_recompute, np.minimum(n_rc, chunk).astype(np.int64) * full, full)
        return held, np.maximum(group, full)
    rc = np.minimum(n, np.maximum(vp, 1) * np.minimum(n_rc, chunk))    # checkpointed layers
    held = np.where(full_recompute, rc * kept + (n - rc) * full, n * kept)
    # backward meets the unchecked layers first and frees each (L - N >= 1 blocks' tensors)
    # before it reruns a checkpointed one: no block is recomputed on top of the kept total
    return held, np.where(full_recompute & (rc < n), kept, full)


def offloaded_block_bytes(setup: TrainingSetup, n_act: np.ndarray, stage_acts: np.ndarray,
                          kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes a stage's blocks keep on the GPU per micro-batch, bytes they keep in host memory)
    under Megatron-Core's CPU activation offload (TrainingSetup.offload_activations = N; megatron-
    core 0.16.1 model_parallel_config.py cpu_offloading_num_layers, through Transformer Engine's
    get_cpu_offload_context in transformer_engine/pytorch/cpu_offload.py): the saved tensors of
    the first N layers are copied to pinned host memory on a side stream while the next layer
    runs, and reloaded one layer ahead in backward (no double buffering: megatron-core's
    cpu_offloading_double_buffering defaults to False), so one offloaded layer's tensors stay on
    the GPU beside the layers that are not offloaded. ``stage_acts`` is stage_block_bytes' first
    term, ``kept`` one block's bytes. Without offload: (stage_acts, 0)."""
    n_off = np.minimum(setup.offload_activations, n_act).astype(np.float64)
    if setup.offload_activations <= 0:
        return stage_acts, np.zeros_like(n_off)
    on_gpu = stage_acts - np.maximum(n_off - 1, 0) * kept
    return on_gpu, n_off * kept


def host_checkpoint_bytes(m: ModelSpec, setup: TrainingSetup, micro_batch: np.ndarray, seq_len_cp: np.ndarray,
                          tp: np.ndarray, full_recompute: np.ndarray, n_act: np.ndarray,
                          held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(host bytes per rank that DeepSpeed's cpu_checkpointing copies the checkpointed block
    inputs to, the GPU bytes of the inputs it keeps), per layout (0 without it).

    deepspeed 0.19.8, runtime/activation_checkpointing/checkpointing.py, CheckpointFunction.
    forward: with CPU_CHECKPOINT each block's checkpointed input goes to host memory, after
    partition_activations splits it over the model-parallel group (mp_size = tp) under
    PARTITION_ACTIVATIONS (``partition.cpu()``), else through the async offload engine
    (offload_activations.py, _ActivationOffloadEngine: pinned host buffers, keep_last_count=1
    keeps the last block's input on the GPU for the first backward). So: one b s h a input
    per block (/ tp when partitioned), less one block on the plain cpu path, which stays on
    the GPU, per micro-batch in flight. The pinned pool (max_cpu_buffer_pool_count 64) reuses
    buffers of one shape: no extra copies are counted.
    """
    zero = np.zeros(np.broadcast_shapes(np.shape(n_act), np.shape(micro_batch)), dtype=np.int64)
    if setup.stack != "deepspeed" or "cpu" not in setup.ds_checkpointing:
        return zero, zero
    partitioned = setup.ds_checkpointing.startswith("partitioned")
    a = setup.precision_spec.activation_bytes
    per_block = -(-(micro_batch * seq_len_cp * m.d_model * a) // (tp if partitioned else 1))
    on_gpu = np.minimum(n_act, 0 if partitioned else 1)
    host = np.where(full_recompute, ((n_act - on_gpu) * per_block * held).astype(np.int64), zero)
    gpu = np.where(full_recompute, (on_gpu * per_block * held).astype(np.int64), zero)
    return host, gpu
