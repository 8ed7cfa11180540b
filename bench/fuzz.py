#!/usr/bin/env python3
"""A longer fuzz of the command line than tests/test_fuzz_cli.py runs in CI: random argument
lists and hostile input files (config.json, topology TOML, jobs YAML, prices TOML), each
checked against the README's exit-status contract: 0, or 2 with at most one line on stderr
starting "error: ", never a traceback or an internal error (exit 1). Prints counts.

    python bench/fuzz.py                 # 400 invocations, seed 0
    python bench/fuzz.py -n 5000 --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from click.testing import CliRunner  # noqa: E402 (after the sys.path set-up above)
from test_fuzz_cli import GPUS, MODELS, OPTIONS  # noqa: E402

from planner.cli.main import cli  # noqa: E402
from planner.models.spec import preset_config  # noqa: E402

HOSTILE = [0, -1, 1, 2**63, 10**400, "1" + "0" * 5000, 1e308, 1e-300, "x" * 300, "", "ℵ", True, None, [], {}]
TOPOLOGY = (REPO / "planner" / "presets" / "topologies" / "dgx-h100.toml").read_text()
JOB = "jobs:\n  - name: {name}\n    model: {model}\n    tokens: {tokens}\n    deadline: {deadline}\n"


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None or isinstance(v, (list, dict)):
        return "[]" if v is None or isinstance(v, list) else "{}"
    if isinstance(v, str) and not v.isdigit():
        return json.dumps(v)
    return str(v)


def random_file(rng: random.Random, d: Path) -> list[str]:
    kind = rng.choice(["config", "topology", "jobs", "prices", "nested"])
    v = rng.choice(HOSTILE)
    if kind == "config":
        cfg = dict(preset_config(rng.choice(["gpt2", "qwen2.5-0.5b", "mixtral-8x7b"])))
        cfg[rng.choice(sorted(cfg))] = v if not (isinstance(v, str) and v.isdigit()) else int(v[:4000])
        (d / "config.json").write_text(json.dumps(cfg))
        return ["--model", str(d / "config.json"), "--gpus", "h100", "--max-gpus", "64"]
    if kind == "topology":
        lines = TOPOLOGY.splitlines()
        i = rng.choice([k for k, line in enumerate(lines) if " = " in line])
        lines[i] = lines[i].split(" = ")[0] + " = " + toml_value(v)
        (d / "t.toml").write_text("\n".join(lines))
        return ["--model", "gpt2", "--gpus", "h100", "--topology", str(d / "t.toml")]
    if kind == "jobs":
        fields = {"name": "j", "model": "gpt2", "tokens": "1e9", "deadline": "30d"}
        fields[rng.choice(sorted(fields))] = toml_value(v)
        (d / "jobs.yaml").write_text(JOB.format(**fields))
        return ["buy", str(d / "jobs.yaml"), "--gpus", "h100", "--max-gpus", "16"]
    if kind == "prices":
        key = rng.choice(["pue", "electricity_usd_per_kwh"])
        (d / "p.toml").write_text(f"{key} = {toml_value(v)}\n")
        return ["--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--prices", str(d / "p.toml")]
    depth = rng.choice([10, 40, 1000])
    (d / "n.toml").write_text("a = " + "[" * depth + "]" * depth + "\n")
    return ["--model", "gpt2", "--gpus", "h100", "--topology", str(d / "n.toml")]


def random_args(rng: random.Random) -> list[str]:
    args = ["--model", rng.choice(MODELS)] if rng.random() < 0.9 else []
    args += ["--gpus", rng.choice(GPUS)] if rng.random() < 0.9 else []
    for opt in rng.sample(sorted(OPTIONS), rng.randint(0, 4)):
        args.append(opt)
        if OPTIONS[opt] is not None:
            args.append(rng.choice(OPTIONS[opt]))
    return args


def verdict(r: object) -> str:
    code = r.exit_code
    err = r.stderr.strip()
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return "exception"
    if "Traceback" in r.output or "internal error" in r.output or code not in (0, 2):
        return "broken"
    if code == 2 and (len(err.splitlines()) > 1 or (err and not err.startswith("error: "))):
        return "not one line"
    return f"exit {code}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    counts: Counter[str] = Counter()
    bad: list[str] = []
    t0 = time.perf_counter()
    for i in range(a.n):
        with tempfile.TemporaryDirectory() as d:
            args = random_file(rng, Path(d)) if i % 2 else random_args(rng)
            r = CliRunner().invoke(cli, args, prog_name="plan", catch_exceptions=True)
            v = verdict(r)
            counts[v] += 1
            if not v.startswith("exit"):
                bad.append(f"{v}: plan {' '.join(a[:80] for a in args)}\n  {r.output.strip()[:300]}")
    print(f"{a.n} invocations in {time.perf_counter() - t0:.1f} s (seed {a.seed}):")
    for v, n in counts.most_common():
        print(f"  {v:<14} {n:>6}")
    for line in bad[:20]:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
