"""Parallel layouts: what a Layout is, which ones are valid, and why the others are not.

Degrees follow Megatron-LM / torchtitan: dp x tp x pp x cp x ep = n_gpus. Expert
parallelism is its own axis here: the ep ranks of a group hold different experts and
also read different data, so dense weights are replicated over dp*ep ranks (and their
gradients reduced over dp*cp*ep), expert weights over dp*cp*tp/etp.

Expert tensor parallelism (etp, megatron-core 0.16.1's expert_tensor_parallel_size,
default tp): Megatron's data-parallel size is world/(tp*cp*pp), the planner's dp*ep, and
parallel_state.initialize_model_parallel builds the expert groups of a pipeline stage as
etp x ep x edp with edp = world/(etp*ep*pp) (megatron/core/parallel_state.py lines
785-808), so edp = tp*cp*dp*ep/(etp*ep) = dp*cp*tp/etp: dp*cp at etp = tp, as before.

Expert-parallel folding (Megatron-Core's MoE parallel folding, ``Layout.ep_fold``): ep is
chosen within the non-pipeline GPUs rather than beside them. Megatron-Core checks only
that tp*cp*pp and etp*ep*pp each divide the world (parallel_state.initialize_model_parallel,
megatron-core 0.16.1 megatron/core/parallel_state.py lines 738-741 and 788-795), so the
attention layers run on the grid tp x cp x DP x pp and the expert layers on etp x ep x edp x pp
over the same GPUs, with edp = tp*cp*DP/(etp*ep). A folded layout's ``dp`` is that DP
(Megatron's data-parallel size) and ep multiplies nothing; the planner folds only where ep
does not divide DP (ep_folds), so every layout has one representation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, NamedTuple

from planner.hardware.axes import AxisSizes
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

SHARDINGS = ("zero", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid")


@dataclass(frozen=True, slots=True)
class Axis:
    """One parallel axis: its field on Layout and SearchSpace (the degree), its command-line
    option, the Megatron-LM argument that sets it (None for dp, which Megatron derives as
    world / (tp x cp x pp): megatron-core 0.16.1 parallel_state.py line 743), and what the
    option's help adds."""

    name: str
    flag: str
    megatron: str | None
    note: str = ""
    shown_at_one: bool = True       # a layout's description names it at degree 1 too
    megatron_at_one: bool = True    # written to Megatron-LM's arguments at degree 1 too


# The parallel axes whose degrees multiply to the GPU count (world_size), in Layout's order:
# what the search space, the options, the reports and the emitters iterate. A new axis is one
# entry here, one field on Layout, SearchSpace and LayoutArrays, and its rules (layouts.rules).
AXES: tuple[Axis, ...] = (
    Axis("dp", "--dp", None),
    Axis("tp", "--tp", "--tensor-model-parallel-size"),
    Axis("pp", "--pp", "--pipeline-model-parallel-size"),
    Axis("cp", "--cp", "--context-parallel-size", shown_at_one=False),
    Axis("ep", "--ep", "--expert-model-parallel-size",
         " With --n-gpus and no --dp, an EP that does not divide the data-parallel size "
         "GPUs / (tp x cp x pp) is folded over tp x cp x dp (Megatron-Core's MoE parallel folding).",
         shown_at_one=False, megatron_at_one=False),
)
AXIS_NAMES = tuple(a.name for a in AXES)      # ("dp", "tp", "pp", "cp", "ep")
FSDP_STAGE = {"fsdp-full": 3, "fsdp-grad-op": 2, "fsdp-hybrid": 3}


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """One way to run a step. ``zero_stage`` is what is sharded over data parallel ranks:
    0 nothing, 1 optimizer states, 2 and gradients, 3 and weights (Rajbhandari et al.
    2019). ``sharding`` says which engine shards: DeepSpeed/Megatron ZeRO or PyTorch
    FSDP2 (full shard = ZeRO-3, shard-grad-op = ZeRO-2, hybrid = ZeRO-3 inside a node,
    replicated across nodes)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    sharding: str = "zero"
    sp: bool = False            # sequence parallelism inside the tp group (Korthikanti et al.)
    vp: int = 1                 # virtual stages per pipeline rank (interleaved 1F1B when > 1)
    micro_batch: int = 1
    grad_accum: int = 1         # micro-batches per optimizer step per data-parallel rank
    seq_len: int = 4096
    recompute: str = "none"     # none | selective | full
    etp: int = 0                # expert tensor-parallel size; 0: equal to tp (megatron-core's default)
    ep_fold: bool = False       # ep folded over tp x cp x dp (Megatron-Core MoE parallel folding): dp is DP
    optimizer_instances: int = 1    # megatron-core's num_distributed_optimizer_instances (HSDP when > 1)

    def degrees(self) -> dict[str, int]:
        """The degree of each parallel axis (AXES), by name."""
        return {a.name: getattr(self, a.name) for a in AXES}

    @property
    def seq_len_per_rank(self) -> int:
        """The sequence positions one rank holds (seq_len_per_rank)."""
        return seq_len_per_rank(self.seq_len, self.cp)

    @property
    def tokens_per_rank(self) -> int:
        """The tokens of one micro-batch one rank holds: micro-batch x its sequence share."""
        return self.micro_batch * self.seq_len_per_rank

    @property
    def data_parallel(self) -> int:
        """Megatron's data-parallel size, world / (tp x cp x pp): dp x ep, or dp when folded."""
        return data_parallel_size(self.dp, self.ep, self.ep_fold)

    @property
    def expert_tp(self) -> int:
        """Ranks an expert's matrices are split over (megatron-core's ETP; tp when unset)."""
        return int(expert_tp_size(self.etp, self.tp))

    @property
    def model_parallel(self) -> int:
        """The GPUs of one data-parallel replica, tp x cp x pp (model_parallel_size)."""
        return model_parallel_size(self.tp, self.cp, self.pp)

    @property
    def n_gpus(self) -> int:
        return world_size(self.dp, self.tp, self.pp, self.cp, self.ep, self.ep_fold)

    @property
    def is_fsdp(self) -> bool:
        return self.sharding.startswith("fsdp")

    @property
    def dense_shard_degree(self) -> int:
        """Ranks that hold replicas of a dense weight (and reduce its gradient)."""
        return dense_shard_size(self.dp, self.cp, self.ep, self.ep_fold)

    @property
    def expert_shard_degree(self) -> int:
        """The expert data-parallel group (megatron-core's EDP): dp*cp*tp/etp."""
        return expert_data_parallel_size(self.dp, self.tp, self.cp, self.ep, self.expert_tp, self.ep_fold)

    @property
    def axis_sizes(self) -> AxisSizes:
        """The degrees as the placement reads them (hardware.axes.AxisSizes: tp, cp, ep, dp, pp)."""
        return AxisSizes(tp=self.tp, cp=self.cp, ep=self.ep, dp=self.dp, pp=self.pp)

    def hybrid_shard(self, gpus_per_node: int) -> int:
        """The HSDP shard group of a dense weight: one distributed-optimizer instance's ranks
        (instance_shard_size) where there are several, FSDP hybrid's node group
        (hybrid_shard_ranks); 0 where the states are not sharded that way."""
        if self.optimizer_instances > 1:
            return int(instance_shard_size(self.dense_shard_degree, self.optimizer_instances))
        if self.sharding != "fsdp-hybrid":
            return 0
        return hybrid_shard_ranks(self.dense_shard_degree, self.tp, gpus_per_node)

    def weight_shard_ranks(self, gpus_per_node: int) -> int:
        """The ranks a dense weight is sharded over where ZeRO-3 or FSDP shards it
        (weight_shard_size)."""
        return weight_shard_size(self.dense_shard_degree, self.hybrid_shard(gpus_per_node))

    def hybrid_replicate(self, gpus_per_node: int) -> int:
        """FSDP hybrid's (HSDP) replicas of its shard group across nodes (hybrid_replicas), 1 where
        the sharding is not hybrid."""
        shard = self.hybrid_shard(gpus_per_node)
        return hybrid_replicas(self.dense_shard_degree, shard) if shard else 1

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.data_parallel

    def shown_degrees(self) -> list[tuple[str, int, bool]]:
        """The degrees every layout string shows, in order, as (name, degree, marked): each axis
        of AXES that is split (or shown at one), followed by what it carries: vp after pp where
        > 1, etp after ep where it differs from tp. ``marked``: sequence parallelism on tp, the
        fold on ep (Layout.ep_fold)."""
        out = []
        for a in AXES:
            d = getattr(self, a.name)
            out.append((a.name, d, bool(self.sp if a.name == "tp" else self.ep_fold if a.name == "ep" else False)))
            if a.name == "pp" and self.vp > 1:
                out.append(("vp", self.vp, False))
            if a.name == "ep" and self.expert_tp != self.tp:
                out.append(("etp", self.expert_tp, False))
        return out

    def degree_words(self, marks: tuple[str, str] = ("+sp", " folded over tp x cp x dp")) -> list[str]:
        """The degrees shown_degrees() lists as words name=degree (tp=4+sp, ep=8 folded over
        tp x cp x dp, with ``marks`` for sequence parallelism and the fold): an axis at one only
        where it is shown at one (Axis.shown_at_one)."""
        shown = {a.name for a in AXES if a.shown_at_one}
        mark = dict(zip(("tp", "ep"), marks))
        return [f"{name}={d}" + (mark[name] if marked else "") for name, d, marked in self.shown_degrees()
                if d > 1 or name in shown or name not in AXIS_NAMES]

    @property
    def key(self) -> str:
        """ASCII identifier, e.g. dp8_tp2_pp1_cp1_ep1_zero1_mb2_ga4_rnone."""
        shard = f"zero{self.zero_stage}" if self.sharding == "zero" else self.sharding
        degrees = "_".join(f"{name}{d}" + ("_sp" if marked and name == "tp" else "")
                           for name, d, marked in self.shown_degrees())
        fold = "_fold" if self.ep_fold else ""
        inst = f"_inst{self.optimizer_instances}" if self.optimizer_instances > 1 else ""
        return f"{degrees}{fold}_{shard}{inst}_mb{self.micro_batch}_ga{self.grad_accum}_r{self.recompute}"

    def describe(self) -> str:
        parts = self.degree_words()
        parts.append(f"ZeRO-{self.zero_stage}" if self.sharding == "zero" else f"FSDP {self.sharding[5:]}")
        if self.optimizer_instances > 1:
            parts[-1] += f" over {self.optimizer_instances} optimizer instances"
        parts += [f"micro-batch {self.micro_batch}", f"grad-accum {self.grad_accum}",
                  f"recompute {self.recompute}"]
        return ", ".join(parts)


def seq_len_per_rank(seq_len: Any, cp: Any) -> Any:
    """The sequence positions each rank of a context-parallel group holds: seq_len // cp
    (Megatron-Core splits the sequence into 2 x cp chunks, two per rank, for load balance
    under the causal mask; torchtitan's context_parallel shards the sequence dimension over
    the cp mesh). Ints or arrays."""
    return seq_len // cp


def data_parallel_size(dp: Any, ep: Any, ep_fold: Any) -> Any:
    """Megatron's data-parallel size world / (tp x cp x pp) (megatron-core 0.16.1
    parallel_state.py line 743): dp x ep, where the ep ranks read different data beside dp;
    dp itself where ep is folded over tp x cp x dp (Layout.ep_fold). Ints or numpy arrays
    (``ep_fold`` an int or bool for every layout at once: a batch none of whose layouts folds
    multiplies dp by ep alone, without the masks' passes over it)."""
    if isinstance(ep_fold, int):
        return dp * ep if ep_fold <= 0 else dp * 1
    return dp * (ep * (ep_fold <= 0) + (ep_fold > 0))


def expert_tp_size(etp: Any, tp: Any) -> Any:
    """Ranks an expert's matrices are split over: etp, or tp where etp is 0 (unset: megatron-core
    0.16.1 model_parallel_config.py lines 413-414 default it to tp). Ints or numpy arrays."""
    return etp * (etp > 0) + tp * (etp <= 0)


def model_parallel_size(tp: Any, cp: Any, pp: Any) -> Any:
    """The GPUs of one data-parallel replica, tp x cp x pp: Megatron's world / data-parallel size
    (parallel_state.py line 743). Ints or numpy arrays."""
    return tp * cp * pp


def world_size(dp: Any, tp: Any, pp: Any, cp: Any, ep: Any, ep_fold: Any) -> Any:
    """The GPUs of a layout: data-parallel size x tp x cp x pp (dp x tp x pp x cp x ep, or
    dp x tp x pp x cp where ep is folded). Ints or numpy arrays."""
    return data_parallel_size(dp, ep, ep_fold) * tp * pp * cp


def dense_shard_size(dp: Any, cp: Any, ep: Any, ep_fold: Any) -> Any:
    """Ranks that hold replicas of a dense weight and reduce its gradient (the group ZeRO and
    FSDP shard its states over): data-parallel size x cp (megatron-core 0.16.1 builds the
    data-parallel group with context parallelism, parallel_state.py's dp-cp groups). Ints or
    numpy arrays."""
    return data_parallel_size(dp, ep, ep_fold) * cp


def expert_data_parallel_size(dp: Any, tp: Any, cp: Any, ep: Any, etp: Any, ep_fold: Any) -> Any:
    """Megatron's expert data-parallel size edp = world / (etp x ep x pp) (parallel_state.py
    line 791), the group the distributed optimizer shards expert states over and expert
    gradients are reduced over: tp x cp x DP / (etp x ep), DP = data_parallel_size. Ints or
    numpy arrays (integer division)."""
    return data_parallel_size(dp, ep, ep_fold) * cp * tp // (etp * ep)


def ep_folds(n_gpus: int, tp: int, pp: int, cp: int, ep: int) -> bool:
    """Whether ep folds over tp x cp x dp on ``n_gpus`` (Megatron-Core's MoE parallel
    folding): tp x cp x pp divides the GPUs (megatron-core 0.16.1 parallel_state.
    initialize_model_parallel, lines 738-741) and ep does not divide the data-parallel size
    n / (tp x cp x pp) it leaves. Whether megatron-core runs the folded layout (etp x ep x pp
    dividing the GPUs, lines 788-795) is the rule "ep-fold-divides" of layouts.rules."""
    replica = model_parallel_size(tp, cp, pp)
    if ep <= 1 or n_gpus % replica:
        return False
    return (n_gpus // replica) % ep != 0


def fold_indivisible(tp: Any, cp: Any, dp: Any, etp: Any, ep: Any) -> Any:
    """Whether a folded layout's expert grid cannot tile its stage: etp x ep does not divide
    tp x cp x DP (megatron-core 0.16.1 parallel_state.initialize_model_parallel, lines 788-795,
    raises "world_size is not divisible by expert_tensor_model_pipeline_parallel size" unless
    etp x ep x pp divides the world). ``etp`` is the expert tensor-parallel size itself
    (expert_tp_size). Ints or numpy arrays."""
    return (tp * cp * dp) % (etp * ep) != 0


def fold_searched(tp: int, cp: int, dp: int, etp: int | None, ep: int, tp_pp_given: bool) -> bool:
    """Whether the search walks a fold of ep over tp x cp x dp (one ep_folds allows): any, with
    --tp and --pp both given (the layout's own rule "ep-fold-divides" then says why it cannot
    run, layouts.rules); with either left open only one megatron-core can tile
    (fold_indivisible), so that an open degree never becomes a reason. The one rule
    folded_shapes searches by and report.advice.folds_on explains with. ``etp``: the option
    (None or 0: tp's, expert_tp_size)."""
    return tp_pp_given or not fold_indivisible(tp, cp, dp, expert_tp_size(etp or 0, tp), ep)


def node_data_ranks(gpus_per_node: Any, tp: Any) -> Any:
    """The data-parallel (dp x cp x ep) ranks of one pipeline stage that share a node: the node's
    GPUs over tp. The pipeline is the outermost axis of the rank order (megatron-core
    parallel_state.py's default order "tp-cp-ep-dp-pp"; torchtitan's mesh ["pp",
    "dp_replicate", "dp_shard", "cp", "tp"]), tp the innermost, so a data-parallel group
    of d ranks spans d x tp consecutive GPUs. Ints or numpy arrays (at least 1)."""
    ranks = gpus_per_node // tp
    return ranks + (1 - ranks) * (ranks < 1)


@lru_cache(maxsize=4096)
def hybrid_shard_ranks(dense_shard_degree: int, tp: int, gpus_per_node: int) -> int:
    """The ranks of an FSDP hybrid (HSDP) shard group: the largest divisor of the dense shard
    degree (dp*cp*ep) that fits in a node beside tp; the groups replicate across nodes
    (PyTorch FSDP HYBRID_SHARD docs; Zhao et al. 2023, arXiv:2304.11277, Sec. 3). The one
    rule the memory model's states, the step time's reduce and the FSDP emitter read."""
    inside = node_data_ranks(gpus_per_node, tp)
    d = dense_shard_degree
    while d > inside or dense_shard_degree % d:
        d -= 1
    return max(d, 1)


def weight_shard_size(dense_shard_degree: Any, hybrid_shard: Any) -> Any:
    """The ranks a dense weight is sharded over where it is sharded: FSDP hybrid's shard group
    (hybrid_shard_ranks; 0 where the sharding is not hybrid), else the whole dense shard group
    dp x cp (x ep unless folded: dense_shard_size), the mesh torchtitan's FSDP2 shards dense
    parameters over (parallel_dims.py, the flattened "dp_shard_cp" mesh) and Megatron's
    distributed optimizer its dp-cp group. Ints or numpy arrays."""
    return hybrid_shard + dense_shard_degree * (hybrid_shard <= 0)


def instance_shard_size(shard_degree: Any, instances: Any) -> Any:
    """The ranks of one distributed-optimizer instance that shard a weight's states: the data-
    parallel (x cp) group, or the expert data-parallel group, over the instances (0 or 1: one
    instance, the whole group). megatron-core 0.16.1 parallel_state.py lines 834-841
    (intra_partial_data_parallel_size = dp x cp / num_distributed_optimizer_instances) and
    1263-1268 (intra_partial_expert_data_parallel_size = edp / instances); the instances
    replicate each other, and the gradients are all-reduced across them
    (distributed/param_and_grad_buffer.py, inter_distributed_optimizer_instance_group). Ints or
    numpy arrays."""
    return shard_degree // (instances + (instances < 1))


def hybrid_replicas(dense_shard_degree: Any, shard_ranks: Any) -> Any:
    """The replicas of an FSDP hybrid (HSDP) shard group across nodes: the dense shard degree
    over the shard group (hybrid_shard_ranks), which divides it. Ints or numpy arrays."""
    return dense_shard_degree // shard_ranks


def sp_by_default(setup: TrainingSetup) -> bool:
    """Whether tp > 1 brings sequence parallelism when the user does not say (--sp/--no-sp):
    yes (Korthikanti et al. 2022), except under --stack deepspeed, whose tensor and pipeline
    parallelism is Megatron-DeepSpeed's as BLOOM and MT-NLG trained (Megatron-LM 2021's tensor
    parallelism, without sequence parallelism)."""
    return setup.stack != "deepspeed"


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def reject_reason(m: ModelSpec, setup: TrainingSetup, lay: Layout, gpus_per_node: int) -> str | None:
    """Why a layout cannot run, or None: the message of the first rule of
    planner.layouts.rules.RULES it breaks."""
    return _reject_reason(m, setup, lay, gpus_per_node)


@lru_cache(maxsize=65536)
def _reject_reason(m: ModelSpec, setup: TrainingSetup, lay: Layout, gpus_per_node: int) -> str | None:
    from planner.layouts.rules import RuleView, first_failing

    view = RuleView.of(m, setup, lay, gpus_per_node)
    rule = first_failing(view)
    return None if rule is None else rule.message(view)


def grad_accum_for(setup: TrainingSetup, micro_batch: int, dp: int, ep: int, ep_fold: bool = False) -> int | None:
    """Accumulation steps that make micro x accum x data-parallel (dp x ep, or dp folded) the
    global batch, or None."""
    per_step = micro_batch * data_parallel_size(dp, ep, ep_fold)
    if setup.global_batch % per_step:
        return None
    return setup.global_batch // per_step


class DegreeShape(NamedTuple):
    """The degrees of one shape the search walks (degree_shapes, folded_shape), in the order
    it walks them: tp innermost, dp what is left."""

    tp: int
    cp: int
    ep: int
    pp: int
    dp: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """Which choices the search may make; a fixed value (not None) pins a choice."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None        # None: equal to tp (no search over it)
    zero_stage: int | None = None
    fsdp: str | None = None       # full | grad-op | hybrid
    vp: int | None = None
    sp: bool | None = None
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    recomputes: tuple[str, ...] = ("none", "selective", "full")
    max_tp: int | None = None     # default: the GPUs of one node
    max_cp: int = 8
    optimizer_instances: int = 1  # megatron-core's num_distributed_optimizer_instances (not searched)

    def fixed_degrees(self) -> dict[str, int]:
        """The degrees the space fixes (not None), by axis name in AXES order."""
        return {a.name: d for a in AXES if (d := getattr(self, a.name)) is not None}

    def fixed_world_size(self) -> int | None:
        """The GPU count every axis's fixed degree pins down (dp x tp x pp x cp x ep), or None
        when one is open."""
        fixed = self.fixed_degrees()
        if len(fixed) < len(AXES):
            return None
        return math.prod(fixed.values())


def _degrees(fixed: int | None, n: int, cap: int) -> list[int]:
    if fixed is not None:
        return [fixed] if n % fixed == 0 else []
    return [d for d in divisors(n) if d <= cap]


def shardings_of(space: SearchSpace) -> list[tuple[str, int]]:
    if space.fsdp is not None:
        name = f"fsdp-{space.fsdp}"
        return [(name, FSDP_STAGE[name])]
    if space.zero_stage is not None:
        return [("zero", space.zero_stage)]
    return [("zero", 0), ("zero", 1), ("zero", 2), ("zero", 3),
            ("fsdp-full", 3), ("fsdp-grad-op", 2), ("fsdp-hybrid", 3)]


def enumerate_layouts(
    m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
    space: SearchSpace = SearchSpace(),
) -> Iterator[tuple[Layout, str | None]]:
    """Every candidate layout on ``n_gpus`` with None or the reason it cannot run (the
    first rule of planner.layouts.rules.RULES it breaks)."""
    for shape in degree_shapes(m, n_gpus, gpus_per_node, space):
        yield from _shape_layouts(m, setup, gpus_per_node, space, shape, False)


def folded_shape(space: SearchSpace, n_gpus: int) -> DegreeShape | None:
    """(tp, cp, ep, pp, dp) of the folded layouts on ``n_gpus`` where the space fixes tp, pp and
    ep (cp: 1 when open) and leaves dp open, and ep folds (ep_folds; dp is Megatron's DP);
    None otherwise. The one place the fold is decided from what the user gives."""
    s = space
    if s.dp is not None or s.tp is None or s.pp is None or s.ep is None:
        return None
    cp = s.cp or 1
    if not ep_folds(n_gpus, s.tp, s.pp, cp, s.ep):
        return None
    return DegreeShape(s.tp, cp, s.ep, s.pp, n_gpus // model_parallel_size(s.tp, cp, s.pp))


def folded_shapes(m: ModelSpec, space: SearchSpace, n_gpus: int, gpus_per_node: int) -> tuple[DegreeShape, ...]:
    """(tp, cp, ep, pp, dp) of the folded layouts on ``n_gpus`` where the space fixes ep and
    leaves dp open: every (tp, pp) the search walks (degree_shapes, over the tp and pp the space
    leaves open; cp: 1 when open) on which ep folds (ep_folds; dp is Megatron's DP). With tp and
    pp fixed this is folded_shape's one shape. Before, a fold was searched only with --tp, --pp and
    --ep all given, so `--tp 2 --ep 64` on 64 GPUs (ep 64 folded over tp 2 x dp 32, the layout
    Megatron-Bridge trains Nemotron 3 Super with) was reported as not fitting below 128 GPUs."""
    s = space
    if s.dp is not None or s.ep is None or s.ep <= 1:
        return ()
    flat = replace(s, ep=1, cp=s.cp or 1)
    shapes = [DegreeShape(d.tp, d.cp, s.ep, d.pp, d.dp) for d in degree_shapes(m, n_gpus, gpus_per_node, flat)
              if ep_folds(n_gpus, d.tp, d.pp, d.cp, s.ep)]
    given = s.tp is not None and s.pp is not None
    return tuple(d for d in shapes if fold_searched(d.tp, d.cp, d.dp, s.etp, d.ep, given))


def enumerate_folded(m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
                     space: SearchSpace = SearchSpace()) -> Iterator[tuple[Layout, str | None]]:
    """The folded candidates on ``n_gpus`` (folded_shapes) over the choices the space leaves
    open, each with None or the reason it cannot run: what enumerate_layouts yields for the
    shapes it walks, for the folded shapes (never searched unless the options give ep)."""
    for shape in folded_shapes(m, space, n_gpus, gpus_per_node):
        yield from _shape_layouts(m, setup, gpus_per_node, space, shape, True)


def _shape_layouts(m: ModelSpec, setup: TrainingSetup, gpus_per_node: int, space: SearchSpace,
                   shape: DegreeShape, fold: bool) -> Iterator[tuple[Layout, str | None]]:
    from planner.layouts.rules import RuleView, first_failing

    tp, cp, ep, pp, dp = shape
    sps = [space.sp] if space.sp is not None else [tp > 1 and sp_by_default(setup)]
    vps = [space.vp] if space.vp is not None else ([1, 2] if pp > 1 else [1])
    for sharding, stage in shardings_of(space):
        for vp in vps:
            for sp in sps:
                for mb in space.micro_batches:
                    ga = grad_accum_for(setup, mb, dp, ep, fold)
                    for rc in space.recomputes:
                        lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep,
                                     zero_stage=stage, sharding=sharding, sp=sp,
                                     vp=vp, micro_batch=mb, grad_accum=ga or 1,
                                     seq_len=setup.seq_len, recompute=rc, etp=space.etp or 0, ep_fold=fold,
                                     optimizer_instances=space.optimizer_instances)
                        view = RuleView.of(m, setup, lay, gpus_per_node, enumerated=True)
                        rule = first_failing(view)
                        yield lay, None if rule is None else rule.message(view)


def degree_shapes(m: ModelSpec, n_gpus: int, gpus_per_node: int,
                  space: SearchSpace = SearchSpace()) -> Iterator[DegreeShape]:
    """The (tp, cp, ep, pp, dp) products equal to ``n_gpus`` the search visits, in its
    order: tp up to ``space.max_tp`` (default: a node), cp up to ``space.max_cp``, ep up to
    the number of experts, pp up to the number of layers; a fixed degree is taken as
    given. Shared by enumerate_layouts, batch.valid_layouts and sweep's floors, so
    that the three walk the same shapes. Kept per count, node size, caps and space
    (_degree_shapes): the searches of one model's methods walk the same counts (the 256-job
    `plan buy` of issue 32: 371 walks of 127 distinct model and count pairs)."""
    return iter(_degree_shapes(n_gpus, gpus_per_node, m.n_experts if m.is_moe else 1, m.n_layers, space))


@lru_cache(maxsize=128)
def _degree_shapes(n_gpus: int, gpus_per_node: int, ep_cap: int, n_layers: int, space: SearchSpace
                   ) -> tuple[DegreeShape, ...]:
    max_tp = space.max_tp or gpus_per_node
    out = []
    for tp in _degrees(space.tp, n_gpus, max_tp if space.tp is None else n_gpus):
        for cp in _degrees(space.cp, n_gpus // tp, space.max_cp if space.cp is None else n_gpus):
            for ep in _degrees(space.ep, n_gpus // (tp * cp), ep_cap if space.ep is None else n_gpus):
                for pp in _degrees(space.pp, n_gpus // (tp * cp * ep), n_layers if space.pp is None else n_gpus):
                    dp = n_gpus // (tp * cp * ep * pp)
                    if space.dp is None or space.dp == dp:
                        out.append(DegreeShape(tp, cp, ep, pp, dp))
    return tuple(out)


def space_refusal(space: Any) -> str | None:
    """Why a SearchSpace cannot be searched, in one line naming the field (and its option),
    or None: each fixed degree a whole number from 1 to MAX_GPUS, ZeRO 0 to 3, a known FSDP
    sharding, micro-batches and recomputations from their ranges (issue 32, W11: SearchSpace(tp=-1)
    raised TypeError, fsdp="bogus" KeyError, recomputes=("bogus",) ValueError)."""
    from planner.training.checks import is_int_in
    from planner.training.setup import MAX_GPUS, MAX_MICRO_BATCH, RECOMPUTE

    if not isinstance(space, SearchSpace):
        return f"the search space must be a SearchSpace, not {type(space).__name__}"
    for field in (*AXIS_NAMES, "etp", "vp", "max_tp", "optimizer_instances"):
        value = getattr(space, field)
        if value is not None and not is_int_in(value, 1, MAX_GPUS):
            return f"--{field.replace('_', '-')} {value!r} ({field}) must be a whole number from 1 to {MAX_GPUS:,}"
    if not is_int_in(space.max_cp, 1, MAX_GPUS):
        return f"max_cp {space.max_cp!r} must be a whole number from 1 to {MAX_GPUS:,}"
    if space.zero_stage is not None and not is_int_in(space.zero_stage, 0, 3):
        return f"--zero {space.zero_stage!r} (zero_stage): ZeRO stages are 0 to 3"
    fsdp = tuple(s[5:] for s in SHARDINGS if s.startswith("fsdp-"))
    if space.fsdp is not None and space.fsdp not in fsdp:
        return f"--fsdp {space.fsdp!r} (fsdp) is not one of {', '.join(fsdp)}"
    if space.sp is not None and not isinstance(space.sp, bool):
        return f"--sp {space.sp!r} (sp) must be True, False or None"
    if (not isinstance(space.micro_batches, tuple) or not space.micro_batches
            or not all(is_int_in(b, 1, MAX_MICRO_BATCH) for b in space.micro_batches)):
        return (f"--micro-batch {space.micro_batches!r} (micro_batches) must be a non-empty tuple of whole "
                f"numbers from 1 to {MAX_MICRO_BATCH}")
    if (not isinstance(space.recomputes, tuple) or not space.recomputes
            or not all(r in RECOMPUTE for r in space.recomputes)):
        return f"--recompute {space.recomputes!r} (recomputes) must be a non-empty tuple of {', '.join(RECOMPUTE)}"
    return None
