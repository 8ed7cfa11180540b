"""Write planner/report/memory_intervals.json: the memory model's error bars, from the measured
residuals of docs/accuracy.json (Hugging Face transformers + DeepSpeed, bench/accuracy.py) and
docs/accuracy-torchtitan.json (torchtitan FSDP2, bench/accuracy_torchtitan.py).

Each row's error is predicted / measured peak memory per rank - 1 (the "total" row). At a level,
the interval is the central quantiles of those errors; the true peak lies within
predicted / (1 + high) .. predicted / (1 + low).

    python bench/memory_intervals.py           # write
    python bench/memory_intervals.py --check   # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (ROOT / "docs" / "accuracy.json", ROOT / "docs" / "accuracy-torchtitan.json")
OUT = ROOT / "planner" / "report" / "memory_intervals.json"
LEVELS = (0.5, 0.8, 0.9, 0.95)
GENERATED = "2026-12-02"


def is_tiny(row: dict) -> bool:
    """bench/configs/tiny-*.json rows (hidden 256, a few blocks, vocabulary 1000): they check a
    family's terms where those terms weigh most, not the memory of a model anyone plans, so the
    error bars of real plans leave them out."""
    return str(row.get("model", "")).startswith("bench/configs/tiny-")


def residuals() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for path in SOURCES:
        rows = json.loads(path.read_text())
        out[path.name] = [float(r["rows"]["total"]["error"]) for r in rows
                          if r["rows"]["total"].get("error") is not None and not is_tiny(r)]
    return out


def intervals() -> dict:
    per = residuals()
    errs = np.array([e for v in per.values() for e in v])
    levels = {}
    for lv in LEVELS:
        # on observed values (lower quantile down, upper up): the interval holds at least lv of them
        lo = np.quantile(errs, (1 - lv) / 2, method="lower")
        hi = np.quantile(errs, (1 + lv) / 2, method="higher")
        levels[f"{lv:.2f}"] = {"error_low": round(float(lo), 4), "error_high": round(float(hi), 4)}
    return {
        "about": ("Memory error bars: quantiles of predicted / measured peak memory per rank - 1 over the "
                  "measured configurations of docs/accuracy.md and docs/accuracy-torchtitan.md (single-node "
                  "runs of up to 8 GPUs, models up to 14B and the first two blocks of larger MoE models at their real "
                  "width; not the tiny configurations); the true peak lies within predicted / (1 + "
                  "error_high) .. predicted / (1 + error_low). Do not edit by hand: python "
                  "bench/memory_intervals.py writes it."),
        "generated": GENERATED,
        "residuals": {k: len(v) for k, v in per.items()},
        "levels": levels,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = json.dumps(intervals(), indent=1) + "\n"
    print(text, end="")
    if args.check:
        return 0 if OUT.exists() and OUT.read_text() == text else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
