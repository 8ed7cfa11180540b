"""Calibration from a user's own runs: fit the step-time model's matmul fraction
(Efficiency.matmul_fraction) to logged step times, and the allocator's overhead
(Overheads.fragmentation) to logged peak reserved memory, then read and write the TOML
file that `--calibration FILE` applies to later plans.

The fit: one matmul fraction x for the GPU type that minimises the sum over logs of
(ln t_planner(x) - ln t_logged)^2, where t_planner is planner.timing.model.step_time on the
layout each log ran (least squares on log error, so a log of 10 s and one of 1 s weigh
alike). t_planner falls as x rises, so the sum has one minimum on [MATMUL_MIN, MATMUL_MAX];
a grid of GRID_STEP then golden-section refinement to 1e-4 finds it. Every other
Efficiency parameter keeps the value given (the overlap settings of the stack).

Memory: torch.cuda's peak reserved bytes (what Megatron's "max reserved", DeepSpeed's
Max_CA and torchtitan's "memory" print) are the tensors the caching allocator handed out
plus what it keeps cached; the CUDA context and NCCL's buffers are outside it (PyTorch
"CUDA semantics", memory management). So the planner's tracked bytes (MemoryBreakdown.tracked)
x (1 + fragmentation) is compared with the logged peak reserved, and fragmentation =
exp(mean ln(reserved / tracked)) - 1 (least squares on log error again), clamped to [0, 1];
the fixed CUDA/NCCL terms keep their defaults. A log with only peak allocated bytes
(DeepSpeed's timer line) shows the tracked-memory error but fits nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.errors import UserError
from planner.layouts.layout import Layout
from planner.models.spec import ModelSpec
from planner.timing.efficiency import MATMUL_FRACTION_MAX
from planner.timing.model import (
    MATMUL_FRACTION,
    MATMUL_FRACTION_DEFAULT,
    NO_MFU_CEILING,
    Cluster,
    Efficiency,
    step_time,
)
from planner.training.setup import Overheads, TrainingSetup

MATMUL_MIN, MATMUL_MAX = 0.05, 1.0
GRID_STEP = 0.01
FRAGMENTATION_MAX = 1.0
MAX_CALIBRATION_BYTES = 1 << 20
FORMAT = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One log: the run it measured and what it measured."""

    name: str                                 # the log's path
    stack: str
    model: ModelSpec
    setup: TrainingSetup
    layout: Layout
    cluster: Cluster
    step_time_s: float                        # logged, mean after warm-up
    tracked_bytes: int                        # the planner's MemoryBreakdown.tracked for the layout
    max_reserved_bytes: int | None = None     # logged peak reserved (None: no such line)
    max_allocated_bytes: int | None = None    # logged peak allocated


@dataclass(frozen=True, kw_only=True, slots=True)
class LogFit:
    """One log's residuals before and after the fit (log error: ln(planner / logged))."""

    name: str
    stack: str
    layout: str
    logged_step_time_s: float
    before_step_time_s: float
    after_step_time_s: float
    tracked_bytes: int
    max_reserved_bytes: int | None
    max_allocated_bytes: int | None

    @property
    def before_log_error(self) -> float:
        return math.log(self.before_step_time_s / self.logged_step_time_s)

    @property
    def after_log_error(self) -> float:
        return math.log(self.after_step_time_s / self.logged_step_time_s)

    @property
    def overhead_bytes(self) -> int | None:
        """Logged peak reserved less the planner's tracked bytes: allocator cache and what the
        planner's tensor model misses."""
        return None if self.max_reserved_bytes is None else self.max_reserved_bytes - self.tracked_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """What a calibration file holds (and `--calibration` applies)."""

    gpu: str
    matmul_fraction: float
    matmul_fraction_before: float
    fragmentation: float | None              # None: no log had a reserved-memory line
    at_bound: bool                           # the fit hit MATMUL_MIN or MATMUL_MAX
    logs: tuple[LogFit, ...]
    planner_version: str
    created: str
    path: str | None = None                  # where it was read from

    def efficiency(self, base: Efficiency) -> Efficiency:
        """``base`` with the fitted matmul fraction; the published-run MFU ceiling gives way to
        the user's own measurement (the fit ran without it)."""
        return replace(base, matmul_fraction=self.matmul_fraction, mfu_ceiling=NO_MFU_CEILING)

    def setup(self, base: TrainingSetup) -> TrainingSetup:
        if self.fragmentation is None:
            return base
        return replace(base, overheads=replace(base.overheads, fragmentation=self.fragmentation))

    @property
    def measured_max(self) -> float | None:
        """The highest matmul fraction this GPU type was measured to sustain
        (timing.efficiency.MATMUL_FRACTION_MAX), None for a GPU not in that table. A fit above it
        means the logs ran faster than the planner's other terms allow (overlap, kernels,
        communication), not that the matmuls did."""
        return MATMUL_FRACTION_MAX.get(self.gpu)

    @property
    def rms_before(self) -> float:
        return _rms([f.before_log_error for f in self.logs])

    @property
    def rms_after(self) -> float:
        return _rms([f.after_log_error for f in self.logs])


def _rms(xs: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else 0.0


def shipped_matmul_fraction(cluster: Cluster, eff: Efficiency) -> float:
    """The matmul fraction the planner uses without calibration (Efficiency's, else the catalog's)."""
    if eff.matmul_fraction is not None:
        return eff.matmul_fraction
    return MATMUL_FRACTION.get(cluster.gpu.name, MATMUL_FRACTION_DEFAULT)


def _golden_min(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-4) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit(obs: Sequence[Observation], base: Efficiency, planner_version: str, created: str) -> Calibration:
    """The joint least-squares fit of the matmul fraction (and the fragmentation where a log
    has peak reserved bytes) over ``obs``, all on one GPU type."""
    if not obs:
        raise UserError("plan calibrate needs at least one log")
    gpus = sorted({o.cluster.gpu.name for o in obs})
    if len(gpus) > 1:
        raise UserError(f"the logs ran on {', '.join(gpus)}; calibrate one GPU type at a time")

    def times(x: float, ceiling: float | None = NO_MFU_CEILING) -> list[float]:
        eff = replace(base, matmul_fraction=x, mfu_ceiling=ceiling)
        return [step_time(o.model, o.setup, o.layout, o.cluster, eff).step_time_s for o in obs]

    def loss(x: float) -> float:
        return sum(math.log(t / o.step_time_s) ** 2 for t, o in zip(times(x), obs, strict=True))

    n = round((MATMUL_MAX - MATMUL_MIN) / GRID_STEP)
    grid = [MATMUL_MIN + i * GRID_STEP for i in range(n + 1)]
    losses = [loss(x) for x in grid]
    i = min(range(len(grid)), key=losses.__getitem__)
    x = _golden_min(loss, grid[max(0, i - 1)], grid[min(n, i + 1)])
    x = round(min(MATMUL_MAX, max(MATMUL_MIN, x)), 4)
    at_bound = i in (0, n)
    before = shipped_matmul_fraction(obs[0].cluster, base)
    t_before, t_after = times(before, base.mfu_ceiling), times(x)     # before: the planner as it ships
    fits = tuple(LogFit(name=o.name, stack=o.stack, layout=o.layout.describe(), logged_step_time_s=o.step_time_s,
                        before_step_time_s=tb, after_step_time_s=ta, tracked_bytes=o.tracked_bytes,
                        max_reserved_bytes=o.max_reserved_bytes, max_allocated_bytes=o.max_allocated_bytes)
                 for o, tb, ta in zip(obs, t_before, t_after, strict=True))
    ratios = [o.max_reserved_bytes / o.tracked_bytes for o in obs
              if o.max_reserved_bytes is not None and o.tracked_bytes > 0]
    frag = None
    if ratios:
        frag = round(min(FRAGMENTATION_MAX, max(0.0, math.exp(sum(map(math.log, ratios)) / len(ratios)) - 1)), 4)
    return Calibration(gpu=gpus[0], matmul_fraction=x, matmul_fraction_before=before, fragmentation=frag,
                       at_bound=at_bound, logs=fits, planner_version=planner_version, created=created)


# ------------------------------------------------------------------------ the file


def _s(v: str) -> str:
    return json.dumps(v)        # a JSON string is a TOML basic string for printable text


def to_toml(c: Calibration) -> str:
    """The calibration file: what was fitted, on which logs, the residuals, the version and date."""
    out = [
        "# written by `plan calibrate`; apply it with `plan ... --calibration FILE`",
        f"format = {FORMAT}",
        f"planner_version = {_s(c.planner_version)}",
        f"created = {_s(c.created)}",
        f"gpu = {_s(c.gpu)}",
        "",
        "[efficiency]      # planner.timing.model.Efficiency fields this file overrides",
        f"matmul_fraction = {c.matmul_fraction}",
        "",
        "[overheads]       # planner.training.setup.Overheads fields this file overrides",
    ]
    if c.fragmentation is not None:
        out.append(f"fragmentation = {c.fragmentation}")
    out += [
        "",
        "[fit]             # least squares on ln(planner / logged) step time over the logs",
        f"matmul_fraction_before = {c.matmul_fraction_before}",
        f"at_bound = {'true' if c.at_bound else 'false'}",
        f"rms_log_error_before = {round(c.rms_before, 4)}",
        f"rms_log_error_after = {round(c.rms_after, 4)}",
    ]
    for f in c.logs:
        out += ["", "[[logs]]", f"path = {_s(f.name)}", f"stack = {_s(f.stack)}", f"layout = {_s(f.layout)}",
                f"logged_step_time_s = {round(f.logged_step_time_s, 6)}",
                f"before_step_time_s = {round(f.before_step_time_s, 6)}",
                f"after_step_time_s = {round(f.after_step_time_s, 6)}",
                f"log_error_before = {round(f.before_log_error, 4)}",
                f"log_error_after = {round(f.after_log_error, 4)}",
                f"tracked_bytes = {f.tracked_bytes}"]
        if f.max_reserved_bytes is not None:
            out.append(f"max_reserved_bytes = {f.max_reserved_bytes}")
            out.append(f"overhead_bytes = {f.overhead_bytes}")
        if f.max_allocated_bytes is not None:
            out.append(f"max_allocated_bytes = {f.max_allocated_bytes}")
    return "\n".join(out) + "\n"


_TOP = {"format", "planner_version", "created", "gpu", "efficiency", "overheads", "fit", "logs"}
_LOG_KEYS = {"path", "stack", "layout", "logged_step_time_s", "before_step_time_s", "after_step_time_s",
             "log_error_before", "log_error_after", "tracked_bytes", "max_reserved_bytes", "overhead_bytes",
             "max_allocated_bytes"}


def load_calibration(path: str) -> Calibration:
    """A calibration file, checked: known keys only, a matmul fraction in (0, 1], a
    fragmentation in [0, 1]; every problem is a one-line UserError naming the file."""
    from planner.limits import decode_text, parse_toml, read_input_file

    what = f"--calibration {path}"
    d = parse_toml(decode_text(read_input_file(path, what, MAX_CALIBRATION_BYTES), what, "a calibration TOML"),
                   what)
    unknown = sorted(set(d) - _TOP)
    if unknown or "gpu" not in d or not isinstance(d.get("efficiency"), dict):
        raise UserError(f"{what}: not a calibration file written by `plan calibrate` "
                        f"({'unknown key ' + repr(unknown[0]) if unknown else 'no gpu or [efficiency]'})")
    eff: dict[str, Any] = d["efficiency"]
    over: dict[str, Any] = d.get("overheads", {})
    if set(eff) - {"matmul_fraction"} or not isinstance(over, dict) or set(over) - {"fragmentation"}:
        raise UserError(f"{what}: [efficiency] takes matmul_fraction and [overheads] fragmentation only")
    if d.get("format", FORMAT) != FORMAT or isinstance(d.get("format"), bool):
        raise UserError(f"{what}: format = {d['format']!r} is not {FORMAT}, the format this planner writes and "
                        f"reads; rerun `plan calibrate`")
    mm = _number(eff, "matmul_fraction", what, "efficiency", MATMUL_MIN, MATMUL_MAX, required=True)
    frag = _number(over, "fragmentation", what, "overheads", 0.0, 1.0)
    if not isinstance(d["gpu"], str):
        raise UserError(f"{what}: gpu must be a GPU name")
    fit_t = d.get("fit", {})
    if not isinstance(fit_t, dict):
        raise UserError(f"{what}: [fit] must be a table")
    before = _number(fit_t, "matmul_fraction_before", what, "fit", 1e-6, 1.0)
    for key in ("rms_log_error_before", "rms_log_error_after"):
        _number(fit_t, key, what, "fit", 0.0, 1e6)
    if not isinstance(fit_t.get("at_bound", False), bool):
        raise UserError(f"{what}: fit.at_bound must be true or false")
    logs_t = d.get("logs", [])
    if not isinstance(logs_t, list):
        raise UserError(f"{what}: logs must be [[logs]] tables")
    logs = []
    for i, entry in enumerate(logs_t, start=1):
        if not isinstance(entry, dict) or set(entry) - _LOG_KEYS:
            raise UserError(f"{what}: a [[logs]] entry has unknown keys")
        table = f"logs[{i}]"
        for key in ("path", "stack", "layout"):
            if not isinstance(entry.get(key), str):
                raise UserError(f"{what}: {table}.{key} must be a string")
        times = [float(_number(entry, k, what, table, 1e-9, 1e9, required=True) or 0.0)
                 for k in ("logged_step_time_s", "before_step_time_s", "after_step_time_s")]
        for key in ("log_error_before", "log_error_after"):
            _number(entry, key, what, table, -1e3, 1e3)
        sizes = {k: _count(entry, k, what, table) for k in ("tracked_bytes", "max_reserved_bytes",
                                                             "max_allocated_bytes")}
        _count(entry, "overhead_bytes", what, table, signed=True)   # reserved - tracked: may be negative
        if sizes["tracked_bytes"] is None:
            raise UserError(f"{what}: {table}.tracked_bytes is missing; rerun `plan calibrate`")
        logs.append(LogFit(name=entry["path"], stack=entry["stack"], layout=entry["layout"],
                           logged_step_time_s=times[0], before_step_time_s=times[1], after_step_time_s=times[2],
                           tracked_bytes=sizes["tracked_bytes"], max_reserved_bytes=sizes["max_reserved_bytes"],
                           max_allocated_bytes=sizes["max_allocated_bytes"]))
    assert mm is not None
    return Calibration(gpu=d["gpu"], matmul_fraction=mm,
                       matmul_fraction_before=mm if before is None else before,
                       fragmentation=frag, at_bound=bool(fit_t.get("at_bound", False)), logs=tuple(logs),
                       planner_version=str(d.get("planner_version", "")), created=str(d.get("created", "")),
                       path=path)


def _number(table: dict[str, Any], key: str, what: str, where: str, lo: float, hi: float,
            required: bool = False) -> float | None:
    """``table[key]`` as a finite number within [lo, hi], None when absent (and not required);
    else a UserError naming the file and the key (issue 32, E3: 1e400 overflowed, "x" raised
    ValueError, nan and -1 passed)."""
    import math

    if key not in table:
        if required:
            raise UserError(f"{what}: {where}.{key} is missing; rerun `plan calibrate`")
        return None
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise UserError(f"{what}: {where}.{key} = {repr(v)[:40]} must be a number from {lo:g} to {hi:g}")
    return float(v)


def _count(table: dict[str, Any], key: str, what: str, where: str, signed: bool = False) -> int | None:
    """``table[key]`` as a whole number of bytes (0 to 2^63, or above -2^63 when ``signed``),
    None when absent; else a UserError."""
    if key not in table:
        return None
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int) or not (-(1 << 63) if signed else 0) <= v < 1 << 63:
        raise UserError(f"{what}: {where}.{key} = {repr(v)[:40]} must be a whole number of bytes")
    return v


def check_gpu(c: Calibration, gpu_names: Sequence[str]) -> None:
    """Refuse a calibration for another GPU type (its matmul fraction is the die's)."""
    other = [g for g in gpu_names if g != c.gpu]
    if other:
        from planner.hardware.gpus import get_gpu

        try:
            get_gpu(c.gpu)
        except UserError:       # issue 32, U8: the advice was --gpus <a name no GPU has>
            raise UserError(f"--calibration {c.path} names GPU {c.gpu[:40]!r}, which is no GPU (`plan gpus`); "
                            f"calibrate on logs from {other[0]} with `plan calibrate`") from None
        raise UserError(f"--calibration {c.path} was fitted on {c.gpu} logs, not {other[0]}; plan with "
                        f"--gpus {c.gpu}, or calibrate on logs from {other[0]}")


def overheads_of(c: Calibration, base: Overheads) -> Overheads:
    return base if c.fragmentation is None else replace(base, fragmentation=c.fragmentation)
