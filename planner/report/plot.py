"""Plots of a plan (`plan --plot FILE`, `plan buy --plot FILE`): pure functions from the
planner's results to a matplotlib Figure, and an atomic save.

  plan_figure(PlanResult, scaling)   memory per rank by category for the chosen layout and
                                     the alternatives, against the GPU's capacity; step time
                                     and throughput against GPU count
  cost_figure(CostPlanResult)        memory as above; training time and cost against GPU
                                     count, per GPU type (`plan --tokens`)
  buy_figure(BuyResult)              GPUs and dollars per GPU type bought; each job's run
                                     against its deadline (`plan buy`)

matplotlib is imported inside the functions, so `plan --help` and a plain plan never pay
for it. Figures are drawn on an Agg canvas made for them, never through pyplot, so no
global backend or state changes. Capacities are in GiB (2**30 bytes), times in seconds or
days, money in US dollars.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.fmt import DAY_S, days, duration, plural, to_gib, usd
from planner.memory.model import CATEGORIES
from planner.report.text import LABELS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from planner.api import PlanResult
    from planner.cost.buy import BuyResult
    from planner.cost.plan import CostPlanResult
    from planner.hardware.gpus import GpuSpec
    from planner.search.search import Candidate

FORMATS = {".png": "png", ".svg": "svg"}
DPI = 110
THIN_FRACTION = 0.005     # a bar segment thinner than this share of the axis (~2 px) cannot be seen
LEGEND_ROW_CHARS = 190    # label characters that fit one legend row across a 16-inch figure at 8 pt

COLORS = {    # one colour per category, the same in every plot
    "weights": "#4C72B0",
    "gradients": "#55A868",
    "optimizer": "#C44E52",
    "activations": "#8172B2",
    "logits": "#CCB974",
    "buffers": "#64B5CD",
    "overhead": "#8C8C8C",
}
# `plan buy --plot`: the jobs whose rows are labelled (name and model, GPUs and days); past it one row
# in ceil(jobs / LABELLED_JOBS), the first job's included. Two-line 8 pt labels of more rows overlap
# on the panel's ~4 inches, and each costs text layout: 256 jobs' labels took about 3 s of CPU to
# draw (issue 32's hunt: plan buy of 256 jobs 5.7 s, with --plot 8.6 s)
LABELLED_JOBS = 16
GPU_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3")
CHOSEN = "#D62728"


# ------------------------------------------------------------------------ files

def plot_format(path: Path, force: bool = False) -> str:
    """The image format of ``path`` ("png" or "svg", from its suffix); a UserError when the
    suffix is neither, or when the file exists and ``force`` is False. Cheap (imports no
    matplotlib): the CLI calls it before the search."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(f"--plot {path}: cannot tell the image type from {path.suffix or 'no suffix'!r}; "
                        f"name a .png or .svg file")
    if path.is_dir():
        raise UserError(f"--plot {path} is a directory; name a .png or .svg file")
    if (path.exists() or path.is_symlink()) and not force:
        raise UserError(f"{path} already exists; nothing written (pass --force to overwrite)")
    return fmt


def save(fig: Figure, path: Path, force: bool = False) -> Path:
    """Write ``fig`` to ``path`` (PNG or SVG by its suffix): drawn into memory first, then
    written by planner.emit.write.write_file (all or nothing, an existing file refused
    atomically unless ``force``, no temporary file left by a signal)."""
    import io

    from planner.emit.write import write_file

    path = Path(path)
    fmt = plot_format(path, force)
    from matplotlib import rc_context

    # no date or software version in the file (the same plan gives the same PNG bytes), SVG
    # ids from a fixed salt, and SVG text kept as text (searchable, smaller) not glyph outlines
    metadata: dict[str, Any] = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
    buf = io.BytesIO()
    with rc_context({"svg.hashsalt": "planner", "svg.fonttype": "none"}):
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=metadata)
    return write_file(path, buf.getvalue(), force=force, what="--plot")


# ----------------------------------------------------------------------- pieces

def _figure(width_in: float, height_in: float, ratios: Sequence[float]) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(ratios), gridspec_kw={"width_ratios": list(ratios)})
    return fig, list(axes)


def layout_label(c: Candidate) -> str:
    """A layout in three short lines for a tick label: degrees, sharding and micro-batch,
    recomputation."""
    lay = c.layout
    degrees = [w.replace("=", "") for w in lay.degree_words(marks=("", "")) if not w.startswith("etp=")]
    shard = f"ZeRO-{lay.zero_stage}" if lay.sharding == "zero" else f"FSDP {lay.sharding[5:]}"
    label = f"{' '.join(degrees)}\n{shard}, mb {lay.micro_batch}\nrecompute {lay.recompute}"
    # the step time tells apart alternatives whose memory is the same (identical bars, issue 20)
    return label + (f"\n{duration(c.time.step_time_s)}/step" if c.time is not None else "")


def _gpu_count_axis(ax: Axes, counts: Sequence[int]) -> None:
    """Log-2 GPU-count axis with plain integer ticks at powers of two (every other one
    when there are many)."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    lo, hi = min(counts), max(counts)
    ticks = [2**k for k in range(25) if lo <= 2**k <= hi]
    if len(ticks) < 2:
        ticks = sorted(set(counts))
    if len(ticks) > 8:
        ticks = ticks[::2]
    ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    if lo == hi:
        ax.set_xlim(lo / 2, hi * 2)
    ax.set_xlabel("GPUs (log scale)")
    ax.grid(True, which="major", alpha=0.3)


def _no_data(ax: Axes, title: str, text: str) -> None:
    import textwrap

    ax.set_title(title)
    lines = [w for line in text.splitlines() for w in textwrap.wrap(line, 58) or [""]]
    ax.text(0.5, 0.5, "\n".join(lines), ha="center", va="center", transform=ax.transAxes, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def memory_panel(ax: Axes, bars: Sequence[tuple[str, Candidate]], gpu: GpuSpec, capacity_bytes: int,
                 empty: str = "no valid layout") -> None:
    """Stacked bars of each candidate's per-rank memory by category (GiB), with the GPU's
    memory and, when smaller, the usable part of it as horizontal lines; ``empty`` is
    written in their place when there are none."""
    title = "Memory per rank (most loaded rank)"
    if not bars:
        _no_data(ax, title, empty)
        return
    x = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    gpu_gib, cap_gib = to_gib(gpu.memory_bytes), to_gib(capacity_bytes)
    y_max = max(gpu_gib, *(to_gib(c.memory.breakdown.total) for _, c in bars)) * 1.1
    for cat in CATEGORIES:
        heights = [to_gib(getattr(c.memory.breakdown, cat)) for _, c in bars]
        # a segment under THIN_FRACTION of the axis is a line or nothing in every bar: its size
        # goes in the legend (the largest of the bars'), so that no category is invisible (issue 20)
        top = max(heights)
        label = LABELS[cat] if top >= THIN_FRACTION * y_max else f"{LABELS[cat]} (at most {top:.2f} GiB)"
        ax.bar(x, heights, 0.6, bottom=bottom, color=COLORS[cat], label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, top in enumerate(bottom):      # the total inside the bar's top, clear of the capacity line
        inside = top > 0.12 * y_max
        ax.text(i, top - 0.01 * y_max if inside else top, f"{top:.1f}", ha="center", va="top" if inside else "bottom",
                fontsize=8, color="white" if inside else "black", fontweight="bold")
    ax.axhline(gpu_gib, color="black", lw=1.3, label=f"{gpu.name} memory: {gpu_gib:.1f} GiB")
    if capacity_bytes < gpu.memory_bytes:
        ax.axhline(cap_gib, color="black", lw=1.1, ls="--",
                   label=f"usable ({capacity_bytes / gpu.memory_bytes:.0%}): {cap_gib:.1f} GiB")
    ax.set_xticks(x, [label for label, _ in bars], fontsize=8 if len(bars) <= 4 else 7)   # no overlap at 6
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_ylim(0, y_max)
    ax.set_ylabel("memory per rank (GiB)")
    counts = sorted({c.n_gpus for _, c in bars})
    on = f" on {counts[0]} x {gpu.name}" if len(counts) == 1 else ""
    ax.set_title(f"{title}{on}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _memory_bars(r: PlanResult) -> list[tuple[str, Candidate]]:
    if r.best is not None:
        head = "chosen" if r.best.fits else "does not fit"
        return [(f"{head}\n{layout_label(r.best)}", r.best)] + [
            (f"alternative {i}\n{layout_label(c)}", c) for i, c in enumerate(r.alternatives, 1)]
    sm = r.result.smallest
    return [] if sm is None else [(f"least memory\n(does not fit)\n{layout_label(sm)}", sm)]


def _no_fit_text(r: PlanResult) -> str:
    """Why the plain plan has no layout, as report.no_fit_text says it, in short."""
    tried = r.result.counts_tried
    out = f"No layout fits on {tried[-1] if tried else '?'} x {r.gpu.name} or fewer."
    if r.result.smallest is None:
        out += (f"\nWeights, gradients and optimizer states alone need at least "
                f"{r.min_gpus_for_states:,} x {r.gpu.name}, even fully sharded.")
    if r.fits_from_gpus:
        out += f"\nIt fits from {r.fits_from_gpus:,} x {r.gpu.name}: raise --max-gpus."
    return out


def _title(r: PlanResult) -> str:
    method = r.setup.finetune.method
    return r.model.name + (f" ({method})" if method != "full" else "")


def _legend(fig: Figure, ax: Axes) -> None:
    """The memory panel's legend in one row below the figure: categories in stack order
    (bottom first), then the capacity lines."""
    handles, labels = ax.get_legend_handles_labels()
    names = tuple(LABELS.values())
    order = sorted(range(len(labels)), key=lambda i: not labels[i].startswith(names))
    wide = sum(len(label) for label in labels) > LEGEND_ROW_CHARS      # two rows rather than past the edge
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center",
               ncols=-(-len(labels) // 2) if wide else len(labels), fontsize=8, frameon=False)


def _plain_log_ticks(ax: Axes) -> None:
    """Tick labels 1, 10, 100 rather than 10^0, 10^1, 10^2 on a log y axis."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.6g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _tokens(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:,.3g}{unit}"
    return f"{n:,.0f}"


# ---------------------------------------------------------------------- figures

def plan_figure(r: PlanResult, scaling: Sequence[Candidate] = ()) -> Figure:
    """`plan --plot`: (1) memory per rank by category for the chosen layout and the
    alternatives against the GPU's capacity (GiB); (2) step time (s) and (3) throughput
    (tokens/s) of the fastest layout at each GPU count of ``scaling`` (api.scaling: the
    chosen count and its doublings), against GPU count."""
    fig, (mem, step, tput) = _figure(16, 5.6, (1.7, 1, 1))
    bars = _memory_bars(r)
    memory_panel(mem, bars, r.gpu, r.capacity_bytes, empty=_no_fit_text(r))
    timed = sorted((c for c in scaling if c.time is not None), key=lambda c: c.n_gpus)
    if not timed and r.best is not None and r.best.time is not None:
        timed = [r.best]
    if timed:
        ns = [c.n_gpus for c in timed]
        times = [c.time for c in timed if c.time is not None]
        tps = [t.tokens_per_s for t in times]
        line = "fastest layout per GPU count"
        step.plot(ns, [t.step_time_s for t in times], marker="o", color=GPU_COLORS[0], label=line)
        tput.plot(ns, tps, marker="o", color=GPU_COLORS[0], label=line)
        if len(ns) > 1:
            tput.plot(ns, [tps[0] * n / ns[0] for n in ns], ls="--", color="grey",
                      label=f"linear scaling from {plural(ns[0], 'GPU')}")
        for n, t in zip(ns, times):
            tput.annotate(f"MFU {t.mfu:.0%}", (n, t.tokens_per_s), textcoords="offset points", xytext=(4, -12),
                          fontsize=7)
        b = r.best
        if b is not None and b.time is not None:
            step.plot([b.n_gpus], [b.time.step_time_s], marker="*", ms=15, ls="none", color=CHOSEN,
                      label=f"chosen: {plural(b.n_gpus, 'GPU')}, {duration(b.time.step_time_s)}/step")
            tput.plot([b.n_gpus], [b.time.tokens_per_s], marker="*", ms=15, ls="none", color=CHOSEN,
                      label=f"chosen: {b.time.tokens_per_s:,.0f} tokens/s")
        for ax in (step, tput):
            _gpu_count_axis(ax, ns)
            ax.set_yscale("log")
            ax.legend(fontsize=8, loc="best")
        from matplotlib.ticker import EngFormatter, NullFormatter
        _plain_log_ticks(step)
        tput.yaxis.set_major_formatter(EngFormatter())
        tput.yaxis.set_minor_formatter(NullFormatter())
        step.set_ylabel("step time (s, log scale)")
        tput.set_ylabel("throughput (tokens/s, log scale)")
        step.set_title("Step time vs GPU count")
        tput.set_title("Throughput vs GPU count")
    else:
        why = _no_fit_text(r) if r.best is None else "The layout does not fit: no step time."
        _no_data(step, "Step time vs GPU count", why)
        _no_data(tput, "Throughput vs GPU count", why)
    what = (f"{r.best.n_gpus:,} x {r.gpu.name}, {r.best.layout.describe()}" if r.fits and r.best is not None
            else f"nothing fits on {r.gpu.name}")
    fig.suptitle(f"{_title(r)}: {what}", fontsize=11)
    if bars:
        _legend(fig, mem)
    return fig


def cost_figure(r: CostPlanResult) -> Figure:
    """`plan --tokens N --plot`: (1) memory per rank of the chosen plan and the other
    fastest layouts on its GPU type and count (GiB); (2) time to train on the tokens (days)
    and (3) its cost (USD; GPU-hours without a price) of the fastest layout at each GPU type
    and count, with the chosen plan, the deadline and the budget marked."""
    fig, (mem, when, cost) = _figure(16, 5.6, (1.5, 1, 1))
    res = r.result
    bars = _memory_bars(res) if res.best is not None else []
    if bars:
        memory_panel(mem, bars, res.gpu, res.capacity_bytes)
    else:
        why = " ".join(r.diagnosis.lines) if r.diagnosis is not None else ""
        _no_data(mem, "Memory per rank (most loaded rank)", f"No plan satisfies the constraints.\n{why}".strip())
    priced = all(p.cost_usd is not None for p in r.by_count)
    cost_title = "Rental cost vs GPU count" if priced else "GPU-hours vs GPU count"
    if r.by_count:
        counts = [p.n_gpus for p in r.by_count]
        for i, g in enumerate(r.gpus):
            mine = sorted((p for p in r.by_count if p.gpu.name == g.name), key=lambda p: p.n_gpus)
            if not mine:
                continue
            color = GPU_COLORS[i % len(GPU_COLORS)]
            ns = [p.n_gpus for p in mine]
            when.plot(ns, [p.train_time_s / DAY_S for p in mine], marker="o", color=color, label=g.name)
            # priced: every plan has a cost_usd; matplotlib's stubs reject Optional y values anyway
            cost.plot(ns, [(p.cost_usd if priced else p.gpu_hours) for p in mine],  # type: ignore[arg-type]
                      marker="o", color=color, label=g.name)
        ch = r.chosen
        if ch is not None:
            when.plot([ch.n_gpus], [ch.train_time_s / DAY_S], marker="*", ms=15, ls="none", color=CHOSEN,
                      label=f"chosen: {ch.n_gpus:,} x {ch.gpu.name}, {duration(ch.train_time_s)}")
            y = ch.cost_usd if priced else ch.gpu_hours
            # priced: the chosen plan has a cost_usd; matplotlib's stubs reject an Optional y value
            cost.plot([ch.n_gpus], [y], marker="*", ms=15, ls="none", color=CHOSEN,  # type: ignore[arg-type]
                      label=f"chosen: {usd(y) if priced else f'{y:,.0f} GPU-hours'}")  # type: ignore[arg-type]
        if r.limits.deadline_s is not None:
            when.axhline(r.limits.deadline_s / DAY_S, color="black", ls="--", lw=1,
                         label=f"deadline: {days(r.limits.deadline_s)} days")
        if r.limits.budget_usd is not None and priced:
            cost.axhline(r.limits.budget_usd, color="black", ls="--", lw=1,
                         label=f"budget: {usd(r.limits.budget_usd)}")
        from matplotlib.ticker import FuncFormatter
        for ax in (when, cost):
            _gpu_count_axis(ax, counts)
            ax.legend(fontsize=8, loc="best")
        when.set_yscale("log")
        _plain_log_ticks(when)
        when.set_ylabel("time to train (days, log scale)")
        when.set_title(f"Time to train on {_tokens(r.tokens)} tokens")
        if priced:
            cost.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: usd(v)))
            cost.set_ylabel("rental cost (USD)")
        else:
            cost.set_ylabel("GPU-hours")
        cost.set_ylim(bottom=0)
        cost.set_title(cost_title)
    else:
        _no_data(when, "Time to train", "no layout fits at any GPU count tried")
        _no_data(cost, cost_title, "no layout fits at any GPU count tried")
    ch = r.chosen
    what = (f"{ch.n_gpus:,} x {ch.gpu.name}, {usd(ch.cost_usd) + ', ' if ch.cost_usd is not None else ''}"
            f"{duration(ch.train_time_s)}; {ch.candidate.layout.describe()}" if ch is not None
            else "no plan satisfies the constraints")
    fig.suptitle(f"{_title(res)}, {_tokens(r.tokens)} tokens, minimising {r.objective}: {what}", fontsize=11)
    if bars:
        _legend(fig, mem)
    return fig


def buy_figure(r: BuyResult) -> Figure:
    """`plan buy --plot`: (1) GPUs bought per GPU type; (2) what they cost over the horizon
    (purchase and power, USD); (3) each job's run (days from the cluster's start), coloured
    by the GPU type it runs on, with its deadline."""
    fig, (gpus, dollars, jobs) = _figure(16, 5.2, (0.8, 0.9, 1.6))
    colors = {p.gpu: GPU_COLORS[i % len(GPU_COLORS)] for i, p in enumerate(r.pools)}
    names = [p.gpu for p in r.pools]
    x = list(range(len(names)))
    if r.feasible:
        n_gpus = [r.nodes.get(p.gpu, 0) * p.gpus_per_node for p in r.pools]
        gpus.bar(x, n_gpus, 0.6, color=[colors[g] for g in names])
        for i, (p, n) in enumerate(zip(r.pools, n_gpus)):
            nodes = r.nodes.get(p.gpu, 0)
            gpus.text(i, n, f"{nodes} node{'s' if nodes != 1 else ''}", ha="center", va="bottom", fontsize=8)
        gpus.set_ylim(0, max(max(n_gpus), 1) * 1.15)
        capex = [r.nodes.get(p.gpu, 0) * p.capex_usd for p in r.pools]
        opex = [r.nodes.get(p.gpu, 0) * p.opex_usd for p in r.pools]
        dollars.bar(x, capex, 0.6, color=[colors[g] for g in names], label="purchase")
        dollars.bar(x, opex, 0.6, bottom=capex, color="#333333", label="power over the horizon")
        for i, (a, b) in enumerate(zip(capex, opex)):
            dollars.text(i, a + b, usd(a + b), ha="center", va="bottom", fontsize=8)
        dollars.set_ylim(0, max(max(a + b for a, b in zip(capex, opex)), 1) * 1.15)
        from matplotlib.ticker import FuncFormatter
        dollars.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: usd(v)))
        from matplotlib.patches import Patch
        dollars.legend(handles=[Patch(color="#BBBBBB", label="purchase (colour: GPU type)"),
                                Patch(color="#333333", label="power over the horizon")], fontsize=8, loc="upper right")
        for ax in (gpus, dollars):
            ax.set_xticks(x, names)
            ax.set_xlabel("GPU type")
            ax.grid(True, axis="y", alpha=0.3)
            ax.set_axisbelow(True)
        gpus.set_ylabel("GPUs bought")
        gpus.set_title("GPUs bought per type")
        dollars.set_ylabel(f"cost over {days(r.horizon_s, 0)} days (USD)")
        dollars.set_title("Cost per GPU type")
        rows = list(reversed(r.plans))     # the first job on top
        y = list(range(len(rows)))
        every = -(-len(rows) // LABELLED_JOBS)     # label one row in ``every``: all of them up to LABELLED_JOBS
        labelled = [i for i in y if (len(rows) - 1 - i) % every == 0]     # from the top: the first job's row
        for i, j in zip(y, rows):
            start, length = j.start_s / DAY_S, (j.finish_s - j.start_s) / DAY_S
            jobs.barh(i, length, 0.5, left=start, color=colors[j.gpu.name])
            jobs.plot([j.deadline_s / DAY_S] * 2, [i - 0.35, i + 0.35], color="black", lw=2)
            if (len(rows) - 1 - i) % every == 0:
                jobs.text(max(j.finish_s, j.deadline_s) / DAY_S, i,
                          f"  {j.n_gpus} x {j.gpu.name}, {length:,.1f} days", va="center", fontsize=8)
        from matplotlib.artist import Artist
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        keys: list[Artist] = [Line2D([], [], color="black", lw=2, label="deadline")]
        keys += [Patch(color=colors[g], label=f"on {g}") for g in names if any(j.gpu.name == g for j in rows)]
        jobs.legend(handles=keys, fontsize=8, loc="lower right")
        jobs.set_yticks(labelled, [f"{rows[i].name}\n{rows[i].model.name}" for i in labelled], fontsize=8)
        end = max(max(j.deadline_s, j.finish_s) for j in rows) / DAY_S
        jobs.set_xlim(0, end * 1.35)
        jobs.set_ylim(-0.7, len(rows) - 0.3)
        jobs.set_xlabel(f"days from {r.start_date}")
        jobs.set_title("Jobs: run time and deadline")
        jobs.grid(True, axis="x", alpha=0.3)
        jobs.set_axisbelow(True)
        title = (f"Cluster purchase for {len(r.plans)} jobs of {Path(r.path).name}: {usd(r.tco_usd)} "
                 f"(purchase {usd(r.capex_usd)} + power {usd(r.opex_usd)} over {days(r.horizon_s, 0)} days)")
    else:
        why = "\n".join(r.lines) or "no purchase satisfies the constraints"
        _no_data(gpus, "GPUs bought per type", "nothing bought")
        _no_data(dollars, "Cost per GPU type", "nothing bought")
        _no_data(jobs, "Jobs: run time and deadline", why)
        title = f"Cluster purchase for the jobs of {Path(r.path).name}: no purchase satisfies the constraints"
    fig.suptitle(title, fontsize=11)
    return fig
