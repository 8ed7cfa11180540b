"""Error bars of the step-time model: central intervals of its out-of-sample errors.

planner/timing/step_intervals.json holds, per level (0.50, 0.80, 0.90, 0.95), the quantiles of
log(predicted / reported speed) over the held-out predictions of bench/out_of_sample.py (leave
one published source out; docs/published-runs-out-of-sample.md): MEASURED residuals of the
planner against published runs it was not fitted on. Each level's quantiles are read at its
quantile_level, the smallest level at which the interval built from the other sources'
residuals holds the stated share of each source's runs, so the interval is itself checked on
sources it was not read from (tests/test_out_of_sample.py). With e = log(predicted / true speed), the
true step time is the predicted one times exp(e), so at a level the step time lies within
predicted x [exp(low), exp(high)], and speed (tokens/s, TFLOP/s, MFU) within
predicted / [exp(high), exp(low)]; train time and cost scale as the step time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from planner.errors import UserError
from planner.hardware.gpus import GpuSpec
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

STEP_INTERVALS_PATH = Path(__file__).resolve().parent / "step_intervals.json"
# the 80% intervals of --stack megatron plans by regime, measured out of fold on NVIDIA's
# Megatron-Bridge runs (bench/megatron_bridge.py, docs/megatron-bridge.md)
REGIME_INTERVALS_PATH = Path(__file__).resolve().parent / "megatron_bridge_intervals.json"
DEFAULT_LEVEL = 0.80
GENERATIONS = {"hopper": "hopper", "blackwell": "blackwell"}     # gpus.toml architecture -> regime


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeBand:
    """The factors a predicted step time is multiplied by for the ends of its interval."""

    level: float
    time_low_factor: float      # exp(low quantile of the log error); < 1 where predictions run slow
    time_high_factor: float

    def step_s(self, step_s: float) -> tuple[float, float]:
        return step_s * self.time_low_factor, step_s * self.time_high_factor

    def speed(self, speed: float) -> tuple[float, float]:
        """(low, high) of a rate: tokens/s, TFLOP/s, MFU."""
        return speed / self.time_high_factor, speed / self.time_low_factor


@lru_cache(maxsize=1)
def interval_data() -> dict:
    return dict(json.loads(STEP_INTERVALS_PATH.read_text()))


@lru_cache(maxsize=1)
def regime_data() -> dict:
    return dict(json.loads(REGIME_INTERVALS_PATH.read_text()))


def regime_of(m: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> str:
    """The regime a plan's error bars are read in: "precision/dense-or-moe/generation" for a
    --stack megatron plan on a Hopper or Blackwell GPU (the regimes of the Megatron-Bridge study),
    "" otherwise (the published-runs study's bars)."""
    gen = GENERATIONS.get(gpu.architecture or "")
    if setup.stack != "megatron" or gen is None:
        return ""
    prec = "low-precision" if setup.precision_spec.fp8 is not None else "bf16"
    return f"{prec}/{'moe' if m.is_moe else 'dense'}/{gen}"


def levels() -> tuple[float, ...]:
    return tuple(sorted(float(k) for k in interval_data()["levels"]))


def time_band(level: float = DEFAULT_LEVEL, regime: str = "") -> TimeBand:
    """The step-time interval at ``level`` (one of levels()); at the 80% level, a ``regime``
    measured on the Megatron-Bridge runs (regime_of) takes its own interval."""
    by_regime = regime_data()["regimes"]
    if regime in by_regime and f"{level:.2f}" == regime_data()["level"]:
        row = by_regime[regime]
        return TimeBand(level=level, time_low_factor=math.exp(row["log_error_low"]),
                        time_high_factor=math.exp(row["log_error_high"]))
    table = interval_data()["levels"]
    key = f"{level:.2f}"
    if key not in table:
        raise UserError(f"--time-confidence {level:g} has no step-time interval; choose one of "
                        f"{', '.join(f'{x:g}' for x in levels())}")
    row = table[key]
    return TimeBand(level=level, time_low_factor=math.exp(row["log_error_low"]),
                    time_high_factor=math.exp(row["log_error_high"]))


NOISE_LEVEL = 0.50


def cost_noise_rel() -> float:
    """The fraction by which two predicted costs (or times) of plans may differ and still be
    within the step-time model's typical error: the half-width of the central 50% interval
    of its out-of-sample log errors (about 6.5%). A modelling choice: plans closer than this
    cannot be ranked by the model (`plan --tokens` without --deadline takes the fastest of
    them, planner.cost.plan)."""
    b = time_band(NOISE_LEVEL)
    return (b.time_high_factor - b.time_low_factor) / 2


def upper_factor(confidence: float) -> float:
    """The factor by which a predicted step time is multiplied so that the true one is at most
    that with ``confidence`` (the one-sided quantile of the out-of-sample log errors): what
    --time-confidence plans with (Efficiency.step_time_factor)."""
    table = interval_data()["upper_quantiles"]
    key = f"{confidence:.2f}"
    if key not in table:
        raise UserError(f"--time-confidence {confidence:g} has no quantile; choose one of {', '.join(sorted(table))}")
    return math.exp(max(0.0, table[key]))


def provenance(regime: str = "") -> str:
    if regime in regime_data()["regimes"]:
        r = regime_data()
        row = r["regimes"][regime]
        pool = "" if row["pool"] == regime else f", pooled over the {row['pool_rows']} runs of {row['pool']}"
        return (f"{r['residuals']}, regime {regime}: {row['rows']} runs{pool}, the central "
                f"{r['quantile_share']:.0%} of the residuals ({r['generated']})")
    d = interval_data()
    return (f"{d['residuals']}: {d['runs']} runs, {len(d['sources'])} sources "
            f"(bench/out_of_sample.py, {d['generated']})")
