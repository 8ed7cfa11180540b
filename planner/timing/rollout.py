"""Post-training step times beside the training step: the teacher's forward (distillation),
and an RL step's generation, log-prob passes and weight resync.

Forward passes that train nothing (the teacher's, the reference's and the policy's log-prob
passes) run the same matrix multiplies as the training forward, so they take their FLOPs at
the rate the training step reaches on the same GPUs (StepTime: hardware FLOPs over compute
seconds): a forward is a third of a training pass's FLOPs (backward twice forward, Kaplan et
al. 2020, Sec. 2.1). Generation is an inference engine's (vLLM): the prompts' prefill is
compute-bound (FLOPs at the matmul rate, planner.timing.kernels.rates), each decode step
reads the engine's weights and the KV cache of the sequences in flight from HBM once
(memory-bound at small batch, Pope et al. 2022, arXiv:2211.05102, Sec. 2-3), or is
compute-bound when the batch is large: the larger of the two per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import Cluster, axis_links
from planner.memory.inference import kv_cache_bytes
from planner.memory.rollout import VLLM_BLOCK_SIZE, VLLM_MAX_NUM_SEQS, EngineBudget
from planner.models.spec import ModelSpec, count_params
from planner.timing.collectives import gather_s
from planner.timing.efficiency import Efficiency
from planner.timing.flops import head_flops, layer_flops
from planner.timing.kernels import rates
from planner.timing.step import StepTime
from planner.training.posttrain import RLSetup
from planner.units import ceil_div

# Host <-> GPU copies of offloaded training states: PCIe Gen5 x16 is 64 GB/s per direction
# (PCI-SIG, PCIe 5.0 specification); pinned-memory copies reach about 50 GB/s on H100 hosts
# (ASSUMED: 0.8 of the link, as NVIDIA's bandwidthTest reports on Gen5 hosts).
HOST_COPY_BYTES_PER_S = 50e9


def forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the whole model (blocks and LM head), the convention of
    planner.timing.flops (full s x s scores)."""
    return m.n_layers * layer_flops(m, seq_len).total + head_flops(m)


def training_flop_rate_per_gpu(t: StepTime) -> float:
    """The FLOP rate one GPU reaches in the training step's compute (hardware FLOPs over the
    compute seconds of the slowest stage), FLOP/s."""
    return t.hardware_flops / t.n_gpus / max(t.compute_s, 1e-12)


def forward_pass_s(m: ModelSpec, seq_len: int, n_tokens: float, n_gpus: int, t: StepTime) -> float:
    """A no-grad forward of ``n_tokens`` tokens over ``n_gpus`` GPUs at the training step's
    rate, seconds."""
    return forward_flops_per_token(m, seq_len) * n_tokens / n_gpus / training_flop_rate_per_gpu(t)


def fsdp_gather_s(weight_bytes: int, dp: int, cluster: Cluster, eff: Efficiency) -> float:
    """One all-gather of ``weight_bytes`` over the data-parallel group (FSDP's gathers of a
    sharded teacher for each forward, or of the policy for the weight resync), seconds."""
    if dp <= 1:
        return 0.0
    link = axis_links(cluster, (1, 1, 1, dp, 1))["dp"]
    return gather_s(weight_bytes, dp, link, eff)


@dataclass(frozen=True, kw_only=True, slots=True)
class GenerationTime:
    """One step's generation on the engines (seconds), and how it ran."""

    prefill_s: float
    decode_s: float
    n_engines: int
    sequences_per_engine: int
    concurrent: int          # sequences one engine decodes at once (KV cache and max_num_seqs)
    waves: int               # batches of ``concurrent`` sequences one engine runs in turn

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def generation_time(m: ModelSpec, gpu: GpuSpec, rl: RLSetup, n_gen_gpus: int, budget: EngineBudget,
                    eff: Efficiency = Efficiency()) -> GenerationTime:
    """Prefill and decode of prompts x group sequences on n_gen_gpus / engine_tp engines.

    Prefill: the forward FLOPs of the prompt tokens at the matmul rate of engine_tp GPUs.
    Decode, per wave of ``concurrent`` sequences: the wave lasts response_len steps (its
    longest response, RLSetup.response_mean); every step reads the engine's weight shard, and
    each sequence of mean length r reads the KV cache of its context at each of its steps,
    r x (prompt + r / 2) token-rows in all; the memory-bound time of those bytes, or the
    compute-bound time of 2 x active parameters FLOPs per generated token, whichever is longer.
    The sequences an engine holds at once are its KV-cache blocks over the blocks a sequence
    of mean length needs (vLLM allocates blocks as sequences grow), at most max_num_seqs."""
    e_tp = rl.engine_tp
    n_engines = max(1, n_gen_gpus // e_tp)
    per_engine = ceil_div(rl.prompts_per_step * rl.group_size, n_engines)
    mean_blocks = ceil_div(rl.prompt_len + rl.mean_response, VLLM_BLOCK_SIZE)
    concurrent = max(1, min(per_engine, VLLM_MAX_NUM_SEQS, budget.n_blocks // mean_blocks))
    waves = ceil_div(per_engine, concurrent)
    r = rates(gpu, "bf16", eff)
    prompt_tokens = per_engine * rl.prompt_len
    prefill_s = forward_flops_per_token(m, rl.prompt_len) * prompt_tokens / (e_tp * r.matmul_flops_per_s)
    active = count_params(m).active
    kv_row_bytes = kv_cache_bytes(m, 1, 1, tp=e_tp)          # one token of every layer on one rank
    mean = rl.mean_response

    def wave_s(n: int) -> float:
        kv_reads = n * mean * (rl.prompt_len + mean / 2) * kv_row_bytes
        memory_s = (rl.response_len * budget.weights_bytes + kv_reads) / r.hbm_bytes_per_s
        compute_s = 2 * active * n * mean / (e_tp * r.matmul_flops_per_s)
        return max(memory_s, compute_s)

    full, rest = divmod(per_engine, concurrent)       # whole waves, then the remainder
    decode_s = full * wave_s(concurrent) + (wave_s(rest) if rest else 0.0)
    return GenerationTime(prefill_s=prefill_s, decode_s=decode_s, n_engines=n_engines,
                          sequences_per_engine=per_engine, concurrent=concurrent, waves=waves)


def resync_s(m: ModelSpec, dp: int, engine_tp: int, colocated: bool, cluster: Cluster,
             eff: Efficiency = Efficiency()) -> float:
    """The policy's new weights into the engines (NeMo-RL's "refit", verl's weight sync):
    colocated, the 16-bit weights are gathered from their data-parallel shards and copied into
    the engine's buffers on the same GPU (an all-gather over dp and one HBM copy of the
    engine's shard); on separate rollout GPUs they are broadcast over the network at the
    GPU's NIC bandwidth. Seconds."""
    weights = 2 * count_params(m).total
    r = rates(cluster.gpu, "bf16", eff)
    if colocated:
        return fsdp_gather_s(weights, dp, cluster, eff) + 2 * ceil_div(weights, engine_tp) / r.hbm_bytes_per_s
    return weights / cluster.gpu.inter_node_bytes_per_s


def offload_s(n_bytes: int) -> float:
    """Training states to the host and back once per step (out before generation, in after),
    at HOST_COPY_BYTES_PER_S each way, seconds."""
    return 2 * n_bytes / HOST_COPY_BYTES_PER_S
