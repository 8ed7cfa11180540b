"""Every causal-LM family of the installed transformers, counted and planned: the table of
docs/models.md ("Every causal-LM family").

    python bench/generic_families.py [--limit-s 150] [--jobs N] [MODEL_TYPE...]

Each family of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` runs tests/causal_families.family_row in
a fresh Python process (its default config, shrunk to 4 blocks where the config class allows;
transformers' count on the meta device; the planner's spec, measured into an empty cache; one
plan on H100) with a CPU-time limit, so one slow reference scan cannot hold up the rest: a
family over the limit is a "timeout" row. Rows are kept in docs/generic-families.json (one per
model_type, with the seconds it took); naming model types re-runs only those. The table
between the markers in docs/models.md is rewritten from every row of that file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "docs" / "generic-families.json"
DOC = REPO / "docs" / "models.md"
BEGIN, END = "<!-- generic-families table: bench/generic_families.py -->", "<!-- end generic-families table -->"
OUTCOMES = ("written", "generic", "refused", "skipped", "timeout")

_CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
from causal_families import family_row
print("ROW " + json.dumps(family_row({mt!r})))
"""


def run_family(mt: str, limit_s: float) -> dict:
    """One family's row from a fresh process (empty planner cache), or a timeout row: over
    ``limit_s`` seconds of CPU time (RLIMIT_CPU, so a loaded shared machine does not turn slow
    families into timeouts), or over six times that of wall-clock time."""
    import resource
    import signal

    def cpu_limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(limit_s), int(limit_s) + 5))

    t0 = time.monotonic()
    over = {"status": "timeout", "why": f"over {limit_s:.0f} s of CPU time", "seconds": round(limit_s)}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PLANNER_CACHE_DIR": cache, "DS_ACCELERATOR": "cpu"}
        try:
            out = subprocess.run([sys.executable, "-c", _CHILD.format(tests=str(REPO / "tests"), mt=mt)],
                                 capture_output=True, text=True, timeout=6 * limit_s, env=env, cwd=REPO,
                                 preexec_fn=cpu_limit)
        except subprocess.TimeoutExpired:
            return {**over, "why": f"over {6 * limit_s:.0f} s of wall-clock time"}
    if out.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return over
    seconds = round(time.monotonic() - t0, 1)
    for line in out.stdout.splitlines():
        if line.startswith("ROW "):
            return {**json.loads(line[4:]), "seconds": seconds}
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:160]
    return {"status": "error", "why": tail, "seconds": seconds}


def reason(why: str) -> str:
    """The exception inside the planner's refusal line ("... (Type: message) ..."), else the line."""
    if "(" in why and ": " in why.split("(", 1)[1]:
        inner = why.split("(", 1)[1]
        if inner[:1].isupper():
            return inner.rsplit(")", 1)[0] if ")" in inner else inner
    return why


def table(rows: dict[str, dict], transformers_version: str) -> str:
    """The markdown table and the list of reasons, from every row."""
    by = {k: sorted(mt for mt, r in rows.items() if r["status"] == k) for k in (*OUTCOMES, "error")}
    lines = [f"Measured with transformers {transformers_version}: {len(rows)} model types, each in its own",
             "process (`python bench/generic_families.py`, rows in docs/generic-families.json).", "",
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
        lines += [f"- `{mt}` ({k}): {reason(rows[mt].get('why', ''))}" for mt in by[k]]
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
    ap.add_argument("--jobs", type=int, default=1, help="families measured at once, each its own process")
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

    def one(mt: str) -> None:
        row = run_family(mt, args.limit_s)
        with lock:
            rows[mt] = row
            print(f"{mt}: {row['status']} ({row['seconds']} s) {row.get('why', '')[:100]}", flush=True)
            ROWS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, todo))
    write_doc(rows, data["transformers"])


if __name__ == "__main__":
    main()
