"""The terminal: the human reports drawn with rich (an answer panel, memory per category
as bars against the GPU's capacity, step time, cost, alternatives).

rich is imported only inside the functions that draw, so `plan --help` and the JSON output
never pay for it. Where the report goes (colour, width) and the progress bar of long
searches are planner.report.screen; the bars are planner.report.bars. Units are formatted
by planner.fmt (gib, duration, usd), as everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from planner.fmt import amount, days, duration, gib, params, plural, usd
from planner.memory.model import CATEGORIES
from planner.report import costs
from planner.report import text as report
from planner.report.bars import BAD, CATEGORY_STYLE, DIM, HEAD, OK, Bar, Stack, Timeline
from planner.report.intervals import cost_interval_text, memory_note, step_interval_text
from planner.report.text import LABELS

if TYPE_CHECKING:
    from rich.console import ConsoleOptions
    from rich.table import Table

    from planner.api import PlanResult
    from planner.measure.crosscheck import Crosscheck
    from planner.search.search import Candidate
    from planner.timing.model import StepTime


# ----------------------------------------------------------------------- building blocks

def _simple_head() -> Any:
    """rich's SIMPLE_HEAD box (a rule under the header, no other lines), drawn with '-'
    where the output is not UTF (rich would substitute its ASCII grid)."""
    from rich import box

    class SimpleHead(box.Box):
        def substitute(self, options: ConsoleOptions, safe: bool = True) -> box.Box:
            if options.ascii_only:
                return box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
            return self

    return SimpleHead("    \n    \n \u2500\u2500 \n    \n    \n    \n    \n    \n")


def _table(title: str | None = None, caption: str | None = None) -> Table:
    from rich.table import Table

    return Table(title=title, caption=caption, box=_simple_head(), title_justify="left", caption_justify="left",
                 title_style=HEAD, caption_style=DIM, header_style=HEAD, pad_edge=False, show_edge=False,
                 padding=(0, 1), collapse_padding=True)


def _text(*chunks: str | tuple[str, str]) -> Any:
    """A rich Text from plain strings and (string, style) pairs."""
    from rich.text import Text

    return Text.assemble(*chunks)


def _lines(lines: Sequence[str], style: str = "") -> Any:
    """Lines indented by two spaces (a wrapped line keeps the indentation)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 0, 0, 2), pad_edge=True)
    grid.add_column(style=style)
    for line in lines:
        grid.add_row(line.strip())
    return grid


def _bullets(items: Sequence[str]) -> Any:
    """A list, each item after a dash (a wrapped item keeps its indentation)."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for item in items:
        grid.add_row("  -", item)
    return grid


def _section(title: str, *body: Any) -> list[Any]:
    return [_text("", ("\n" + title, HEAD)), *body]


def _panel(title: str, rows: Sequence[tuple[str, Any]], style: str = OK) -> Any:
    """The answer: a titled box of label / value rows."""
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style=DIM, no_wrap=True)
    grid.add_column()
    for label, value in rows:
        grid.add_row(label, value)
    return Panel(grid, title=_text((title, f"bold {style}")), title_align="left", border_style=style)


def fits_text(used_bytes: int, capacity_bytes: int, fits: bool) -> Any:
    verdict = ("fits", f"bold {OK}") if fits else ("DOES NOT FIT", BAD)
    return _text(f"{gib(used_bytes)} of {gib(capacity_bytes)} per GPU ({100 * used_bytes / capacity_bytes:.0f}%): ",
                 verdict)


# ----------------------------------------------------------------------------- memory

def memory_table(c: Candidate, title: str = "Memory per rank") -> list[Any]:
    """Each category's bytes on the most loaded rank, with a bar against the GPU's usable
    capacity; the total as a stacked bar; where and when the peak happens."""
    bd, cap, m = c.memory.breakdown, c.capacity_bytes, c.memory
    where = f"pipeline stage {m.stage} ({m.n_layers_on_stage} layers)" if c.layout.pp > 1 else "every rank"
    caption = (f"peak at {m.phase.replace('-', ' ')}, on {where}, "
               f"{amount(m.in_flight, 'micro-batch', 'micro-batches')} of "
               f"activations held, {m.kernels} kernels")
    t = _table(title, caption)
    t.add_column("category")
    t.add_column("per rank", justify="right", no_wrap=True)
    t.add_column(f"share of {gib(cap)}", no_wrap=True)
    t.add_column("", justify="right", no_wrap=True)
    for cat in CATEGORIES:
        v = getattr(bd, cat)
        t.add_row(_text((LABELS[cat], CATEGORY_STYLE[cat])), gib(v), Bar([(v / cap, CATEGORY_STYLE[cat])]),
                  f"{100 * v / cap:.0f}%")
    stacked = Bar([(getattr(bd, cat) / cap, CATEGORY_STYLE[cat]) for cat in CATEGORIES])
    verdict = _text(("fits", f"bold {OK}")) if c.fits else _text(("DOES NOT FIT", BAD))
    t.add_row(_text(("total", HEAD)), _text((gib(bd.total), HEAD)), stacked,
              _text((f"{100 * bd.total / cap:.0f}% ", HEAD), verdict), end_section=True)
    out: list[Any] = [t]
    if m.host_bytes or m.nvme_bytes:
        cap_text = f" of {gib(c.host_capacity_bytes)}" if c.host_capacity_bytes else " (no topology figure to check)"
        line = f"offloaded: {gib(m.host_bytes_per_node)} of CPU memory per node{cap_text}"
        if m.nvme_bytes:
            line += f", {gib(m.nvme_bytes_per_node)} on NVMe per node"
        out.append(_text(line, ("" if c.host_fits else ": MORE THAN THE NODE HAS", BAD)))
    return out


# ------------------------------------------------------------------------------- time

CEILING_MARK = "^"
CEILING_NOTE = (f"{CEILING_MARK} at the GPU's sustained MFU ceiling (presets/gpus.toml): the step is the model's FLOPs "
                "at that rate on any layout, so its cost does not change with the GPU count")


def step_line(t: StepTime) -> str:
    return (f"{duration(t.step_time_s)}, {t.tokens_per_s:,.0f} tokens/s, "
            f"{t.model_flops_per_s_per_gpu / 1e12:,.0f} TFLOP/s per GPU, MFU {t.mfu:.1%}"
            + ("" if t.mfu_fp8 is None else f" of the BF16 peak, {t.mfu_fp8:.1%} of the low-precision peak")
            + (" (the sustained ceiling)" if t.at_mfu_ceiling else ""))


def time_table(t: StepTime) -> Any:
    """Where the step's time goes, each part with a bar against the whole step."""
    tab = _table(f"Step time: {duration(t.step_time_s)}",
                 f"groups placed {'-'.join(t.placement)} (innermost first)")
    tab.add_column("part")
    tab.add_column("per step", justify="right", no_wrap=True)
    tab.add_column("share of the step", no_wrap=True)
    tab.add_column("", justify="right", no_wrap=True)
    rows = [("compute", t.compute_s, "green")]
    rows += [(f"exposed communication, {ax}", v, "yellow") for ax, v in t.comm_s.items() if v > 0]
    if not any(v > 0 for v in t.comm_s.values()):
        rows.append(("exposed communication", 0.0, "yellow"))
    rows += [("pipeline bubble", t.bubble_s, "red"), ("optimizer", t.optimizer_s, "blue")]
    for label, v, style in rows:
        share = v / t.step_time_s if t.step_time_s else 0.0
        tab.add_row(label, duration(v), Bar([(share, style)]), f"{share:.0%}")
    return tab


def _answer_rows(c: Candidate, tokens: float | None, global_batch: int | None = None) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [("layout", c.layout.describe())]
    for line in report.layout_notes(c.layout, c.n_gpus, global_batch):
        rows.append(("note", _text((line, DIM))))
    rows.append(("memory", fits_text(c.memory.total, c.capacity_bytes, c.fits)))
    note = memory_note(c.memory.total, c.capacity_bytes, c.fits)
    if note is not None:
        rows.append(("", note))
    if c.time is not None:
        rows.append(("step", step_line(c.time)))
        if tokens is not None:
            rows.append(("train", f"{params(int(tokens))} tokens in {duration(c.time.train_time_s(tokens))} "
                                  f"on {plural(c.time.n_gpus, 'GPU')}"))
        rows.append(("range", step_interval_text(c.time, tokens)))      # issue 18 (report.intervals)
    return rows


# ------------------------------------------------------------------------------- plan

def _title(r: PlanResult) -> list[Any]:
    m, pc = r.model, r.params
    active = f" ({params(pc.active)} active per token)" if m.is_moe else ""
    out: list[Any] = [_text((f"{m.name}: {pc.total:,} parameters{active} on {r.gpu.name}", HEAD))]
    ft = r.setup.finetune
    if not ft.is_full or r.methods_tried:
        from planner.training.finetune import n_trainable_params
        n_train = n_trainable_params(m, ft, pc)
        tried = f" (--method auto chose it among {', '.join(r.methods_tried)})" if r.methods_tried else ""
        out.append(_text(f"method: {ft.describe(m)}{tried}\n",
                         (f"  {n_train:,} trainable parameters ({100 * n_train / pc.total:.3g}% of the model)", DIM)))
    return out


def alternatives_table(r: PlanResult) -> Any:
    b = r.best
    assert b is not None
    t = _table(f"Alternatives on {plural(b.n_gpus, 'GPU')}")
    t.add_column("memory", justify="right", no_wrap=True)
    t.add_column("", justify="right", no_wrap=True)
    t.add_column("step", justify="right", no_wrap=True)
    t.add_column("MFU", justify="right", no_wrap=True)
    t.add_column("layout")
    for c in r.alternatives:
        step = f"{duration(c.time.step_time_s)}/step" if c.time else "-"
        mfu = f"{c.time.mfu:.1%}" if c.time else "-"
        t.add_row(gib(c.memory.total), f"{100 * c.memory.total / c.capacity_bytes:.0f}%", step, mfu,
                  report.layout_compact(c.layout))
    return t


def no_fit_view(r: PlanResult) -> list[Any]:
    """Why nothing fits, the least memory any layout needs, and what would make it fit."""
    tried = r.result.counts_tried
    span = f"{tried[0]}" if len(tried) == 1 else f"{tried[0]} to {tried[-1]}"
    from planner.report.advice import (
        fit_advice,  # the least memory, and the ways out (planner.report.advice)
    )
    least, *ways = fit_advice(r)
    sm = r.result.smallest
    rows: list[tuple[str, Any]] = [("least", least)] + [("advice" if i == 0 else "", w) for i, w in enumerate(ways)]
    out = [_panel(f"No layout fits on {span} x {r.gpu.name} ({gib(r.capacity_bytes)} each)", rows, BAD)]
    if sm is not None:
        out += [_text("")] + memory_table(sm, f"The least memory any layout needs, on {plural(sm.n_gpus, 'GPU')}")
    return out


def plan_view(r: PlanResult, crosscheck: Crosscheck | None = None) -> list[Any]:
    """`plan`: the answer, its memory and step time, the alternatives, the assumptions."""
    out = _title(r) + [_text("")]
    if r.best is None:
        out += no_fit_view(r)
    else:
        b = r.best
        title = "The layout you gave" if r.fixed else f"Smallest GPU count that fits: {b.n_gpus} x {r.gpu.name}"
        if r.fixed:
            title += f": {b.n_gpus} x {r.gpu.name}"
        out.append(_panel(title, _answer_rows(b, r.tokens, r.setup.global_batch), OK if b.fits else BAD))
        out += [_text("")] + memory_table(b)
        if b.time is not None:
            out += [_text(""), time_table(b.time)]
        if r.alternatives:
            out += [_text(""), alternatives_table(r)]
    if crosscheck is not None:
        out += crosscheck_view(crosscheck)
    out += _section("Assumptions", _lines(report.assumptions_text(r), DIM))
    return out


def crosscheck_view(c: Crosscheck) -> list[Any]:
    """DeepSpeed's estimate beside the planner's figures, and why they differ."""
    d = c.deepspeed
    if d is None:
        return [_text(""), _text(f"Cross-check with DeepSpeed skipped: {c.reason}")]
    i = d.inputs
    off = "optimizer" if i.cpu_offload else ""
    off += (" and parameters" if off else "parameters") if i.cpu_offload_params else ""
    agrees = d.planner_as_deepspeed == d.deepspeed
    head = _text((f"Cross-check with DeepSpeed's {d.estimator} ({i.num_nodes} node(s) x {i.num_gpus_per_node} "
                  f"GPUs, offload: {off or 'none'}):", HEAD))
    t = _table()
    t.add_column("figure")
    t.add_column("bytes", justify="right", no_wrap=True)
    for label, v in (("DeepSpeed, model states per GPU", d.deepspeed.gpu_bytes),
                     ("DeepSpeed, CPU memory per node", d.deepspeed.cpu_bytes),
                     ("planner, weights + gradients + optimizer", d.planner_model_state_bytes),
                     ("planner, communication buffers", d.planner_buffer_bytes),
                     ("planner, total per rank", d.planner_total_bytes)):
        t.add_row(label, gib(v))
    same = _text("the planner's formulas under DeepSpeed's assumptions: "
                 f"{gib(d.planner_as_deepspeed.gpu_bytes)} per GPU, {gib(d.planner_as_deepspeed.cpu_bytes)} CPU "
                 "per node (", ("agrees to the byte", OK) if agrees else ("differs", BAD), ")")
    return [_text(""), head, t, same, _text("why they differ:"), _bullets(d.notes)]


# ------------------------------------------------------------- cost (plan --tokens)

def cost_table(r: Any) -> Any:
    """The fastest (so cheapest) plan at each GPU type and count; * marks the chosen one."""

    dated = ", ".join(f"{g.name} {costs.rent_date(r, g.name)}" for g in r.gpus
                      if r.prices.for_gpu(g.name).rent_usd_per_gpu_hour is not None)
    capped = any(p.candidate.time.at_mfu_ceiling for p in r.by_count)
    t = _table("The fastest layout at each GPU count, its cost and time (* chosen"
               + (f"; rental prices of {dated}" if dated else "") + "):", CEILING_NOTE if capped else None)
    for name, just in (("", "left"), ("gpu", "left"), ("GPUs", "right"), ("cost", "right"), ("time", "right"),
                       ("GPU-hours", "right"), ("MFU", "right")):
        t.add_column(name, justify=just, no_wrap=True)   # type: ignore[arg-type]
    t.add_column("layout")
    for p in r.by_count:
        chosen = r.chosen is not None and p.candidate is r.chosen.candidate
        broken = costs.broken_limits(r, p)
        note = f" (over {' and '.join(broken)})" if broken else ""
        t.add_row("*" if chosen else "", p.gpu.name, f"{p.n_gpus:,}",
                  usd(p.cost_usd) if p.cost_usd is not None else "-", duration(p.train_time_s),
                  f"{p.gpu_hours:,.0f}",
                  f"{p.candidate.time.mfu:.1%}{CEILING_MARK if p.candidate.time.at_mfu_ceiling else ''}",
                  _text(report.layout_compact(p.candidate.layout), (note, BAD)),
                  style=f"bold {OK}" if chosen else (DIM if broken else None))
    return t


def cost_view(r: Any, crosscheck: Crosscheck | None = None) -> list[Any]:
    """`plan --tokens`: the chosen plan with its cost and time, its memory, the table by GPU
    count, the prices, the assumptions and the solver."""

    res = r.result
    m, pc, lim = res.model, res.params, r.limits
    goal = "the cost" if r.objective == "cost" else "the time"
    cons = [f"deadline {duration(lim.deadline_s)}" if lim.deadline_s is not None else "no deadline",
            f"budget {usd(lim.budget_usd)}" if lim.budget_usd is not None else "no budget",
            f"at most {lim.max_gpus:,} GPUs"]
    out: list[Any] = [_text((f"{m.name}: {pc.total:,} parameters; {params(int(r.tokens))} tokens; "
                             f"minimising {goal}", HEAD)),
                      _text(f"GPU types {', '.join(g.name for g in r.gpus)}; {'; '.join(cons)}")]
    for name, why in r.left_out:
        out.append(_text((f"left out: {name}, {why}", BAD)))
    for line in (r.global_batch_basis, costs.provider_line(r), costs.topology_cap_line(r)):
        if line:
            out.append(_text(line))
    ft = res.setup.finetune
    if not ft.is_full:
        out.append(_text(f"method: {ft.describe(m)}"))
    out.append(_text(""))
    if r.chosen is None:
        lines = r.diagnosis.lines if r.diagnosis else ()
        out.append(_panel("No plan satisfies the constraints.", [("why", _lines(lines))] if lines else [], BAD))
    else:
        c = r.chosen
        what = "Cheapest plan" if r.objective == "cost" else "Fastest plan"    # within the noise: the "why" row
        cost = usd(c.cost_usd) if c.cost_usd is not None else "no price"
        rate = r.prices.for_gpu(c.gpu.name).rent_usd_per_gpu_hour
        priced = (f", at ${rate:,.2f} per GPU-hour (price of {costs.rent_date(r, c.gpu.name)})"
                  if rate is not None else "")
        rows = [("cost", _text((cost, HEAD), f" for {duration(c.train_time_s)} ({c.gpu_hours:,.0f} GPU-hours)"
                               f"{priced}")), ("", cost_interval_text(c))]       # issue 18 (report.intervals)
        rows += _answer_rows(c.candidate, r.tokens, res.setup.global_batch)
        why = costs.choice_lines(r)
        if why:
            rows.append(("why", _text("\n".join(why))))
        out.append(_panel(f"{what}: {c.n_gpus} x {c.gpu.name}", rows))
        out += [_text("")] + memory_table(c.candidate)
        out += [_text(""), time_table(c.candidate.time)]
    if r.by_count:
        out += [_text(""), cost_table(r)]
    out += _section("Prices (override with --prices FILE):", _lines(costs.rent_lines(r), DIM))
    stale = costs.stale_price_warning(r.prices, [g.name for g in r.gpus])
    if stale:
        out.append(_text((stale, BAD)))
    out += _section("Assumptions", _lines(report.assumptions_text(res), DIM))
    out += _section("Solver", _lines(costs.solver_lines(r), DIM))
    if crosscheck is not None:
        out += crosscheck_view(crosscheck)
    return out


# ---------------------------------------------------------------------- plan buy

BATCH_RULE = "scaled with the run for full training, 64 for a fine-tune; planner/training/batch.py"


def buy_view(r: Any) -> list[Any]:
    """`plan buy`: the nodes to buy and what they cost, each job's GPUs and schedule on a
    timeline, the node prices and the solver."""

    p = r.prices
    budget = f", budget {usd(r.budget_usd)}" if r.budget_usd is not None else ""
    out: list[Any] = [_text((f"Cluster purchase for {len(r.plans) or 'the'} jobs of {r.path}: horizon "
                             f"{duration(r.horizon_s)} from {r.start_date}{budget}", HEAD))]
    for name, why in r.left_out:
        out.append(_text((f"left out: {name}, {why}", BAD)))
    out.append(_text(""))
    if not r.feasible:
        out.append(_panel("No purchase satisfies the constraints.", [("why", _lines(r.lines))], BAD))
    else:
        bought = ", ".join(f"{n} x {g} node{'s' if n != 1 else ''}" for g, n in r.nodes.items() if n)
        grid = _table()
        for name, just in (("GPU", "left"), ("nodes", "right"), ("GPUs", "right"), ("purchase", "right"),
                           ("power", "right")):
            grid.add_column(name, justify=just, no_wrap=True)   # type: ignore[arg-type]
        for pool in r.pools:
            n = r.nodes[pool.gpu]
            grid.add_row(pool.gpu, str(n), f"{n * pool.gpus_per_node:,}", usd(n * pool.capex_usd),
                         usd(n * pool.opex_usd), style=None if n else DIM)
        out.append(_panel(f"Buy: {bought}", [("cost", _text(f"capex {usd(r.capex_usd)}, opex {usd(r.opex_usd)}, ",
                                                             (f"total {usd(r.tco_usd)}", HEAD))),
                                             ("nodes", grid)]))
        out += [_text(""), jobs_table(r)]
        out.append(_lines([f"{j.name}: {report.layout_compact(j.candidate.layout)}; step "
                           f"{duration(j.candidate.time.step_time_s)}, "
                           f"MFU {j.candidate.time.mfu:.1%}"
                           + ("" if j.batch_given else f"; global batch {j.candidate.layout.global_batch:,} sequences "
                                                       f"(none in the jobs file: {BATCH_RULE})")
                           for j in r.plans], DIM))
    t = _table("Nodes on offer (purchase + power over the horizon)",
               f"power: {p.electricity_usd_per_kwh:g} $/kWh ({p.electricity_source}), PUE {p.pue:g} ({p.pue_source})")
    for name, just in (("GPU", "left"), ("node", "left"), ("purchase", "right"), ("power", "right")):
        t.add_column(name, justify=just, no_wrap=True)    # type: ignore[arg-type]
    t.add_column("sources")
    for pool in r.pools:
        g = p.for_gpu(pool.gpu)
        t.add_row(pool.gpu, f"{pool.gpus_per_node} GPUs", usd(pool.capex_usd), usd(pool.opex_usd),
                  f"{g.purchase_source} ({g.purchase_date}); {g.node_power_kw:g} kW: {g.power_source}")
    out += [_text(""), t]
    stale = costs.stale_price_warning(p, [pool.gpu for pool in r.pools], own=True)
    if stale:
        out.append(_text((stale, BAD)))
    out += _section("Solver", _lines(costs.buy_solver_lines(r), DIM))
    return out


def jobs_table(r: Any) -> Any:
    """Each job's GPUs, dates (and days from the start), step time, and a timeline: running
    (block) and the time left before its deadline (track), on a scale to the last deadline."""
    from datetime import date, timedelta

    day0 = date.fromisoformat(r.start_date)

    def when(seconds: float) -> str:
        return f"{(day0 + timedelta(seconds=seconds)).isoformat()}\nday {days(seconds)}"

    end_s = max((j.deadline_s for j in r.plans), default=1.0) or 1.0
    t = _table("Jobs:")
    for name, just in (("job / model", "left"), ("tokens", "right"), ("on", "left"), ("start", "left"),
                       ("finish", "left"), ("deadline", "left"), ("takes", "right")):
        t.add_column(name, justify=just, no_wrap=True)     # type: ignore[arg-type]
    t.add_column(f"days 0 to {days(end_s, 0)}", no_wrap=True)
    for j in r.plans:
        bar = Timeline(j.start_s / end_s, (j.finish_s - j.start_s) / end_s, (j.deadline_s - j.finish_s) / end_s, 16)
        t.add_row(_text(j.name, (f"\n{j.model.name}", DIM)), params(int(j.tokens)), f"{j.n_gpus} x {j.gpu.name}",
                  when(j.start_s), when(j.finish_s), when(j.deadline_s), duration(j.finish_s - j.start_s), bar)
    return t


# ------------------------------------------------------------------- plan measure

def comparison_view(m: Any, gpu: Any, cmp: Any) -> list[Any]:
    """`plan measure`: the prediction beside the measurement, per category."""
    from planner.measure.titan_moments import SHORT as MOMENT_NAMES  # here: 10 ms of import `plan` does not need

    meas = cmp.measured
    how = "fake tensors on the CPU, fake process group" if meas.get("fake") else f"real run on {meas.get('device')}"
    ft = cmp.setup.finetune
    out: list[Any] = [_text((f"{m.name}: {cmp.layout.describe()}, sequence {cmp.layout.seq_len}, "
                             f"{cmp.setup.precision}, {cmp.setup.optimizer}", HEAD))]
    if not ft.is_full:
        out.append(_text(ft.describe(m)))
    out.append(_text(f"measured with {meas.get('tracker')} ({how}) in {meas.get('wall_s', 0):.1f} s"))
    top = max([1, *(max(r.predicted_bytes, r.measured_bytes) for r in cmp.rows)])
    t = _table()
    moment = getattr(cmp, "moment", "")
    named = MOMENT_NAMES.get(moment, moment.replace("-", " "))
    t.add_column(f"category (at the {named})" if moment else "category (at the peak)")
    t.add_column("predicted", justify="right", no_wrap=True)
    t.add_column("measured", justify="right", no_wrap=True)
    t.add_column("error", justify="right", no_wrap=True)
    t.add_column("predicted (solid) / measured", no_wrap=True)
    for r in cmp.rows:
        err = "-" if r.error is None else f"{100 * r.error:+.1f}%"
        style = "" if r.error is None else OK if abs(r.error) <= 0.1 else BAD
        label = (("total at the peak" if moment else "total (less overhead)") if r.category == "total"
                 else LABELS.get(r.category, r.category))
        if r.category == "activations":
            label = "activations and loss"
        colour = CATEGORY_STYLE.get(r.category, "white")
        pair = Stack([Bar([(r.predicted_bytes / top, colour)], width=20),
                       Bar([(r.measured_bytes / top, colour)], width=20, shade=True)])
        t.add_row(_text((label, HEAD if r.category == "total" else "")), gib(r.predicted_bytes),
                  gib(r.measured_bytes), _text((err, style)), pair, end_section=r.category == "total")
    out += [_text(""), t]
    lines = [f"peak: predicted at {cmp.predicted_phase.replace('-', ' ')}; measured in {meas.get('peak_phase')} of "
             f"step {meas.get('peak_step')} ({meas.get('peak_module') or 'outside modules'})",
             f"overhead not seen by the tracker (CUDA context, NCCL, fragmentation): {gib(cmp.predicted.overhead)}; "
             f"planner total {gib(cmp.predicted.total)} of {gib(gpu.memory_bytes)}"]
    if moment:
        lines.insert(0, f"categories at the tracker's peak moment, the {named}, each predicted at the planner's "
                        "same moment; the total is peak against peak, less overhead")
        large = max([0, *(t.measured_bytes for t in cmp.moment_totals)]) >= 2**30
        unit, div = ("GiB", 2**30) if large else ("MiB", 2**20)
        lines.append("tracked total by moment, predicted / measured: " + "; ".join(
            f"{MOMENT_NAMES.get(t.moment, t.moment)} {t.predicted_bytes / div:.2f} / {t.measured_bytes / div:.2f}"
            for t in cmp.moment_totals) + f" {unit}")
        lines += [f"why: {n}" for n in cmp.notes]
    if meas.get("max_allocated_bytes"):
        lines.append(f"CUDA max allocated {gib(meas['max_allocated_bytes'])}, "
                     f"max reserved {gib(meas['max_reserved_bytes'])}")
    out.append(_lines(lines))
    return out


# --------------------------------------------------------------------- --task load

def load_view(r: Any) -> list[Any]:
    """`plan --task load`: the split and the memory of the most loaded GPU, with bars."""
    from planner.memory.inference import mla_cache_description  # here: `plan` and `plan buy` need none of it

    s, m = r.setup, r.model
    fmt = {"none": f"{8 * s.weight_bytes}-bit", "int8": "int8 (LLM.int8)", "int4": "int4 (group 128)",
           "nf4": "NF4 (4-bit, double-quantized constants)"}[s.quant]
    out: list[Any] = [
        _text((f"{m.name}: {r.params.total:,} parameters, held for inference on {r.gpu.name}", HEAD)),
        _text(f"weights {fmt}" + (", embeddings and LM head in 16 bits" if s.quant != "none" else "")
              + f"; KV cache for {s.batch} sequence(s) of {s.context:,} tokens, {8 * s.kv_bytes}-bit")]
    mla = mla_cache_description(m, s.mla_cache, r.tp)
    if mla:
        other = "per-head" if s.mla_cache == "latent" else "latent"
        out.append(_text(f"{mla}; --mla-cache {other} for the other layout"))
    out.append(_text(""))
    head = "The split you gave" if r.fixed else ("Fewest GPUs that hold it" if r.fits else
                                                 "Nothing fits; the least memory tried")
    cap = r.capacity_bytes
    out.append(_panel(f"{head}: {r.n_gpus} x {r.gpu.name} (tp={r.tp}, pp={r.pp})",
                      [("memory", fits_text(r.memory.total, cap, r.fits))], OK if r.fits else BAD))
    t = _table("Memory per GPU")
    t.add_column("category")
    t.add_column("per GPU", justify="right", no_wrap=True)
    t.add_column(f"share of {gib(cap)}", no_wrap=True)
    t.add_column("", justify="right", no_wrap=True)
    for key, label in report.LOAD_LABELS.items():
        v = getattr(r.memory, key)
        style = CATEGORY_STYLE.get(key, "white")
        t.add_row(_text((label, style)), gib(v), Bar([(v / cap, style)]), f"{100 * v / cap:.0f}%")
    stacked = Bar([(getattr(r.memory, k) / cap, CATEGORY_STYLE.get(k, "white")) for k in report.LOAD_LABELS])
    verdict = _text(("fits", f"bold {OK}")) if r.fits else _text(("DOES NOT FIT", BAD))
    t.add_row(_text(("total per GPU", HEAD)), _text((gib(r.memory.total), HEAD)), stacked,
              _text((f"{100 * r.memory.total / cap:.0f}% ", HEAD), verdict))
    out += [_text(""), t]
    return out
