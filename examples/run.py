#!/usr/bin/env python3
"""Run the examples and compare what they print with their committed output.txt.

    python examples/run.py --check          # run every example, diff against output.txt, exit 1 on a mismatch
    python examples/run.py --write          # regenerate every output.txt
    python examples/run.py --check 04 buy   # only the examples whose folder name contains "04" or "buy"

An example is a folder examples/NN-name/ holding command.sh (the exact `plan ...` command
lines; `bash command.sh` runs them from the repository root) and output.txt (what they
print). run.py reads the `plan ...` lines of command.sh (a trailing backslash continues a
line; `cd`/`set` lines and comments are skipped) and runs each as `python -m planner ...`
with the interpreter that runs run.py, from the repository root, in a fixed environment
(ENVIRONMENT: no terminal, 100 columns, no colour), so the report reads the same on every
machine. Wall-clock timings (the solver's and the search's seconds) are masked, trailing
spaces dropped.

output.txt holds, for each command, a "$ plan ..." line, its stdout, its stderr under a
"(stderr)" line when there is any, and "[exit status N]" when it is not 0 (a plan that
does not fit exits with 2).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
REPO = EXAMPLES.parent
OUTPUT = "output.txt"
COMMANDS = "command.sh"
TIMEOUT_S = 300

# The terminal report depends on the terminal: width, colour, whether stdout is a TTY (it
# never is here: stdout is a pipe, stdin /dev/null). Fix what the report reads.
ENVIRONMENT = {
    "COLUMNS": "100",
    "LINES": "50",
    "NO_COLOR": "1",
    "TERM": "dumb",
    "PYTHONUNBUFFERED": "1",      # stdout and stderr written in the order printed
    "PYTHONIOENCODING": "utf-8",
    "PYTHONUTF8": "1",
    "PYTHONHASHSEED": "0",
    "PLANNER_TODAY": "2026-12-02",    # the day prices are aged against (the stale-price warning)
    "TZ": "UTC",
}
UNSET = ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS", "COLORTERM", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
         "JUPYTER_COLUMNS", "JUPYTER_LINES", "PYTHONSTARTUP", "PYTHONWARNINGS")

# A duration in seconds or milliseconds ("0.018 s", "9.8 s", "12 ms") on a line that reports
# how long the solver or the search took. "limit 20 s" (the solver's time limit) is a
# setting, not a measurement, and stays.
TIMED_LINE = re.compile(r"\b(solver|solve|solved|search|searched|elapsed|took|wall)\b", re.IGNORECASE)
DURATION = re.compile(r"(?<!limit )(?<![\w.])\d+(?:[.,]\d+)?\s?(?:ms|s)\b")
MASK = "[time]"


def find_examples(names: list[str] | None = None) -> list[Path]:
    """The example folders (those with a command.sh), in name order; with ``names``, those
    whose folder name contains one of them."""
    folders = sorted(p.parent for p in EXAMPLES.glob(f"*/{COMMANDS}"))
    if names:
        folders = [f for f in folders if any(n in f.name for n in names)]
    return folders


def read_commands(path: Path) -> list[list[str]]:
    """The argument lists (after `plan`) of the `plan ...` lines of a command.sh."""
    lines, pending = [], ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    if pending:
        raise ValueError(f"{path}: the last line ends with a backslash")
    commands = []
    for line in lines:
        words = shlex.split(line)
        if words[0] == "plan":
            commands.append(words[1:])
        elif words[0] not in ("cd", "set"):
            raise ValueError(f"{path}: only `plan ...`, `cd` and `set` lines are allowed, not {line!r}")
    if not commands:
        raise ValueError(f"{path}: no `plan ...` line")
    return commands


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(ENVIRONMENT)
    return env


def mask(text: str) -> str:
    """``text`` with the wall-clock durations masked and trailing spaces dropped.

    The report wraps long lines, and a duration of another width wraps them elsewhere: from
    the first line that names the solver or the search to the end of its paragraph, the
    lines are joined into one before the durations are masked."""
    out: list[str] = []
    timed: list[str] = []          # the lines of the current paragraph from a timed line on

    def flush() -> None:
        if timed:
            out.append(DURATION.sub(MASK, " ".join(timed)))
            timed.clear()

    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            flush()
            out.append(line)
        elif timed or TIMED_LINE.search(line):
            timed.append(line.strip() if timed else line)
        else:
            out.append(line)
    flush()
    return "\n".join(out).strip("\n") + "\n"


def run_command(args: list[str]) -> str:
    """What `plan ARGS` prints, as output.txt records it."""
    p = subprocess.run([sys.executable, "-m", "planner", *args], cwd=REPO, env=environment(),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, encoding="utf-8",
                       timeout=TIMEOUT_S, check=False)     # a plan that does not fit exits with 2
    text = f"$ {shlex.join(['plan', *args])}\n{p.stdout}"
    if p.stderr:
        text += f"{'' if text.endswith(chr(10)) else chr(10)}(stderr)\n{p.stderr}"
    if p.returncode:
        text += f"{'' if text.endswith(chr(10)) else chr(10)}[exit status {p.returncode}]\n"
    return text


def run_example(folder: Path) -> str:
    """The output of every command of ``folder``'s command.sh, masked."""
    return mask("\n".join(run_command(args) for args in read_commands(folder / COMMANDS)))


def expected(folder: Path) -> str | None:
    path = folder / OUTPUT
    return mask(path.read_text(encoding="utf-8")) if path.exists() else None


def diff(folder: Path, actual: str) -> str:
    """A unified diff from the committed output.txt to ``actual``; empty when they agree."""
    want = expected(folder)
    name = f"examples/{folder.name}/{OUTPUT}"
    if want is None:
        return f"{name} is missing; run `python examples/run.py --write`\n"
    return "".join(difflib.unified_diff(want.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        fromfile=f"{name} (committed)", tofile=f"{name} (now)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="run the examples and diff against output.txt")
    mode.add_argument("--write", action="store_true", help="run the examples and write output.txt")
    ap.add_argument("names", nargs="*", help="only the examples whose folder name contains one of these")
    a = ap.parse_args(argv)
    folders = find_examples(a.names)
    if not folders:
        print(f"no example matches {a.names}", file=sys.stderr)
        return 2
    failed = []
    for folder in folders:
        t0 = time.perf_counter()
        actual = run_example(folder)
        took = time.perf_counter() - t0
        if a.write:
            (folder / OUTPUT).write_text(actual, encoding="utf-8")
            print(f"wrote  {folder.name}/{OUTPUT}  ({took:.1f} s)")
            continue
        d = diff(folder, actual)
        print(f"{'ok    ' if not d else 'DIFFER'} {folder.name}  ({took:.1f} s)")
        if d:
            failed.append(folder.name)
            sys.stdout.write(d)
    if failed:
        print(f"\n{len(failed)} example(s) differ: {', '.join(failed)}; "
              "if the change is intended, regenerate with `python examples/run.py --write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
