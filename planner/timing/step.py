"""The step: its named parts (StepParts) on one placement, and StepTime, the best placement's,
read from them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from planner.hardware.placement import (
    Cluster,
)
from planner.hardware.topology import AXES
from planner.layouts.layout import Layout
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.timing.dp import dp_collectives, dp_parts, optimizer_time_s, trained_split
from planner.timing.efficiency import DEFAULT_EFFICIENCY, PLACEMENT_ORDERS, Efficiency
from planner.timing.flops import StepFlops, flops_per_step
from planner.timing.kernels import LayerTime, layer_time
from planner.timing.pipeline import (
    PipelinePart,
    block_kernels,
    layer_key,
    pipeline_part,
)
from planner.training.finetune import (
    RankSplit,
)
from planner.training.setup import (
    Precision,
    TrainingSetup,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTime:
    """The predicted time of one optimizer step and what it is made of (seconds).

    compute_s: matmuls, attention and element-wise kernels of every micro-batch on the
    slowest stage; comm_s: the exposed (not overlapped) communication per axis; bubble_s:
    pipeline fill and drain, (p-1)/v micro-batch times (Narayanan et al. 2021, Sec. 2.2:
    the bubble fraction of 1F1B is (p-1)/m, of the interleaved schedule (p-1)/(v m));
    optimizer_s: the optimizer update.
    """

    compute_s: float
    comm_s: dict[str, float] = field(default_factory=dict)
    bubble_s: float
    optimizer_s: float
    micro_batch_s: float          # one micro-batch, forward and backward, on the slowest stage
    step_time_s: float
    tokens_per_step: int
    n_gpus: int
    model_flops: float
    hardware_flops: float
    peak_flops_per_s: float
    placement: tuple[str, ...] = AXES

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def model_flops_per_s_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.n_gpus

    @property
    def hardware_flops_per_s_per_gpu(self) -> float:
        return self.hardware_flops / self.step_time_s / self.n_gpus

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022, PaLM, App. B)."""
        return self.model_flops_per_s_per_gpu / self.peak_flops_per_s

    @property
    def hfu(self) -> float:
        return self.hardware_flops_per_s_per_gpu / self.peak_flops_per_s

    def train_time_s(self, tokens: float) -> float:
        """Time to train on ``tokens`` tokens at this step time (Narayanan et al. Eq. 4)."""
        return tokens / self.tokens_per_s


def distinct_orders(lay: Layout, orders: Sequence[tuple[str, ...]]) -> Iterator[tuple[str, ...]]:
    """The placement ``orders`` that differ for ``lay``: two orders that differ only in
    axes of size 1 place its groups alike, so only the first of them is kept."""
    sizes = {"tp": lay.tp, "cp": lay.cp, "ep": lay.ep, "dp": lay.dp, "pp": lay.pp}
    seen: set[tuple[str, ...]] = set()
    for order in orders:
        used = tuple(ax for ax in order if sizes[ax] > 1)
        if used not in seen:
            seen.add(used)
            yield tuple(order)


def step_time(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster,
              eff: Efficiency = DEFAULT_EFFICIENCY, pc: ParamCount | None = None,
              orders: Sequence[tuple[str, ...]] = PLACEMENT_ORDERS) -> StepTime:
    """The step time of ``lay``, on the best of the placement ``orders`` (orders that
    differ only in axes of size 1 are tried once)."""
    best: StepTime | None = None
    for order in distinct_orders(lay, orders):
        t = _step_time(m, setup, lay, cluster, eff, pc, order)
        if best is None or t.step_time_s < best.step_time_s:
            best = t
    assert best is not None
    return best


def _step_time(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency,
               pc: ParamCount | None, order: tuple[str, ...]) -> StepTime:
    return step_parts(m, setup, lay, cluster, eff, pc, order).step_time()


@lru_cache(maxsize=4096)
def _flops_per_step(m: ModelSpec, seq_len: int, n_sequences: int, recompute: str) -> StepFlops:
    return flops_per_step(m, seq_len, n_sequences, recompute)


@dataclass(frozen=True, kw_only=True, slots=True)
class DpCollective:
    """One data-parallel collective of a step (dp_collectives), and what of it the compute
    window hides (hide): seconds per occurrence; once per micro-batch or once per step."""

    seconds: float           # the collective alone
    window: str              # the compute it may hide under: "fwd" or "bwd" of a micro-batch
    overlap: float           # the share of that window it may use
    per_micro_batch: bool
    exposed_s: float
    hidden_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StepParts:
    """The named parts of one layout's step on one placement (seconds unless named), from
    which StepTime is read and which `plan explain` prints as they are:

    step = m t_mb + bubble + dp exposed + dp slowdown + optimizer, with t_mb the slowest
    stage's micro-batch (pipeline: compute, exposed tp/cp/ep/pp communication and the
    slowdown of what is hidden; Narayanan et al. 2021, Sec. 2.2)."""

    placement: tuple[str, ...]
    pipeline: PipelinePart
    block: LayerTime            # one block, one micro-batch (layer_time)
    trained: RankSplit          # the slowest stage's rank: trainable and frozen parameters
    dp: tuple[DpCollective, ...]
    grad_accum: int
    optimizer_s: float
    flops: StepFlops
    tokens_per_step: int
    n_gpus: int
    peak_flops_per_s: float
    dp_slowdown_factor: float   # Efficiency.overlap_slowdown

    def occurrences(self, c: DpCollective) -> int:
        """How often ``c`` runs in a step: every micro-batch, or once."""
        return self.grad_accum if c.per_micro_batch else 1

    @property
    def compute_s(self) -> float:
        return self.grad_accum * (self.pipeline.fwd_mb + self.pipeline.bwd_mb)

    @property
    def dp_exposed_s(self) -> float:
        return sum(c.exposed_s * self.occurrences(c) for c in self.dp)

    @property
    def dp_hidden_s(self) -> float:
        return sum(c.hidden_s * self.occurrences(c) for c in self.dp)

    def step_time(self) -> StepTime:
        p, n_mb = self.pipeline, self.grad_accum
        dp_exposed = self.dp_exposed_s
        dp_slowdown = self.dp_slowdown_s
        comm = dict(p.comm_s)
        comm["dp"] = dp_exposed
        step = n_mb * p.t_mb + p.bubble_s + dp_exposed + dp_slowdown + self.optimizer_s
        return StepTime(compute_s=self.compute_s, comm_s=comm, bubble_s=p.bubble_s, optimizer_s=self.optimizer_s,
                        micro_batch_s=p.t_mb, step_time_s=step, tokens_per_step=self.tokens_per_step,
                        n_gpus=self.n_gpus, model_flops=self.flops.model_flops,
                        hardware_flops=self.flops.hardware_flops, peak_flops_per_s=self.peak_flops_per_s,
                        placement=self.placement)

    @property
    def dp_slowdown_s(self) -> float:
        """Efficiency.overlap_slowdown x the data-parallel seconds hidden under compute."""
        return self.dp_slowdown_factor * self.dp_hidden_s


def step_parts(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency = DEFAULT_EFFICIENCY,
               pc: ParamCount | None = None, order: tuple[str, ...] = AXES) -> StepParts:
    """The parts of the step of ``lay`` with its groups placed along ``order``: the
    pipeline part (pipeline_part), then the data-parallel communication and the optimizer
    update, which depend on the sharding."""
    pc = pc or count_params(m)
    p = pipeline_part(m, setup, lay, cluster, eff, order)
    gpu = cluster.gpu
    prec: Precision = setup.precision_spec
    # data parallel: gradients and (ZeRO/FSDP) parameters of the most loaded rank
    rp = trained_split(m, pc, setup, lay, p.slow_stage, p.n_slow)
    dp = tuple(DpCollective(seconds=comm, window=window, overlap=overlap, per_micro_batch=per_mb,
                            exposed_s=exposed, hidden_s=hidden)
               for (comm, window, overlap, per_mb), (exposed, hidden, _) in
               zip(dp_collectives(lay, rp, p.links, eff, gpu, prec),
                   dp_parts(lay, rp, p.links, eff, gpu, prec, p.fwd_mb, p.bwd_mb)))
    total_sequences = lay.micro_batch * lay.grad_accum * lay.dp * lay.ep
    return StepParts(placement=order, pipeline=p, block=layer_time(m, setup, layer_key(lay),
                                                                    block_kernels(setup, lay), gpu, eff),
                     trained=rp, dp=dp, grad_accum=lay.grad_accum,
                     optimizer_s=optimizer_time_s(rp.trainable_dense, rp.trainable_expert, lay, setup, p.rates),
                     flops=_flops_per_step(m, lay.seq_len, total_sequences, lay.recompute),
                     tokens_per_step=total_sequences * lay.seq_len, n_gpus=lay.n_gpus,
                     peak_flops_per_s=gpu.peak_flops_per_s(prec.compute_dtype),
                     dp_slowdown_factor=eff.overlap_slowdown)
