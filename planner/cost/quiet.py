"""What runs around a solver library while it solves (planner.cost.solve): what it prints from
C silenced, so that `plan buy --json` stays one JSON object; a limit on the CPU time it spends."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator


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

# HiGHS's model status where a time limit ended a solve -> that limit, as cost.solve's
# SolverInfo.stopped_by says it (kInterrupt: only cpu_time_interrupt interrupts)
STOPPED_BY = {"kInterrupt": "CPU-time limit", "kTimeLimit": "wall-clock limit"}


def cpu_time_interrupt(limit_s: float) -> Callable[..., None]:
    """HiGHS's interrupt callback (kCallbackMipInterrupt, highspy's signature: type, message,
    data out, data in, user data) that stops a MIP once this process has spent ``limit_s``
    seconds of CPU time (time.process_time) since this call: HiGHS's own time_limit counts wall
    time, which a loaded machine stretches, so a solve stopped by it answers by the load.

    HiGHS asks at its limit checks (each node, the root's cut rounds and sub-MIPs), up to
    seconds apart in a costly root (issue 32, b39h: 66 calls in 16 s), so it stops that much
    after the limit at most. A stop is HiGHS's status kInterrupt (cost.solve reads it as this
    limit's)."""
    start_s = time.process_time()

    def interrupt(_type: int, _message: str, _out: object, data_in: object, _user: object) -> None:
        if time.process_time() - start_s > limit_s:
            data_in.user_interrupt = True  # type: ignore[attr-defined]

    return interrupt
