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

import math
from dataclasses import dataclass
from functools import lru_cache

from planner.hardware.axes import AXES as PLACEMENT_AXES
from planner.hardware.axes import AxisSizes
from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import Cluster, axis_links, cluster_for
from planner.layouts.layout import Layout
from planner.memory.inference import kv_cache_bytes, mamba_state_bytes
from planner.memory.rollout import VLLM_BLOCK_SIZE, VLLM_MAX_NUM_SEQS, EngineBudget
from planner.models.spec import ModelSpec, count_params
from planner.timing.collectives import all_reduce_s, gather_s
from planner.timing.efficiency import Efficiency
from planner.timing.flops import head_flops, layer_flops
from planner.timing.host_link import HOST_COPY_BYTES_PER_S
from planner.timing.kernels import rates
from planner.timing.step import StepTime
from planner.training.posttrain import RLSetup
from planner.units import ceil_div

# Time per decode step that the physical terms (weights and KV cache at the HBM fraction, the
# tp all-reduces) leave out, seconds: vLLM's host work per step (scheduler, input preparation,
# sampling, output processing) and the gaps between CUDA-graph replays, and whatever else each
# step costs beyond them (MoE kernels below the HBM fraction at a few tokens per expert).
# FITTED: the one free value of the RL step time, least squares on the relative errors of
# NeMo-RL's five on-policy GRPO rows (16.25 ms when fitted; 16.37 ms, leave one row out 13.4 to
# 28.7 ms, on the tree after the MoE changes: bench/posttrain_nemo_rl.py; kept, not refitted on
# the five 1-step-off rows, which it predicts out of sample). Not measured: no published
# per-step figure for vLLM at these batches was found, and the value stands for every per-step
# cost not modelled, not the host time alone (the dense rows ask for about 10 ms, Qwen3-30B-A3B for about 38 ms).
DECODE_STEP_OVERHEAD_S = 16.2e-3


def distinct_experts(n_experts: int, top_k: int, batch: float) -> float:
    """Expected number of distinct routed experts that ``batch`` tokens touch in one MoE
    layer, each token picking ``top_k`` of ``n_experts``: E x (1 - (1 - k/E)^B).

    ASSUMED uniform, independent routing (the load-balancing loss drives routing towards
    uniform; real routers are skewed, which touches fewer experts). One decode step of B
    sequences reads every expert touched, so at B of a few hundred nearly all experts are read,
    not the active parameters. Experts (count)."""
    if n_experts <= 0 or batch <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** batch)


def decode_weight_bytes(m: ModelSpec, shard_bytes: int, batch: float) -> float:
    """16-bit weight bytes one engine rank reads in one decode step of ``batch`` sequences:
    its whole shard (``shard_bytes``, the engine's weights over its tp) less the routed experts
    no sequence routes to (distinct_experts). vLLM's fused MoE kernel reads only the experts
    that received tokens (vllm/model_executor/layers/fused_moe: tokens are sorted by expert and
    each expert's block of weights is loaded once). Under tensor parallelism every expert is
    split over the engine's tp like the dense matrices, so the untouched share is the same on
    each rank. Bytes."""
    if not m.is_moe:
        return float(shard_bytes)
    pc = count_params(m)
    untouched = m.n_experts - distinct_experts(m.n_experts, m.n_experts_per_token, batch)
    share_idle = untouched * pc.one_expert * pc.n_moe_layers / max(1, pc.total)
    return shard_bytes * (1.0 - share_idle)


def decode_collective_s(m: ModelSpec, batch: int, engine_tp: int, cluster: Cluster,
                        eff: Efficiency = Efficiency()) -> float:
    """Tensor-parallel all-reduces of one decode step: two per layer (after attention's output
    projection and after the MLP or MoE block: vLLM's RowParallelLinear, Megatron's tensor
    parallelism, Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3) of ``batch`` tokens x hidden in
    16-bit, on the engine's tp link (planner.hardware.placement.axis_links; a tp above a node's
    GPUs crosses the network). These messages are a few KiB to a MiB: the time is mostly hop
    latency, paid on the critical path of every step (nothing else runs beside them). Seconds."""
    if engine_tp <= 1:
        return 0.0
    link = axis_links(cluster, AxisSizes(tp=engine_tp))["tp"]
    return 2 * m.n_layers * all_reduce_s(2 * batch * m.d_model, engine_tp, link, eff)


@lru_cache(maxsize=64)
def forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the whole model (blocks and LM head), the convention of
    planner.timing.flops (full s x s scores). Kept per (model, length): post-training searches
    ask it twice per candidate layout (40,148 times for Kimi K2 distilled on 16,384 H100)."""
    return m.n_layers * layer_flops(m, seq_len).total + head_flops(m)


def training_flop_rate_per_gpu(t: StepTime) -> float:
    """The FLOP rate one GPU reaches in the training step's compute (hardware FLOPs over the
    compute seconds of the slowest stage), FLOP/s."""
    return t.hardware_flops / t.n_gpus / max(t.compute_s, 1e-12)


def forward_pass_s(m: ModelSpec, seq_len: int, n_tokens: float, n_gpus: int, t: StepTime) -> float:
    """A no-grad forward of ``n_tokens`` tokens over ``n_gpus`` GPUs at the training step's
    rate, seconds."""
    return forward_flops_per_token(m, seq_len) * n_tokens / n_gpus / training_flop_rate_per_gpu(t)


def logprob_pass_s(m: ModelSpec, seq_len: int, n_tokens: float, n_gpus: int, t: StepTime) -> float:
    """An RL log-prob pass (the policy's old log-probs, the reference's, PPO's values): a
    no-grad forward of ``n_tokens`` over the training GPUs, run by the training stack itself
    (NeMo-RL's ``get_logprobs`` on the Megatron policy workers, the same tp/pp/cp layout and
    micro-batches), so it pays what the training step pays per FLOP: its tensor-parallel
    collectives, pipeline bubbles and exposed data movement, not the matmuls alone. Its FLOPs
    at the training step's whole hardware rate (StepTime.hardware_flops_per_s_per_gpu:
    hardware FLOPs over the step time), seconds."""
    return forward_flops_per_token(m, seq_len) * n_tokens / n_gpus / max(t.hardware_flops_per_s_per_gpu, 1e-12)


def fsdp_gather_s(weight_bytes: int, dp: int, cluster: Cluster, eff: Efficiency) -> float:
    """One all-gather of ``weight_bytes`` over the data-parallel group (FSDP's gathers of a
    sharded teacher for each forward, or of the policy for the weight resync), seconds."""
    if dp <= 1:
        return 0.0
    link = axis_links(cluster, AxisSizes(dp=dp))["dp"]
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
    decode_steps: int = 0    # decode steps one engine runs (decode_steps)
    collective_s: float = 0.0   # of decode_s: the tp all-reduces' time
    overhead_s: float = 0.0     # of decode_s: the fitted per-step time (DECODE_STEP_OVERHEAD_S)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def generation_time(m: ModelSpec, gpu: GpuSpec, rl: RLSetup, n_gen_gpus: int, budget: EngineBudget,
                    eff: Efficiency = Efficiency(), cluster: Cluster | None = None,
                    step_overhead_s: float | None = None) -> GenerationTime:
    """Prefill and decode of prompts x group sequences on n_gen_gpus / engine_tp engines.

    Prefill: the forward FLOPs of the prompt tokens at the matmul rate of engine_tp GPUs.
    Decode: decode_steps steps of up to ``concurrent`` sequences (continuous batching; the
    longest response sets the last ones, RLSetup.response_mean). Each step reads the weights its batch touches
    (decode_weight_bytes: the whole shard for dense models, the experts any sequence routes to
    for MoE), and each sequence of mean length r reads the KV cache of its context at each of
    its steps, r x (prompt + r / 2) token-rows in all; the memory-bound time of those bytes at
    the HBM fraction of the efficiency model, or the compute-bound time of 2 x active
    parameters FLOPs per generated token, whichever is longer; plus, every step, the engine's
    tp all-reduces (decode_collective_s) and the fitted time per step not otherwise modelled
    (``step_overhead_s``, default DECODE_STEP_OVERHEAD_S), which nothing hides. The sequences
    an engine holds at once are its KV-cache blocks over the blocks a sequence of mean length
    needs (vLLM allocates blocks as sequences grow), at most max_num_seqs."""
    cluster = cluster or cluster_for(gpu)
    per_step = DECODE_STEP_OVERHEAD_S if step_overhead_s is None else step_overhead_s
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
    # one token of every layer on one rank; a hybrid's Mamba layers keep a fixed state per
    # sequence instead (memory.inference.mamba_state_bytes), read and written at every decode step
    state_bytes = mamba_state_bytes(m, 1, e_tp)
    kv_row_bytes = kv_cache_bytes(m, 1, 1, tp=e_tp) - state_bytes
    mean = rl.mean_response
    steps = decode_steps(per_engine, concurrent, mean, rl.response_len)
    kv_reads = per_engine * mean * ((rl.prompt_len + mean / 2) * kv_row_bytes + 2 * state_bytes)
    memory_s = (steps * decode_weight_bytes(m, budget.weights_bytes, concurrent) + kv_reads) / r.hbm_bytes_per_s
    compute_s = 2 * active * per_engine * mean / (e_tp * r.matmul_flops_per_s)
    comm_s = steps * decode_collective_s(m, concurrent, e_tp, cluster, eff)
    overhead_s = steps * per_step
    return GenerationTime(prefill_s=prefill_s, decode_s=max(memory_s, compute_s) + comm_s + overhead_s,
                          n_engines=n_engines, sequences_per_engine=per_engine, concurrent=concurrent,
                          waves=waves, decode_steps=steps, collective_s=comm_s, overhead_s=overhead_s)


def decode_steps(n_sequences: int, concurrent: int, mean_response: int, response_len: int) -> int:
    """Decode steps one engine runs for ``n_sequences`` of mean response ``mean_response``
    with at most ``concurrent`` in flight, under continuous batching (vLLM's scheduler admits
    a waiting sequence as soon as one finishes; Yu et al. 2022, Orca, OSDI, Sec. 3.1). All
    fit at once: the longest response sets the steps, response_len (ASSUMED: one sequence per
    engine reaches the limit, the truncated tail RL rollouts have). More: the slots stay full
    while sequences wait, n x mean / concurrent steps of generated tokens, and the last
    admitted sequence may still run to the limit, response_len - mean more steps. It leaves
    out the start-up lag (every slot starts at once, so the first sequences finish together,
    late): against a simulated scheduler (tests/test_posttrain.py) it counts up to 9% fewer
    steps. Steps."""
    if n_sequences <= concurrent:
        return response_len
    return ceil_div(n_sequences * mean_response, concurrent) + response_len - mean_response


def resync_s(m: ModelSpec, lay: Layout, engine_tp: int, colocated: bool, cluster: Cluster,
             eff: Efficiency = Efficiency()) -> float:
    """The policy's new weights into the engines (NeMo-RL's "refit", verl's weight sync), seconds.

    Colocated, as NeMo-RL does it (NeMo-RL blog, "Journey of Optimizing Weight Transfer in
    Large MoE Models by 10x", 2025-08-12: policy parameter gather, CUDA-IPC handles to the vLLM
    workers on the same GPU, vLLM's load_weights; nemo_rl/models/megatron/refit_utils.py
    ``gather_params`` gathers each parameter over the pipeline and expert groups): every
    training GPU receives the full 16-bit weights from the ranks that shard them (tp x pp x ep,
    and dp under ZeRO-3/FSDP), an all-gather on the slowest link of that group, then copies
    its engine shard into the engine's buffers (one HBM read and write). On separate rollout
    GPUs the weights are broadcast over the network at the GPU's NIC bandwidth."""
    weights = 2 * count_params(m).total
    r = rates(cluster.gpu, "bf16", eff)
    if not colocated:
        return weights / cluster.gpu.inter_node_bytes_per_s
    dp_shard = lay.dp if lay.zero_stage >= 3 else 1
    sizes = AxisSizes(tp=lay.tp, ep=lay.ep, dp=dp_shard, pp=lay.pp)
    n = math.prod(sizes)
    copy_s = 2 * ceil_div(weights, engine_tp) / r.hbm_bytes_per_s
    if n <= 1:
        return copy_s
    links = axis_links(cluster, sizes)
    slowest = min((links[a] for a, k in zip(PLACEMENT_AXES, sizes) if k > 1),
                  key=lambda link: link.bus_bytes_per_s)
    return gather_s(weights, n, slowest, eff) + copy_s


# The phases of an RL step that run on the engines (planner.search.posttrain.rl_choice's keys)
GENERATION_PHASES = ("generation: prefill", "generation: decode")


def rl_step_s(times_s: dict[str, float], overlapped: bool) -> float:
    """One RL step from its phases' seconds. On-policy: the phases take turns, their sum.
    Asynchronous (RLSetup.overlapped; NeMo-RL's async GRPO, docs/guides/async-grpo.md: the
    trajectory collector generates the next batch on the engines' own GPUs while the training
    loop trains on the last one, then the new weights are sent to the engines): in the steady
    state the slower side sets the step, max(generation on the engines' GPUs, everything else
    on the training GPUs: log-prob passes, training, the weight resync). ASSUMED: the resync
    counts on the training side only (in-flight weight updates: the engines do not wait for it),
    and how many steps off (max_trajectory_age_steps) does not change the steady state, only
    how much a slow step can be absorbed. Seconds."""
    gen, rest = generation_and_rest_s(times_s)
    return max(gen, rest) if overlapped else gen + rest


def generation_and_rest_s(times_s: dict[str, float]) -> tuple[float, float]:
    """An RL step's phases split by where they run: generation (GENERATION_PHASES, the engines)
    and the rest (log-prob passes, training, resync, offload: the training GPUs), seconds."""
    gen = sum(v for k, v in times_s.items() if k in GENERATION_PHASES)
    return gen, sum(times_s.values()) - gen


def offload_s(n_bytes: int) -> float:
    """Training states to the host and back once per step (out before generation, in after),
    at HOST_COPY_BYTES_PER_S each way, seconds."""
    return 2 * n_bytes / HOST_COPY_BYTES_PER_S
