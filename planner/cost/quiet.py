"""Silence what solver libraries print from C while they run (planner.cost.solve), so that
`plan buy --json` stays one JSON object."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def solver_output_silenced() -> Iterator[None]:
    """Silence what solver libraries print from C (HiGHS prints a banner on stdout even with
    msg=False), so --json output stays one JSON object. A closed stdout or stderr (None in
    sys, or a closed descriptor: `plan buy >&-`) stays closed and is left alone."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):   # a full or closed stream: the CLI reports it when it prints
            pass
    saved: list[tuple[int, int]] = []
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:             # no devnull (an embedding host): print through
        devnull = -1
    if devnull >= 0:
        for fd in (1, 2):
            if fd == devnull:
                continue                # the descriptor was closed; devnull took its number
            try:
                copy = os.dup(fd)
            except OSError:             # closed: nothing can print there
                continue
            os.dup2(devnull, fd)
            saved.append((fd, copy))
        if devnull > 2:
            os.close(devnull)
    try:
        yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        if 0 <= devnull <= 2:
            os.close(devnull)           # closed before, closed again
