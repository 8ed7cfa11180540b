#!/usr/bin/env python3
"""Rewrite examples/calibrate/output.txt from commands.sh (tests/test_calibrate.py checks it):

    python examples/calibrate/regenerate.py

The commands run as examples/run.py runs the other examples (same environment, same masking).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    spec = importlib.util.spec_from_file_location("examples_run", HERE.parent / "run.py")
    assert spec is not None and spec.loader is not None
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    parts = []
    for args in run.read_commands(HERE / "commands.sh"):
        t0 = time.perf_counter()
        parts.append(run.run_command(args))
        print(f"{time.perf_counter() - t0:5.1f} s  plan {' '.join(args)[:90]}", file=sys.stderr)
    (HERE / "output.txt").write_text(run.mask("\n".join(parts)), encoding="utf-8")


if __name__ == "__main__":
    main()
