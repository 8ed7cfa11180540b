#!/usr/bin/env python3
"""A longer fuzz of the command line than tests/test_fuzz_cli.py runs in CI: random argument
lists and hostile input files (config.json, GPU TOML, topology TOML, jobs YAML, prices TOML,
calibration files and training logs for `plan calibrate`), names holding control characters
(a model file's name, a GPU's or a topology's name), each checked against the README's
exit-status contract: 0, or 2 with at most one line on stderr starting "error: ", never a
traceback or an internal error (exit 1). Prints counts; tests/test_fuzz_bench.py runs a
short fixed-seed run in CI.

    python bench/fuzz.py                 # 400 invocations, seed 0
    python bench/fuzz.py -n 5000 --seed 7
    python bench/fuzz.py --kinds gpu,calibration,log -n 300
"""

from __future__ import annotations

import argparse
import json
import random
import re
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

# control characters a name may carry: newline, CR, tab, ESC, NUL, DEL, NEL, line and paragraph separators
CONTROL = ["\n", "\r", "\t", "\x1b[2J", "\x00", "\x7f", "\x85", "\u2028", "\u2029"]
HOSTILE = [0, -1, 1, 2**63, 10**400, "1" + "0" * 5000, 1e308, 1e-300, "x" * 300, "", "ℵ", True, None, [], {},
           float("nan"), float("inf"), "x\ntouch PWNED\n", 'z"""', "$(touch PWNED)"]
TOPOLOGY = (REPO / "planner" / "presets" / "topologies" / "dgx-h100.toml").read_text()
_CATALOG = (REPO / "planner" / "presets" / "gpus.toml").read_text()
_START = _CATALOG.index('[[gpu]]\nname = "h100"')
GPU = _CATALOG[_START:_CATALOG.index("[[gpu]]", _START + 1)]    # the catalog's h100 entry, a GPU file
CALIBRATION = REPO / "examples" / "calibrate"
# `plan calibrate` on each sample log with the layout it ran (examples/calibrate/commands.sh)
LOGS = {
    "megatron_llama2-7b_h100x8.log": "--model llama2-7b --dp 4 --tp 2 --pp 1 --cp 1 --zero 1 --micro-batch 1 "
                                     "--seq-len 4096 --recompute selective",
    "torchtitan_llama3.1-8b_h100x8.log": "--model llama3.1-8b --dp 8 --tp 1 --pp 1 --cp 1 --fsdp full "
                                         "--micro-batch 1 --global-batch 8 --seq-len 4096 --recompute selective",
    "deepspeed_llama2-7b_h100x8.log": "--model llama2-7b --dp 8 --tp 1 --pp 1 --cp 1 --zero 3 --micro-batch 2 "
                                      "--global-batch 64 --seq-len 4096 --recompute full",
    "hf-trainer_qwen2.5-1.5b_h100x8.log": "--model qwen2.5-1.5b --dp 8 --tp 1 --pp 1 --cp 1 --zero 0 "
                                          "--micro-batch 4 --global-batch 64 --seq-len 2048 --recompute none",
}
KINDS = ("config", "gpu", "topology", "jobs", "prices", "calibration", "log", "name", "nested")
JOB = "jobs:\n  - name: {name}\n    model: {model}\n    tokens: {tokens}\n    deadline: {deadline}\n"


def toml_value(v: object) -> str:
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None or isinstance(v, (list, dict)):
        return "[]" if v is None or isinstance(v, list) else "{}"
    if isinstance(v, str) and not v.isdigit():
        return json.dumps(v)
    return str(v)


def set_toml_key(rng: random.Random, text: str, v: object) -> str:
    """``text`` with one ``key = value`` line's value replaced by ``v``."""
    lines = text.splitlines()
    i = rng.choice([k for k, line in enumerate(lines) if " = " in line and not line.startswith("#")])
    lines[i] = lines[i].split(" = ")[0] + " = " + toml_value(v)
    return "\n".join(lines) + "\n"


def calibration_text(d: Path) -> str:
    """A calibration file as `plan calibrate` writes it (written once per run, then mutated)."""
    cached = d.parent / "planner-fuzz-calibration.toml"
    if not cached.exists():
        args = ["calibrate", str(CALIBRATION / "megatron_llama2-7b_h100x8.log"), "--gpus", "h100",
                *LOGS["megatron_llama2-7b_h100x8.log"].split(), "--out", str(cached)]
        r = CliRunner().invoke(cli, args, prog_name="plan")
        assert r.exit_code == 0, r.output
    return cached.read_text()


def mutated_log(rng: random.Random, text: str) -> str:
    """A training log with one line's number changed to a hostile one, cut short, or grown."""
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    how = rng.choice(["number", "number", "number", "cut", "repeat", "binary", "empty"])
    if how == "number":
        numbers = [m for m in re.finditer(r"\d+(\.\d+)?(E[-+]\d+)?", lines[i])]
        if numbers:
            m = rng.choice(numbers)
            value = rng.choice(["0", "0.0", "-1", "1e999", "nan", "inf", "99999999999999999999999", "1e-300"])
            lines[i] = lines[i][:m.start()] + value + lines[i][m.end():]
    elif how == "cut":
        lines = lines[:i]
    elif how == "repeat":
        lines[i] = lines[i] * rng.choice([2, 50, 500])
    elif how == "binary":
        lines[i] = "\x00\xff" + lines[i]
    else:
        lines = []
    return "\n".join(lines) + "\n"


def random_file(rng: random.Random, d: Path, kind: str | None = None) -> list[str]:
    kind = kind or rng.choice(KINDS)
    v = rng.choice(HOSTILE)
    if kind == "config":
        cfg = dict(preset_config(rng.choice(["gpt2", "qwen2.5-0.5b", "mixtral-8x7b"])))
        cfg[rng.choice(sorted(cfg))] = v if not (isinstance(v, str) and v.isdigit()) else int(v[:4000])
        (d / "config.json").write_text(json.dumps(cfg))
        return ["--model", str(d / "config.json"), "--gpus", "h100", "--max-gpus", "64"]
    if kind == "gpu":
        (d / "gpu.toml").write_text(set_toml_key(rng, GPU, v))
        mode = rng.choice([[], ["--out", str(d / "out")], ["--task", "load"], ["--tokens", "1e9"]])
        return ["--model", "gpt2", "--gpus", str(d / "gpu.toml"), "--max-gpus", "64", *mode]
    if kind == "topology":
        (d / "t.toml").write_text(set_toml_key(rng, TOPOLOGY, v))
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
    if kind == "calibration":
        (d / "cal.toml").write_text(set_toml_key(rng, calibration_text(d), v))
        return ["--model", "gpt2", "--gpus", "h100", "--max-gpus", "64", "--calibration", str(d / "cal.toml"),
                *rng.choice([[], ["--tokens", "1e9"], ["-q"]])]
    if kind == "log":
        name = rng.choice(sorted(LOGS))
        (d / name).write_text(mutated_log(rng, (CALIBRATION / name).read_text()), errors="surrogateescape")
        return ["calibrate", str(d / name), "--gpus", "h100", *LOGS[name].split(), "--out", str(d / "cal.toml")]
    if kind == "name":                      # a name that holds a control character
        c = rng.choice(CONTROL)
        where = rng.choice(["model file", "gpu name", "topology name"])
        if where == "model file":
            f = d / f"m{c.replace(chr(0), chr(1))}x.json"      # a file name holds no NUL
            f.write_text(json.dumps(preset_config("gpt2")))
            return ["--model", str(f), "--gpus", "h100", "--out", str(d / "out"), "-q"]
        if where == "gpu name":
            (d / "gpu.toml").write_text(GPU.replace('name = "h100"', f"name = {json.dumps('my' + c + 'gpu')}"))
            return ["--model", "gpt2", "--gpus", str(d / "gpu.toml"), "--out", str(d / "out")]
        (d / "t.toml").write_text(TOPOLOGY.replace('name = "dgx-h100"', f"name = {json.dumps('t' + c)}", 1))
        return ["--model", "gpt2", "--gpus", "h100", "--topology", str(d / "t.toml"), "-q"]
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


def fuzz(n: int, seed: int, kinds: tuple[str, ...] = KINDS) -> tuple[Counter[str], Counter[str], list[str]]:
    """Run ``n`` invocations (every other one a hostile file of one of ``kinds``); the verdict
    counts, the file kinds run, and the calls that broke the contract."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    ran: Counter[str] = Counter()
    bad: list[str] = []
    with tempfile.TemporaryDirectory() as top:
        for i in range(n):
            d = Path(tempfile.mkdtemp(dir=top))
            kind = rng.choice(kinds) if i % 2 else "options"
            ran[kind] += 1
            args = random_args(rng) if kind == "options" else random_file(rng, d, kind)
            r = CliRunner().invoke(cli, args, prog_name="plan", catch_exceptions=True)
            v = verdict(r)
            if v.startswith("exit") and leftovers(d):
                v = "left files"
            counts[v] += 1
            if not v.startswith("exit"):
                bad.append(f"{v}: plan {' '.join(repr(a[:80]) for a in args)}\n  {r.output.strip()[:300]}")
    return counts, ran, bad


def leftovers(d: Path) -> list[str]:
    """Temporary files, and an --out directory written although the run failed."""
    return [p.name for p in d.rglob("*") if p.name.startswith(".") and p.name.endswith(".tmp")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"file kinds, of {', '.join(KINDS)}")
    a = ap.parse_args()
    kinds = tuple(k for k in a.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}")
    t0 = time.perf_counter()
    counts, ran, bad = fuzz(a.n, a.seed, kinds)
    print(f"{a.n} invocations in {time.perf_counter() - t0:.1f} s (seed {a.seed}):")
    for v, k in counts.most_common():
        print(f"  {v:<14} {k:>6}")
    print("  by input: " + ", ".join(f"{kind} {k}" for kind, k in sorted(ran.items())))
    for line in bad[:20]:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
