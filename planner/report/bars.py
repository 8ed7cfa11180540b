"""The bars of the terminal reports, drawn as rich renderables: a memory or time bar against
a whole (Bar), a job's window on a shared time scale (Timeline), and renderables stacked in
one table cell (Stack); the styles every terminal report shares.

rich is imported only inside the methods that draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.measure import Measurement

BAR_WIDTH = 30             # cells of a memory bar at 100% of the GPU

# One colour per memory category, the same in every table and in the stacked total.
CATEGORY_STYLE = {
    "weights": "blue", "gradients": "magenta", "optimizer": "yellow", "activations": "green",
    "logits": "cyan", "buffers": "bright_black", "overhead": "red",
    "kv_cache": "cyan",
}
OK, BAD, DIM, HEAD = "green", "bold red", "dim", "bold"


class Bar:
    """A horizontal bar, ``width`` cells for a whole: stacked parts (fraction, style) drawn
    in block characters on a light track, in eighths of a cell when there is one part; '#'
    and '.' where the output is not UTF; a '>' marks a total over the whole."""

    def __init__(self, parts: Sequence[tuple[float, str]], width: int = BAR_WIDTH, shade: bool = False) -> None:
        self.parts = [(max(0.0, f), style) for f, style in parts]
        self.width = width
        self.shade = shade      # a lighter fill, whole cells: the second of two bars compared

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement
        return Measurement(self.width + 1, self.width + 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.segment import Segment
        from rich.style import Style

        ascii_only = options.ascii_only
        full, track = ("#", ".") if ascii_only else ("\u2588", "\u2591")
        if self.shade:
            full, track = ("=" if ascii_only else "\u2592"), " "
        total = sum(f for f, _ in self.parts)
        cells = 0
        if len(self.parts) == 1 and not ascii_only and not self.shade:
            eighths = min(self.width * 8, round(self.parts[0][0] * self.width * 8))
            whole, rest = divmod(eighths, 8)
            text = full * whole + (" \u258f\u258e\u258d\u258c\u258b\u258a\u2589"[rest] if rest else "")
            cells = len(text)
            yield Segment(text, Style.parse(self.parts[0][1]))
        else:
            done = 0.0
            for fraction, style in self.parts:       # cumulative rounding: the total stays right
                done += fraction
                end = min(self.width, round(done * self.width))
                if end > cells:
                    yield Segment(full * (end - cells), Style.parse(style))
                    cells = end
        if cells < self.width:
            yield Segment(track * (self.width - cells), Style.parse(DIM))
        yield Segment(">" if total > 1 + 1e-9 else " ", Style.parse(BAD))


class Timeline:
    """A job's window on a shared scale: blank before it starts, block characters while it
    runs, a track until its deadline."""

    def __init__(self, lead: float, run: float, slack: float, width: int) -> None:
        self.lead, self.run, self.slack, self.width = lead, run, slack, width

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement
        return Measurement(self.width, self.width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.segment import Segment
        from rich.style import Style

        full, track = ("#", ".") if options.ascii_only else ("\u2588", "\u2591")
        a = round(self.lead * self.width)
        b = max(a + 1, round((self.lead + self.run) * self.width))
        c = max(b, round((self.lead + self.run + self.slack) * self.width))
        yield Segment(" " * a)
        yield Segment(full * (b - a), Style.parse(OK))
        yield Segment(track * (min(c, self.width) - b), Style.parse(DIM))


class Stack:
    """Renderables one above the other in one table cell."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = parts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.segment import Segment

        for i, part in enumerate(self.parts):
            if i:
                yield Segment.line()
            yield part

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        from rich.measure import Measurement
        return Measurement.get(console, options, self.parts[0])
