"""torchtitan measurements by depth: the tracker mixins that let torchtitan's step run under
FSDPMemTracker and keep each phase's peak, and the linear scaling of two depths to the full one
(planner/measure/torchtitan.py's docstring, "Depth scaling", says why per phase)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

from planner.measure.readout import CATEGORIES, MeasuredMemory

# the phase buckets whose peak snapshots are scaled (torchtitan.py, "Depth scaling")
BUCKETS = ("forward", "loss", "backward-start", "backward-end", "optimizer")
LAYER_RE = re.compile(r"\.layers\.(\d+)(?:\.|$)")


@contextlib.contextmanager
def leaf_input_hooks_off() -> Iterator[None]:
    """Trap 7: ModTracker (inside FSDPMemTracker) registers a multi-grad hook on every module input
    that requires grad (torch 2.13.0, torch/distributed/_tools/mod_tracker.py, _fw_pre_hook, line
    228). The LM head's inputs under torchtitan's chunked loss are detached leaf chunks; the hook on
    a leaf's gradient accumulator keeps the chunk alive for good (not freed by gc.collect): 8 chunk
    copies, b s h x 2 B, leak per step, and the next step's peak counts them (measured with
    bench/loss_peak_tensors.py --leak: none alive without the tracker, 8, 16, 24 after steps 1-3
    under ModTracker alone). Inside this context ModTracker skips leaf inputs; the hooks on the
    module's non-leaf inputs and outputs, which order the backward, stay."""
    from torch.distributed._tools import mod_tracker

    register = mod_tracker.register_multi_grad_hook

    def register_non_leaf(tensors: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        kept = [t for t in tensors if not t.is_leaf]
        return register(kept, fn, *args, **kwargs) if kept else None

    mod_tracker.register_multi_grad_hook = register_non_leaf
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = register


class RepeatedCalls:
    """FSDPMemTracker mixin (trap 5): a non-root FSDP module may run forward again (torchtitan's
    chunked loss calls the LM head once per chunk); its first statistics are kept and extended."""

    def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
        inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)  # type: ignore[misc]

        def call(*args: Any, **kwargs: Any) -> Any:
            tracking = self.memory_tracking  # type: ignore[attr-defined]
            old = None
            if fsdp_mod is not self._root_mod and not self._mod_tracker.is_bw:  # type: ignore[attr-defined]
                old = tracking.pop(fsdp_mod, None)
            out = inner(*args, **kwargs)
            if old is not None:
                for state, snaps in tracking[fsdp_mod].snapshots.items():
                    old.snapshots.setdefault(state, []).extend(snaps)
                tracking[fsdp_mod] = old
            return out

        return call


class PhaseBuckets:
    """Tracker mixin: the snapshot at the highest total of each phase bucket (BUCKETS), for
    depth scaling. Set ``n_layers`` before entering."""

    n_layers = 0

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)  # type: ignore[misc]
        bucket = self._bucket()
        if bucket is None:
            return
        store: dict[str, dict[str, int]] = self.__dict__.setdefault("bucket_peak", {})
        where: dict[str, str] = self.__dict__.setdefault("bucket_module", {})
        for snap in self._curr_mem_snap.values():  # type: ignore[attr-defined]
            named = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
            if named.get("Total", 0) > store.get(bucket, {}).get("Total", -1):
                store[bucket] = named
                active = [m for m in self._mod_tracker.parents if m != "Global"]  # type: ignore[attr-defined]
                where[bucket] = max(active, key=lambda m: m.count("."), default="")

    def _bucket(self) -> str | None:
        if self._in_opt:  # type: ignore[attr-defined]
            return "optimizer"
        mt = self._mod_tracker  # type: ignore[attr-defined]
        found = [int(m.group(1)) for p in mt.parents if (m := LAYER_RE.search(p))]
        last = self.n_layers - 1
        if mt.is_bw:
            if found:
                self.__dict__["decoder_bw"] = True
                return "backward-start" if max(found) == last else "backward-end" if min(found) == 0 else None
            return "backward-end" if self.__dict__.get("decoder_bw") else "loss"
        self.__dict__["decoder_bw"] = False
        if found:
            return "forward" if max(found) == last else None
        return "loss"


def _line(blocks: tuple[int, ...], full: int) -> Any:
    def line(v1: int, v2: int) -> int:
        if len(blocks) == 1:
            return round(v1 * full / blocks[0])
        return round(v1 + (v2 - v1) * (full - blocks[0]) / (blocks[1] - blocks[0]))
    return line


def scale_buckets(runs: list[tuple[MeasuredMemory, dict[str, dict[str, int]]]], blocks: tuple[int, ...],
                  full: int) -> dict[str, dict[str, int]]:
    """Each bucket's peak snapshot (the tracker's own categories, bytes) scaled linearly in depth
    to ``full`` blocks (one depth: in proportion), in BUCKETS order."""
    line = _line(blocks, full)
    last = runs[-1][1]
    first = runs[0][1]
    scaled: dict[str, dict[str, int]] = {}
    for bucket in BUCKETS:
        if bucket not in last:
            continue
        a, b = first.get(bucket, last[bucket]), last[bucket]
        scaled[bucket] = {k: max(0, line(a.get(k, 0), b.get(k, 0))) for k in set(a) | set(b)}
    return scaled


def scale_depths(runs: list[tuple[MeasuredMemory, dict[str, dict[str, int]]]], blocks: tuple[int, ...],
           full: int) -> MeasuredMemory:
    """Scale each bucket's snapshot linearly in depth (one depth: in proportion) and take the
    bucket with the highest total as the peak; category maxima scale the same way."""
    line = _line(blocks, full)
    scaled = scale_buckets(runs, blocks, full)
    bucket = max(scaled, key=lambda k: scaled[k].get("Total", 0))
    raw = scaled[bucket]
    m1, m2 = runs[0][0], runs[-1][0]
    at_peak = {cat: sum(raw.get(n, 0) for n in names) for cat, names in CATEGORIES.items()}
    maxima = {f"max_{cat}_bytes": max(0, line(getattr(m1, f"max_{cat}_bytes"), getattr(m2, f"max_{cat}_bytes")))
              for cat in CATEGORIES}
    raw_max = {k: max(0, line(m1.raw_max.get(k, 0), m2.raw_max.get(k, 0))) for k in set(m1.raw_max) | set(m2.raw_max)}
    fields: dict[str, Any] = {f"{c}_bytes": n for c, n in at_peak.items()} | maxima
    return dataclasses.replace(
        m2, peak_bytes=raw.get("Total", sum(at_peak.values())), raw=raw, raw_max=raw_max, by_module={},
        n_params=full_params(m1, m2, blocks, full), peak_phase=bucket, peak_module="",
        tracker=f"{m2.tracker} (blocks {', '.join(map(str, blocks))} scaled to {full})",
        wall_s=round(sum(r[0].wall_s for r in runs), 3), **fields)


def full_params(m1: MeasuredMemory, m2: MeasuredMemory, blocks: tuple[int, ...], full: int) -> int:
    if len(blocks) == 1:
        return m1.n_params
    per_block = (m2.n_params - m1.n_params) // (blocks[1] - blocks[0])
    return m1.n_params + per_block * (full - blocks[0])
