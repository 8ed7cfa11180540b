"""``--task load``: the memory to hold a model for inference, and how many GPUs that takes.

The first question most users ask: can this model run on my GPU at this precision? The
answer is the weights (16- or 32-bit, or weight-only quantized: planner.training.finetune's storage
formats), the KV cache for a batch of sequences of a given context, the working set of a
prefill forward pass, and the memory no tensor tracker sees (planner.training.setup.Overheads).

KV cache (Pope et al. 2022, "Efficiently Scaling Transformer Inference", arXiv:2211.05102,
Sec. 3.1; Kwon et al. 2023, "vLLM", arXiv:2309.06180, Sec. 2): every causal block keeps a
key and a value per token and KV head,

    2 x layers x kv_heads x head_dim x context x batch x bytes

(grouped-query attention shrinks kv_heads; tests/test_inference.py checks the formula
against the cache transformers builds). Encoders (BERT) keep no cache.

Architectures of 2024-2026 store less (``kv_cache_bytes``; each checked in tests/test_inference.py
against the cache transformers 5.24.0 builds for a tiny model of the family):

- Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2-2.1.3 and Table 1:
  (d_c + d_h^R) x layers elements per token instead of 2 n_h d_h x layers). ``mla_cache="latent"``
  stores the compressed latent (kv_lora_rank) and the shared rotary key (qk_rope_head_dim) per
  token and layer, as vLLM's and SGLang's MLA backends do with the up-projections absorbed, and
  as transformers 5.24.0's DeepseekV3Attention does (``cache.update(kv_nope, k_rot, ...)`` on
  the single-head latents, models/deepseek_v3/modeling_deepseek_v3.py). The latent is shared
  by all heads, so tensor parallelism does not split it (each rank keeps all of it).
  ``mla_cache="per-head"`` stores per-head K (qk_nope + qk_rope wide) and V (v_head_dim wide),
  as a framework that does not absorb the projections does (transformers 4.x's
  DeepseekV3Attention updated the cache with the expanded key and value states); heads split
  over tp.
- Sliding-window and chunked attention (Gemma 3, gpt-oss: sliding; Llama 4: chunked): a local
  layer needs at most ``attention_window`` past tokens (the window, or the current chunk), so
  its cache holds min(context, window) tokens; the other layers hold the whole context.
  transformers' DynamicCache builds a DynamicSlidingWindowLayer for each sliding or chunked
  layer type (cache_utils.py), which keeps the last window - 1 tokens after a prefill longer than
  the window (the newest token is attended with them); serving engines keep whole blocks of the
  window, so the planner sizes the window itself.

Across GPUs the model is split like a tensor- and pipeline-parallel training layout
(the training model's per-stage parameters, planner.memory.shapes.stage_figures, over a batch
of splits: load_memory_batch): tensor parallelism splits the matrices and the KV heads (a rank
holds at least one KV head, so K and V are replicated when tp exceeds kv_heads), pipeline
parallelism splits the layers. The most loaded rank decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from planner.hardware.gpus import GpuSpec
from planner.layouts.batch import LayoutArrays
from planner.layouts.distinct import group
from planner.layouts.layout import divisors
from planner.layouts.rules import split_refusal
from planner.memory.shapes import stage_figures
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.finetune import FinetuneSpec, frozen_block_bytes
from planner.training.setup import Overheads, TrainingSetup
from planner.units import ceil_div

LOAD_QUANTS = ("none", "int8", "int4", "nf4")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadSetup:
    """How the model is held: the 16/32-bit format (``weight_bytes``: 2 for bf16/fp16, 4
    for fp32), weight-only quantization of the blocks' linear layers (``quant``), the
    sequences held at once (``batch``) and their length (``context``, prompt plus
    generated tokens), the KV cache's bytes per element, and for MLA models which layout the
    cache has (``mla_cache``, see the module docstring)."""

    weight_bytes: int = 2
    quant: str = "none"
    double_quant: bool = True
    batch: int = 1
    context: int = 4096
    kv_bytes: int = 2
    mla_cache: str = "latent"       # MLA models: "latent" (absorbed, vLLM/SGLang) or "per-head" K and V
    overheads: Overheads = field(default_factory=Overheads)
    usable_memory_fraction: float = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadMemory:
    """Bytes on the most loaded GPU, by category."""

    weights: int
    kv_cache: int
    activations: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.overhead

    def as_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations,
                "overhead": self.overhead, "total": self.total}


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadPlan:
    """The fewest GPUs that hold the model (tp x pp), or the least memory when none fits."""

    model: ModelSpec
    params: ParamCount
    gpu: GpuSpec
    setup: LoadSetup
    tp: int
    pp: int
    memory: LoadMemory
    capacity_bytes: int
    fixed: bool = False

    @property
    def n_gpus(self) -> int:
        return self.tp * self.pp

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.capacity_bytes


MLA_CACHES = ("latent", "per-head")


def kv_elements_per_token(m: ModelSpec, tp: int = 1, mla_cache: str = "latent") -> int:
    """Cached elements per token and block on one tensor-parallel rank (module docstring):
    2 x ceil(kv_heads / tp) x head_dim; MLA's latent plus rotary key (kv_lora_rank +
    qk_rope_head_dim, whole on every rank), or its per-head K and V; DeepSeek-V3.2 adds its
    indexer's one key of index_head_dim per token (transformers' DynamicIndexedLayer keeps it
    beside the latent; every query's indexer scores all of them, arXiv:2512.02556 Sec. 2.1)."""
    if m.is_mla:
        if mla_cache not in MLA_CACHES:
            raise ValueError(f"unknown MLA cache layout {mla_cache!r}; choose one of {', '.join(MLA_CACHES)}")
        if mla_cache == "latent":
            return m.kv_lora_rank + m.qk_rope_head_dim + m.index_head_dim
        return ceil_div(m.n_heads, tp) * (m.head_dim + m.value_head_dim) + m.index_head_dim
    return 2 * ceil_div(m.n_kv_heads, tp) * m.head_dim


def mla_cache_description(m: ModelSpec, mla_cache: str, tp: int = 1) -> str | None:
    """The MLA cache layout in words, with its elements per token and block on one rank (what
    `plan --task load` prints); None for other attention."""
    if not m.is_mla:
        return None
    per_token = kv_elements_per_token(m, tp, mla_cache)
    if mla_cache == "latent":
        return (f"MLA cache: latent, kv_lora_rank {m.kv_lora_rank} + rotary key {m.qk_rope_head_dim} = "
                f"{per_token:,} elements per token and block for all heads (up-projections absorbed)")
    return (f"MLA cache: per-head, {ceil_div(m.n_heads, tp)} heads x (K {m.head_dim} + V {m.value_head_dim}) = "
            f"{per_token:,} elements per token and block on a rank (up-projections not absorbed)")


def cached_token_layers(m: ModelSpec, context: int, n_layers: int | None = None) -> int:
    """Sum over ``n_layers`` blocks (default all) of the tokens each caches for one sequence of
    ``context`` tokens: local (sliding or chunked) blocks at most ``attention_window``, the rest
    ``context``. A pipeline stage holding part of the blocks is given its share of the global
    blocks, rounded up (the most loaded stage)."""
    layers = m.n_layers if n_layers is None else n_layers
    if m.layer_pattern:     # a hybrid: only its attention layers cache keys and values (mamba_state_bytes)
        return min(layers, ceil_div(layers * m.n_attention_layers, m.n_layers)) * context
    if not m.local_attention or not m.attention_window or not m.n_local_layers:
        return layers * context
    n_global = m.n_layers - m.n_local_layers
    global_here = min(layers, ceil_div(layers * n_global, m.n_layers))
    return global_here * context + (layers - global_here) * min(context, m.attention_window)


def mamba_state_bytes(m: ModelSpec, batch: int, tp: int = 1, n_layers: int | None = None, kv_bytes: int = 2) -> int:
    """The fixed state a hybrid's Mamba-2 layers keep per sequence instead of a KV cache, on one
    tensor-parallel rank, for a stage of ``n_layers`` (default all) layers holding their share of
    the Mamba layers, rounded up: the conv state, K x (d_inner + 2 G N) in the cache dtype (K
    positions, as transformers' cache and mamba_ssm's conv_state keep), and the SSM state, H x P x
    N in fp32 (transformers 5.x NemotronHConfig.mamba_ssm_cache_dtype "float32"; the Nemotron 3
    deployment guide asks for float32 too). 0 without Mamba layers. tests/test_hybrid.py checks
    it with the attention layers' keys and values against transformers' own cache. Gated DeltaNet
    layers keep the same two states (deltanet_state_bytes), added here: this is the one fixed
    per-sequence state of a hybrid."""
    layers = m.n_layers if n_layers is None else n_layers
    total = deltanet_state_bytes(m, batch, tp, layers, kv_bytes)
    if not m.n_mamba_layers:
        return total
    mamba_here = min(layers, ceil_div(layers * m.n_mamba_layers, m.n_layers))
    per_layer = m.conv_kernel * m.mamba_conv_dim * kv_bytes + m.mamba_heads * m.mamba_head_dim * m.ssm_state * 4
    return total + mamba_here * batch * ceil_div(per_layer, tp)


def deltanet_state_bytes(m: ModelSpec, batch: int, tp: int, n_layers: int, kv_bytes: int = 2) -> int:
    """The fixed state a hybrid's gated DeltaNet layers keep per sequence, on one tensor-parallel
    rank, for a stage of ``n_layers`` layers holding their share of them, rounded up: the conv
    state, W x (2K + V) in the cache dtype, and the recurrent state, Hv x dk x dv in fp32 (what
    transformers 5.x's Qwen3-Next cache holds after a forward: torch_chunk_gated_delta_rule's
    state is fp32; tests/test_deltanet.py reads it). 0 without gated DeltaNet layers."""
    if not m.n_deltanet_layers:
        return 0
    here = min(n_layers, ceil_div(n_layers * m.n_deltanet_layers, m.n_layers))
    per_layer = (m.conv_kernel * m.gdn_conv_dim * kv_bytes
                 + m.gdn_value_heads * m.gdn_key_dim * m.gdn_value_dim * 4)
    return here * batch * ceil_div(per_layer, tp)


def kv_cache_bytes(m: ModelSpec, batch: int, context: int, kv_bytes: int = 2, tp: int = 1,
                   n_layers: int | None = None, mla_cache: str = "latent") -> int:
    """Keys and values of ``n_layers`` (default all) blocks for ``batch`` sequences of
    ``context`` tokens on one tensor-parallel rank: kv_elements_per_token x the tokens each
    block caches (cached_token_layers) x batch x kv_bytes; for a classic block 2 x layers x
    ceil(kv_heads / tp) x head_dim x context x batch x kv_bytes; a hybrid's Mamba layers add
    their fixed state (mamba_state_bytes). 0 for encoders."""
    if not m.causal:
        return 0
    return (kv_elements_per_token(m, tp, mla_cache) * cached_token_layers(m, context, n_layers) * batch * kv_bytes
            + mamba_state_bytes(m, batch, tp, n_layers, kv_bytes))


def prefill_activation_bytes(m: ModelSpec, setup: LoadSetup, tp: int, last_stage: bool) -> int:
    """The largest set of tensors alive at once in a prefill forward pass (no gradients,
    nothing saved), per rank: the block's input and output streams (2h) beside the gated
    MLP's act(gate), up and their product (3 d_ff, k experts per token; 2 d_ff ungated), or
    beside Q, K, V and the attention output; plus, on the last stage, the fp32 logits of
    the last position of each sequence (transformers' generate keeps only those:
    ``logits_to_keep``). Activations are 16-bit unless the weights are fp32."""
    tokens = setup.batch * setup.context
    a = 4 if setup.weight_bytes == 4 else 2
    h = m.d_model
    k = m.n_experts_per_token if m.is_moe else 1
    mlp = (3 if m.gated_mlp else 2) * k * ceil_div(m.d_ff, tp)
    attention = ceil_div(2 * m.q_dim + 2 * m.kv_dim, tp)
    per_token = (2 * h + max(mlp, attention)) * a
    logits = setup.batch * ceil_div(m.vocab_size, tp) * 4 if last_stage else 0
    return tokens * per_token + logits


@dataclass(frozen=True, slots=True)
class LoadBatch:
    """The most loaded rank of each (tp, pp) split of a batch, by category (int64 arrays)."""

    weights: np.ndarray
    kv_cache: np.ndarray
    activations: np.ndarray
    overhead: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.weights + self.kv_cache + self.activations + self.overhead

    def at(self, i: int) -> LoadMemory:
        return LoadMemory(weights=int(self.weights[i]), kv_cache=int(self.kv_cache[i]),
                          activations=int(self.activations[i]), overhead=int(self.overhead[i]))


def _per_value(fn: Callable[[int], int], x: np.ndarray) -> np.ndarray:
    """fn of each element of an int array, called once per distinct value."""
    flat = x.ravel()
    inv, first = group([flat])
    return np.array([fn(v) for v in flat[first].tolist()], dtype=np.int64)[inv.reshape(x.shape)]


def load_memory_batch(m: ModelSpec, setup: LoadSetup, tp: np.ndarray, pp: np.ndarray,
                      pc: ParamCount | None = None) -> LoadBatch:
    """Memory of the most loaded rank of ``m`` split over tp[i] x pp[i] GPUs, for every i.

    The stages that can be the most loaded and their ranks' parameters are the training
    model's (planner.memory.shapes.stage_figures: params.rank_params per stage slot, once per
    distinct (tp, pp)); per slot the weights at their stored format, the KV cache of the
    slot's blocks and the prefill working set; the first most loaded slot, in stage order."""
    pc = pc or count_params(m)
    tp, pp = np.asarray(tp, dtype=np.int64), np.asarray(pp, dtype=np.int64)
    ones, zeros = np.ones_like(tp), np.zeros_like(tp)
    lay = LayoutArrays(dp=ones, tp=tp, pp=pp, cp=ones, ep=ones, zero_stage=zeros, sharding=zeros, sp=zeros,
                       vp=ones, micro_batch=ones, grad_accum=ones, recompute=zeros)
    st = stage_figures(m, pc, TrainingSetup(), lay)        # (slot, batch)
    rp = st.rank_params
    # the blocks at their stored format (quantized linear weights, 16-bit norms and biases),
    # the embedding and LM head at ``weight_bytes`` (quantization leaves them in 16 bits)
    spec = FinetuneSpec(method="lora", quant=setup.quant, double_quant=setup.double_quant)
    bb = frozen_block_bytes(m, spec, setup.weight_bytes, pc)
    weights = ((rp.dense - rp.root_unit) * bb.dense_bytes_per_param + rp.expert * bb.expert_bytes_per_param
               + rp.root_unit * setup.weight_bytes).astype(np.int64)
    kv = np.zeros_like(weights)
    if m.causal:
        per_token = _per_value(lambda t: kv_elements_per_token(m, t, setup.mla_cache), tp)
        token_layers = _per_value(lambda n: cached_token_layers(m, setup.context, n), st.n_layers)
        kv = per_token * token_layers * setup.batch * setup.kv_bytes
        if m.n_mamba_layers or m.n_deltanet_layers:     # a hybrid's Mamba or DeltaNet layers: a fixed state
            kv = kv + np.array([[mamba_state_bytes(m, setup.batch, int(t), int(n), setup.kv_bytes)
                                 for t, n in zip(tp.tolist(), row.tolist(), strict=True)]
                                for row in np.broadcast_to(st.n_layers, kv.shape)], dtype=np.int64)
    last = st.stage == pp - 1
    acts = np.where(last, _per_value(lambda t: prefill_activation_bytes(m, setup, t, True), tp),
                    _per_value(lambda t: prefill_activation_bytes(m, setup, t, False), tp))
    tracked = weights + kv + acts
    o = setup.overheads
    overhead = o.untracked_bytes(tracked, tp * pp > 1)
    total = np.where(st.valid, tracked + overhead, -1)
    slot = total.argmax(axis=0)           # the first of equals, in stage order
    cols = np.arange(len(tp))
    return LoadBatch(weights=weights[slot, cols], kv_cache=kv[slot, cols], activations=acts[slot, cols],
                     overhead=overhead[slot, cols])


def load_memory(m: ModelSpec, setup: LoadSetup, tp: int = 1, pp: int = 1,
                pc: ParamCount | None = None) -> LoadMemory:
    """Memory of the most loaded rank holding ``m`` split over tp x pp GPUs (load_memory_batch
    on a batch of one)."""
    return load_memory_batch(m, setup, np.array([tp]), np.array([pp]), pc).at(0)


@lru_cache(maxsize=256)
def load_weight_bytes(m: ModelSpec, setup: LoadSetup, tp: int = 1, pp: int = 1) -> int:
    """The stored weights on the most loaded of tp x pp ranks holding ``m`` (load_memory's
    ``weights``), bytes. Kept per (model, format, tp, pp): the post-training searches ask it for
    every candidate layout, whose dp, cp, ep and batch do not enter (issue 32: Kimi K2 distilled
    from itself on 16,384 H100 asked it 60,222 times, DeepSeek-V3's GRPO 63,712 times)."""
    return load_memory(m, setup, tp=tp, pp=pp).weights


def tp_degrees(m: ModelSpec, limit: int) -> list[int]:
    """Tensor-parallel degrees that split the weights evenly (layouts.rules.split_refusal), up
    to ``limit`` (a node)."""
    return [t for t in divisors(m.n_heads) if t <= limit and split_refusal(m, t, 1) is None]


def plan_load(m: ModelSpec, gpu: GpuSpec, setup: LoadSetup, tp: int | None = None, pp: int | None = None,
              max_gpus: int = 4096) -> LoadPlan:
    """The fewest GPUs that hold ``m``: tensor parallelism inside a node first (powers that
    divide the heads), then pipeline stages across nodes. With ``tp`` and ``pp`` given,
    that split is evaluated. When nothing fits up to ``max_gpus``, the least-memory split
    tried is returned (``fits`` False)."""
    pc = count_params(m)
    cap = int(gpu.memory_bytes * setup.usable_memory_fraction)
    if tp is not None and pp is not None:
        return LoadPlan(model=m, params=pc, gpu=gpu, setup=setup, tp=tp, pp=pp,
                        memory=load_memory(m, setup, tp, pp, pc), capacity_bytes=cap, fixed=True)
    tps = [tp] if tp is not None else tp_degrees(m, gpu.gpus_per_node)
    options: list[tuple[int, int]] = []
    for t in tps:
        pps = [pp] if pp is not None else range(1, min(m.n_layers, max_gpus // t) + 1)
        options += [(t, p) for p in pps if t * p <= max_gpus]
    options.sort(key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[1]))
    if not options:
        raise ValueError("no tensor/pipeline split to try")
    # the first split in order that fits, else the first with the least memory. The splits are
    # sized a chunk at a time, stopping at the first chunk that holds a fit: sizing every pp up
    # to n_layers at once is quadratic in the layer count (issue 32, H3: 10,000 layers, 27 s)
    least: tuple[int, int, Any] | None = None        # (total, option index, its batch row)
    for lo in range(0, len(options), LOAD_CHUNK):
        part = options[lo:lo + LOAD_CHUNK]
        batch = load_memory_batch(m, setup, np.array([t for t, _ in part]), np.array([p for _, p in part]), pc)
        total = batch.total
        fits = np.flatnonzero(total <= cap)
        if len(fits):
            i = int(fits[0])
            t, p = part[i]
            return LoadPlan(model=m, params=pc, gpu=gpu, setup=setup, tp=t, pp=p, memory=batch.at(i),
                            capacity_bytes=cap)
        j = int(total.argmin())
        if least is None or int(total[j]) < least[0]:
            least = (int(total[j]), lo + j, batch.at(j))
    assert least is not None
    t, p = options[least[1]]
    return LoadPlan(model=m, params=pc, gpu=gpu, setup=setup, tp=t, pp=p, memory=least[2], capacity_bytes=cap)


LOAD_CHUNK = 256      # splits sized at once by plan_load
