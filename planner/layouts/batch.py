"""Layouts as arrays (one int64 array per field), and the valid layouts of a GPU count
as one batch: what the batched memory and step-time models evaluate.

numpy is imported by this package's batch modules only (never by `plan --help`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from planner.layouts.distinct import Unsupported as Unsupported  # (where the batched models raise it)
from planner.layouts.distinct import group
from planner.layouts.layout import (
    AXIS_NAMES,
    SHARDINGS,
    DegreeShape,
    Layout,
    SearchSpace,
    data_parallel_size,
    degree_shapes,
    dense_shard_size,
    expert_data_parallel_size,
    expert_tp_size,
    hybrid_replicas,
    hybrid_shard_ranks,
    instance_shard_size,
    model_parallel_size,
    seq_len_per_rank,
    shardings_of,
    sp_by_default,
    world_size,
)
from planner.layouts.rules import RULES, RuleView, first_failing_index, valid_mask
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

RECOMPUTES = ("none", "selective", "full")


def at_least_one_instance(x: Any) -> Any:
    """Distributed-optimizer instances as given (LayoutArrays.optimizer_instances: 0 or None
    for one), at least 1; elementwise. (LayoutArrays.layout reads one row's: the whole array's
    took 0.7 s of `plan buy` of 256 jobs of distinct global batches, once per kept layout.)"""
    return np.maximum(x, 1)


@dataclass(frozen=True, slots=True)
class LayoutArrays:
    """Layouts as one int64 array per field (struct of arrays). ``sharding`` indexes
    layouts.SHARDINGS and ``recompute`` RECOMPUTES; ``sp`` is 0 or 1."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    zero_stage: np.ndarray
    sharding: np.ndarray
    sp: np.ndarray
    vp: np.ndarray
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    recompute: np.ndarray
    etp: np.ndarray | None = None   # expert tensor-parallel size, 0 or None: equal to tp
    ep_fold: np.ndarray | None = None   # 1: ep folded over tp x cp x dp (Layout.ep_fold); None: 0
    optimizer_instances: np.ndarray | None = None   # Layout.optimizer_instances; None (or 0): 1

    FIELDS: ClassVar[tuple[str, ...]] = ()      # every field, in the dataclass's order (set below)

    @property
    def folds(self) -> np.ndarray | int:
        """ep_fold per layout, or 0 for all where not given (no array of zeros built)."""
        return 0 if self.ep_fold is None else self.ep_fold

    def seq_len_per_rank(self, seq_len: int) -> np.ndarray:
        """The sequence positions one rank holds per layout (layout.seq_len_per_rank)."""
        return seq_len_per_rank(seq_len, self.cp)

    @property
    def data_parallel(self) -> np.ndarray:
        """Megatron's data-parallel size (Layout.data_parallel)."""
        return data_parallel_size(self.dp, self.ep, self.folds)

    @property
    def dense_shard_degree(self) -> np.ndarray:
        """Ranks that hold replicas of a dense weight (Layout.dense_shard_degree)."""
        return dense_shard_size(self.dp, self.cp, self.ep, self.folds)

    @property
    def expert_shard_degree(self) -> np.ndarray:
        """The expert data-parallel group (Layout.expert_shard_degree)."""
        return expert_data_parallel_size(self.dp, self.tp, self.cp, self.ep, self.expert_tp, self.folds)

    @property
    def model_parallel(self) -> np.ndarray:
        """The GPUs of one data-parallel replica (Layout.model_parallel)."""
        return model_parallel_size(self.tp, self.cp, self.pp)

    @property
    def n_gpus(self) -> np.ndarray:
        return world_size(self.dp, self.tp, self.pp, self.cp, self.ep, self.folds)

    @property
    def expert_tp(self) -> np.ndarray:
        """Ranks an expert's matrices are split over (Layout.expert_tp)."""
        if self.etp is None:
            return self.tp
        return expert_tp_size(self.etp, self.tp)

    @property
    def instances(self) -> np.ndarray:
        """Distributed-optimizer instances per layout (Layout.optimizer_instances), at least 1."""
        return at_least_one_instance(self.field("optimizer_instances"))

    def hybrid_shard(self, gpus_per_node: int) -> np.ndarray:
        """The HSDP shard group per layout (Layout.hybrid_shard): one distributed-optimizer
        instance's ranks (instance_shard_size) where there are several, FSDP hybrid's node group
        (hybrid_shard_ranks), 0 elsewhere; the node rule runs once per distinct (degree, tp)."""
        inst = self.instances
        out = np.where(inst > 1, instance_shard_size(self.dense_shard_degree, inst), 0).astype(np.int64)
        rows = np.flatnonzero((self.sharding == SHARDINGS.index("fsdp-hybrid")) & (inst <= 1))
        if not len(rows):
            return out
        keys = (self.dense_shard_degree[rows], self.tp[rows])
        inv, first = group(keys)
        degs = [hybrid_shard_ranks(d_all, t, gpus_per_node) for d_all, t in zip(*(k[first].tolist() for k in keys))]
        out[rows] = np.array(degs, dtype=np.int64)[inv]
        return out

    def hybrid_replicate(self, gpus_per_node: int) -> np.ndarray:
        """FSDP hybrid's (HSDP) replicas per layout (Layout.hybrid_replicate: hybrid_replicas), 1
        where the sharding is not hybrid."""
        shard = self.hybrid_shard(gpus_per_node)
        return np.where(shard > 0, hybrid_replicas(self.dense_shard_degree, np.maximum(shard, 1)), 1)

    def __len__(self) -> int:
        return len(self.dp)

    @staticmethod
    def from_layouts(layouts: Sequence[Layout]) -> LayoutArrays:
        get = operator.attrgetter(*LayoutArrays.FIELDS)
        i_sharding, i_recompute = LayoutArrays.FIELDS.index("sharding"), LayoutArrays.FIELDS.index("recompute")
        rows = []
        for x in layouts:
            row = list(get(x))
            row[i_sharding], row[i_recompute] = SHARDINGS.index(x.sharding), RECOMPUTES.index(x.recompute)
            rows.append(row)
        width = len(LayoutArrays.FIELDS)
        a = np.array(rows, dtype=np.int64).reshape(-1, width)
        return LayoutArrays(*(a[:, i].copy() for i in range(width)))

    def take(self, rows: slice | np.ndarray) -> LayoutArrays:
        """The layouts at ``rows`` (a slice: views); a field not given stays not given (field()
        would build its zeros at the full length: 3.4 s of 21,384 zeros of `plan buy` of 256
        jobs of distinct global batches)."""
        return LayoutArrays(*(None if (x := getattr(self, f)) is None else x[rows] for f in self.FIELDS))  # type: ignore[arg-type]

    @staticmethod
    def concat(parts: Sequence[LayoutArrays]) -> LayoutArrays:
        if not parts:
            return LayoutArrays.from_layouts([])
        return LayoutArrays(*(np.concatenate([p.field(f) for p in parts]) for f in LayoutArrays.FIELDS))

    def field(self, name: str) -> np.ndarray:
        """One field as an array (``etp`` and ``ep_fold`` as zeros where not given)."""
        x = getattr(self, name)
        return np.zeros(len(self.dp), dtype=np.int64) if x is None else x

    def layout(self, i: int, seq_len: int) -> Layout:
        degrees: dict[str, Any] = {a: int(getattr(self, a)[i]) for a in AXIS_NAMES}
        return Layout(**degrees, zero_stage=int(self.zero_stage[i]),
                      sharding=SHARDINGS[int(self.sharding[i])], sp=bool(self.sp[i]), vp=int(self.vp[i]),
                      micro_batch=int(self.micro_batch[i]), grad_accum=int(self.grad_accum[i]),
                      seq_len=seq_len, recompute=RECOMPUTES[int(self.recompute[i])],
                      etp=0 if self.etp is None else int(self.etp[i]),
                      ep_fold=False if self.ep_fold is None else bool(self.ep_fold[i]),
                      optimizer_instances=int(at_least_one_instance(
                          0 if self.optimizer_instances is None else self.optimizer_instances[i])))

LayoutArrays.FIELDS = tuple(f.name for f in fields(LayoutArrays))


def _grid(m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
          space: SearchSpace, batches: Sequence[int] | None = None
          ) -> tuple[RuleView, Any, list[DegreeShape], list[int], list[int]] | None:
    """enumerate_layouts()' candidates as a grid (global batch, shape, sharding, vp,
    micro-batch): the rules' view broadcast over it, where enumeration visits a cell (its vps
    per pp), the degree shapes and the recomputation modes; None when there is nothing to
    enumerate. ``batches``: the global batches of the first axis (default: the set-up's); no
    rule reads the set-up's own where they are given (RuleView.global_batch)."""
    shapes = list(degree_shapes(m, n_gpus, gpus_per_node, space))   # enumerate_layouts' order
    shardings = shardings_of(space)
    vps = [space.vp] if space.vp is not None else [1, 2]
    mbs, rcs = list(space.micro_batches), [RECOMPUTES.index(r) for r in space.recomputes]
    if not shapes or not mbs or not rcs:
        return None
    # G, S, K, V, M: global batches, shapes, shardings, vps, mbs; recomputation is read by no rule
    sh = np.array(shapes, dtype=np.int64)
    tp, cp, ep, pp, dp = (sh[:, i][None, :, None, None, None] for i in range(5))    # (1,S,1,1,1), DegreeShape order
    sharding = np.array([SHARDINGS.index(name) for name, _ in shardings], dtype=np.int64)[None, None, :, None, None]
    zero = np.array([stage for _, stage in shardings], dtype=np.int64)[None, None, :, None, None]   # (1,1,K,1,1)
    vp = np.array(vps, dtype=np.int64)[None, None, None, :, None]                    # (1,1,1,V,1)
    mb = np.array(mbs, dtype=np.int64)[None, None, None, None, :]                    # (1,1,1,1,M)
    gb = np.array([setup.global_batch] if batches is None else list(batches),
                  dtype=np.int64)[:, None, None, None, None]                          # (G,1,1,1,1)
    sp = ((tp > 1) & sp_by_default(setup)).astype(np.int64) if space.sp is None \
        else np.full(tp.shape, int(bool(space.sp)))
    per_step = np.maximum(mb * data_parallel_size(dp, ep, 0), 1)
    ga = np.where(gb % per_step == 0, gb // per_step, 1)   # grad_accum_for, or 1
    view = RuleView(m=m, setup=setup, gpus_per_node=gpus_per_node, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep,
                    zero_stage=zero, sharding=sharding, sp=sp, vp=vp, micro_batch=mb, grad_accum=ga, enumerated=1,
                    etp=space.etp or 0, optimizer_instances=space.optimizer_instances, global_batch=gb)
    # enumerate_layouts visits vp 1 and 2 where pp > 1, vp 1 only otherwise (or the fixed vp)
    visited = (vp == 1) | (pp > 1) if space.vp is None else np.ones((1, 1, 1, 1, 1), dtype=bool)
    return view, visited, shapes, vps, rcs


def _cells(view: RuleView, shape: tuple[int, ...], at_cells: tuple[np.ndarray, ...], rcs: list[int],
           limit: int | None = None) -> LayoutArrays:
    """The layouts of the grid's cells ``at_cells`` (indices along G, S, K, V, M), each cell
    once per recomputation mode of ``rcs`` (the innermost axis of enumeration); the first
    ``limit`` of them where given."""
    per = len(rcs)
    if limit is not None:
        at_cells = tuple(c[:-(-limit // per)] for c in at_cells)
    n = len(at_cells[0]) * per

    repeated: dict[int, np.ndarray] = {}     # axis -> the cells' index along it, repeated per mode

    def at(x: np.ndarray) -> np.ndarray:
        """x broadcast over the grid, at the cells, each repeated per recomputation mode:
        indexed along its own axes only (along all five and the modes', 428,334 layouts of 128
        batches took 14 ms a field). A field along one axis (the degrees, sharding, vp,
        micro-batch) is taken at that axis's repeated index, shared by the fields (issue 32:
        half the time of indexing and repeating each)."""
        x = np.asarray(x).reshape((1,) * (len(shape) - np.ndim(x)) + np.shape(x))
        if x.size == 1:
            return np.full(n, x.reshape(()), dtype=x.dtype)[:limit]
        axes = [i for i, d in enumerate(x.shape) if d > 1]
        if len(axes) == 1:
            (axis,) = axes
            if axis not in repeated:
                repeated[axis] = np.repeat(at_cells[axis], per)[:limit]
            return x.reshape(-1).take(repeated[axis])
        return np.repeat(x[tuple(c if d > 1 else 0 for c, d in zip(at_cells, x.shape))], per)[:limit]

    degrees: dict[str, Any] = {a: at(getattr(view, a)) for a in AXIS_NAMES}
    k = n if limit is None else min(n, limit)
    return LayoutArrays(**degrees, zero_stage=at(view.zero_stage), sharding=at(view.sharding), sp=at(view.sp),
                        vp=at(view.vp), micro_batch=at(view.micro_batch), grad_accum=at(view.grad_accum),
                        recompute=np.tile(np.array(rcs, dtype=np.int64), len(at_cells[0]))[:limit],
                        etp=_constant(k, int(view.etp), 0),
                        optimizer_instances=_constant(k, int(view.optimizer_instances), 1))


def _constant(n: int, value: int, unset: int) -> np.ndarray | None:
    """A field of one value over ``n`` layouts: None (not given) where the value means what an
    absent field means (etp 0: tp; one distributed-optimizer instance), which every reader of
    the field takes as that value (LayoutArrays.field, expert_tp, instances) and take() and the
    groups pass over no array of it; else the array."""
    return None if value <= unset else np.full(n, value, dtype=np.int64)


def _grid_shape(view: RuleView, shapes: list[DegreeShape], vps: list[int]) -> tuple[int, ...]:
    """The grid's (G, S, K, V, M) shape."""
    return (view.global_batch.shape[0], len(shapes), view.sharding.shape[2], len(vps), view.micro_batch.shape[4])


def valid_layouts(m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
                  space: SearchSpace | None = None) -> LayoutArrays:
    """The layouts layouts.enumerate_layouts() yields with no reject reason, in the same
    order, as arrays. The parallel degrees are walked in Python (a few hundred
    combinations); sharding, virtual stages, micro-batch and recomputation form a grid
    over which every rule of planner.layouts.rules.RULES is one array expression."""
    arrays, _ = valid_layouts_of_batches(m, setup, [setup.global_batch], n_gpus, gpus_per_node, space)
    return arrays


def valid_layouts_of_batches(m: ModelSpec, setup: TrainingSetup, batches: Sequence[int], n_gpus: int,
                             gpus_per_node: int, space: SearchSpace | None = None) -> tuple[LayoutArrays, list[int]]:
    """valid_layouts() of ``setup`` with each global batch of ``batches``, one after another
    as one LayoutArrays, and where each batch's layouts start (and the last end): the grid is
    built and the rules evaluated once, the batches along its first axis (`plan buy` of 256
    jobs of one model, each its own global batch, built 2,809 grids, issue 32)."""
    grid = _grid(m, setup, n_gpus, gpus_per_node, space or SearchSpace(), batches)
    if grid is None:
        return LayoutArrays.from_layouts([]), [0] * (len(batches) + 1)
    view, visited, shapes, vps, rcs = grid
    shape = _grid_shape(view, shapes, vps)
    at_cells = np.nonzero(np.broadcast_to(valid_mask(view) & visited, shape))       # (G,S,K,V,M)
    starts = (np.searchsorted(at_cells[0], np.arange(len(batches) + 1)) * len(rcs)).tolist()
    return _cells(view, shape, at_cells, rcs), starts


def rejected_layouts(m: ModelSpec, setup: TrainingSetup, n_gpus: int, gpus_per_node: int,
                     space: SearchSpace | None = None, limit: int = 10_000) -> list[tuple[Layout, str]]:
    """The first ``limit`` layouts enumerate_layouts() rejects, in its order, with their
    reasons (the message of the first rule each breaks)."""
    grid = _grid(m, setup, n_gpus, gpus_per_node, space or SearchSpace())
    if grid is None or limit <= 0:
        return []
    view, visited, shapes, vps, rcs = grid
    shape = _grid_shape(view, shapes, vps)
    first = np.broadcast_to(first_failing_index(view), shape)
    bad = np.broadcast_to((first < len(RULES)) & visited, shape)
    at_cells = np.nonzero(bad)
    cells = _cells(view, shape, at_cells, rcs, limit)
    rule_i = np.repeat(first[at_cells][:-(-limit // len(rcs))], len(rcs))[:limit]
    out = []
    for j in range(len(cells)):
        lay = cells.layout(j, setup.seq_len)
        one = RuleView.of(m, setup, lay, gpus_per_node, enumerated=True)
        out.append((lay, RULES[int(rule_i[j])].message(one)))
    return out
