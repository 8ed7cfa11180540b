"""Where a report goes: the screen it is drawn for (colour or not, its width, UTF or not),
the rendering of rich renderables to a string, and the progress bar of long searches on stderr.

rich is imported only inside the functions that draw, so `plan --help` and the JSON output
never pay for it. Colour is on only where the output is a terminal (or FORCE_COLOR asks for
it) and NO_COLOR is unset and TERM is not dumb; elsewhere the report is plain text at a fixed
width (COLUMNS, else 100), so saved outputs are stable.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

DEFAULT_WIDTH = 100        # columns of a report that does not go to a terminal
PROGRESS_DELAY_S = 1.0     # a progress bar appears only once the work has run this long


# ----------------------------------------------------------------------------- output

@dataclass(frozen=True, slots=True)
class Screen:
    """Where a report goes: colour or not, its width in columns, and whether block and
    box-drawing characters can be written (a UTF encoding)."""

    colour: bool = False
    width: int = DEFAULT_WIDTH
    unicode: bool = True


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _env_width(default: int) -> int:
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return default
    return columns if 20 <= columns <= 1000 else default


def screen_for(stream: TextIO) -> Screen:
    """Colour only on a terminal (or with FORCE_COLOR), never with NO_COLOR or TERM=dumb
    (no-color.org); the terminal's width, or COLUMNS, else DEFAULT_WIDTH."""
    env = os.environ
    tty = _isatty(stream)
    dumb = env.get("TERM", "").lower() in ("dumb", "unknown")
    colour = (tty or bool(env.get("FORCE_COLOR"))) and not env.get("NO_COLOR") and not dumb
    width = _env_width(DEFAULT_WIDTH)
    if tty and "COLUMNS" not in env:
        try:
            width = max(40, os.get_terminal_size(stream.fileno()).columns)
        except (AttributeError, ValueError, OSError):
            pass
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
    return Screen(colour=colour, width=width, unicode=encoding.startswith("utf"))


class _Buffer(io.StringIO):
    """A string buffer that reports the target stream's encoding (rich draws ASCII boxes
    where it is not UTF)."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding


def _colour_system() -> Literal["truecolor", "256", "standard"]:
    if os.environ.get("COLORTERM", "").lower() in ("truecolor", "24bit"):
        return "truecolor"
    return "256" if "256" in os.environ.get("TERM", "") else "standard"


def render(parts: Sequence[RenderableType], screen: Screen = Screen()) -> str:
    """The report as a string: ANSI styles only when ``screen.colour``; no trailing newline."""
    from rich.console import Console

    buf = _Buffer("utf-8" if screen.unicode else "ascii")
    console = Console(file=buf, width=screen.width, color_system=_colour_system() if screen.colour else None,
                      force_terminal=screen.colour, force_interactive=False, force_jupyter=False,
                      highlight=False, emoji=False, markup=False, legacy_windows=False, soft_wrap=False)
    for part in parts:
        console.print(part)
    lines = buf.getvalue().rstrip("\n").split("\n")
    if not screen.colour:       # rich pads tables and captions to their width
        lines = [line.rstrip() for line in lines]
    return "\n".join(lines)


# --------------------------------------------------------------------------- progress

def stderr_can_redraw() -> bool:
    """stderr is a terminal that can redraw a line (not TERM=dumb)."""
    return _isatty(sys.stderr) and os.environ.get("TERM", "").lower() not in ("dumb", "unknown")


def progress_console() -> Console:
    """The console a progress bar draws on: stderr."""
    from rich.console import Console
    return Console(file=sys.stderr, highlight=False)


Update = Callable[..., None]     # update(done, total=None, description=None)


class _Progress:
    """A transient bar on stderr that appears only once the work has run PROGRESS_DELAY_S
    (from a timer thread), and takes updates before and after it appears."""

    def __init__(self, description: str) -> None:
        self.lock = threading.Lock()
        self.state: tuple[int, int | None, str] = (0, None, description)
        self.bar: Any = None
        self.task: Any = None
        self.closed = False
        self.timer = threading.Timer(PROGRESS_DELAY_S, self.start)
        self.timer.daemon = True

    def update(self, done: int, total: int | None = None, description: str | None = None) -> None:
        with self.lock:
            self.state = (done, total, description or self.state[2])
            if self.bar is not None:
                self.bar.update(self.task, completed=done, total=total, description=self.state[2])

    def start(self) -> None:
        console = progress_console()
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        with self.lock:
            if self.closed:
                return
            done, total, description = self.state
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                TimeElapsedColumn(), console=console, transient=True,
                                redirect_stdout=False, redirect_stderr=False)
            self.task = self.bar.add_task(description, total=total, completed=done)
            self.bar.start()

    def close(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.closed = True
            if self.bar is not None:
                self.bar.stop()


@contextmanager
def progress(description: str, enabled: bool = True) -> Iterator[Update]:
    """A progress bar for work that may run past a second: yields ``update(done, total,
    description)`` (total None: a bar without an end). The bar goes to stderr, appears
    only when stderr is a terminal and the work has run PROGRESS_DELAY_S, and is erased
    when the work ends. With ``enabled`` false (--json, --quiet) nothing is drawn."""
    if not enabled or not stderr_can_redraw():
        yield lambda done, total=None, description=None: None
        return
    p = _Progress(description)
    p.timer.start()
    try:
        yield p.update
    finally:
        p.close()
