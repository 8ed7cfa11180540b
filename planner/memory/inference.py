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

Across GPUs the model is split like a tensor- and pipeline-parallel training layout
(planner.memory.model.rank_params): tensor parallelism splits the matrices and the KV heads (a rank
holds at least one KV head, so K and V are replicated when tp exceeds kv_heads), pipeline
parallelism splits the layers. The most loaded rank decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import Layout, divisors
from planner.memory.model import rank_params, stage_layers
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.finetune import FinetuneSpec, frozen_block_bytes
from planner.training.setup import Overheads
from planner.units import ceil_div

LOAD_QUANTS = ("none", "int8", "int4", "nf4")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadSetup:
    """How the model is held: the 16/32-bit format (``weight_bytes``: 2 for bf16/fp16, 4
    for fp32), weight-only quantization of the blocks' linear layers (``quant``), the
    sequences held at once (``batch``) and their length (``context``, prompt plus
    generated tokens), the KV cache's bytes per element."""

    weight_bytes: int = 2
    quant: str = "none"
    double_quant: bool = True
    batch: int = 1
    context: int = 4096
    kv_bytes: int = 2
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


def kv_cache_bytes(m: ModelSpec, batch: int, context: int, kv_bytes: int = 2, tp: int = 1,
                   n_layers: int | None = None) -> int:
    """Keys and values of ``n_layers`` (default all) blocks for ``batch`` sequences of
    ``context`` tokens on one tensor-parallel rank: 2 x layers x ceil(kv_heads / tp) x
    head_dim x context x batch x kv_bytes. 0 for encoders."""
    if not m.causal:
        return 0
    layers = m.n_layers if n_layers is None else n_layers
    return 2 * layers * ceil_div(m.n_kv_heads, tp) * m.head_dim * context * batch * kv_bytes


def weight_bytes_on_rank(m: ModelSpec, pc: ParamCount, setup: LoadSetup, tp: int, pp: int, stage: int) -> int:
    """Weights one rank of ``stage`` holds: the blocks at their stored format (quantized
    linear weights, 16-bit norms and biases), the embedding and LM head at ``weight_bytes``
    (quantization leaves them in 16 bits)."""
    lay = Layout(tp=tp, pp=pp)
    n_layers = stage_layers(m.n_layers, pp)[stage]
    rp = rank_params(m, pc, lay, stage, n_layers)
    spec = FinetuneSpec(method="lora", quant=setup.quant, double_quant=setup.double_quant)
    bb = frozen_block_bytes(m, spec, setup.weight_bytes, pc)
    layers_dense = rp.dense - rp.root_unit
    return int(layers_dense * bb.dense_bytes_per_param + rp.expert * bb.expert_bytes_per_param
               + rp.root_unit * setup.weight_bytes)


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


def load_memory(m: ModelSpec, setup: LoadSetup, tp: int = 1, pp: int = 1,
                pc: ParamCount | None = None) -> LoadMemory:
    """Memory of the most loaded rank holding ``m`` split over tp x pp GPUs."""
    pc = pc or count_params(m)
    counts = stage_layers(m.n_layers, pp)
    best: LoadMemory | None = None
    for stage in range(pp):
        weights = weight_bytes_on_rank(m, pc, setup, tp, pp, stage)
        kv = kv_cache_bytes(m, setup.batch, setup.context, setup.kv_bytes, tp, counts[stage])
        acts = prefill_activation_bytes(m, setup, tp, stage == pp - 1)
        tracked = weights + kv + acts
        o = setup.overheads
        overhead = o.fixed_bytes(tp * pp > 1) + int(tracked * o.fragmentation)
        mem = LoadMemory(weights=weights, kv_cache=kv, activations=acts, overhead=overhead)
        if best is None or mem.total > best.total:
            best = mem
    assert best is not None
    return best


def tp_degrees(m: ModelSpec, limit: int) -> list[int]:
    """Tensor-parallel degrees that split the heads evenly, up to ``limit`` (a node)."""
    return [t for t in divisors(m.n_heads) if t <= limit and m.d_ff % t == 0
            and (m.n_kv_heads % t == 0 or t % m.n_kv_heads == 0)]


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
        pps = [pp] if pp is not None else [p for p in range(1, m.n_layers + 1)]
        options += [(t, p) for p in pps if t * p <= max_gpus]
    options.sort(key=lambda tp_pp: (tp_pp[0] * tp_pp[1], tp_pp[1]))
    least: LoadPlan | None = None
    for t, p in options:
        plan = LoadPlan(model=m, params=pc, gpu=gpu, setup=setup, tp=t, pp=p,
                        memory=load_memory(m, setup, t, p, pc), capacity_bytes=cap)
        if plan.fits:
            return plan
        if least is None or plan.memory.total < least.memory.total:
            least = plan
    if least is None:
        raise ValueError("no tensor/pipeline split to try")
    return least
