"""Grouping of layout arrays by shape, and tables kept across calls: the batched models
compute per-shape figures once per distinct shape and spread them back over the batch."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.layouts.batch import RECOMPUTES, LayoutArrays
from planner.layouts.distinct import group
from planner.layouts.layout import SHARDINGS
from planner.training.kernels import auto_fuses

# glibc gives freed heap memory back to the OS whenever more than 128 KiB lie free at the
# top of the heap, so a call that holds a few MiB of temporaries faults every page of
# them in again, call after call: about half the time of sizing ten thousand layouts.
# Freeing one block of 16 MiB raises glibc's dynamic mmap and trim thresholds to 16 and
# 32 MiB (mallopt(3), M_MMAP_THRESHOLD), after which the heap keeps its pages. Elsewhere
# this is one short-lived allocation.
np.empty(16 << 20, dtype=np.uint8)



_MEMO: dict[tuple, dict[tuple, tuple[int, ...]]] = {}


def memo(*key: object) -> dict[tuple, tuple[int, ...]]:
    """A table of per-shape figures for one model and set-up, kept across calls (the search
    asks for the same shapes on every GPU count)."""
    if len(_MEMO) > 64:
        _MEMO.clear()
    return _MEMO.setdefault(key, {})


class Rows:
    """Figures per distinct key, kept across calls (a search asks for the same degrees
    and block shapes on every GPU count): key -> a row of a table."""

    def __init__(self, width: int, dtype: type) -> None:
        self.index: dict[tuple, int] = {}
        self.table: np.ndarray = np.zeros((0, width), dtype=dtype)
        self.dtype = dtype
        self.known: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}   # columns_of()'s answers
        self.last_spread: tuple[tuple, np.ndarray] | None = None       # spread()'s last answer

    def columns_of(self, columns: Sequence[np.ndarray], fn: Callable[..., tuple] | None = None,
                   many: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows): ids() of the keys whose fields are ``columns`` (int64 arrays of
        equal length), and their rows as a (width, keys) array, remembered per column
        contents (rows are never renumbered): a search asks for the same block shapes again.
        New keys' rows come from fn(*key) each, or from many(keys as a (fields, new keys) int64
        array) all at once, as a (new keys, width) array."""
        packed = np.stack(columns)
        blob = packed.tobytes() + bytes([len(columns)])
        hit = self.known.get(blob)
        if hit is None:
            if len(self.known) > 256:
                self.known.clear()
            ids = self.ids(list(zip(*packed.tolist())), fn, many)
            rows = np.ascontiguousarray(self.table[ids].T)
            ids.flags.writeable = rows.flags.writeable = False
            hit = self.known[blob] = (ids, rows)
        return hit

    def spread(self, columns: Sequence[np.ndarray], fn: Callable[..., tuple],
               bounds: Sequence[tuple[int, int | None] | None] | None = None) -> np.ndarray:
        """lookup() of each distinct row of ``columns`` (integer arrays of equal length), spread
        over every element, as a read-only (width, elements) array whose rows are contiguous.
        The last answer is kept with its column contents (rows are never renumbered nor
        changed): the purchase sweep times each count on its GPU types in turn, and they ask
        for the same degrees (issue 32: 400 of the 788 stage tables of the 256-job `plan buy`).
        Only the last: the per-layout answers of a batch are large (more kept cost 8 MiB of
        peak memory there for 60 more hits), and only in the SPREAD_HOLDERS tables asked most
        recently. ``bounds``: as for group()."""
        blob = tuple((col.dtype.str, col.tobytes()) for col in columns)
        last = self.last_spread
        _SPREAD_HOLDERS[id(self)] = self        # (held: its id stays its own)
        _SPREAD_HOLDERS.move_to_end(id(self))
        if last is not None and last[0] == blob:
            return last[1]
        inverse, first = group(columns, bounds)
        keys = list(zip(*(col[first].tolist() for col in columns)))
        out = np.take(np.ascontiguousarray(self.lookup(keys, fn).T), inverse, axis=1)
        out.flags.writeable = False
        self.last_spread = (blob, out)
        while len(_SPREAD_HOLDERS) > SPREAD_HOLDERS:    # the least recently asked table lets go of its answer
            _SPREAD_HOLDERS.popitem(last=False)[1].last_spread = None
        return out

    def lookup(self, keys: list[tuple], fn: Callable[..., tuple]) -> np.ndarray:
        """The rows of ``keys`` (len(keys) x width), computing fn(*key) for new keys."""
        idx = self.ids(keys, fn)        # (grows the table for new keys)
        return self.table[idx]

    def ids(self, keys: list[tuple], fn: Callable[..., tuple] | None = None,
            many: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """The row numbers of ``keys`` in ``table``, computing fn(*key) (or many(), as
        columns_of) for new keys, numbered in the order they first occur."""
        get = self.index.get
        idx = [get(k) for k in keys]
        if None in idx:
            new = list(dict.fromkeys(k for k, i in zip(keys, idx) if i is None))
            if many is not None:
                rows = np.asarray(many(np.array(new, dtype=np.int64).T), dtype=self.dtype)
            else:
                assert fn is not None
                rows = np.array([fn(*k) for k in new], dtype=self.dtype)
            first = len(self.index)
            for j, k in enumerate(new):
                self.index[k] = first + j
            self.table = np.concatenate([self.table, rows.reshape(len(new), self.table.shape[1])])
            idx = [get(k) for k in keys]
        return np.array(idx, dtype=np.int64)


ROWS: dict[tuple, Rows] = {}
# the tables that hold a spread() answer, least recently asked first: each answer is as large as its
# batch (with the batch's columns as its key), and up to 513 tables live (rows()), one per model,
# set-up and kind: unbounded, 129 of them held 5.7 MiB in the 256-job `plan buy` (issue 32), a
# size that grows with the jobs. 16 hold 0.9 MiB there and keep 580 of its 587 hits (the GPU types
# of one count ask one model's stage and FLOPs tables in turn; 128 keep all 587).
SPREAD_HOLDERS = 16
_SPREAD_HOLDERS: OrderedDict[int, Rows] = OrderedDict()      # id -> table, least recently asked first


def rows(width: int, dtype: type, *key: object) -> Rows:
    if len(ROWS) > 512:
        ROWS.clear()
    rows = ROWS.get(key)
    if rows is None:
        rows = ROWS[key] = Rows(width, dtype)
    return rows


@dataclass(frozen=True, slots=True)
class LayoutGroups:
    """The groups of a LayoutArrays that peak_bytes() and planner.timing.fast share, each as
    (inverse, representatives) (group):

    - D, by degrees (tp, cp, ep, dp, pp);
    - P, by pipeline shape (D, sp, vp, micro-batch, recomputation, and the accumulation
      where it does not follow from them), with each P's columns;
    - B, by block shape: P's tp, cp, ep, whether the kernels are fused under
      kernels="auto" (tp, pp or cp above 1), sp, micro-batch and recomputation; a
      block's activations (memory) and its times (timing.layer_time) depend on no more;

    and each layout's ZeRO stage and sharding as one number (``pair``).
    """

    d_inv: np.ndarray
    d_rep: np.ndarray
    p_inv: np.ndarray
    p_rep: np.ndarray
    degrees: tuple[np.ndarray, ...]     # tp, cp, ep, dp, pp of each D
    degrees_key: bytes                  # the same, as bytes: part of the cache keys of per-D tables
    p_d: np.ndarray                     # each P's D
    p_cols: tuple[np.ndarray, ...]      # each P's sp, vp, micro-batch, recomputation, accumulation
    fused_d: np.ndarray                 # per D: 1 where tp, pp or cp is above 1 (kernels="auto" fuses), else 0
    b_inv: np.ndarray                   # each P's B
    b_rep: np.ndarray                   # a P standing for each B
    pair: np.ndarray                    # per layout: len(SHARDINGS) x ZeRO stage + SHARDINGS index

    @staticmethod
    def of(a: LayoutArrays) -> LayoutGroups:
        # every degree and micro-batch is at least 1: only the largest value of a column is
        # looked up; the narrow degrees are packed before the wide dp
        d_inv, d_rep = group([a.tp, a.cp, a.ep, a.pp, a.dp], [(1, None)] * 5)
        p_cols_of = (a.sp, a.vp, a.micro_batch, a.recompute)
        p_inv, p_rep = group([d_inv, *p_cols_of],
                              [(0, len(d_rep) - 1), (0, 1), (1, None), (1, None), (0, len(RECOMPUTES) - 1)])
        p_ga = a.grad_accum[p_rep]
        if not np.array_equal(p_ga[p_inv], a.grad_accum):   # valid layouts: ga = B / (mb dp ep)
            # group([d_inv, *p_cols_of, a.grad_accum])'s groups in its order: p_inv numbers the
            # shapes in their packed key's order, the accumulation the most significant column
            # either way (it grouped P twice over all its columns: a batch grid of 32 global batches)
            p_inv, p_rep = group([p_inv, a.grad_accum], [(0, len(p_rep) - 1), None])
            p_ga = a.grad_accum[p_rep]
        degrees = np.stack([a.tp[d_rep], a.cp[d_rep], a.ep[d_rep], a.dp[d_rep], a.pp[d_rep]])
        degrees_key = degrees.tobytes()
        p_d = d_inv[p_rep]
        p_sp, p_vp, p_mb, p_rc = (x[p_rep] for x in p_cols_of)
        fused, d_block, n_d_block = block_degrees(degrees, degrees_key)
        b_inv, b_rep = group([d_block[p_d], p_sp, p_mb, p_rc],
                              [(0, n_d_block - 1), (0, 1), (1, None), (0, len(RECOMPUTES) - 1)])
        return LayoutGroups(d_inv, d_rep, p_inv, p_rep, tuple(degrees), degrees_key, p_d,
                            (p_sp, p_vp, p_mb, p_rc, p_ga), fused, b_inv, b_rep,
                            len(SHARDINGS) * a.zero_stage + a.sharding)


_BLOCK_DEGREES: dict[bytes, tuple[np.ndarray, np.ndarray, int]] = {}


def block_degrees(degrees: np.ndarray, degrees_key: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """Per D (``degrees``: tp, cp, ep, dp, pp rows; ``degrees_key``: their bytes): 1
    where kernels="auto" fuses (tp, pp or cp above 1), else 0; the group of its tp, cp,
    ep and that; how many groups. Kept per distinct degrees: a search asks for the same
    ones again."""
    hit = _BLOCK_DEGREES.get(degrees_key)
    if hit is None:
        tp, cp, ep, _, pp = degrees
        fused = auto_fuses(tp, pp, cp).astype(np.int64)     # training.kernels: what "auto" fuses
        d_block, d_block_rep = group([tp, cp, ep, fused], [(1, None), (1, None), (1, None), (0, 1)])
        fused.flags.writeable = d_block.flags.writeable = False
        if len(_BLOCK_DEGREES) > 64:
            _BLOCK_DEGREES.clear()
        hit = _BLOCK_DEGREES[degrees_key] = (fused, d_block, len(d_block_rep))
    return hit


class TableCache:
    """Tables kept across calls, least recently used first out: at most ``max_entries``
    of them and, beyond the most recent one, ``max_bytes`` of numpy arrays in all."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.entries: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
        self.n_bytes = 0
        self.last: tuple[tuple, object] | None = None   # the last key asked for and its tables

    def get(self, key: tuple) -> Any:
        # the same key as the last call's, most often the same objects: a tuple compares
        # identical items without calling their __eq__, where hashing a model or set-up
        # hashes every field
        last = self.last
        if last is not None and last[0] == key:
            return last[1]
        hit = self.entries.get(key)
        if hit is None:
            return None
        self.entries.move_to_end(key)
        self.last = (key, hit[0])
        return hit[0]

    def put(self, key: tuple, tables: tuple) -> None:
        arrays = _arrays(tables)
        for x in arrays:               # later calls read them; none may write
            x.flags.writeable = False
        size = sum(x.nbytes for x in arrays)
        self.entries[key] = (tables, size)
        self.n_bytes += size
        while len(self.entries) > 1 and (len(self.entries) > self.max_entries or self.n_bytes > self.max_bytes):
            self.n_bytes -= self.entries.popitem(last=False)[1][1]

    def clear(self) -> None:
        self.entries.clear()
        self.n_bytes = 0
        self.last = None


def _arrays(x: object) -> list[np.ndarray]:
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for y in x for a in _arrays(y)]
    return []
