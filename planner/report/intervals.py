"""Error bars on a plan: step time, throughput, MFU, train time and cost from the step-time
model's out-of-sample residuals (planner.timing.intervals, bench/out_of_sample.py), peak memory
from the memory model's measured residuals (memory_intervals.json, bench/memory_intervals.py).

Memory: e = predicted / measured - 1 per configuration (docs/accuracy.md,
docs/accuracy-torchtitan.md), so the true peak lies within predicted / (1 + e_high) ..
predicted / (1 + e_low) at a level; a plan whose upper end exceeds the capacity fits only at
the low end of its interval, and says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.errors import UserError
from planner.fmt import duration
from planner.timing.intervals import DEFAULT_LEVEL, provenance, time_band
from planner.timing.step import StepTime

MEMORY_INTERVALS_PATH = Path(__file__).resolve().parent / "memory_intervals.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBand:
    level: float
    low_factor: float        # true peak / predicted, lower end
    high_factor: float

    def bytes(self, predicted_bytes: float) -> tuple[float, float]:
        return predicted_bytes * self.low_factor, predicted_bytes * self.high_factor


@lru_cache(maxsize=1)
def memory_data() -> dict:
    return dict(json.loads(MEMORY_INTERVALS_PATH.read_text()))


def memory_band(level: float = DEFAULT_LEVEL) -> MemoryBand:
    table = memory_data()["levels"]
    key = f"{level:.2f}"
    if key not in table:
        raise UserError(f"--fit-confidence {level:g} has no memory interval; choose one of "
                        f"{', '.join(sorted(table))}")
    row = table[key]
    return MemoryBand(level=level, low_factor=1 / (1 + row["error_high"]), high_factor=1 / (1 + row["error_low"]))


def time_interval_json(t: StepTime | None, tokens: float | None = None, level: float = DEFAULT_LEVEL
                       ) -> dict[str, Any] | None:
    """The ``level`` interval of each timed figure, as [low, high] pairs (None: not timed)."""
    if t is None:
        return None
    b = time_band(level)
    out: dict[str, Any] = {
        "level": level,
        "step_time_s": list(b.step_s(t.step_time_s)),
        "tokens_per_s": list(b.speed(t.tokens_per_s)),
        "tflops_per_gpu": list(b.speed(t.model_flops_per_s_per_gpu / 1e12)),
        "mfu": list(b.speed(t.mfu)),
        "source": provenance(),
    }
    if tokens is not None:
        out["train_time_s"] = list(b.step_s(t.train_time_s(tokens)))
    return out


def cost_interval_json(cost_usd: float | None, train_time_s: float, gpu_hours: float,
                       level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """A priced plan's interval: its cost, train time and GPU-hours scale with the step time
    (rental: GPU-hours x price per GPU-hour, planner.cost.plan)."""
    b = time_band(level)
    return {"level": level, "cost_usd": None if cost_usd is None else list(b.step_s(cost_usd)),
            "train_time_s": list(b.step_s(train_time_s)), "gpu_hours": list(b.step_s(gpu_hours))}


def memory_interval_json(total_bytes: float, capacity_bytes: float, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    b = memory_band(level)
    lo, hi = b.bytes(total_bytes)
    d = memory_data()
    return {"level": level, "bytes": [lo, hi], "fits_at_high_end": hi <= capacity_bytes,
            "source": f"measured residuals ({', '.join(f'{k} {n} runs' for k, n in d['residuals'].items())}; "
                      f"bench/memory_intervals.py, {d['generated']})"}


def step_interval_text(t: StepTime, tokens: float | None = None, level: float = DEFAULT_LEVEL) -> str:
    """One line: the step time's and MFU's interval (and the train time's)."""
    b = time_band(level)
    lo, hi = b.step_s(t.step_time_s)
    mlo, mhi = b.speed(t.mfu)
    text = f"{level:.0%} interval {duration(lo)}-{duration(hi)} per step, MFU {mlo:.1%}-{mhi:.1%}"
    if tokens is not None:
        tlo, thi = b.step_s(t.train_time_s(tokens))
        text += f", train {duration(tlo)}-{duration(thi)}"
    return text + " (out-of-sample errors on published runs)"


def memory_note(total_bytes: float, capacity_bytes: float, fits: bool, level: float = DEFAULT_LEVEL) -> str | None:
    """A warning when a plan fits at its predicted peak but not at the upper end of its interval."""
    if not fits:
        return None
    lo, hi = memory_band(level).bytes(total_bytes)
    if hi <= capacity_bytes:
        return None
    return (f"fits only at the low end of its {level:.0%} memory interval (up to {hi / 2**30:.2f} GiB); "
            f"--fit-confidence {level:g} asks for a plan that fits at the upper end")
