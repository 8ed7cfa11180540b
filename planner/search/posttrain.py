"""Post-training plans: the fewest GPUs (or a given count) on which distillation or an RL step
fits, and the fastest layout there.

Both walk the GPU counts as the training search does (planner.search.search) and, on each,
take the student's (policy's) fitting layouts ranked by their own step time; each is then sized
with what post-training adds (planner.memory.distill, planner.memory.rollout) and timed with
its extra passes (planner.timing.rollout). The first count with a layout that fits everything
wins, with its fastest such layout. The teacher's sharding is searched per layout
(memory.distill.best_distill_memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner.errors import UserError
from planner.fmt import gib
from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import Layout, SearchSpace
from planner.memory.distill import DistillMemory, best_distill_memory
from planner.memory.rollout import EngineBudget, PhaseMemory, engine_budget, frozen_copy_bytes, phase_memory
from planner.models.spec import ModelSpec, count_params
from planner.search.search import Candidate, gpu_counts, search
from planner.timing.efficiency import Efficiency
from planner.timing.model import Cluster, StepTime, cluster_for, scale_up_domain_gpus
from planner.timing.rollout import (
    GenerationTime,
    forward_flops_per_token,
    forward_pass_s,
    fsdp_gather_s,
    generation_time,
    logprob_pass_s,
    offload_s,
    resync_s,
    rl_step_s,
)
from planner.training.posttrain import DistillSetup, RLSetup
from planner.training.setup import TrainingSetup


@dataclass(frozen=True, kw_only=True, slots=True)
class DistillChoice:
    """A student layout with the teacher held on it: memory and step time."""

    candidate: Candidate
    teacher: DistillMemory
    total_bytes: int                 # the student's peak + the teacher's terms (+ their fragmentation)
    teacher_forward_s: float         # the teacher's forward over the step's tokens
    teacher_gather_s: float          # FSDP: its all-gathers per step, not hidden (ASSUMED exposed)
    teacher_flops: float             # the teacher's forward FLOPs per step, all GPUs

    @property
    def student_time(self) -> StepTime:
        assert self.candidate.time is not None
        return self.candidate.time

    @property
    def step_time_s(self) -> float:
        return self.student_time.step_time_s + self.teacher_forward_s + self.teacher_gather_s


@dataclass(frozen=True, kw_only=True, slots=True)
class RLChoice:
    """A policy layout and its RL step: memory by phase, time by phase."""

    candidate: Candidate
    phases: PhaseMemory
    engine: EngineBudget | None
    generation: GenerationTime | None
    times_s: dict[str, float]
    overlapped: bool = False         # asynchronous RL: generation beside the rest (RLSetup.overlapped)

    @property
    def step_time_s(self) -> float:
        return rl_step_s(self.times_s, self.overlapped)


@dataclass(frozen=True, kw_only=True, slots=True)
class PosttrainPlan:
    """The chosen layout on the smallest count that fits (None when nothing fits up to
    max_gpus), the GPU counts tried and the capacity per GPU."""

    model: ModelSpec
    gpu: GpuSpec
    setup: TrainingSetup
    capacity_bytes: int
    counts_tried: tuple[int, ...]
    distill: DistillChoice | None = None
    rl: RLChoice | None = None
    teacher: ModelSpec | None = None
    distill_setup: DistillSetup | None = None
    rl_setup: RLSetup | None = None
    alternatives: tuple[DistillChoice | RLChoice, ...] = ()
    steps: int | None = None          # the run's steps (--rl-steps; distillation: --tokens over the batch)

    @property
    def fits(self) -> bool:
        return self.distill is not None or self.rl is not None

    @property
    def chosen(self) -> DistillChoice | RLChoice | None:
        return self.distill if self.distill is not None else self.rl

    @property
    def run_time_s(self) -> float | None:
        """The whole run: steps x the chosen layout's step time (None without steps or a plan)."""
        c = self.chosen
        return None if c is None or self.steps is None else self.steps * c.step_time_s

    @property
    def n_gpus(self) -> int | None:
        """Every GPU the run holds: the chosen layout's, and the engines' own beside them
        (RLSetup.engine_gpus) (None without a plan)."""
        c = self.chosen
        if c is None:
            return None
        n = c.candidate.layout.n_gpus
        return n + (self.rl_setup.engine_gpus(n) if self.rl_setup is not None else 0)

    @property
    def gpu_hours(self) -> float | None:
        """GPU-hours of the run on every GPU it holds, the engines' own included (before,
        --rollout separate counted the training GPUs alone: half the hours)."""
        n, t = self.n_gpus, self.run_time_s
        return None if n is None or t is None else n * t / 3600


def _counts(gpu: GpuSpec, n_gpus: int | None, max_gpus: int) -> list[int]:
    return [n_gpus] if n_gpus is not None else gpu_counts(gpu.gpus_per_node, max_gpus)


def _fitting(m: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, cap: int, n: int, space: SearchSpace,
             cluster: Cluster, eff: Efficiency) -> tuple[Candidate, ...]:
    """The layouts on n GPUs whose own training step fits, fastest first (search.search)."""
    from planner.timing.fast import step_times

    pc = count_params(m)

    def batch_timer(layouts: Sequence[Layout]) -> list[StepTime]:
        return step_times(m, setup, layouts, cluster, eff, pc)

    return search(m, setup, cap, gpu.gpus_per_node, [n], space, batch_timer=batch_timer).fitting


def _space(space: SearchSpace, gpu: GpuSpec, cluster: Cluster) -> SearchSpace:
    if space.max_tp is None:
        return replace(space, max_tp=max(gpu.gpus_per_node, scale_up_domain_gpus(cluster)))
    return space


def distill_choice(student: ModelSpec, teacher: ModelSpec, setup: TrainingSetup, d: DistillSetup, c: Candidate,
                   cluster: Cluster, eff: Efficiency) -> DistillChoice:
    """The teacher's terms and times on one student candidate (which has its step time)."""
    lay = c.layout
    tm = best_distill_memory(student, teacher, setup, d, lay)
    total = c.memory.total + tm.extra + int(setup.overheads.fragmentation * tm.extra)
    t = c.time
    assert t is not None
    tokens = t.tokens_per_step
    fwd_s = forward_pass_s(teacher, lay.seq_len, tokens, lay.n_gpus, t) if d.online else 0.0
    flops = forward_flops_per_token(teacher, lay.seq_len) * tokens if d.online else 0.0
    gather = 0.0
    if tm.sharding == "fsdp":   # one all-gather of the teacher per micro-batch
        whole = tm.teacher_weights * lay.dense_shard_degree
        gather = lay.grad_accum * fsdp_gather_s(whole, lay.dense_shard_degree, cluster, eff)
    return DistillChoice(candidate=c, teacher=tm, total_bytes=total, teacher_forward_s=fwd_s,
                         teacher_gather_s=gather, teacher_flops=flops)


def plan_distill(student: ModelSpec, teacher: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, d: DistillSetup,
                 space: SearchSpace = SearchSpace(), n_gpus: int | None = None, max_gpus: int = 16_384,  # noqa: B008
                 cluster: Cluster | None = None, efficiency: Efficiency = Efficiency()) -> PosttrainPlan:
    """Distillation on the fewest GPUs that hold the student's training step and the teacher's
    terms, the fastest such layout (student step + teacher forward + exposed gathers)."""
    cluster = cluster or cluster_for(gpu)
    cap = int(gpu.memory_bytes * setup.usable_memory_fraction)
    space = _space(space, gpu, cluster)
    tried: list[int] = []
    for n in _counts(gpu, n_gpus, max_gpus):
        tried.append(n)
        choices = [distill_choice(student, teacher, setup, d, c, cluster, efficiency)
                   for c in _fitting(student, setup, gpu, cap, n, space, cluster, efficiency)]
        ok = sorted((ch for ch in choices if ch.total_bytes <= cap), key=lambda ch: ch.step_time_s)
        if ok:
            return PosttrainPlan(model=student, gpu=gpu, setup=setup, capacity_bytes=cap, counts_tried=tuple(tried),
                                 distill=ok[0], teacher=teacher, distill_setup=d, alternatives=tuple(ok[1:4]))
    return PosttrainPlan(model=student, gpu=gpu, setup=setup, capacity_bytes=cap, counts_tried=tuple(tried),
                         teacher=teacher, distill_setup=d)


def rl_choice(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, rl: RLSetup, c: Candidate, cluster: Cluster,
              eff: Efficiency) -> RLChoice:
    """Phases' memory and times of one policy layout (which has its training step time)."""
    lay = c.layout
    t = c.time
    assert t is not None
    phases = phase_memory(m, gpu, rl, lay, c.memory, setup.overheads)
    tokens = rl.sequences_per_step * (rl.prompt_len + rl.mean_response)
    times: dict[str, float] = {}
    engine = gen = None
    if rl.generates:
        engine = engine_budget(m, gpu, rl)
        gen = generation_time(m, gpu, rl, lay.n_gpus, engine, eff, cluster)
        times["generation: prefill"] = gen.prefill_s
        times["generation: decode"] = gen.decode_s
    # log-prob passes: the policy's old log-probs (verl, NeMo-RL) and the reference's
    passes = (1 if rl.task != "dpo" else 0) + (1 if rl.reference_model else 0) + (1 if rl.has_critic else 0)
    times["log-prob passes"] = passes * logprob_pass_s(m, rl.seq_len, tokens, lay.n_gpus, t)
    # the training step is sized at full length; its time follows the packed tokens
    times["training"] = t.step_time_s * rl.token_share * (2 if rl.has_critic else 1)
    if rl.generates:
        times["weight resync"] = resync_s(m, lay, rl.engine_tp, rl.placement == "colocated", cluster, eff)
        if rl.offload_train_states and rl.placement == "colocated":
            bd = c.memory.breakdown
            ref = frozen_copy_bytes(m, lay, gpu.gpus_per_node) if rl.reference_model else 0
            times["offload and reload"] = offload_s(bd.weights + bd.optimizer + ref)
    return RLChoice(candidate=c, phases=phases, engine=engine, generation=gen, times_s=times,
                    overlapped=rl.overlapped)


def splits_kv_heads(m: ModelSpec, engine_tp: int) -> bool:
    """An engine tensor-parallel size vLLM takes for ``m``: it divides the KV heads, or they divide it
    (each rank then holds a replica of one head)."""
    return m.n_kv_heads % engine_tp == 0 or engine_tp % m.n_kv_heads == 0


def engine_refusal(m: ModelSpec, gpu: GpuSpec, rl: RLSetup) -> str | None:
    """The refusal of an RL plan whose rollout engine cannot hold one sequence, or None.

    The engine's share of a GPU does not depend on the policy's layout or GPU count
    (memory.rollout.engine_budget: its weights at --rollout-tp, the profile run and the
    sampler within --rollout-memory-fraction of one GPU), and search.posttrain.plan_rl keeps
    only layouts whose engine holds at least one sequence (EngineBudget.max_sequences >= 1).
    When it holds none, no GPU count can, so the plan is refused at once, naming the way
    out: the smallest larger --rollout-tp (a power of two up to the option's 64 that splits the
    KV heads) whose engine holds one.
    plan_rl asks it first. Issue 32's hunt: `plan --model 70b --gpus h100 --task
    grpo` took about 100 s of CPU to sweep 33 GPU counts and print "nothing fits on up to
    16384 x h100", advising more GPUs (Llama 3.1 70B's 16-bit weights on one engine GPU are
    131 GiB)."""
    if not rl.generates:
        return None
    budget = engine_budget(m, gpu, rl)
    if budget.max_sequences >= 1:
        return None
    wider = next((tp for tp in (2**k for k in range(1, 7)) if tp > rl.engine_tp and splits_kv_heads(m, tp)
                  and engine_budget(m, gpu, replace(rl, engine_tp=tp)).max_sequences >= 1), None)
    way_out = (f"give --rollout-tp {wider} (or more)" if wider is not None else
               "no --rollout-tp up to 64 holds one: give a GPU with more memory or shorter --prompt-len / "
               "--response-len")
    return (f"the rollout engine cannot hold one sequence of {rl.seq_len:,} tokens at --rollout-tp {rl.engine_tp}: "
            f"its {gib(budget.weights_bytes)} of weights and {gib(budget.profile_bytes)} of profile run and "
            f"sampler leave {gib(budget.kv_bytes)} of the {gib(budget.reserved_bytes)} it may take "
            f"(--rollout-memory-fraction {rl.engine_memory_fraction:g} of {gpu.name}) for the KV cache, on any "
            f"GPU count; {way_out}")


def colocated_refusal(gpu: GpuSpec, setup: TrainingSetup, rl: RLSetup) -> str | None:
    """The refusal of a colocated RL plan whose engine leaves less of each GPU than the fixed
    costs every rank holds beyond its tensors, or None.

    In the generation phase a training GPU holds the engine's --rollout-memory-fraction, the
    training states it keeps and their untracked bytes (memory.rollout.phase_memory); the
    states shrink as the GPU count grows, the fixed costs (Overheads.fixed_bytes: the CUDA
    context and library workspaces, NCCL when distributed) do not. When the engine and the
    smaller fixed cost already pass the plan's memory (--usable-memory of the GPU), no GPU
    count fits (search.posttrain.plan_rl's peak <= capacity), and the plan is refused at once.
    plan_rl asks it first. Issue 32's hunt: `plan --model 8b --gpus h100 --task grpo
    --rollout-memory-fraction 1` swept every GPU count to 16,384 for over 120 s of CPU."""
    if not rl.generates or rl.placement != "colocated":
        return None
    cap = int(gpu.memory_bytes * setup.usable_memory_fraction)
    fixed = min(setup.overheads.fixed_bytes(False), setup.overheads.fixed_bytes(True))
    reserved = int(rl.engine_memory_fraction * gpu.memory_bytes)
    if reserved + fixed <= cap:
        return None
    most = (cap - fixed) / gpu.memory_bytes
    way_out = (f"give --rollout-memory-fraction {math.floor(most * 100) / 100:g} or less, or --rollout separate"
               if most >= 0.05 else "give --rollout separate")
    return (f"--rollout-memory-fraction {rl.engine_memory_fraction:g} gives the colocated engine {gib(reserved)} of "
            f"each {gpu.name}, and every rank holds at least {gib(fixed)} beyond its tensors (CUDA context, library "
            f"workspaces): more than the {gib(cap)} a plan may use, on any GPU count; {way_out}")


def plan_rl(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, rl: RLSetup, space: SearchSpace = SearchSpace(),  # noqa: B008
            n_gpus: int | None = None, max_gpus: int = 16_384, cluster: Cluster | None = None,
            efficiency: Efficiency = Efficiency()) -> PosttrainPlan:
    """An RL step on the fewest GPUs whose every phase fits (the engine's KV cache holding at
    least one sequence), the fastest layout by the sum of the phases' times. Refused at once
    (UserError) where no GPU count can fit: engine_refusal, colocated_refusal."""
    refusal = engine_refusal(m, gpu, rl) or colocated_refusal(gpu, setup, rl)
    if refusal:
        raise UserError(refusal)
    cluster = cluster or cluster_for(gpu)
    cap = int(gpu.memory_bytes * setup.usable_memory_fraction)
    space = _space(space, gpu, cluster)
    setup = replace(setup, seq_len=rl.seq_len, global_batch=rl.sequences_per_step)
    tried: list[int] = []
    for n in _counts(gpu, n_gpus, max_gpus):
        tried.append(n)
        choices = [rl_choice(m, gpu, setup, rl, c, cluster, efficiency)
                   for c in _fitting(m, setup, gpu, cap, n, space, cluster, efficiency)]
        ok = sorted((ch for ch in choices if ch.phases.peak <= cap
                     and (ch.engine is None or ch.engine.max_sequences >= 1)), key=lambda ch: ch.step_time_s)
        if ok:
            return PosttrainPlan(model=m, gpu=gpu, setup=setup, capacity_bytes=cap, counts_tried=tuple(tried),
                                 rl=ok[0], rl_setup=rl, alternatives=tuple(ok[1:4]))
    return PosttrainPlan(model=m, gpu=gpu, setup=setup, capacity_bytes=cap, counts_tried=tuple(tried), rl_setup=rl)
