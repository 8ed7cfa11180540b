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
from planner.fmt import duration, usd
from planner.timing.intervals import DEFAULT_LEVEL, provenance, regime_data, time_band
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
    """The ``level`` interval of each timed figure, as [low, high] pairs (None: not timed).

    Centred on the model's own prediction (StepTime.predicted_step_time_s): the residuals are
    of that, so a --time-confidence margin already in the step time is not applied again."""
    if t is None:
        return None
    b, f = time_band(level, t.regime), t.step_time_factor
    out: dict[str, Any] = {
        "level": level,
        "step_time_s": list(b.step_s(t.predicted_step_time_s)),
        "tokens_per_s": list(b.speed(t.tokens_per_s * f)),
        "tflops_per_gpu": list(b.speed(t.model_flops_per_s_per_gpu * f / 1e12)),
        "mfu": list(b.speed(t.mfu * f)),
        "source": provenance(t.regime),
    }
    if f != 1.0:
        out["step_time_factor"] = f      # the --time-confidence margin in the point figures
    if tokens is not None:
        out["train_time_s"] = list(b.step_s(t.train_time_s(tokens) / f))
    return out


def cost_interval_json(cost_usd: float | None, train_time_s: float, gpu_hours: float,
                       level: float = DEFAULT_LEVEL, step_time_factor: float = 1.0, regime: str = "") -> dict[str, Any]:
    """A priced plan's interval: its cost, train time and GPU-hours scale with the step time
    (rental: GPU-hours x price per GPU-hour, planner.cost.plan). ``step_time_factor``: the
    --time-confidence margin already in the figures (StepTime.step_time_factor), taken out
    before the band is applied, as in time_interval_json. ``regime``: StepTime.regime."""
    b, f = time_band(level, regime), step_time_factor
    return {"level": level, "cost_usd": None if cost_usd is None else list(b.step_s(cost_usd / f)),
            "train_time_s": list(b.step_s(train_time_s / f)), "gpu_hours": list(b.step_s(gpu_hours / f))}


def priced_interval_json(p: Any, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """cost_interval_json of a priced plan (planner.cost.plan.PricedPlan)."""
    t = p.candidate.time
    return cost_interval_json(p.cost_usd, p.train_time_s, p.gpu_hours, level,
                              1.0 if t is None else t.step_time_factor, "" if t is None else t.regime)


def cost_interval_text(p: Any, level: float = DEFAULT_LEVEL) -> str:
    """One line beside a priced plan's cost: its interval and the train time's."""
    d = priced_interval_json(p, level)
    lo, hi = d["train_time_s"]
    cost = "" if d["cost_usd"] is None else f"{usd(d['cost_usd'][0])}-{usd(d['cost_usd'][1])} for "
    return f"{level:.0%} interval {cost}{duration(lo)}-{duration(hi)}"


def memory_interval_json(total_bytes: float, capacity_bytes: float, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    b = memory_band(level)
    lo, hi = b.bytes(total_bytes)
    d = memory_data()
    return {"level": level, "bytes": [lo, hi], "fits_at_high_end": hi <= capacity_bytes,
            "source": f"measured residuals ({', '.join(f'{k} {n} runs' for k, n in d['residuals'].items())}; "
                      f"bench/memory_intervals.py, {d['generated']})"}


def step_interval_text(t: StepTime, tokens: float | None = None, level: float = DEFAULT_LEVEL) -> str:
    """One line: the step time's and MFU's interval (and the train time's)."""
    b, f = time_band(level, t.regime), t.step_time_factor
    lo, hi = b.step_s(t.predicted_step_time_s)     # not margined twice (time_interval_json)
    mlo, mhi = b.speed(t.mfu * f)
    text = f"{level:.0%} interval {duration(lo)}-{duration(hi)} per step, MFU {mlo:.1%}-{mhi:.1%}"
    if tokens is not None:
        tlo, thi = b.step_s(t.train_time_s(tokens) / f)
        text += f", train {duration(tlo)}-{duration(thi)}"
    if f != 1.0:
        text += (f", about the model's {duration(t.predicted_step_time_s)} (the figures above are "
                 f"planned {f:.3f}x slower, --time-confidence)")
    where = f"Megatron-Bridge runs, regime {t.regime}" if t.regime in regime_data()["regimes"] else "published runs"
    return text + f" (out-of-sample errors on {where})"


def memory_note(total_bytes: float, capacity_bytes: float, fits: bool, level: float = DEFAULT_LEVEL) -> str | None:
    """A warning when a plan fits at its predicted peak but not at the upper end of its interval."""
    if not fits:
        return None
    lo, hi = memory_band(level).bytes(total_bytes)
    if hi <= capacity_bytes:
        return None
    return (f"fits only at the low end of its {level:.0%} memory interval (up to {hi / 2**30:.2f} GiB); "
            f"--fit-confidence {level:g} asks for a plan that fits at the upper end")
