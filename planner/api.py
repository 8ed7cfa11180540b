"""The public entry points: plan() searches, evaluate_layout() checks one layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from planner.errors import UserError
from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import (
    AXIS_NAMES,
    Layout,
    SearchSpace,
    data_parallel_size,
    folded_shape,
    grad_accum_for,
    reject_reason,
    sp_by_default,
    world_size,
)
from planner.memory.model import min_model_state_bytes_per_param
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.search.search import Candidate, SearchResult, gpu_counts, search
from planner.timing.model import Cluster, Efficiency, StepTime, cluster_for, scale_up_domain_gpus, step_time
from planner.training.finetune import FinetuneSpec
from planner.training.setup import MAX_GPUS, MAX_SEARCH_GPUS, TrainingSetup
from planner.units import ceil_div

N_ALTERNATIVES = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanResult:
    """What `plan` answers: the chosen candidate (None when nothing fits), alternatives,
    and the search that found them."""

    model: ModelSpec
    params: ParamCount
    gpu: GpuSpec
    setup: TrainingSetup
    best: Candidate | None
    alternatives: tuple[Candidate, ...]
    result: SearchResult
    capacity_bytes: int
    fixed: bool = False           # the user fixed every choice: one layout evaluated
    fits_from_gpus: int | None = None   # when nothing fits: the smallest count that would
    min_gpus_for_states: int = 1        # model states alone need at least this many GPUs
    cluster: Cluster | None = None      # the GPU and topology the step times assume
    efficiency: Efficiency = Efficiency()   # the step-time model's named parameters
    tokens: float | None = None         # tokens to train on, for train_time_s
    host_capacity_bytes: int | None = None   # a node's CPU memory (topology), for offload
    nvme_capacity_bytes: int | None = None   # a node's NVMe (topology), for NVMe offload
    methods_tried: tuple[str, ...] = ()      # --method auto: the methods compared, preferred first
    calibration: str | None = None           # the `plan calibrate` file applied (--calibration)
    space: SearchSpace | None = None         # the choices searched: report.advice re-plans within them

    @property
    def fits(self) -> bool:
        return self.best is not None and self.best.fits


def capacity_bytes(gpu: GpuSpec, setup: TrainingSetup) -> int:
    return int(gpu.memory_bytes * setup.usable_memory_fraction)


def host_capacities(cluster: Cluster) -> tuple[int | None, int | None]:
    """A node's CPU memory and NVMe from the cluster's topology, or None where not given."""
    host = cluster.topology.host if cluster.topology is not None else None
    if host is None:
        return None, None
    return host.memory_bytes, host.nvme_bytes


def _shape(c: Candidate) -> tuple:
    lay = c.layout
    return (lay.tp, lay.pp, lay.cp, lay.ep, lay.sharding, lay.zero_stage, lay.vp)


def pick_alternatives(fitting: tuple[Candidate, ...], best: Candidate,
                      k: int = N_ALTERNATIVES) -> tuple[Candidate, ...]:
    """The best candidate of each other layout shape (degrees and sharding), best first."""
    seen = {_shape(best)}
    out = []
    for c in fitting:
        if _shape(c) not in seen:
            seen.add(_shape(c))
            out.append(c)
        if len(out) == k:
            break
    return tuple(out)


def check_request(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, space: SearchSpace | None = None,
                  n_gpus: int | None = None, max_gpus: int | None = None, tokens: float | None = None) -> None:
    """UserError (one line) for arguments the command line would have refused: the set-up
    by planner.training.checks' table, the GPU against the precision (precision_refusal), the
    search space by planner.layouts.layout.space_refusal,
    the GPU counts and the tokens by their options' ranges (issue 32, W11)."""
    import math

    from planner.layouts.layout import space_refusal
    from planner.training.checks import check_setup, is_int_in, precision_refusal

    check_setup(m, setup)
    if not isinstance(gpu, GpuSpec):
        raise UserError(f"the GPU must be a GpuSpec (planner.hardware.gpus.get_gpu('h100')), not {type(gpu).__name__}")
    why = precision_refusal(gpu, setup.precision)
    if why is not None:
        raise UserError(why)
    if space is not None:
        why = space_refusal(space)
        if why is not None:
            raise UserError(why)
    for flag, count in (("--n-gpus", n_gpus), ("--max-gpus", max_gpus)):
        if count is not None and not is_int_in(count, 1, MAX_GPUS):
            raise UserError(f"{flag} {count!r} must be a whole number from 1 to {MAX_GPUS:,}")
    if tokens is not None and not (isinstance(tokens, int | float) and math.isfinite(tokens) and 1 <= tokens <= 1e18):
        raise UserError(f"--tokens {tokens!r} must be between 1 and 1e18 tokens")
    if tokens is not None:
        from planner.training.checks import tokens_refusal

        why = tokens_refusal(setup, tokens)
        if why is not None:
            raise UserError(why)


def plan(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, space: SearchSpace = SearchSpace(),
         n_gpus: int | None = None, max_gpus: int = MAX_SEARCH_GPUS, cluster: Cluster | None = None,
         efficiency: Efficiency = Efficiency(), tokens: float | None = None,
         progress: Callable[[int, int, int], None] | None = None) -> PlanResult:
    """Search GPU counts (smallest first) and layouts; return the fastest fitting layout
    on the smallest GPU count that has one (step times from planner.timing.model on ``cluster``,
    by default the GPU's default topology).

    With every degree and choice fixed, this evaluates exactly that layout.
    ``progress(n_gpus, i, n_counts)`` is told of each GPU count before it is searched
    (planner.search.search.search), for a progress bar.
    """
    if n_gpus is not None and isinstance(n_gpus, int) and not 1 <= n_gpus <= MAX_GPUS:
        raise UserError(f"--n-gpus {n_gpus} is outside 1..{MAX_GPUS}")
    check_request(m, gpu, setup, space, n_gpus, max_gpus, tokens)
    pinned = space.fixed_world_size()
    if n_gpus is None and pinned is not None:
        n_gpus = pinned
        if n_gpus > max(max_gpus, 1):       # as the CLI refuses it (issue 32, W2)
            raise UserError(f"{' x '.join(AXIS_NAMES)} = {n_gpus:,} GPUs is more than max_gpus {max_gpus:,}")
    counts = [n_gpus] if n_gpus is not None else gpu_counts(gpu.gpus_per_node, max_gpus)
    cap = capacity_bytes(gpu, setup)
    cluster = cluster or cluster_for(gpu)
    pc = count_params(m)
    if space.max_tp is None:    # tp may span the NVLink domain (72 GPUs on an NVL72 rack)
        space = replace(space, max_tp=max(gpu.gpus_per_node, scale_up_domain_gpus(cluster)))

    def batch_timer(layouts: Sequence[Layout]) -> list[StepTime]:
        from planner.timing.fast import step_times  # numpy: only once there is something to time
        return step_times(m, setup, layouts, cluster, efficiency, pc)

    host_cap, nvme_cap = host_capacities(cluster)
    res = search(m, setup, cap, gpu.gpus_per_node, counts, space, batch_timer=batch_timer,
                 host_capacity_bytes=host_cap, nvme_capacity_bytes=nvme_cap, progress=progress)
    floor = ceil_div(int(min_model_state_bytes_per_param(setup) * pc.total), cap)
    fits_from = None
    if res.fitting:
        best = res.fitting[0]
        alts = pick_alternatives(res.fitting, best)
    else:
        best, alts = None, ()
        wider = [c for c in gpu_counts(gpu.gpus_per_node, MAX_SEARCH_GPUS) if c > max(counts)]
        if wider:
            fits_from = search(m, setup, cap, gpu.gpus_per_node, wider, space,
                               host_capacity_bytes=host_cap, nvme_capacity_bytes=nvme_cap,
                               progress=progress).n_gpus
    return PlanResult(model=m, params=pc, gpu=gpu, setup=setup, best=best, alternatives=alts,
                      result=res, capacity_bytes=cap, fits_from_gpus=fits_from,
                      min_gpus_for_states=max(1, floor), cluster=cluster, efficiency=efficiency,
                      tokens=tokens, host_capacity_bytes=host_cap, nvme_capacity_bytes=nvme_cap, space=space)


SCALING_STEPS = 7      # `plan --plot`: the chosen count and six doublings (n, 2n ... 64n)


def scaling(r: PlanResult, space: SearchSpace = SearchSpace(),
            max_gpus: int = MAX_SEARCH_GPUS) -> tuple[Candidate, ...]:
    """The fastest fitting layout on the chosen GPU count and its doublings up to
    ``max_gpus`` (r.best first, then planner.search.sweep's), for `plan --plot`'s time against
    GPU count; counts where nothing fits are left out. Empty when nothing fits."""
    if r.best is None or not r.best.fits:
        return ()
    if r.fixed:                 # the user fixed every choice: that one layout
        return (r.best,)
    from planner.search.sweep import sweep

    n = r.best.n_gpus
    counts = [n * 2**k for k in range(1, SCALING_STEPS) if n * 2**k <= max_gpus]
    cluster = r.cluster or cluster_for(r.gpu)
    if space.max_tp is None:
        space = replace(space, max_tp=max(r.gpu.gpus_per_node, scale_up_domain_gpus(cluster)))
    found = sweep(r.model, r.setup, cluster, counts, r.capacity_bytes, space, r.efficiency, keep=1,
                  host_capacity_bytes=r.host_capacity_bytes, nvme_capacity_bytes=r.nvme_capacity_bytes)
    return (r.best, *(cb.fastest[0] for cb in found if cb.fastest))


AUTO_METHODS = ("full", "lora", "qlora")


def auto_methods(setup: TrainingSetup) -> tuple[str, ...]:
    """The methods ``--method auto`` compares, preferred first: under FP8 or NVFP4 those the
    planner models there, full training and LoRA, not QLoRA's 4-bit base (issue 32, W4: auto
    returned the QLoRA plan that --method qlora --precision fp8 refuses)."""
    from planner.training.checks import LOW_PRECISIONS

    return tuple(m for m in AUTO_METHODS if m != "qlora") if setup.precision in LOW_PRECISIONS else AUTO_METHODS


def plan_methods(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, methods: tuple[FinetuneSpec, ...],
                 space: SearchSpace = SearchSpace(), n_gpus: int | None = None,
                 max_gpus: int = MAX_SEARCH_GPUS, cluster: Cluster | None = None,
                 efficiency: Efficiency = Efficiency(), tokens: float | None = None,
                 progress: Callable[[int, int, int], None] | None = None) -> PlanResult:
    """``--method auto``: plan each method (in order of preference, e.g. full, LoRA, QLoRA)
    and keep the one that fits on the fewest GPUs; on the same count the earlier method
    wins, so full training is chosen whenever it fits where the others do. A later method
    is only searched up to the count an earlier one needed. When none fits, the answer is
    the method whose least-memory layout needs the least (issue 33: 70B on 4090s reported
    full training's 292.58 GiB, not QLoRA's 30.19 GiB), so the report and its advice speak
    of the method closest to fitting."""

    def least_bytes(r: PlanResult) -> float:
        sm = r.result.smallest
        return sm.memory.total if sm is not None else float("inf")

    best: PlanResult | None = None
    for ft in methods:
        limit = max_gpus if best is None or best.best is None else best.best.n_gpus - 1
        if limit < 1 or (n_gpus is not None and best is not None and best.fits):
            break
        r = plan(m, gpu, replace(setup, finetune=ft), space, n_gpus=n_gpus,
                 max_gpus=max(1, min(max_gpus, limit)), cluster=cluster, efficiency=efficiency, tokens=tokens,
                 progress=progress)
        if best is None or (r.fits and (not best.fits or r.best.n_gpus < best.best.n_gpus)):  # type: ignore[union-attr]
            best = r
        elif not r.fits and not best.fits and least_bytes(r) < least_bytes(best):
            best = r
    assert best is not None
    return replace(best, methods_tried=tuple(ft.method for ft in methods))


def evaluate_layout(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, lay: Layout,
                    cluster: Cluster | None = None, efficiency: Efficiency = Efficiency(),
                    tokens: float | None = None) -> PlanResult:
    """Evaluate one fully specified layout (memory, and step time when it fits); a
    layout that cannot run is a UserError."""
    check_request(m, gpu, setup, tokens=tokens)
    if not isinstance(lay, Layout):
        raise UserError(f"the layout must be a Layout, not {type(lay).__name__}")
    reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
    if reason:
        raise UserError(f"layout {lay.describe()} cannot run: {reason}")
    from planner.search.search import evaluate

    cap = capacity_bytes(gpu, setup)
    cluster = cluster or cluster_for(gpu)
    host_cap, nvme_cap = host_capacities(cluster)
    (cand,) = evaluate(m, setup, [lay], cap, gpus_per_node=gpu.gpus_per_node,
                       host_capacity_bytes=host_cap, nvme_capacity_bytes=nvme_cap)
    if cand.fits:
        cand = replace(cand, time=step_time(m, setup, lay, cluster, efficiency))
    res = SearchResult(n_gpus=lay.n_gpus, fitting=(cand,) if cand.fits else (), smallest=cand,
                       rejected=(), counts_tried=(lay.n_gpus,))
    return PlanResult(model=m, params=count_params(m), gpu=gpu, setup=setup, best=cand,
                      alternatives=(), result=res, capacity_bytes=cap, fixed=True, cluster=cluster,
                      efficiency=efficiency, tokens=tokens, host_capacity_bytes=host_cap,
                      nvme_capacity_bytes=nvme_cap)


def fixed_layout(space: SearchSpace, setup: TrainingSetup, n_gpus: int | None) -> Layout | None:
    """The one layout the user's options pin down, or None when something is left open.

    With --n-gpus, --tp, --pp and --ep given (--cp: 1 when not given) and no --dp, an ep
    that does not divide Megatron's data-parallel size n / (tp x cp x pp) is folded over
    tp x cp x dp (layouts.layout.folded_shape), dp being that data-parallel size."""
    s = space
    dp, fold = s.dp, False
    shape = folded_shape(s, n_gpus) if n_gpus is not None else None
    if shape is not None:
        s = replace(s, cp=shape.cp)
        dp, fold = shape.dp, True
    if (dp is None or s.tp is None or s.pp is None or s.cp is None or s.ep is None
            or len(s.micro_batches) != 1 or len(s.recomputes) != 1):
        return None
    if s.zero_stage is None and s.fsdp is None:
        return None
    tp, pp, cp, ep = s.tp, s.pp, s.cp, s.ep
    if n_gpus is not None and not fold and n_gpus != world_size(dp, tp, pp, cp, ep, False):
        raise UserError(f"--n-gpus {n_gpus} differs from {' x '.join(AXIS_NAMES)} = "
                        f"{world_size(dp, tp, pp, cp, ep, False)}")
    mb = s.micro_batches[0]
    ga = grad_accum_for(setup, mb, dp, ep, fold)
    if ga is None:
        raise UserError(f"--global-batch {setup.global_batch} is not a multiple of micro-batch {mb} "
                        f"x data-parallel {data_parallel_size(dp, ep, fold)}; change --global-batch or --micro-batch")
    if s.fsdp is not None:
        from planner.layouts.layout import FSDP_STAGE
        sharding = f"fsdp-{s.fsdp}"
        if s.zero_stage is not None and s.zero_stage != FSDP_STAGE[sharding]:
            raise UserError(f"--fsdp {s.fsdp} shards like ZeRO-{FSDP_STAGE[sharding]}; drop --zero {s.zero_stage}")
        stage = FSDP_STAGE[sharding]
    else:
        assert s.zero_stage is not None     # checked above: --zero or --fsdp is given
        sharding, stage = "zero", s.zero_stage
    return Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero_stage=stage, sharding=sharding,
                  sp=s.sp if s.sp is not None else tp > 1 and sp_by_default(setup), vp=s.vp or 1, micro_batch=mb,
                  grad_accum=ga, seq_len=setup.seq_len, recompute=s.recomputes[0], etp=s.etp or 0, ep_fold=fold,
                  optimizer_instances=s.optimizer_instances)

