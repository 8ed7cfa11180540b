"""List the live tensors at the loss's peak of torchtitan 0.3.0's step under FSDPMemTracker.

Usage: python bench/loss_peak_tensors.py [micro_batch] [n_steps] [bucket]   (Llama 3.1 70B width, 2 blocks,
dp 2, tp 8, sequence 8192, full recomputation; about 10 s on a CPU under fake tensors; bucket: a
planner.measure.titan_depth phase bucket, "loss" by default, "backward-start" for the step's peak)
       python bench/loss_peak_tensors.py --leak {none,modtracker} [micro_batch] [n_steps]
           the same steps without FSDPMemTracker (none) or under torch's plain ModTracker only, printing
           after each step which steps' chunk copies (the loss's ``clone`` of b x s/8 x h) are still alive
       python bench/loss_peak_tensors.py --scaled
           the whole scaled measurement (blocks 2 and 4 to 80), in this process
       python bench/loss_peak_tensors.py --dump [bucket] [micro_batch] [recompute]
           the live storages at the bucket's peak of step 2 ("backward-start" by default: inside the last
           block's recomputed backward; FullAC by default), in the order the step made them, each with
           its op, shape, dtype and the module that ran it (forward or backward): how
           memory.activations.titan_backward_working_bytes was matched; the newest op's output is
           listed as None (it is tagged after the tracker's update)
       --with-leak (with either of the tracker runs): undo planner.measure's trap 7 fix, letting
           ModTracker hook the LM head's leaf inputs again (titan_depth.leaf_input_hooks_off)

A mixin before the tracker (planner.measure.readout.make_tracker) tags each new storage with its
creating op, shape, dtype and step, and keeps the tracker's live storages at the highest total of
the loss bucket in the last step. Measured, not modelled: docs/published-memory.md (the 70B row)
cites what it prints.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

import planner.measure.readout as readout
from planner.measure import torchtitan as tt
from planner.models.spec import load_hf_config

TAGS: Any = WeakIdKeyDictionary()
GIB = 2**30


class LiveTensors:
    """Tracker mixin: tags storages by creating op; keeps the live set at the loss's last-step peak."""

    last_step = 2
    bucket = "loss"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[misc]
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st not in TAGS:
                    TAGS[st] = (str(func), tuple(t.shape), str(t.dtype), getattr(self, "step", 0))
        return out

    def _update_peak_stats(self, peak_state: Any) -> None:
        super()._update_peak_stats(peak_state)  # type: ignore[misc]
        if self._bucket() != self.bucket or getattr(self, "step", 0) != self.last_step:  # type: ignore[attr-defined]
            return
        total = max(int(v) for snap in self._curr_mem_snap.values()  # type: ignore[attr-defined]
                    for k, v in snap.items() if str(getattr(k, "value", k)) == "Total")
        if total > self.__dict__.get("live_total", -1):
            self.__dict__["live_total"] = total
            self.__dict__["live"] = [(w.mem_consumed, str(getattr(w.reftype, "value", w.reftype)), TAGS.get(st))
                                     for st, (w, _) in list(self._WINFO.items())]  # type: ignore[attr-defined]


class _Done(Exception):
    """Raised in place of the tracker's readout once the steps have run (--leak)."""


class _TagMode(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage() not in TAGS:
                TAGS[t.untyped_storage()] = (str(func), tuple(t.shape), str(t.dtype), STEP[0])
        return out


class _Bare:
    """Stands in for the tracker: tags storages, optionally under torch's ModTracker alone."""

    def __init__(self, with_modtracker: bool) -> None:
        from torch.distributed._tools.mod_tracker import ModTracker

        self.modes: list[Any] = ([ModTracker()] if with_modtracker else []) + [_TagMode()]

    def __enter__(self) -> _Bare:
        for m in self.modes:
            m.__enter__()
        return self

    def __exit__(self, *a: Any) -> None:
        for m in reversed(self.modes):
            m.__exit__(*a)

    def reset_mod_stats(self) -> None:
        pass

    def get_tracker_snapshot(self, kind: str) -> dict[str, Any]:
        return {}


STEP = [1]


def leak(argv: list[str]) -> int:
    import gc

    kind, micro_batch = argv[0], int(argv[1]) if len(argv) > 1 else 16
    n_steps = int(argv[2]) if len(argv) > 2 else 3
    chunk_shape = (micro_batch, 8192 // 8, 8192)
    readout.make_tracker = lambda *a, **k: _Bare(kind == "modtracker")  # type: ignore[assignment]

    def done(*a: Any, **k: Any) -> Any:
        raise _Done

    readout.tracker_result = done  # type: ignore[assignment]
    zero_grad = torch.optim.AdamW.zero_grad

    def zero_grad_and_count(self: Any, *a: Any, **k: Any) -> None:
        zero_grad(self, *a, **k)
        gc.collect()
        alive = sorted(tag[3] for tag in list(TAGS.values()) if tag[0] == "aten.clone.default"
                       and tag[1] == chunk_shape)
        print(f"after step {STEP[0]}: chunk copies alive, by the step that made them: {alive}")
        STEP[0] += 1

    torch.optim.AdamW.zero_grad = zero_grad_and_count  # type: ignore[method-assign]
    setup = tt.TitanSetup(hf_config=load_hf_config("llama3.1-70b"), dp=2, tp=8, micro_batch=micro_batch,
                          seq_len=8192, recompute="full", blocks=(2,), n_steps=n_steps)
    try:
        tt.measure(setup)
    except _Done:
        pass
    return 0


def scaled(argv: list[str]) -> int:
    setup = tt.TitanSetup(hf_config=load_hf_config("llama3.1-70b"), dp=2, tp=8, micro_batch=16, seq_len=8192,
                          recompute="full")
    m = tt.measure(setup).memory
    print(f"activations and loss {(m.activations_bytes + m.temporaries_bytes) / GIB:.2f} GiB, "
          f"peak {m.peak_bytes / GIB:.2f} GiB (scaled to 80 blocks)")
    return 0


class _OrderedLive(LiveTensors):
    """LiveTensors whose tags also hold the op's order in the step and the module running it."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super(LiveTensors, self).__torch_dispatch__(func, types, args, kwargs)  # type: ignore[misc]
        ORDER[0] += 1
        mt = self._mod_tracker  # type: ignore[attr-defined]
        module = max([m for m in mt.parents if m != "Global"], key=lambda m: m.count("."), default="")
        where = ("backward " if mt.is_bw else "forward ") + module.replace("Llama3Model.", "")
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage() not in TAGS:
                TAGS[t.untyped_storage()] = (str(func), tuple(t.shape), str(t.dtype), getattr(self, "step", 0),
                                             ORDER[0], where)
        return out


ORDER = [0]


def dump(argv: list[str]) -> int:
    bucket = argv[0] if argv else "backward-start"
    micro_batch = int(argv[1]) if len(argv) > 1 else 16
    recompute = argv[2] if len(argv) > 2 else "full"
    held: dict[str, Any] = {}
    orig = readout.make_tracker
    _OrderedLive.bucket, _OrderedLive.last_step = bucket, 2

    def make_tracker(*a: Any, mixins: tuple[type, ...] = (), **k: Any) -> Any:
        held["t"] = orig(*a, mixins=(_OrderedLive, *mixins), **k)
        return held["t"]

    readout.make_tracker = make_tracker  # type: ignore[assignment]
    setup = tt.TitanSetup(hf_config=load_hf_config("llama3.1-70b"), dp=2, tp=8, micro_batch=micro_batch,
                          seq_len=8192, recompute=recompute, blocks=(2,), n_steps=2)
    tt.measure(setup)
    t = held["t"]
    print(f"{bucket} peak of step 2 ({recompute}, micro-batch {micro_batch}): {t.live_total / GIB:.3f} GiB live; "
          "storages of 0.1 GiB or more, model states left out, in the order made")
    rows = [(tag[4] if tag else 0, size, ref, tag) for size, ref, tag in t.live
            if size >= 0.1 * GIB and ref not in ("OptState", "Sharded Param", "Sharded Grad")]
    for _, size, ref, tag in sorted(rows, key=lambda r: r[0]):
        print(f"{size / GIB:7.3f} GiB  {ref:12s} " + ("None" if tag is None else
              f"#{tag[4]} step {tag[3]} {tag[0]} {tag[1]} {tag[2]} ({tag[5]})"))
    return 0


def main(argv: list[str]) -> int:
    if "--with-leak" in argv:
        argv = [a for a in argv if a != "--with-leak"]
        tt.leaf_input_hooks_off = contextlib.nullcontext  # type: ignore[assignment]
    if argv and argv[0] == "--leak":
        return leak(argv[1:])
    if argv and argv[0] == "--scaled":
        return scaled(argv[1:])
    if argv and argv[0] == "--dump":
        return dump(argv[1:])
    micro_batch = int(argv[0]) if argv else 16
    n_steps = int(argv[1]) if len(argv) > 1 else 2
    LiveTensors.bucket = argv[2] if len(argv) > 2 else "loss"
    held: dict[str, Any] = {}
    orig = readout.make_tracker
    LiveTensors.last_step = n_steps

    def make_tracker(*a: Any, mixins: tuple[type, ...] = (), **k: Any) -> Any:
        held["t"] = orig(*a, mixins=(LiveTensors, *mixins), **k)
        return held["t"]

    readout.make_tracker = make_tracker  # type: ignore[assignment]
    setup = tt.TitanSetup(hf_config=load_hf_config("llama3.1-70b"), dp=2, tp=8, micro_batch=micro_batch,
                          seq_len=8192, recompute="full", blocks=(2,), n_steps=n_steps)
    tt.measure(setup)
    t = held["t"]
    print(f"{LiveTensors.bucket} peak of step {n_steps}: {t.live_total / GIB:.3f} GiB live")
    for size, ref, tag in sorted(t.live, key=lambda r: -r[0]):
        if size >= 0.1 * GIB:
            print(f"{size / GIB:7.3f} GiB  {ref:15s} {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
