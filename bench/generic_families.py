"""Every causal-LM family of the installed transformers, counted and planned: the table of
docs/models.md ("Every causal-LM family").

    python bench/generic_families.py [--limit-s 150] [--jobs N] [MODEL_TYPE...]

Each family of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` runs tests/causal_families.family_row
(its default config, shrunk to 4 blocks where the config class allows; transformers' count on
the meta device; the planner's spec, measured into an empty cache; one plan on H100) in a child
Python process that measures families one after another (torch and transformers imported
once), with a CPU-time limit per family, so one slow reference scan cannot hold up the rest: a
family over the limit is a "timeout" row and a new child takes the families after it. Rows are
kept in docs/generic-families.json (one per model_type, with the seconds it took); naming model
types re-runs only those. The table between the markers in docs/models.md is rewritten from
every row of that file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "docs" / "generic-families.json"
DOC = REPO / "docs" / "models.md"
BEGIN, END = "<!-- generic-families table: bench/generic_families.py -->", "<!-- end generic-families table -->"
OUTCOMES = ("written", "generic", "refused", "skipped", "timeout")

# A child measures families one after another, each in an empty planner cache, and stops itself
# (exit 3) when one family passes its CPU-time limit
_CHILD = """
import json, os, resource, sys, tempfile, threading, time
sys.path.insert(0, {tests!r})
from causal_families import family_row
limit = {limit!r}
state = {{"mt": None, "t0": 0.0}}

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def watch():
    while True:
        time.sleep(1)
        mt = state["mt"]
        if mt is not None and cpu() - state["t0"] > limit:
            print("ROW " + json.dumps({{"mt": mt, "status": "timeout", "why": "over %d s of CPU time" % limit,
                                       "seconds": limit}}), flush=True)
            os._exit(3)

threading.Thread(target=watch, daemon=True).start()
for mt in {families!r}:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PLANNER_CACHE_DIR"] = cache
        state["t0"], state["mt"] = cpu(), mt
        t0 = time.monotonic()
        try:
            row = family_row(mt)
        except Exception as e:
            row = {{"status": "error", "why": (type(e).__name__ + ": " + " ".join(str(e).split()))[:160]}}
        state["mt"] = None
    print("ROW " + json.dumps({{"mt": mt, **row, "seconds": round(time.monotonic() - t0, 1)}}), flush=True)
"""


def run_families(families: list[str], limit_s: float, done: Callable[[str, dict], None]) -> None:
    """Rows of ``families`` from child processes (see _CHILD), each given to ``done`` as it
    comes; after a child stops on a family over the limit, a new one takes the rest."""
    todo = list(families)
    while todo:
        env = {**os.environ, "DS_ACCELERATOR": "cpu"}
        code = _CHILD.format(tests=str(REPO / "tests"), limit=limit_s, families=todo)
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True, env=env, cwd=REPO)
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                mt = row.pop("mt")
                todo.remove(mt)
                done(mt, row)
        if child.wait() not in (0, 3) and todo:       # ended without a row: the family it was on
            done(todo.pop(0), {"status": "error", "why": f"the process ended ({child.returncode})", "seconds": 0})


def reason(why: str, model_type: str) -> str:
    """A row's reason on one line: the planner's refusal without its "default <model_type>: "
    prefix, else the exception, cut to 240 characters."""
    why = " ".join(why.split()).removeprefix(f"default {model_type}: ")
    return why if len(why) <= 240 else why[:239] + "..."


def table(rows: dict[str, dict], transformers_version: str) -> str:
    """The markdown table and the list of reasons, from every row."""
    by = {k: sorted(mt for mt, r in rows.items() if r["status"] == k) for k in (*OUTCOMES, "error")}
    lines = [f"Measured with transformers {transformers_version}: {len(rows)} model types, each with an empty "
             "planner cache", "(`python bench/generic_families.py`, rows in docs/generic-families.json).", "",
             "| outcome | families | which |", "|---|---|---|"]
    for k in (*OUTCOMES, "error"):
        if not by[k]:
            continue
        which = ("every family not named elsewhere in this table" if k == "generic"
                 else ", ".join(f"`{mt}`" for mt in by[k]))
        lines.append(f"| {k} | {len(by[k])} | {which} |")
    wrong = sorted(mt for mt, r in rows.items() if r["status"] in ("written", "generic")
                   and (r["planner"] != r["transformers"] or not r["planned"]))
    lines += ["", f"Families planned whose count differs from transformers' or that got no plan: "
              f"{', '.join(wrong) if wrong else 'none'}.", ""]
    for k in ("refused", "skipped", "timeout", "error"):
        lines += [f"- `{mt}` ({k}): {reason(rows[mt].get('why', ''), mt)}" for mt in by[k]]
    return "\n".join(lines)


def write_doc(rows: dict[str, dict], transformers_version: str) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table(rows, transformers_version)}\n{END}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_types", nargs="*", help="re-run only these (default: every family not yet in the rows)")
    ap.add_argument("--limit-s", type=float, default=150.0, help="CPU-time limit per family (s)")
    ap.add_argument("--jobs", type=int, default=1, help="child processes measuring at once")
    ap.add_argument("--doc-only", action="store_true", help="rewrite the docs/models.md table from the rows")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    import transformers
    from causal_families import causal_lm_types

    data = json.loads(ROWS.read_text()) if ROWS.exists() else {}
    if data.get("transformers") != transformers.__version__:
        data = {"transformers": transformers.__version__, "rows": {}}
    rows = data["rows"]
    todo = [] if args.doc_only else (args.model_types or [mt for mt in causal_lm_types() if mt not in rows])
    import threading
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()

    def done(mt: str, row: dict) -> None:
        with lock:
            rows[mt] = row
            print(f"{mt}: {row['status']} ({row['seconds']} s) {row.get('why', '')[:100]}", flush=True)
            ROWS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")

    shares = [todo[i::args.jobs] for i in range(args.jobs)]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(lambda share: run_families(share, args.limit_s, done), shares))
    write_doc(rows, data["transformers"])


if __name__ == "__main__":
    main()
