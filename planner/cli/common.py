"""What every command shares: the error contract (run_safely), stdout that went away or
filled up, printing a report, the progress bar, and naming the files written.

User errors end with one line on stderr and exit status 2; internal errors with a short
message, a hint to report them, and exit status 1. No traceback reaches a user.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from planner.cli.options import Options
from planner.errors import UserError

ISSUES_HINT = "this is a bug in planner; please report it with the command you ran"


def run_safely(fn: Callable[[], None]) -> None:
    """Turn user errors into exit 2 and anything unexpected into exit 1, never a traceback."""
    try:
        fn()
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Exit:
        raise
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        reader_left()
    except OSError as e:
        if is_stdout_error(e):
            stdout_failed(e)
        if _traceback_wanted():
            raise
        click.echo(f"internal error: {type(e).__name__}: {e} ({ISSUES_HINT})", err=True)
        sys.exit(1)
    except Exception as e:  # the last line of defence
        if _traceback_wanted():     # for a bug report: where it happened
            raise
        click.echo(f"internal error: {type(e).__name__}: {e} ({ISSUES_HINT})", err=True)
        sys.exit(1)


def _traceback_wanted() -> bool:
    return bool(os.environ.get("PLANNER_TRACEBACK"))


def is_stdout_error(e: OSError) -> bool:
    """An error of writing stdout itself: the device is full (ENOSPC, /dev/full), the
    quota is spent, or the descriptor is gone (EBADF, a closed stdout), rather than of a
    file the planner writes."""
    return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EBADF, errno.EIO) and e.filename is None


def _silence_stdout() -> None:
    """Point stdout at devnull, so that Python's flush at exit writes nowhere and says nothing."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def reader_left() -> NoReturn:
    """The reader of stdout went away (`plan ... | head`): stop quietly, status 0. Python
    would flush stdout again at exit and print a BrokenPipeError; point it at devnull."""
    _silence_stdout()
    sys.exit(0)


def stdout_failed(e: OSError) -> NoReturn:
    """stdout cannot be written (`plan --help > /dev/full`, a closed stdout): one line on
    stderr, status 2, and no second error from Python's flush at exit."""
    _silence_stdout()
    try:
        sys.stderr.write(f"error: cannot write the output: {e.strerror or e}; "
                         f"send stdout to a file or device with space\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    sys.exit(2)


def check_quiet(o: Options) -> None:
    if o.quiet and o.as_json:
        raise UserError("--quiet and --json cannot be used together; give one of them")


def note(message: str, aside: bool) -> None:
    """A line on what was done (the files written, a calibration applied), after the answer:
    on stdout, or on stderr when stdout carries --json or --quiet (``aside``). A stderr that
    cannot take it (full, closed) loses the line and nothing else: the answer is out and the
    files are written, so the run stays a success (issue 32, U10)."""
    if not aside:
        click.echo(message)
        return
    try:
        click.echo(message, err=True)
    except (OSError, ValueError, AttributeError):
        try:                        # and no second failure from Python's flush of stderr at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
        except (OSError, ValueError, AttributeError):
            pass


def written_text(out: Path | None, written: list[Path], stack: str | None = None) -> str:
    used = f" (stack: {stack})" if stack else ""
    return f"wrote {', '.join(p.name for p in written)} to {out}{used}"


def say_written(o: Options, written: list[Path], plotted: Path | None, stack: str | None = None) -> None:
    """Name the files --out and --plot wrote, and the stack they are for (on stderr when stdout
    is --json or --quiet)."""
    if written:
        note(written_text(o.out, written, stack), o.aside)
    if plotted is not None:
        note(f"wrote the plot to {plotted}", o.aside)


def show(parts: list[Any]) -> None:
    """Print a human report (planner.report.terminal) on stdout: colour only on a terminal."""
    from planner.report.screen import render, screen_for

    screen = screen_for(sys.stdout)
    click.echo(render(parts, screen), color=screen.colour)


def progress(aside: bool, description: str) -> Any:
    """A progress bar on stderr for work that may run past a second; none with --json or --quiet."""
    from planner.report.screen import progress as progress_bar

    return progress_bar(description, enabled=not aside)


def per_count(update: Any, gpu_name: str) -> Callable[[int, int, int], None]:
    """api.plan's progress(n_gpus, i, n_counts) -> the bar."""
    return lambda n, i, total: update(i, total, f"searching layouts on {n:,} x {gpu_name}")


@contextmanager
def guarded_stdout() -> Iterator[None]:
    """Around click's own printing (help, --version, usage): a full or closed stdout ends
    with one line and status 2, a reader that left with status 0."""
    try:
        yield
    except BrokenPipeError:
        reader_left()
    except OSError as e:
        if is_stdout_error(e):
            stdout_failed(e)
        raise
