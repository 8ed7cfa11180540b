"""The RL step time against NVIDIA NeMo-RL's published GRPO runs (issue 34).

Source: NeMo-RL's performance summary, docs/about/performance-summary.md, "Nemo RL v0.4",
GRPO on OpenMathInstruct-2, DGX-H100, training and generation BF16, Megatron-Core training
(github.com/NVIDIA-NeMo/RL; the table prints the total step time only, no per-phase times).
Every on-policy row is predicted; the 1-step-off rows overlap generation with training
(asynchronous GRPO), which the planner does not model, and are named, not predicted.

Settings from the recipes (examples/configs/recipes/llm/performance/grpo-*.yaml and their
defaults examples/configs/grpo_math_1B.yaml): 64 prompts x 32 generations (G-GBS 2,048) or
16 x 32 (G-GBS 512), vLLM colocated with gpu_memory_utilization 0.6, the published generation
TP, training tp/pp/cp as published, activation checkpointing, a reference model (KL penalty
0.01), sequence packing. ASSUMED: prompts of 128 tokens (the table gives only the mean total
length, G-Average Seq len, which sets the mean response: mean - 128); the longest response per
engine reaches T-Max Sequence Length - 128.

    python bench/posttrain_nemo_rl.py      # prints the table docs/post-training.md holds
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

PROMPT = 128   # ASSUMED (see the module docstring)

# (model preset, GPUs, T-max length, G-average length, prompts, group, generation TP,
#  training options as published, published step time s)
ROWS = [
    ("llama3.1-8b", 16, 4096, 1060, 64, 32, 1, ["--tp", "1", "--pp", "2", "--cp", "1"], 97.7),
    ("qwen3-32b", 32, 4096, 3206, 64, 32, 4, ["--tp", "4", "--pp", "4", "--cp", "1"], 393.0),
    ("qwen3-30b-a3b", 32, 4096, 3154, 64, 32, 4, ["--tp", "2", "--pp", "1", "--cp", "1"], 225.0),
    ("qwen3-235b-a22b", 128, 8192, 5671, 16, 32, 16, ["--tp", "2", "--pp", "8", "--cp", "2"], 506.0),
    ("deepseek-v3", 256, 1536, 745, 16, 32, 32, ["--pp", "16"], 154.0),
]
NOT_PREDICTED = "the six 1-step-off (asynchronous) rows: generation overlaps training, not modelled"


def predict(row: tuple) -> dict:
    model, n, t_max, g_avg, prompts, group, g_tp, train, _ = row
    args = ["--model", model, "--task", "grpo", "--gpus", "h100", "--n-gpus", str(n),
            "--prompt-len", str(PROMPT), "--response-len", str(t_max - PROMPT),
            "--response-mean", str(g_avg - PROMPT), "--group-size", str(group), "--prompts-per-step", str(prompts),
            "--rollout-memory-fraction", "0.6", "--rollout-tp", str(g_tp), "--recompute", "full", *train, "--json"]
    out = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)["plan"]


def fit_step_overhead(rows: list[tuple[float, int, float]]) -> float:
    """The per-decode-step host time c that minimises the squared relative errors of
    base + steps x c against the published step times (linear least squares, c >= 0);
    rows are (predicted step time without the per-step time, decode steps, published)."""
    num = sum(s / y * (1 - b / y) for b, s, y in rows)
    den = sum((s / y) ** 2 for _, s, y in rows)
    return max(0.0, num / den) if den else 0.0


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main() -> None:
    from planner.timing.rollout import DECODE_STEP_OVERHEAD_S

    print("| model | GPUs | published step s | predicted s | error | physics only (c = 0) | leave-one-out error | "
          "generation s (tp all-reduces, per-step fitted) | log-probs s | training s | resync + offload s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    preds = []
    for row in ROWS:
        p = predict(row)
        if p is None:
            print(f"| {row[0]} | {row[1]} | {row[-1]} | does not fit | | | | | | | |")
            continue
        g = p["generation"]
        base = p["step_time_s"] - g["decode_overhead_s"]
        preds.append((row, p, base, g["decode_steps"]))
    fit_rows = [(b, s, row[-1]) for row, _, b, s in preds]
    c_all = fit_step_overhead(fit_rows)
    errors, loo = [], []
    for i, (row, p, base, steps) in enumerate(preds):
        c_out = fit_step_overhead(fit_rows[:i] + fit_rows[i + 1:])
        y = row[-1]
        err = (base + steps * DECODE_STEP_OVERHEAD_S) / y - 1
        err_loo = (base + steps * c_out) / y - 1
        errors.append(err)
        loo.append(err_loo)
        t, g = p["time_by_phase_s"], p["generation"]
        gen = t.get("generation: prefill", 0) + t.get("generation: decode", 0)
        other = t.get("weight resync", 0) + t.get("offload and reload", 0)
        print(f"| {row[0]} | {row[1]} | {y} | {p['step_time_s']:.1f} | {err:+.0%} | "
              f"{base / y - 1:+.0%} | {err_loo:+.0%} "
              f"(c = {c_out * 1e3:.1f} ms) | {gen:.1f} ({g['decode_collective_s']:.1f}, "
              f"{g['decode_overhead_s']:.1f}) | "
              f"{t['log-prob passes']:.1f} | {t['training']:.1f} | {other:.1f} |")
    print(f"\nper-decode-step fitted time in the planner (DECODE_STEP_OVERHEAD_S): "
          f"{DECODE_STEP_OVERHEAD_S * 1e3:.2f} ms; fitted to these {len(preds)} rows: {c_all * 1e3:.2f} ms")
    print(f"{len(errors)} of {len(ROWS)} on-policy rows predicted; in sample median error {_median(errors):+.0%}, "
          f"median |error| {_median([abs(e) for e in errors]):.0%}, range {min(errors):+.0%} to {max(errors):+.0%}; "
          f"leave one row out median |error| {_median([abs(e) for e in loo]):.0%}, range {min(loo):+.0%} to "
          f"{max(loo):+.0%}; not predicted: {NOT_PREDICTED}")


if __name__ == "__main__":
    main()
