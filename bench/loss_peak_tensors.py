"""List the live tensors at the loss's peak of torchtitan 0.3.0's step under FSDPMemTracker.

Usage: python bench/loss_peak_tensors.py [micro_batch] [n_steps]   (Llama 3.1 70B width, 2 blocks,
dp 2, tp 8, sequence 8192, full recomputation; about 10 s on a CPU under fake tensors)

A mixin before the tracker (planner.measure.readout.make_tracker) tags each new storage with its
creating op, shape, dtype and step, and keeps the tracker's live storages at the highest total of
the loss bucket in the last step. Measured, not modelled: docs/published-memory.md (the 70B row)
cites what it prints.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
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
        if self._bucket() != "loss" or getattr(self, "step", 0) != self.last_step:  # type: ignore[attr-defined]
            return
        total = max(int(v) for snap in self._curr_mem_snap.values()  # type: ignore[attr-defined]
                    for k, v in snap.items() if str(getattr(k, "value", k)) == "Total")
        if total > self.__dict__.get("live_total", -1):
            self.__dict__["live_total"] = total
            self.__dict__["live"] = [(w.mem_consumed, str(getattr(w.reftype, "value", w.reftype)), TAGS.get(st))
                                     for st, (w, _) in list(self._WINFO.items())]  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    micro_batch = int(argv[0]) if argv else 16
    n_steps = int(argv[1]) if len(argv) > 1 else 2
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
    print(f"loss peak of step {n_steps}: {t.live_total / GIB:.3f} GiB live")
    for size, ref, tag in sorted(t.live, key=lambda r: -r[0]):
        if size >= 0.1 * GIB:
            print(f"{size / GIB:7.3f} GiB  {ref:15s} {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
