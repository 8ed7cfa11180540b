"""Reading PyTorch's memory trackers: the planner's categories (CATEGORIES), the tracker a
step runs under (MemTracker, or FSDPMemTracker for FSDP2-sharded models; torch
2.13's torch/distributed/_tools/mem_tracker.py and fsdp2_mem_tracker.py) and
MeasuredMemory, what one rank's steps used. torch is imported inside functions only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Planner category -> the tracker categories it sums. MemTracker names first, then FSDPMemTracker's.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "weights": ("Parameter", "Sharded Param", "Unsharded Param"),
    "gradients": ("Gradient", "Sharded Grad", "Unsharded Grad"),
    "optimizer": ("Optstate", "OptState"),
    "activations": ("Activation",),
    "temporaries": ("Temp",),
    "buffers": ("Buffer", "All Gather", "Reduce Scatter"),
    "inputs": ("Other", "Inputs"),
}
_TOTAL = "Total"
_BY_MODULE_DEPTH = 4  # "LlamaForCausalLM.model.layers.0" is depth 4
_BY_MODULE_MAX_ENTRIES = 64


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredMemory:
    """One rank's memory over the measured steps, in bytes.

    ``*_bytes`` are the categories in the tracker's snapshot at the moment of the peak total; they
    sum to ``peak_bytes``. ``max_*_bytes`` are each category's own maximum over the steps (reached
    at different moments, so they do not sum to anything). See CATEGORIES for which tracker
    categories each one sums, and the module docstring for what each tracker category holds.
    ``raw`` / ``raw_max`` are the tracker's own categories (at the peak / each one's maximum).
    ``by_module``: for each module down to depth 4 that the tracker followed (every module for
    MemTracker, the FSDP-wrapped ones for FSDPMemTracker), the highest total seen while it ran.
    ``peak_step`` (1-based), ``peak_phase`` ("forward", "backward" or "optimizer") and
    ``peak_module`` (the innermost module running, "" outside any) say when the peak happened.
    ``n_params``: the model's parameter count, unsharded.
    ``max_allocated_bytes`` / ``max_reserved_bytes`` / ``device_stats``: CUDA runs only.
    """

    peak_bytes: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    temporaries_bytes: int
    buffers_bytes: int
    inputs_bytes: int
    max_weights_bytes: int
    max_gradients_bytes: int
    max_optimizer_bytes: int
    max_activations_bytes: int
    max_temporaries_bytes: int
    max_buffers_bytes: int
    max_inputs_bytes: int
    raw: dict[str, int]
    raw_max: dict[str, int]
    by_module: dict[str, int]
    n_params: int
    peak_step: int
    peak_phase: str
    peak_module: str
    tracker: str
    device: str
    fake: bool
    rank: int = 0
    wall_s: float = 0.0
    max_allocated_bytes: int | None = None
    max_reserved_bytes: int | None = None
    device_stats: dict[str, int] = field(default_factory=dict)
    # seconds of each step timed after the tracked ones, outside the tracker (CUDA runs only;
    # planner.measure.calibration fits a calibration file on them, plan measure --real --calibration-out)
    step_times_s: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MeasuredMemory:
        return cls(**json.loads(text))


def make_tracker(model: Any, optimizer: Any, ids: Any, *, sharded: bool, mixins: tuple[type, ...] = ()) -> Any:
    """A MemTracker (replicated) or FSDPMemTracker (FSDP2) that also keeps each category's max.

    ``mixins`` are classes put before the tracker in the method order (planner.measure.torchtitan
    uses one to let torchtitan's chunked loss call its FSDP-wrapped LM head several times)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    base = FSDPMemTracker if sharded else MemTracker

    class _MaxTracker(*mixins, base):  # type: ignore[misc, valid-type]
        """Adds category maxima: the trackers keep only the snapshot at the peak total."""

        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.raw_max: dict[Any, dict[str, int]] = {}
            self.category_max: dict[Any, dict[str, int]] = {}
            self.step = 0  # set by the training loop, 1-based
            self.peak_step = 0
            self.peak_phase = ""
            self.peak_module = ""
            self.skip_unchanged = True   # False: MemTracker's update after every op, as torch has it
            self._snap_changed = True
            self._peak_key: tuple[Any, frozenset[str]] | None = None

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            # frozen parameters (LoRA's base, freeze) never get a gradient, and
            # Tensor.register_hook refuses them: give them no-op handles so none is installed
            for p in module.parameters():
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = (_NoHandle(), _NoHandle())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_snap(self, *args: Any, **kwargs: Any) -> None:  # every change of the live bytes
            self._snap_changed = True
            super()._update_snap(*args, **kwargs)

        def _update_peak_stats(self, peak_state: Any) -> None:  # called after every op
            # MemTracker's update walks every module seen so far after every op. It reads only
            # the live bytes, the active modules and the phase, and the module hooks leave each
            # entered module's peak at the live total: with none of the three changed since the
            # last call it would change nothing, so it is skipped (most ops allocate nothing the
            # tracker counts: views, in-place ops, fake collectives' waits)
            key = (peak_state, frozenset(self._mod_tracker.parents))
            if self.skip_unchanged and not self._snap_changed and key == self._peak_key:
                return
            self._snap_changed = False
            self._peak_key = key
            peak_before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != peak_before:  # a new peak: note where the step was
                self.peak_step = self.step
                self.peak_phase = ("optimizer" if self._in_opt
                                   else "backward" if self._mod_tracker.is_bw else "forward")
                active = [m for m in self._mod_tracker.parents if m != "Global"]
                self.peak_module = max(active, key=lambda m: m.count("."), default="")
            for dev, snap in self._curr_mem_snap.items():
                named = _named(snap)
                raw_max = self.raw_max.setdefault(dev, {})
                for name, n_bytes in named.items():
                    raw_max[name] = max(raw_max.get(name, 0), n_bytes)
                cat_max = self.category_max.setdefault(dev, {})
                for cat, n_bytes in _categorize(named).items():
                    cat_max[cat] = max(cat_max.get(cat, 0), n_bytes)

    if sharded:
        tracker = _MaxTracker(model, optimizer)
        tracker.track_inputs((ids,))
    else:
        tracker = _MaxTracker()
        tracker.track_external(model, optimizer, ids)
    return tracker


class _NoHandle:
    """A hook handle for a hook never installed (MemTracker removes its handles on exit)."""

    def remove(self) -> None:
        pass


def _named(snap: Mapping[Any, int]) -> dict[str, int]:
    """A tracker snapshot with its enum keys turned into their names ("Parameter", "Total")."""
    return {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}


def _categorize(named: Mapping[str, int]) -> dict[str, int]:
    """Tracker categories summed into the planner's (CATEGORIES)."""
    return {cat: sum(named.get(n, 0) for n in names) for cat, names in CATEGORIES.items()}


def _by_module(tracker: Any, device: Any) -> dict[str, int]:
    """Highest total seen while each module (depth <= 4) ran, forward or backward."""
    by_module: dict[str, int] = {}
    for stats in list(tracker.memory_tracking.values()):
        fqn = stats.mod_fqn
        if fqn.count(".") + 1 > _BY_MODULE_DEPTH:
            continue
        peak = 0
        for state, snaps in stats.snapshots.items():
            if "Peak" not in str(getattr(state, "value", state)):
                continue
            for snap in snaps:
                peak = max(peak, int(snap.get(device, {}).get(_TOTAL, 0)))
        by_module[fqn] = peak
    return dict(list(by_module.items())[:_BY_MODULE_MAX_ENTRIES])


def tracker_result(tracker: Any, snapshots: Mapping[Any, Mapping[Any, int]], device: Any, *,
                   fake: bool, n_params: int, rank: int, wall_s: float) -> MeasuredMemory:
    """MeasuredMemory from a tracker made by make_tracker, after its steps ran (bytes)."""
    import torch

    # Fake tensors all live on the CPU; a real run may leave a few CPU tensors beside the GPU's.
    dev = device if device in snapshots else max(snapshots, key=lambda d: snapshots[d].get(_TOTAL, 0))
    raw = _named(snapshots[dev])
    at_peak = _categorize(raw)
    cat_max = tracker.category_max.get(dev) or at_peak
    raw_max = tracker.raw_max.get(dev) or raw
    cuda: dict[str, Any] = {}
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        cuda = {
            "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
            "device_stats": {k: int(stats.get(k, 0)) for k in (
                "allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
                "inactive_split_bytes.all.peak", "num_alloc_retries", "num_ooms")},
        }
    # the per-category int fields by name; typed Any so that mypy does not match them against
    # MeasuredMemory's dict-valued fields (raw, raw_max, by_module), which are passed by keyword
    category_fields: dict[str, Any] = {f"{cat}_bytes": n for cat, n in at_peak.items()}
    category_fields.update({f"max_{cat}_bytes": int(cat_max.get(cat, 0)) for cat in CATEGORIES})
    return MeasuredMemory(
        peak_bytes=raw.get(_TOTAL, sum(at_peak.values())),
        **category_fields,
        raw=raw,
        raw_max=raw_max,
        by_module=_by_module(tracker, dev),
        n_params=n_params,
        peak_step=tracker.peak_step,
        peak_phase=tracker.peak_phase,
        peak_module=tracker.peak_module,
        tracker=next(c.__name__ for c in type(tracker).__mro__ if c.__name__ in ("FSDPMemTracker", "MemTracker")),
        device=str(dev),
        fake=fake,
        rank=rank,
        wall_s=round(wall_s, 3),
        **cuda,
    )
