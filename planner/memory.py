"""Per-rank memory from first principles: model states, activations, logits, buffers.

Everything is bytes on one GPU (int). The most loaded rank is found by evaluating every
pipeline stage. Categories line up with PyTorch's memory trackers: everything a tensor
tracker can see is outside ``overhead``; ``overhead`` holds only what no tracker sees
(CUDA context, library workspaces, NCCL buffers, allocator fragmentation).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from .layouts import Layout
from .model import ModelSpec, ParamCount, count_params
from .training import Precision, TrainingSetup, optimizer_state_bytes_per_param
from .units import ceil_div

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

    @property
    def total(self) -> int:
        return self.breakdown.total


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
    lay: Layout, shard_degree_dense: int | None = None,
) -> ModelStates:
    """Weights, gradients and optimizer state of one rank (ZeRO paper, Sec. 5).

    ZeRO-1 shards the optimizer states (with the fp32 master copy) over the data ranks,
    ZeRO-2 also the gradients, ZeRO-3 also the weights: with Psi parameters, K=12 and
    N_d ranks, (2+2+K)Psi, 2Psi+2Psi+K Psi/N_d, 2Psi+(2+K)Psi/N_d, (2+2+K)Psi/N_d
    (Rajbhandari et al. 2019, arXiv:1910.02054, Fig. 1). FSDP2 with a mixed-precision
    policy keeps the sharded parameters in fp32 (they are the master copy) and fp32
    gradients, and gathers 16-bit copies for compute (PyTorch FSDP2 docs,
    MixedPrecisionPolicy); shard-grad-op keeps the gathered copies from forward to
    backward.
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
        unsharded = (n_dense + n_expert) * precision.weight_bytes if lay.sharding == "fsdp-grad-op" else 0
        return ModelStates(
            weights=shard(n_dense * stored, n_expert * stored, True),
            gradients=shard(n_dense * grad, n_expert * grad, True),
            optimizer=shard(n_dense * opt, n_expert * opt, True),
            unsharded_weights=unsharded,
        )
    opt = precision.master_bytes + optimizer_bytes_per_param
    return ModelStates(
        weights=shard(n_dense * precision.weight_bytes, n_expert * precision.weight_bytes, stage >= 3),
        gradients=shard(n_dense * precision.grad_bytes, n_expert * precision.grad_bytes, stage >= 2),
        optimizer=shard(n_dense * opt, n_expert * opt, stage >= 1),
    )


# ----------------------------------------------------------------------- activations

def resolve_kernels(setup: TrainingSetup, lay: Layout) -> str:
    if setup.kernels != "auto":
        return setup.kernels
    return "fused" if (lay.tp > 1 or lay.pp > 1 or lay.cp > 1) else "eager"


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
    eager = kernels == "eager"
    terms: list[ActivationTerm] = []

    def add(name: str, width_bytes: float, divisor: int, selective: bool = False) -> None:
        terms.append(ActivationTerm(name=name, bytes=ceil_div(int(tokens * width_bytes), divisor),
                                    selective=selective))

    # norms: every norm keeps its input; eager RMSNorm keeps an fp32 copy of it and the
    # normalised 16-bit tensor it multiplies by the weight
    if m.norm == "rmsnorm" and eager:
        add("norm inputs (fp32 copy) and normalised outputs", m.norms_per_layer * h * (4 + a), sp_div)
    else:
        add("norm inputs", m.norms_per_layer * h * a, sp_div)
    add("attention input (norm output)", h * a, sp_div)
    if not m.parallel_block:
        add("MLP input (norm output)", h * a, sp_div)

    # attention core, inside the tensor-parallel region
    if setup.attention == "eager":
        add("Q, K, V (K, V expanded to all heads)", 3 * q * a, tp)
        s_kv = lay.seq_len
        add("softmax output (b x heads x s x s)", m.n_heads * s_kv * a, tp, selective=True)
        if m.attention_dropout > 0:
            add("attention dropout mask and output", m.n_heads * s_kv * (1 + a), tp, selective=True)
        add("attention output (input of the output projection)", q * a, tp)
    else:
        add("Q, K, V", (q + 2 * kv) * a, tp)
        add("attention output (flash output, projection input)", q * a, tp)
        add("log-sum-exp per head and row (fp32)", m.n_heads * 4, tp)
        if eager:
            add("attention output made contiguous for the projection", q * a, tp)
    if m.hidden_dropout > 0:
        add("dropout mask after attention", h * 1, sp_div)

    # MLP: dense, or k experts per token
    k = m.n_experts_per_token if m.is_moe else 1
    if m.gated_mlp:
        add("MLP gate, up, activation and product" if eager else "MLP [gate, up] and product",
            k * (4 if eager else 3) * f * a, tp)
    else:
        add("MLP activation input and second linear input", k * 2 * f * a, tp)
    if m.is_moe:
        add("tokens permuted to their experts", k * h * a, sp_div)
        add("router probabilities (fp32)", m.n_experts * 4, 1)
    if m.hidden_dropout > 0:
        add("dropout mask after the MLP", h * 1, sp_div)
    return terms


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
    """The output layer and loss on the last stage, for one micro-batch.

    Fused (Megatron-LM's vocab-parallel cross entropy): the final norm input and the LM
    head input, sbh each (split under sp), and the logits in fp32, 4sbv/t (Korthikanti
    et al. Sec. 4.3). Eager (Hugging Face): the 16-bit logits the model returns, the
    fp32 copy the loss upcasts, and log-softmax's fp32 output kept for backward.
    """
    b, s = lay.micro_batch, lay.seq_len // lay.cp
    a = setup.precision_spec.activation_bytes
    tokens = b * s
    sp_div = lay.tp if lay.sp else 1
    norm_in = 0 if not m.final_norm else ceil_div(tokens * m.d_model * a, sp_div)
    head_in = ceil_div(tokens * m.d_model * a, sp_div)
    v = ceil_div(m.vocab_size, lay.tp)
    if kernels == "eager":
        per_vocab = a + 4 + 4 if a == 2 else 4 + 4
    else:
        per_vocab = 4
    return norm_in + head_in + tokens * v * per_vocab


# --------------------------------------------------------------------------- buffers

def buffer_bytes(
    m: ModelSpec, setup: TrainingSetup, lay: Layout, rp: RankParams, precision: Precision,
) -> int:
    """Communication buffers the engine allocates beside the model states.

    ZeRO-1/2 (DeepSpeed): the gradient reduce bucket, min(bucket, params) 16-bit
    elements (DeepSpeed config "reduce_bucket_size"). DeepSpeed ZeRO-3: the gathered
    16-bit copy of the module being computed and of the one prefetched (the largest
    module: a block, or the word embedding; "stage3_prefetch_bucket_size") and the
    reduce bucket. FSDP2 full/hybrid at the start of backward: the root unit (embedding,
    final norm, LM head), which FSDP2 does not reshard between forward and backward,
    and the last block, gathered again for its backward (FSDPMemTracker's "unsharded
    params" and "all-gather" at the peak of a Llama-3-8B step, shared/notes/FACTS.md).
    The unsharded gradients of a unit before its reduce-scatter come later in backward,
    when most activations are freed.
    Pipeline stages: send and receive buffers of one activation tensor each.
    """
    out = 0
    wb = precision.weight_bytes
    stage = lay.zero_stage
    if lay.sharding == "zero" and stage in (1, 2):
        out += min(setup.buffers.zero_bucket_numel, rp.total) * precision.grad_bytes
    if stage == 3:
        if lay.is_fsdp:
            out += (rp.root_unit + rp.block_unit) * wb
        else:
            out += 2 * rp.largest_module * wb + min(setup.buffers.zero_bucket_numel, rp.total) * precision.grad_bytes
    if lay.pp > 1:
        act = lay.micro_batch * (lay.seq_len // lay.cp) * m.d_model * precision.activation_bytes
        out += 2 * ceil_div(act, lay.tp if lay.sp else 1)
    return out


# ------------------------------------------------------------------------ the rank

def per_rank_memory(m: ModelSpec, setup: TrainingSetup, lay: Layout,
                    pc: ParamCount | None = None, gpus_per_node: int = 8) -> RankMemory:
    """The peak memory of the most loaded rank of ``lay``, by category.

    The peak is at the start of backward (all in-flight activations held) unless the
    gradients appear only during backward (one micro-batch per step, no persistent
    gradient buffers: plain PyTorch or FSDP with set_to_none), in which case the larger
    of backward-start (activations, no gradients) and backward-end (gradients, one
    block's activations) is taken. Overhead adds the fixed CUDA/NCCL costs and the
    allocator's fragmentation on top of the tracked bytes.
    """
    pc = pc or count_params(m)
    prec = setup.precision_spec
    kernels = resolve_kernels(setup, lay)
    opt_pp = _optimizer_bytes_per_param(m, setup.optimizer)
    layer_act, full_layer = _block_activations(m, setup, _activation_key(lay), kernels)
    dropout_embed = (lay.micro_batch * (lay.seq_len // lay.cp) * m.d_model
                     if m.hidden_dropout > 0 else 0)
    hybrid = _hybrid_degree(lay, gpus_per_node)
    persistent_grads = lay.grad_accum > 1 or lay.pp > 1 or (
        not lay.is_fsdp and lay.dense_shard_degree > 1)
    distributed = lay.n_gpus > 1

    best: RankMemory | None = None
    counts = stage_layers(m.n_layers, lay.pp)
    for stage in _stages_to_check(counts):
        n_layers = counts[stage]
        rp = rank_params(m, pc, lay, stage, n_layers)
        ms = model_state_bytes(rp.dense, rp.expert, prec, opt_pp, lay, hybrid)
        held = in_flight_microbatches(lay, stage)
        acts = int(n_layers * layer_act * held)
        if n_layers:
            acts += full_layer - layer_act   # one block's recomputed tensors during its backward
        if stage == 0:
            acts += int(dropout_embed * held)
        logits = logits_bytes(m, setup, lay, kernels) if stage == lay.pp - 1 else 0
        buffers = buffer_bytes(m, setup, lay, rp, prec)
        weights = ms.weights + ms.unsharded_weights

        start = (weights + (ms.gradients if persistent_grads else 0) + ms.optimizer
                 + acts + logits + buffers)
        end = weights + ms.gradients + ms.optimizer + (full_layer if n_layers else 0) + buffers
        if persistent_grads or start >= end:
            phase, grads, act_at, logits_at = "backward-start", (ms.gradients if persistent_grads else 0), acts, logits
        else:
            phase, grads, act_at, logits_at = "backward-end", ms.gradients, (full_layer if n_layers else 0), 0
        tracked = weights + grads + ms.optimizer + act_at + logits_at + buffers
        overhead = setup.overheads.fixed_bytes(distributed) + int(tracked * setup.overheads.fragmentation)
        bd = MemoryBreakdown(weights=weights, gradients=grads, optimizer=ms.optimizer,
                             activations=act_at, logits=logits_at, buffers=buffers, overhead=overhead)
        if best is None or bd.total > best.total:
            best = RankMemory(breakdown=bd, stage=stage, phase=phase, n_layers_on_stage=n_layers,
                              in_flight=held, kernels=kernels)
    assert best is not None
    return best


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


def _activation_key(lay: Layout) -> Layout:
    """The fields of a layout that block activations depend on (a cache key)."""
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
    summed over all ranks, under any sharding: each state exists at least once."""
    p = setup.precision_spec
    opt = optimizer_state_bytes_per_param(setup.optimizer) if setup.optimizer != "adafactor" else 0.0
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
