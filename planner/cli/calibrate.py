"""`plan calibrate LOG... --out FILE`: fit the step-time model's matmul fraction and the
allocator overhead to a user's own training logs (planner.measure.logs reads them,
planner.timing.calibrate fits), and write the file `--calibration FILE` applies."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from planner.cli.common import run_safely
from planner.cli.layout_options import layout_options
from planner.cli.options import Options
from planner.cli.request import build_request
from planner.cli.task_options import method_options
from planner.cli.training_options import stack_options
from planner.cli.types import OutputPath
from planner.errors import UserError

if TYPE_CHECKING:
    from planner.measure.logs import TrainingLog
    from planner.timing.calibrate import Calibration, Observation

MAX_LOGS = 64
# The logs of one calibration, in all: one long run's log (planner.measure.logs.MAX_LOG_BYTES, 256
# MiB, about 5 s of CPU and 1 GB to parse on 2 cores). Issue 32's hunt: 64 logs of 255 MiB each,
# within both per-log limits, read 16 GB (4 of them: 19 s of CPU, 1.4 GB; each parsed log is kept).
MAX_LOGS_TOTAL_BYTES = 256 * 2**20


@click.command("calibrate")
@click.argument("logs", metavar="LOG...", nargs=-1, required=False,
                type=click.Path(dir_okay=True, path_type=Path))
@layout_options
@method_options
@stack_options
@click.option("--topology", metavar="NAME|PATH", default=None,
              help="The cluster the logs ran on (`plan topologies`)  [default: the GPU's own].")
@click.option("--runs", "runs_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="A TOML file of [[run]] tables (log = PATH, options = \"--model ... --dp ...\"): "
                                   "logs of other layouts, fitted jointly with the LOGs given.")
@click.option("--out", "out_file", type=OutputPath(path_type=Path), default=Path("calibration.toml"),
              show_default=True, metavar="FILE", help="Where to write the calibration file.")
@click.option("--force", is_flag=True, help="Overwrite --out FILE if it exists.")
@click.option("--warmup", type=click.IntRange(0, 1000), default=None,
              help="Logged step records to leave out at the start of each log  [default: 3].")
def calibrate_cmd(logs: tuple[Path, ...], runs_file: Path | None, out_file: Path, force: bool, warmup: int | None,
                  **kw: Any) -> None:
    """Fit the planner to your own training logs (torchtitan, Megatron-LM, DeepSpeed, the
    Hugging Face Trainer): the GPU's matmul fraction so that the planner's step time equals
    the logged one (least squares on log error over every log), and the allocator overhead
    from the logs' peak reserved memory. Give the layout the LOGs ran with plan's options
    (every LOG ran that layout); logs of other layouts go in a --runs file. The memory
    profile is --stack, or by default the stack that wrote each log.

    \b
      plan calibrate train.log --model llama3.1-8b --gpus h100 --dp 8 --fsdp full \\
          --micro-batch 2 --global-batch 16 --seq-len 8192 --recompute selective --out h100.toml
      plan calibrate --runs runs.toml --gpus h100 --out h100.toml
      plan --model 70b --gpus h100 --calibration h100.toml
    """
    run_safely(lambda: calibrate(logs, Options.from_click(kw), out_file, force, warmup, runs_file))


Run = tuple["TrainingLog", Options]


def calibrate(paths: tuple[Path, ...], o: Options, out_file: Path, force: bool, warmup: int | None,
              runs_file: Path | None = None) -> None:
    from planner import __version__
    from planner.measure.logs import WARMUP_RECORDS, read_log
    from planner.timing.calibrate import fit, to_toml
    from planner.timing.model import Efficiency

    if o.method == "auto":
        raise UserError("plan calibrate fits the method the logs ran: give --method full, lora, qlora or freeze")
    if not paths and runs_file is None:
        raise UserError("plan calibrate needs a log: give LOG... with the layout it ran, or --runs FILE")
    check_out(out_file, force)
    skip = WARMUP_RECORDS if warmup is None else warmup
    if len(paths) > MAX_LOGS:       # refused before any log is read
        raise UserError(f"{len(paths)} logs given; plan calibrate takes at most {MAX_LOGS}")
    sources: list[tuple[Path, Options]] = [(p, o) for p in paths]
    if runs_file is not None:
        sources += read_runs(runs_file, o)
    if len(sources) > MAX_LOGS:
        raise UserError(f"{len(sources)} logs given; plan calibrate takes at most {MAX_LOGS}")
    check_total_bytes([p for p, _ in sources])
    runs: list[Run] = [(read_log(p, skip), opts) for p, opts in sources]
    obs = [observation(lg, opts) for lg, opts in runs]
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    c = fit(obs, Efficiency(), __version__, created)
    write_atomically(out_file, to_toml(c), force)
    logs = [lg for lg, _ in runs]
    if o.as_json:
        click.echo(json.dumps(summary_json(c, logs, out_file), indent=2))
    else:
        click.echo(summary_text(c, logs, out_file))


def log_stack(log_stack_name: str) -> str | None:
    """The --stack whose memory profile a log of ``log_stack_name`` ran under; None where no
    --stack names it (the Hugging Face Trainer runs DDP as well as FSDP: the plan's default
    for the layout, eager kernels either way)."""
    from planner.stacks import STACKS

    return log_stack_name if log_stack_name in STACKS else None


def observation(lg: TrainingLog, o: Options) -> Observation:
    """One log with the layout it ran: the planner's inputs, the logged step time, the memory."""
    from planner.api import fixed_layout
    from planner.layouts.layout import reject_reason
    from planner.memory.model import per_rank_memory
    from planner.timing.calibrate import Observation
    from planner.timing.model import cluster_for

    if o.stack is None:         # issue 33: a torchtitan log was fitted under the hf memory profile
        o = replace(o, stack=log_stack(lg.stack))
    if o.global_batch is None and o.grad_accum is None and lg.global_batch is not None:
        o = replace(o, global_batch=lg.global_batch)     # Megatron prints it on every iteration line
    # a log ran one layout: an axis not given is not split (as `plan measure` takes it)
    o = replace(o.unsplit_where_not_given(), dp=o.dp)     # dp as given (fixed_layout asks for it unless ep folds)
    m, gpu, setup, space, n_gpus = build_request(o)
    lay = fixed_layout(space, setup, n_gpus)
    if lay is None:
        raise UserError(f"plan calibrate needs the layout {lg.path} ran: give --dp, --zero or --fsdp, "
                        f"--micro-batch and --recompute (and --tp, --pp, --cp, --ep where above 1)")
    reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
    if reason:
        raise UserError(f"{lg.path}: layout {lay.describe()} cannot run: {reason}")
    tracked = per_rank_memory(m, setup, lay, gpus_per_node=gpu.gpus_per_node).breakdown.tracked
    return Observation(name=lg.path, stack=lg.stack, model=m, setup=setup, layout=lay,
                       cluster=cluster_for(gpu, o.topology),
                       step_time_s=lg.step_time_s(setup.global_batch, setup.seq_len, lay.n_gpus),
                       tracked_bytes=tracked, max_reserved_bytes=lg.max_reserved_bytes,
                       max_allocated_bytes=lg.max_allocated_bytes)


MAX_RUNS_BYTES = 1 << 20


def check_total_bytes(paths: list[Path]) -> None:
    """Refuse (UserError) logs of more than MAX_LOGS_TOTAL_BYTES in all, from their sizes on
    disk, before any is read (a path that is no regular file, or one log past its own limit, is
    left to read_log's message)."""
    from planner.measure.logs import MAX_LOG_BYTES

    total = 0
    for p in paths:
        try:
            st = os.stat(p)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_LOG_BYTES:
            total += st.st_size
    if total > MAX_LOGS_TOTAL_BYTES:
        raise UserError(f"the {len(paths)} logs hold {total / 2**20:,.0f} MiB in all; plan calibrate reads at most "
                        f"{MAX_LOGS_TOTAL_BYTES // 2**20} MiB of logs at once: give fewer or shorter logs")


def read_runs(path: Path, o: Options) -> list[tuple[Path, Options]]:
    """--runs FILE: [[run]] tables of ``log`` (a path, relative to the file) and ``options``
    (plan's layout options as one string); --gpus and --topology default to the command line's.
    Each log's path with its options; the logs are read by the caller."""
    import shlex

    from planner.limits import decode_text, parse_toml, read_input_file

    what = f"--runs {path}"
    d = parse_toml(decode_text(read_input_file(path, what, MAX_RUNS_BYTES), what, "a runs TOML"), what)
    entries = d.get("run")
    if set(d) - {"run"} or not isinstance(entries, list) or not entries:
        raise UserError(f"{what}: expected [[run]] tables, each with log = PATH and options = \"--model ...\"")
    out: list[tuple[Path, Options]] = []
    for i, e in enumerate(entries, start=1):
        if not isinstance(e, dict) or set(e) != {"log", "options"} or not all(isinstance(v, str) for v in e.values()):
            raise UserError(f"{what}: run {i} needs exactly log = PATH and options = \"...\" (strings)")
        try:
            args = shlex.split(e["options"])
        except ValueError as err:
            raise UserError(f"{what}: run {i}: options {e['options']!r}: {err}") from None
        for flag, value in (("--gpus", o.gpu_name), ("--topology", o.topology)):
            if flag not in args and value is not None:
                args += [flag, value]
        opts = run_options(args, f"{what}: run {i}")
        out.append((path.parent / e["log"], opts))
    return out


def run_options(args: list[str], where: str) -> Options:
    """plan's layout options from a --runs entry, parsed by this command's own click options."""
    try:
        ctx = calibrate_cmd.make_context("calibrate", list(args), resilient_parsing=False)
    except click.ClickException as e:
        raise UserError(f"{where}: {' '.join(e.format_message().split())}") from None
    kw = {k: v for k, v in ctx.params.items() if k not in ("logs", "runs_file", "out_file", "force", "warmup")}
    if ctx.params.get("logs") or ctx.params.get("runs_file"):
        raise UserError(f"{where}: options hold a log or --runs; give the log as log = PATH")
    return Options.from_click(kw)


def check_out(path: Path, force: bool) -> None:
    """--out FILE: a name the file system takes, in an existing directory, new unless --force."""
    from planner.limits import check_name

    check_name(str(path), "--out")
    if path.is_dir():
        raise UserError(f"--out {path} is a directory; give a file name (calibration.toml)")
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: directory {path.parent} does not exist; create it or give another")
    if path.exists() and not force:
        raise UserError(f"--out {path} exists; pass --force to overwrite it")


def write_atomically(path: Path, text: str, force: bool = False) -> None:
    """Write the calibration file all or nothing; an existing one only with ``force``, refused
    atomically otherwise (planner.emit.write.write_file: of two concurrent runs one is refused)."""
    from planner.emit.write import write_file

    write_file(path, text.encode("utf-8"), force=force, what="--out")


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.2f} s"


def summary_text(c: Calibration, logs: list[TrainingLog], out_file: Path) -> str:
    from planner.fmt import gib

    lines = [f"Calibrated {c.gpu} on {len(c.logs)} log(s); wrote {out_file}",
             f"  matmul fraction: {c.matmul_fraction_before:.3f} (shipped) -> {c.matmul_fraction:.3f} (fitted)"
             + ("  [at the bound of the search: the logs are not explained by matmul speed alone]"
                if c.at_bound else ""),
             f"  step-time log error (rms): {c.rms_before:.1%} before -> {c.rms_after:.1%} after"]
    if c.measured_max is not None and c.matmul_fraction > c.measured_max:
        lines.append(f"  note: {c.matmul_fraction:.3f} is above the {c.measured_max:.3f} a {c.gpu} is measured to "
                     "sustain on matmuls (MSMF/MAMF); the planner's other terms (overlap, kernels, "
                     "communication) are slower than your stack's, and the fitted fraction absorbs that")
    if c.fragmentation is not None:
        lines.append(f"  allocator overhead (fragmentation): {c.fragmentation:.1%} of tracked tensor memory")
    for f, lg in zip(c.logs, logs, strict=True):
        lines.append(f"  {f.name} ({f.stack}, {len(lg.measured)} steps after {lg.warmup_records} warm-up): "
                     f"logged {_ms(f.logged_step_time_s)}, planner {_ms(f.before_step_time_s)} -> "
                     f"{_ms(f.after_step_time_s)} ({f.before_log_error:+.1%} -> {f.after_log_error:+.1%} log error)")
        if f.max_reserved_bytes is not None:
            lines.append(f"    memory: peak reserved {gib(f.max_reserved_bytes)}, planner tracked "
                         f"{gib(f.tracked_bytes)}, overhead {gib(f.overhead_bytes or 0)}")
        elif f.max_allocated_bytes is not None:
            lines.append(f"    memory: peak allocated {gib(f.max_allocated_bytes)}, planner tracked "
                         f"{gib(f.tracked_bytes)} (no reserved line: overhead not fitted)")
    return "\n".join(lines)


def summary_json(c: Calibration, logs: list[TrainingLog], out_file: Path) -> dict[str, Any]:
    return {
        "calibration_file": str(out_file), "gpu": c.gpu,
        "matmul_fraction": {"before": c.matmul_fraction_before, "after": c.matmul_fraction, "at_bound": c.at_bound,
                            "measured_max": c.measured_max},
        "fragmentation": c.fragmentation,
        "rms_log_error": {"before": round(c.rms_before, 4), "after": round(c.rms_after, 4)},
        "logs": [{"path": f.name, "stack": f.stack, "layout": f.layout, "n_steps": len(lg.measured),
                  "warmup_records": lg.warmup_records, "logged_step_time_s": round(f.logged_step_time_s, 6),
                  "before_step_time_s": round(f.before_step_time_s, 6),
                  "after_step_time_s": round(f.after_step_time_s, 6),
                  "tracked_bytes": f.tracked_bytes, "max_reserved_bytes": f.max_reserved_bytes,
                  "max_allocated_bytes": f.max_allocated_bytes, "overhead_bytes": f.overhead_bytes}
                 for f, lg in zip(c.logs, logs, strict=True)],
    }
