"""An RL step's memory by phase: generation (the rollout engine), scoring (log-prob passes)
and training, on the policy's GPUs.

The engine is vLLM. It takes ``gpu_memory_utilization`` of the GPU's memory for itself
(vllm/config/cache.py, CacheConfig.gpu_memory_utilization, default 0.9) and fills what its
weights and its profiled forward leave of that with KV-cache blocks: vllm/v1/worker/
gpu_worker.py determine_available_memory (requested memory less the non-KV-cache memory:
weights, the peak activations of a profile run of max_num_batched_tokens, non-torch
allocations), then vllm/v1/core/kv_cache_utils.py get_num_blocks (``available_memory //
page_size // num_layers``) with the page of vllm/v1/kv_cache_interface.py
(AttentionSpec.real_page_size_bytes = 2 x block_size x num_kv_heads x head_size x dtype
bytes, KV heads of the engine's tensor-parallel rank). A sequence of L tokens holds
ceil(L / block_size) blocks. The engine's start refuses a fraction larger than the free memory
it finds (vLLM's "free memory ... is less than desired GPU memory utilization"): what the
training keeps resident during generation comes on top of the engine's share, which is the
out-of-memory of colocated GRPO (TRL issue 2927).

Training states during generation: verl and NeMo-RL move the policy's weights, gradients and
optimizer states (and the reference) to the host before generation and back after
(RLSetup.offload_train_states); TRL keeps them and puts the engine to sleep for training
(RLSetup.engine_sleeps: vLLM's sleep mode frees its weights and KV cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import Layout
from planner.memory.inference import LoadSetup, kv_elements_per_token, load_weight_bytes, prefill_activation_bytes
from planner.memory.model import RankMemory
from planner.models.spec import ModelSpec
from planner.training.posttrain import RLSetup
from planner.training.setup import Overheads
from planner.units import ceil_div

VLLM_BLOCK_SIZE = 16                  # vllm/config/cache.py CacheConfig.block_size default on CUDA
VLLM_MAX_NUM_SEQS = 256               # vllm/config/scheduler.py SchedulerConfig.max_num_seqs (ASSUMED default)
VLLM_MAX_NUM_BATCHED_TOKENS = 8192    # the profile run's tokens (SchedulerConfig, V1 default for offline LLM)
ENGINE_TERM = "engine (weights, KV cache, sampling)"


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineBudget:
    """One engine rank's share of the GPU, by vLLM's arithmetic (module docstring), bytes."""

    reserved_bytes: int        # gpu_memory_utilization x the GPU's memory
    weights_bytes: int         # the engine's 16-bit weight shard
    profile_bytes: int         # the profile run's activations and the sampler's fp32 logits
    kv_bytes: int              # what is left for the KV cache (0 when nothing is)
    page_bytes: int            # one block of all the layers
    n_blocks: int
    blocks_per_sequence: int
    max_sequences: int         # sequences held at once: blocks / blocks per sequence, <= max_num_seqs

    @property
    def kv_tokens(self) -> int:
        return self.n_blocks * VLLM_BLOCK_SIZE


def engine_budget(m: ModelSpec, gpu: GpuSpec, rl: RLSetup) -> EngineBudget:
    """vLLM's KV-cache blocks on one engine rank for sequences of prompt_len + response_len."""
    tp = rl.engine_tp
    reserved = int(rl.engine_memory_fraction * gpu.memory_bytes)
    weights = load_weight_bytes(m, LoadSetup(), tp=tp)
    profile = prefill_activation_bytes(m, LoadSetup(batch=1, context=VLLM_MAX_NUM_BATCHED_TOKENS), tp, last_stage=False)
    sampler = 2 * VLLM_MAX_NUM_SEQS * m.vocab_size * 4      # logits and probabilities, fp32
    available = max(0, reserved - weights - profile - sampler)
    page_per_layer = kv_elements_per_token(m, tp) * VLLM_BLOCK_SIZE * 2
    n_blocks = available // page_per_layer // m.n_layers
    per_seq = ceil_div(rl.seq_len, VLLM_BLOCK_SIZE)
    return EngineBudget(reserved_bytes=reserved, weights_bytes=weights, profile_bytes=profile + sampler,
                        kv_bytes=n_blocks * page_per_layer * m.n_layers, page_bytes=page_per_layer * m.n_layers,
                        n_blocks=n_blocks, blocks_per_sequence=per_seq,
                        max_sequences=min(VLLM_MAX_NUM_SEQS, n_blocks // per_seq))


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseMemory:
    """Bytes on one training GPU in each phase of an RL step, by term."""

    generation: dict[str, int]
    scoring: dict[str, int]
    training: dict[str, int]

    def totals(self) -> dict[str, int]:
        return {"generation": sum(self.generation.values()), "scoring": sum(self.scoring.values()),
                "training": sum(self.training.values())}

    @property
    def peak_phase(self) -> str:
        t = self.totals()
        return max(t, key=lambda k: t[k])

    @property
    def peak(self) -> int:
        return max(self.totals().values())

    def largest_engine_fraction(self, capacity_bytes: int, gpu: GpuSpec) -> float | None:
        """The largest gpu_memory_utilization the engine may take beside what stays on the GPU
        during generation (the fraction TRL issue 2927's users look for by trial); None when
        the engine is not on these GPUs."""
        engine = self.generation.get(ENGINE_TERM, 0)
        if not engine:
            return None
        beside = sum(self.generation.values()) - engine
        return max(0.0, (capacity_bytes - beside) / gpu.memory_bytes)


def frozen_copy_bytes(m: ModelSpec, lay: Layout, gpus_per_node: int = 8) -> int:
    """A frozen 16-bit copy of the policy (the reference model) held like the policy: split over
    tp x pp, and where the policy's weights are sharded (ZeRO-3 / FSDP) sharded over the same
    ranks as its dense weights (Layout.weight_shard_ranks: dp x cp x ep, or FSDP hybrid's
    shard group), bytes."""
    w = load_weight_bytes(m, LoadSetup(), tp=lay.tp, pp=lay.pp)
    return ceil_div(w, lay.weight_shard_ranks(gpus_per_node)) if lay.zero_stage >= 3 else w


def logprob_pass_bytes(m: ModelSpec, lay: Layout) -> int:
    """One no-grad forward over a micro-batch for token log-probs: a block's working set
    (prefill_activation_bytes) and the logits in 16 bits with their fp32 log-softmax and its
    fp32 upcast input (the stacks' logprobs_from_logits), vocabulary split over tp."""
    tokens = lay.tokens_per_rank
    fwd = prefill_activation_bytes(m, LoadSetup(batch=lay.micro_batch, context=lay.seq_len_per_rank),
                                   lay.tp, last_stage=False)
    return fwd + tokens * ceil_div(m.vocab_size, lay.tp) * (2 + 4 + 4)


def phase_memory(m: ModelSpec, gpu: GpuSpec, rl: RLSetup, lay: Layout, train: RankMemory,
                 overheads: Overheads = Overheads()) -> PhaseMemory:
    """The three phases on one training GPU (module docstring). ``train`` is the planner's own
    training-step memory of the policy on ``lay`` (RankMemory)."""
    bd = train.breakdown
    distributed = lay.n_gpus > 1      # the fixed costs and fragmentation: Overheads.untracked_bytes
    ref = frozen_copy_bytes(m, lay, gpu.gpus_per_node) if rl.reference_model else 0
    critic = bd.weights + bd.gradients + bd.optimizer if rl.has_critic else 0
    resident = bd.weights + bd.optimizer            # between steps: gradients freed (zero_grad(set_to_none))
    engine = 0
    if rl.generates and rl.placement == "colocated":
        engine = engine_budget(m, gpu, rl).reserved_bytes
    kept = 0 if rl.offload_train_states else resident + ref + critic
    generation: dict[str, int] = {}
    if rl.generates:
        generation = {ENGINE_TERM: engine, "training states kept": kept,
                      "overhead": overheads.untracked_bytes(kept, distributed)}
    awake = 0 if rl.engine_sleeps else engine
    lp = logprob_pass_bytes(m, lay)
    scoring = {"policy states": resident, "reference weights": ref, "critic states": critic,
               "log-prob pass": lp, "engine (awake)": awake,
               "overhead": overheads.untracked_bytes(resident + ref + critic + lp, distributed)}
    training = {"training step": bd.total, "reference weights": ref, "critic states": critic,
                "engine (awake)": awake, "overhead": overheads.fragmentation_bytes(ref + critic)}
    return PhaseMemory(generation=generation, scoring=scoring, training=training)
