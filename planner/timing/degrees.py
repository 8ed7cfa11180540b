"""The step-time model's tables per distinct degrees (tp, cp, ep, dp, pp) and per block shape,
which planner.timing.fast reads for a batch of layouts: each axis's links on each placement
order, the stages that can be the slowest and their ranks' trainable and frozen parameters,
the data-parallel collectives of every sharding and the optimizer update (Degrees, kept
across calls in DEGREE_CACHE), and the
memo of slowest stages per block shape (SlowestMemo). See planner.timing.fast for the model.
"""


from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from planner.hardware.axes import AXES
from planner.hardware.placement import (
    FALLBACK_INTRA_LATENCY_S,
    AxisLink,
    Cluster,
    all_to_all_table,
    axis_link_table,
)
from planner.layouts.batch import Unsupported
from planner.layouts.groups import Rows as _Rows
from planner.layouts.groups import TableCache
from planner.layouts.groups import rows as _rows
from planner.layouts.layout import (
    SHARDINGS,
    dense_shard_size,
    expert_data_parallel_size,
    expert_tp_size,
    hybrid_replicas,
    hybrid_shard_ranks,
    instance_shard_size,
)
from planner.memory.model import stage_layers
from planner.models.spec import ModelSpec, ParamCount
from planner.timing.collectives import Ring
from planner.timing.dp import degrees_split, instance_links, optimizer_update_bytes_per_param
from planner.timing.efficiency import (
    Efficiency,
)
from planner.timing.flops import mtp_blocks
from planner.timing.kernels import (
    backward_layers,
    rates,
)
from planner.timing.parts import (
    ALL_REDUCE,
    FSDP_GRAD_OP,
    FSDP_HYBRID,
    SHARD_3,
    ZERO_12,
)
from planner.training.layer_precision import stage_bf16_layers
from planner.training.moe_runtime import dedup_routing
from planner.training.setup import TrainingSetup, block_table_setup

EXACT_INT = 2**53          # integers below this convert to float64 exactly
SLOTS = 3                  # the stages a pipeline's slowest can be: first, last, fullest
PER_SLOT = 7               # the rows of Degrees.per_slot per slot
N_VALS = 7                 # what SlowestMemo keeps of a slowest stage: t, fwd, bwd, hidden, comm, and
                           # one block's exposed cp and ep seconds



def branches() -> np.ndarray:
    """The branch of each (ZeRO stage, sharding), indexed by 4 x stage + SHARDINGS index."""
    out = np.zeros(4 * len(SHARDINGS), dtype=np.int64)
    for stage in range(4):
        for i, name in enumerate(SHARDINGS):
            if stage == 3:
                b = FSDP_HYBRID if name == "fsdp-hybrid" else SHARD_3
            elif stage == 2 and name.startswith("fsdp"):
                b = FSDP_GRAD_OP
            elif stage in (1, 2):
                b = ZERO_12
            else:
                b = ALL_REDUCE
            out[len(SHARDINGS) * stage + i] = b
    return out


BRANCH = branches()


# ------------------------------------------------------------------ memoised tables

class SlowestMemo:
    """The slowest stage (the max() of (time, fwd, bwd, comm, hidden, stage) over the stages) per block shape and
    Degrees.q_d, on each distinct set of tp, cp and ep links of the placement orders,
    kept with a Degrees entry: a search or sweep asks for the same ones again for other
    micro-batches, accumulations and shardings. Block shapes are numbered in the order
    they arrive (``local``: the block table's row -> that number); a (block shape, q_d)
    pair asked for gets a place in ``vals``, ``slot`` and ``known`` when first asked for
    (places()). Only the pairs asked for are stored: a table of every block shape x every
    q_d held 1.3 million places, 160 MB, for the 2,620 block shapes and 490 q_d of one
    DeepSeek-V3 count, of which a batch reads one per pipeline shape, and grew by copying
    on every call (issue 32: 7 of 27 s and 1.9 GB of `--tokens` over the catalog)."""

    def __init__(self, n_q_d: int, n_sets: int) -> None:
        self.n_q_d, self.n_sets = n_q_d, n_sets
        self.clear(None)

    def clear(self, blocks: _Rows | None) -> None:
        self.blocks = blocks                                # the block table whose rows these are
        self.local = np.full(0, -1, dtype=np.int64)
        self.n_local = 0
        self.keys = np.zeros(0, dtype=np.int64)             # the pairs with a place, sorted (number x n_q_d + q_d)
        self.key_place = np.zeros(0, dtype=np.int64)        # the place of each of them
        self.n_places = 0
        self.known = np.zeros(0, dtype=bool)
        self.vals = np.zeros((self.n_sets, N_VALS, 0))      # t, fwd, bwd, hidden, comm, cp and ep per place
        self.slot = np.zeros((self.n_sets, 0), dtype=np.int64)

    def numbers(self, blocks: _Rows, block_rows: np.ndarray) -> np.ndarray:
        """The numbers of the rows ``block_rows`` of the block table ``blocks``, numbering
        new ones (and starting afresh on another block table: _rows() makes a new one when
        it is full)."""
        if blocks is not self.blocks:
            self.clear(blocks)
        if len(self.local) <= int(block_rows.max()):
            self.local = np.concatenate([self.local, np.full(int(block_rows.max()) + 1 - len(self.local), -1)])
        local = self.local[block_rows]
        if local.min() < 0:
            new = np.unique(block_rows[local < 0])
            self.local[new] = np.arange(self.n_local, self.n_local + len(new))
            self.n_local += len(new)
            local = self.local[block_rows]
        return local

    def places(self, blocks: _Rows, block_rows: np.ndarray, q_d: np.ndarray) -> np.ndarray:
        """The place in ``vals``, ``slot`` and ``known`` of each (row ``block_rows`` of the
        block table ``blocks``, ``q_d``) pair, giving new pairs a place (not known yet)."""
        key = self.numbers(blocks, block_rows) * self.n_q_d + q_d
        if not self.n_places:       # the first call: every pair is new, placed in key order as below
            self.keys, at = np.unique(key, return_inverse=True)
            self.n_places = len(self.keys)
            self.key_place = np.arange(self.n_places)
            self.known = np.zeros(self.n_places, dtype=bool)
            self.vals = np.zeros((self.n_sets, N_VALS, self.n_places))
            self.slot = np.zeros((self.n_sets, self.n_places), dtype=np.int64)
            return at.reshape(-1)
        at = np.searchsorted(self.keys, key)
        found = at < len(self.keys)
        found[found] = self.keys[at[found]] == key[found]
        if not found.all():
            new = np.unique(key[~found])
            first = self.n_places
            self.n_places += len(new)
            if self.n_places > len(self.known):      # room for twice as many: no copy on every call
                room = max(2 * len(self.known), self.n_places) - len(self.known)
                self.known = np.concatenate([self.known, np.zeros(room, dtype=bool)])
                self.vals = np.concatenate([self.vals, np.zeros((self.n_sets, N_VALS, room))], axis=2)
                self.slot = np.concatenate([self.slot, np.zeros((self.n_sets, room), dtype=np.int64)], axis=1)
            keys = np.concatenate([self.keys, new])
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
            self.key_place = np.concatenate([self.key_place, np.arange(first, self.n_places)])[order]
            at = np.searchsorted(self.keys, key)
        return self.key_place[at]


def distinct_rows(columns: Sequence[np.ndarray], rows: _Rows, fn: Callable[..., tuple],
                   bounds: Sequence[tuple[int, int] | None] | None = None) -> np.ndarray:
    """rows.lookup() of each distinct row of ``columns``, spread over every element, as a
    (width, elements) array whose rows are contiguous (read-only: groups.Rows.spread keeps it per
    column contents). ``bounds``: as for planner.layouts.groups.group()."""
    return rows.spread(columns, fn, bounds)


@lru_cache(maxsize=4096)
def stage_slots(n_layers: int, pp: int, balance: str = "none", mtp: int = 0) -> tuple[tuple[int, int], ...]:
    """(stage, layers) of the stages a pipeline's slowest can be, in increasing stage order
    (``balance``, ``mtp``: TrainingSetup.pp_balance and mtp_layers, layouts.stages.stage_layers).
    The last stage is always one: it holds the LM head, and the MTP modules where there are any."""
    counts = stage_layers(n_layers, pp, balance, mtp)
    return tuple((s, counts[s]) for s in sorted({0, len(counts) - 1, counts.index(max(counts))}))


# --------------------------------------------------- timing's collectives, on arrays

# ------------------------------------------------------------------------ the step

# the rows of each order's link table: bus bandwidth and hop latency of tp, cp, ep, dp, pp (AXES),
# then the ep all-to-all's; a stage's time reads tp, cp, ep and the all-to-all's (INNER_ROWS)
LINK_ROWS = 12
A2A_BW, A2A_LAT = 10, 11
INNER_ROWS = np.r_[0:6, 10:12]


class Degrees(NamedTuple):
    """What step_times_s() reads per distinct degrees (D: tp, cp, ep, dp, pp), as
    (rows, D) tables."""

    stage: np.ndarray          # (SLOTS, D): the stages a pipeline's slowest can be, -1: none
    links: list[np.ndarray]    # per placement order (10, D): bus bandwidth, hop latency of each axis
    optimizer_s: np.ndarray    # (3 x SLOTS x D): the optimizer update unsharded, sharded, sharded over an instance
    # (orders x 5 branches x SLOTS x D): the data-parallel collectives' three terms (parts.DP_TERMS)
    c0: np.ndarray
    c1: np.ndarray
    c2: np.ndarray
    n_slots: int               # the slots some pipeline has
    per_slot: np.ndarray       # (PER_SLOT x n_slots, D): layers, pipeline edges, last stage (its LM head and MTP
                               # modules), -inf if absent, backward layers, layers kept in BF16, communicating blocks
    q_d: np.ndarray            # per D: its pipeline depth and tp, cp, ep links on every order, numbered 0, 1, ...
    n_q_d: int
    inner_of: tuple[int, ...]  # per order: its set of tp, cp, ep links (the first order with the same ones)
    slowest: SlowestMemo
    pp_on: np.ndarray          # (orders, D): pp > 1 and a finite pipeline hop latency
    pp_link: np.ndarray        # (2, orders, D): pipeline hop latency and bus bandwidth x bus fraction, and
    pp_send: np.ndarray        # the same with latency 0.0 and bandwidth inf where not pp_on (sends add 0.0)


def layout_links(cluster: Cluster, sizes: tuple[int, ...], order: tuple[str, ...] = AXES, etp: int = 0,
                 ep_fold: int = 0, routing: tuple[int, int, int] | None = None
                 ) -> tuple[dict[str, AxisLink], AxisLink]:
    """(each axis's ring links, the ep all-to-all's link) for a layout of degrees ``sizes``
    (tp, cp, ep, dp, pp): layout_link_table's column of it."""
    col = layout_link_table(cluster, np.array(sizes, dtype=np.int64)[:, None], order, etp, ep_fold,
                            routing)[:, 0].tolist()
    rings = {ax: AxisLink(bus_bytes_per_s=col[2 * AXES.index(ax)], latency_s=col[2 * AXES.index(ax) + 1])
             for ax in order}
    return rings, AxisLink(bus_bytes_per_s=col[A2A_BW], latency_s=col[A2A_LAT])


def layout_link_table(cluster: Cluster, sizes: np.ndarray, order: tuple[str, ...] = AXES, etp: int = 0,
                      ep_fold: int = 0, routing: tuple[int, int, int] | None = None) -> np.ndarray:
    """Each axis's ring links, then the ep all-to-all's link, for layouts of degrees ``sizes``
    (int64, (5, N): tp, cp, ep, dp, pp rows, as placement.axis_link_table and
    placement.all_to_all_table read them), as a (LINK_ROWS, N) array: bus bandwidth and hop
    latency of tp, cp, ep, dp, pp, then of the all-to-all.
    The ep groups lie on the expert grid etp x ep x edp x pp: megatron-core 0.16.1 builds it
    over the same GPUs with the same rank order, cp left out and etp innermost
    (parallel_state.py lines 797-805: RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1,
    order=order)), so an ep group is etp-strided ranks spanning etp x ep consecutive GPUs;
    the all-to-all is timed there (the planner's own grid tp x cp x ep x dp x pp strides it by
    tp x cp, the same where etp = tp and cp = 1). Where ep is folded over tp x cp x dp
    (Layout.ep_fold), the attention grid tp x cp x dp x pp places every other axis and the ep
    ring too is the expert grid's. ``etp`` 0: equal to tp. ``routing``: a dispatcher that sends a
    token once per remote node (training.moe_runtime.dedup_routing)."""
    tp, cp, ep, dp, pp = sizes
    e_tp = expert_tp_size(etp, tp)
    ones = np.ones_like(tp)
    expert_grid = np.stack([e_tp, ones, ep, expert_data_parallel_size(dp, tp, cp, ep, e_tp, ep_fold), pp])
    a2a = all_to_all_table(cluster, expert_grid, order, routing)
    if not ep_fold:
        return np.concatenate([axis_link_table(cluster, sizes, order), a2a])
    rings = axis_link_table(cluster, np.stack([tp, cp, ones, dp, pp]), order)
    ep_row = 2 * AXES.index("ep")
    rings[ep_row:ep_row + 2] = axis_link_table(cluster, expert_grid, order)[ep_row:ep_row + 2]
    return np.concatenate([rings, a2a])


def link_tables(cluster: Cluster, orders: tuple[tuple[str, ...], ...], sizes: np.ndarray, etp: int = 0,
                ep_fold: int = 0, routing: tuple[int, int, int] | None = None) -> list[np.ndarray]:
    """layout_link_table of the degrees ``sizes`` ((5, D): tp, cp, ep, dp, pp) on each placement
    order, each degree tuple's rows kept across calls per cluster, orders, etp, folding and
    routing: they read no model, so the searches of several models on one cluster share them
    (the 256-job `plan buy` of issue 32); new tuples are worked out together."""
    rows = _rows(LINK_ROWS * len(orders), np.float64, "links", cluster, orders, etp, ep_fold, routing)
    keys = list(zip(*sizes.tolist()))
    ids = rows.ids(keys, many=lambda new: np.concatenate(
        [layout_link_table(cluster, new, order, etp, ep_fold, routing) for order in orders]).T)
    every = np.ascontiguousarray(rows.table[ids].T)
    return [every[LINK_ROWS * i:LINK_ROWS * (i + 1)] for i in range(len(orders))]


# Degree tables kept across calls, per (model, set-up, cluster, efficiencies, placement
# orders, distinct degrees): a search or a sweep scores the same GPU counts' layouts again
# and again (other micro-batches, recomputation, ZeRO stages), and these tables are most
# of a call's fixed cost. Least recently used first out. The set-up is keyed without its
# global batch (training.setup.block_table_setup: no step-time model reads it), so that jobs
# that differ only in it share the tables and their slowest stages (issue 32, H1's 128 jobs of
# distinct global batches built 2,803 of them).
DEGREE_CACHE = TableCache(max_entries=32, max_bytes=64 * 2**20)
# (kept per set-up: the slowest stages key their block rows by it too, once per batch)
table_setup = lru_cache(maxsize=256)(block_table_setup)


def degree_tables(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, cluster: Cluster, eff: Efficiency,
                   orders: list[tuple[str, ...]], degrees: tuple[np.ndarray, ...], degrees_key: bytes,
                   any_hybrid: bool, etp: int = 0, ep_fold: int = 0, instances: int = 1) -> Degrees:
    """build_degrees(), or its answer for the same arguments from an earlier call
    (``degrees_key``: LayoutGroups.degrees_key; ``etp``: the batch's expert tensor-parallel
    setting, context.batch_etp; ``ep_fold``: whether its ep is folded, context.batch_fold;
    ``instances``: its distributed-optimizer instances, context.batch_instances)."""
    setup = table_setup(setup)
    key = (m, pc, setup, cluster, eff, tuple(orders), any_hybrid, degrees_key, etp, ep_fold, instances)
    hit = DEGREE_CACHE.get(key)
    if hit is not None:
        return hit
    out = build_degrees(m, pc, setup, cluster, eff, orders, degrees, any_hybrid, etp, ep_fold, instances)
    DEGREE_CACHE.put(key, out)
    return out


def build_degrees(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, cluster: Cluster, eff: Efficiency,
                   orders: list[tuple[str, ...]], degrees: tuple[np.ndarray, ...], any_hybrid: bool,
                   etp: int = 0, ep_fold: int = 0, instances: int = 1) -> Degrees:
    """Per distinct degrees: the stages that can be the slowest and their ranks'
    parameters, each axis's links on each placement order, the optimizer update and the
    data-parallel collectives of every sharding. Raises Unsupported for parameter bytes
    too large to convert to floats exactly. ``etp`` (0: equal to tp): expert weights are
    split over ep x etp and their gradients reduced over the expert data-parallel group
    dp x cp x tp / etp (layouts.layout's notes), on the links of the data-parallel axis.
    ``ep_fold``: ep folded over tp x cp x dp (Layout.ep_fold; dp is Megatron's DP), its
    all-to-all on the expert grid's links (layout_links). ``instances`` > 1: megatron-core's
    distributed-optimizer instances (Layout.optimizer_instances), whose gathers and
    reduce-scatters run inside one instance and whose gradients are all-reduced across them
    (dp.instance_links)."""
    tp, cp, ep, dp, pp = degrees
    n_d = len(tp)
    gpu, prec = cluster.gpu, setup.precision_spec
    r = rates(gpu, prec.compute_dtype, eff)
    bus = eff.bus_fraction
    # ---- per D: the stages that can be the slowest, their ranks' parameters, the links;
    # (slots, D) tables
    ft = setup.finetune
    wb = prec.weight_bytes
    balance, mtp = setup.pp_balance, setup.mtp_layers

    def stages_of(tp_: int, ep_: int, pp_: int) -> tuple[int, ...]:
        """Per slot: the stage (-1: none), its layers, its blocks with a backward pass, its
        rank's trainable dense and expert parameters, its frozen dense and expert bytes
        (dp.trained_split), and its layers kept in BF16 (training.layer_precision)."""
        out = [-1] * SLOTS + [0] * (7 * SLOTS)
        counts = stage_layers(m.n_layers, pp_, balance, mtp)
        for j, (s, c) in enumerate(stage_slots(m.n_layers, pp_, balance, mtp)):
            sp = degrees_split(m, pc, setup, tp_, ep_, pp_, etp, s, c)
            n_bwd = backward_layers(ft, m.n_layers, sum(counts[:s]), c)
            for i, x in enumerate((s, c, n_bwd, sp.trainable_dense, sp.trainable_expert, sp.frozen_dense_bytes,
                                   sp.frozen_expert_bytes, stage_bf16_layers(s, pp_, c, bf16))):
                out[i * SLOTS + j] = x
        return tuple(out)

    bf16 = setup.bf16_layers
    stage_d, layers_d, bwd_layers_d, dense, expert, frozen_dense, frozen_expert, bf16_d = np.split(
        distinct_rows([tp, ep, pp], _rows(8 * SLOTS, np.int64, "stages", m, pc, ft, wb, etp, balance, bf16, mtp),
                      stages_of), 8)
    if max(int(dense.max()), int(expert.max())) * 8 >= EXACT_INT or \
            max(int(frozen_dense.max()), int(frozen_expert.max())) * 2 >= EXACT_INT:
        raise Unsupported("a stage's parameter bytes are too large for exact float conversion")
    dense, expert = dense.astype(np.float64), expert.astype(np.float64)       # trainable
    frozen_dense, frozen_expert = frozen_dense.astype(np.float64), frozen_expert.astype(np.float64)

    routing = dedup_routing(m, setup.moe_dispatcher)

    # per order: bw, lat of each axis, then of the ep all-to-all (placement.all_to_all_link)
    links = link_tables(cluster, tuple(orders), np.stack(degrees), etp, ep_fold, routing)

    # ---- per D: the optimizer update unsharded and sharded (timing.optimizer_time_s), as
    # (2, slots, D) flattened
    moe = m.is_moe
    n_dense = dense_shard_size(dp, cp, ep, ep_fold)
    n_expert = expert_data_parallel_size(dp, tp, cp, ep, expert_tp_size(np.int64(etp), tp), ep_fold)
    nd_f, ne_f = n_dense.astype(np.float64), n_expert.astype(np.float64)
    per_param = optimizer_update_bytes_per_param(m, setup)
    unsharded = dense + expert if moe else dense
    sharded = dense / nd_f + expert / ne_f if moe else dense / nd_f
    # the distributed optimizer over several instances updates one instance's shard
    # (instance_shard_size; Megatron FSDP's outer 'optim' shards the update over the whole group)
    in_inst = (dense / instance_shard_size(nd_f, instances)
               + (expert / np.maximum(instance_shard_size(ne_f, instances), 1) if moe else 0.0))
    optimizer_s = np.concatenate([(x * per_param / r.hbm_bytes_per_s).ravel() for x in (unsharded, sharded, in_inst)])
    g_b, w_b = eff.grad_reduce_bytes or prec.grad_bytes, prec.weight_bytes
    has_frozen = bool(frozen_dense.any() or frozen_expert.any())
    inst = None
    if instances > 1:
        # each rank's gathers and reduce-scatters inside its instance (instance_shard_size ranks),
        # then its shard's gradients all-reduced across the instances
        in_d, in_e = instance_shard_size(n_dense, instances), np.maximum(instance_shard_size(n_expert, instances), 1)
        lk_in, lk_x = zip(*(instance_links(cluster, int(t), int(i), instances) for t, i in zip(tp, in_d)))
        inst = (in_d, in_e, *(np.array([getattr(lk, f) for lk in lks]) for lks in (lk_in, lk_x)
                              for f in ("bus_bytes_per_s", "latency_s")))
    hybrid = None
    if any_hybrid:
        (inside,) = distinct_rows([tp, n_dense], _rows(1, np.int64, "hybrid", gpu.gpus_per_node),
                                   lambda tp_, dd: (hybrid_shard_ranks(dd, tp_, gpu.gpus_per_node),))
        hybrid = (inside.astype(np.float64), np.maximum(1, hybrid_replicas(n_dense, inside)),
                  Ring.of(inside, gpu.intra_node_bytes_per_s, FALLBACK_INTRA_LATENCY_S, bus, 1))

    def dp_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The data-parallel collectives per (order, branch, slot, D), flattened: c0 once a step under
        the backward, c1 under the forward, c2 under the backward."""
        pick, cols = np.where(dp > 1, 6, np.where(cp > 1, 2, 4)), np.arange(n_d)   # dp, else cp, else ep link
        bw = np.stack([lk[pick, cols] for lk in links])[:, None, :]          # (orders, 1, D)
        lat = np.stack([lk[pick + 1, cols] for lk in links])[:, None, :]
        ring_d = Ring.of(n_dense, bw, lat, bus, 1)
        across = None
        if inst is not None:
            in_d, in_e, in_bw, in_lat, x_bw, x_lat = inst
            in_bw, in_lat = np.broadcast_to(in_bw, bw.shape), np.broadcast_to(in_lat, lat.shape)   # every order
            ring_d = Ring.of(in_d, in_bw, in_lat, bus, 1)
            shard_bytes = dense * g_b / in_d + (expert * g_b / in_e if moe else 0.0)
            across = np.broadcast_to(Ring.of(np.full(len(tp), instances), x_bw, x_lat, bus, 2).time_s(shard_bytes),
                                     (len(links),) + shard_bytes.shape)

        def over_dp(ring: Ring, ring_e: Ring | None, per: int, frozen: bool = False) -> np.ndarray:
            """Trainable parameters x ``per`` bytes, plus the frozen base's bytes."""
            out = ring.time_s(frozen_dense + dense * per if frozen else dense * per)
            if ring_e is None:
                return out
            return out + ring_e.time_s(frozen_expert + expert * per if frozen else expert * per)

        ring_e = Ring.of(n_expert, bw, lat, bus, 1) if moe else None
        if inst is not None and moe:
            ring_e = Ring.of(inst[1], np.broadcast_to(inst[2], bw.shape), np.broadcast_to(inst[3], lat.shape), bus, 1)
        ag = over_dp(ring_d, ring_e, w_b)                   # the trainable weights (ZeRO-1/2)
        ag_all = over_dp(ring_d, ring_e, w_b, True) if has_frozen else ag   # and the frozen (ZeRO-3, FSDP)
        if prec.gather_bytes != w_b:     # FSDP2 float8 all-gather (training.fp8, tensorwise)
            ag_all = over_dp(ring_d, ring_e, prec.gather_bytes, has_frozen)
        rs = ag if g_b == w_b else over_dp(ring_d, ring_e, g_b)
        ar = over_dp(Ring.of(n_dense, bw, lat, bus, 2), Ring.of(n_expert, bw, lat, bus, 2) if moe else None, g_b)
        zero = np.zeros_like(ag)
        c0, c1, c2 = [ar, rs, zero, zero, zero], [zero, ag, ag_all, ag_all, zero], [zero, zero, rs, ag_all + rs, zero]
        if across is not None:      # the distributed optimizer after its reduce-scatter; FSDP under the backward
            c0[ZERO_12], c2[SHARD_3] = c0[ZERO_12] + across, c2[SHARD_3] + across
        if hybrid is not None:
            inside_f, across, intra = hybrid          # hybrid_shard_ranks inside, replicas across
            total = dense + expert
            ag_h = intra.time_s((frozen_dense + frozen_expert) + total * w_b if has_frozen else total * w_b)
            rs_h = intra.time_s(total * g_b)
            # the replica all-reduce: each of a node's ``inside`` shard ranks all-reduces its own
            # shard with its replicas at once, so the node's NICs carry every shard: each ring
            # gets the dp link's bandwidth / inside (issue 18: at bw it was inside x too fast;
            # Zhao et al. 2023, PyTorch FSDP, Sec. 3.2.2: hybrid sharding's all-reduce across
            # replicas per shard rank; nccl-tests doc/PERFORMANCE.md: bus bandwidth per NIC)
            c0[FSDP_HYBRID] = Ring.of(across, bw / inside_f, lat, bus, 2).time_s(total * g_b / inside_f)
            c1[FSDP_HYBRID], c2[FSDP_HYBRID] = ag_h, ag_h + rs_h
        out = np.empty((3, ag.shape[0], len(c0), *ag.shape[1:]))      # (c0, c1, c2) x (order, branch, slot, D)
        for j, c in enumerate((c0, c1, c2)):
            for b, x in enumerate(c):
                out[j, :, b] = x          # (broadcast over the orders)
        return out[0].ravel(), out[1].ravel(), out[2].ravel()

    # each stage slot's layers, pipeline edges (embedding, LM head), whether it is the last
    # stage, -inf for a slot the pipeline does not have, its blocks with a backward pass, its
    # layers kept in BF16, and the blocks whose tp, cp and ep communication it runs: its layers,
    # and on the last stage the MTP modules' layers too (flops.mtp_blocks)
    n_slots = int((stage_d >= 0).any(axis=1).sum())
    last = stage_d[:n_slots] == pp - 1
    layers_f = layers_d[:n_slots].astype(np.float64)
    per_slot = np.concatenate([layers_f,
                               (stage_d[:n_slots] == 0) + last.astype(np.float64), last.astype(np.float64),
                               np.where(stage_d[:n_slots] >= 0, 0.0, -np.inf),
                               bwd_layers_d[:n_slots].astype(np.float64), bf16_d[:n_slots].astype(np.float64),
                               layers_f + last * float(mtp_blocks(m, mtp))])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c0, c1, c2 = dp_tables()
    # the degrees that give a stage the same time for the same block: the same depth (the
    # stages and their layers) and the same tp, cp and ep links on every order
    inner = np.concatenate([pp[None].astype(np.float64)] + [lk[INNER_ROWS] for lk in links]).T
    numbers: dict[bytes, int] = {}
    q_d = np.array([numbers.setdefault(row.tobytes(), len(numbers)) for row in inner], dtype=np.int64)
    inner_of = []
    for lk in links:
        inner_of.append(next(j for j in range(len(links)) if np.array_equal(links[j][INNER_ROWS], lk[INNER_ROWS])))
    every_order = np.stack(links)                                     # (orders, LINK_ROWS, D)
    pp_on = (pp > 1) & ~np.isinf(every_order[:, 9])
    pp_link = np.stack([every_order[:, 9], every_order[:, 8] * bus])
    pp_send = np.stack([np.where(pp_on, pp_link[0], 0.0), np.where(pp_on, pp_link[1], np.inf)])
    return Degrees(stage_d, links, optimizer_s, c0, c1, c2, n_slots, per_slot, q_d, len(numbers), tuple(inner_of),
                    SlowestMemo(len(numbers), len(links)), pp_on, pp_link, pp_send)
