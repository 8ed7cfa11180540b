"""The RL step time against NVIDIA NeMo-RL's published GRPO runs (issue 34).

Source: NeMo-RL's performance summary, docs/about/performance-summary.md, "Nemo RL v0.4",
GRPO on OpenMathInstruct-2, DGX-H100, training and generation BF16, Megatron-Core training
(github.com/NVIDIA-NeMo/RL; the table prints the total step time only, no per-phase times).
Every row is predicted: the five on-policy rows, then the five 1-step-off rows (asynchronous
GRPO, --rl-async 1) out of sample with the per-decode-step value fitted on the on-policy rows
alone, then in sample with it refitted on all ten.

Settings from the recipes (examples/configs/recipes/llm/performance/grpo-*.yaml and their
defaults examples/configs/grpo_math_1B.yaml): 64 prompts x 32 generations (G-GBS 2,048) or
16 x 32 (G-GBS 512), vLLM colocated with gpu_memory_utilization 0.6, the published generation
TP, training tp/pp/cp as published, activation checkpointing, a reference model (KL penalty
0.01), sequence packing. ASSUMED: prompts of 128 tokens (the table gives only the mean total
length, G-Average Seq len, which sets the mean response: mean - 128); the longest response per
engine reaches T-Max Sequence Length - 128.

The 1-step-off rows (the same table, "On/Off policy" 1-step Off) run NeMo-RL's async GRPO
(recipes examples/configs/recipes/llm/performance/async-grpo-*.yaml: grpo.async_grpo.enabled,
max_trajectory_age_steps 1, policy.generation.colocated.enabled false, vLLM async_engine,
gpu_memory_utilization 0.8): generation on GPUs of its own, half of the row's GPUs in every
recipe (policy.generation.colocated.resources: 1 of 2 nodes for Llama 3.1 8B, 2 of 4 for
Qwen3-30B-A3B, 4 of 8 for Qwen3-32B, 16 of 32 for Qwen3-235B, 32 of 64 for DeepSeek-V3), so
the plan's --n-gpus is half the row's and --rollout separate puts as many engines' GPUs beside.
Generation TP and the training layout are the table's (where the stored Qwen3-30B-A3B recipe
differs, TP 4 and training tp 2 pp 1, the table is taken: it is what was measured). DeepSeek-V3
gives pp 16 only, as its on-policy row does: the published tp 1, ep 16 does not fit the
planner's training phase with the reference model's 16-bit copy resident beside it (15.4 GiB
on 64.1 GiB), so the search picks tp. NeMo-RL keeps the reference's weights in host memory and
swaps them in for the reference pass (nemo_rl/models/policy/megatron_policy_worker.py: the
reference state dict is copied to the CPU), which the planner does not model.

    python bench/posttrain_nemo_rl.py      # prints the tables docs/post-training.md holds
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
# The 1-step-off rows, source as above (performance-summary.md, "Nemo RL v0.4", rows "1-step Off"):
# (model preset, GPUs in all, of them generation GPUs (the recipe's generation resources), T-max
#  length, G-average length, prompts, group, generation TP, training options as published,
#  published step time s)
ASYNC_ROWS = [
    ("llama3.1-8b", 16, 8, 4096, 1129, 64, 32, 1, ["--tp", "1", "--pp", "2", "--cp", "1"], 74.6),
    ("deepseek-v3", 512, 256, 1536, 744, 16, 32, 32, ["--pp", "16"], 77.9),
    ("qwen3-235b-a22b", 256, 128, 8192, 5691, 16, 32, 8, ["--tp", "4", "--cp", "1", "--pp", "8"], 241.0),
    ("qwen3-30b-a3b", 32, 16, 4096, 3158, 64, 32, 2, ["--tp", "1", "--cp", "1", "--pp", "2"], 244.0),
    ("qwen3-32b", 64, 32, 4096, 3207, 64, 32, 4, ["--tp", "4", "--cp", "1", "--pp", "4"], 215.0),
]
ASYNC_MEMORY_FRACTION = 0.8    # the async recipes' vllm_cfg.gpu_memory_utilization
NOT_PREDICTED = "none (the table has five 1-step-off rows, predicted below)"


def predict(row: tuple) -> dict:
    model, n, t_max, g_avg, prompts, group, g_tp, train, _ = row
    return _plan([model, str(n), t_max, g_avg, prompts, group, g_tp, train], ["--rollout-memory-fraction", "0.6"])


def predict_async(row: tuple) -> dict:
    """A 1-step-off row: the training half of its GPUs, the engines on as many of their own."""
    model, n, n_gen, t_max, g_avg, prompts, group, g_tp, train, _ = row
    assert n_gen == n - n_gen, "--rollout separate gives the engines as many GPUs as training"
    return _plan([model, str(n - n_gen), t_max, g_avg, prompts, group, g_tp, train],
                 ["--rollout-memory-fraction", str(ASYNC_MEMORY_FRACTION), "--rollout", "separate", "--rl-async", "1"])


def _plan(r: list, extra: list[str]) -> dict:
    model, n, t_max, g_avg, prompts, group, g_tp, train = r
    args = ["--model", model, "--task", "grpo", "--gpus", "h100", "--n-gpus", n,
            "--prompt-len", str(PROMPT), "--response-len", str(t_max - PROMPT),
            "--response-mean", str(g_avg - PROMPT), "--group-size", str(group), "--prompts-per-step", str(prompts),
            *extra, "--rollout-tp", str(g_tp), "--recompute", "full", *train, "--json"]
    out = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)["plan"]


def parts(p: dict) -> tuple[float, int, float, bool]:
    """A predicted plan as (generation seconds without the fitted per-step time, decode steps,
    the other phases' seconds, overlapped): its step time at any per-step value c is
    at_c(parts, c)."""
    t, g = p["time_by_phase_s"], p["generation"]
    gen = t.get("generation: prefill", 0) + t.get("generation: decode", 0)
    return gen - g["decode_overhead_s"], g["decode_steps"], sum(t.values()) - gen, bool(p.get("overlapped"))


def at_c(pt: tuple[float, int, float, bool], c: float) -> float:
    """The step time at per-decode-step value c: generation and the rest in turn, or the slower
    of the two when asynchronous (planner.timing.rollout.rl_step_s)."""
    gen_base, steps, rest, overlapped = pt
    gen = gen_base + steps * c
    return max(gen, rest) if overlapped else gen + rest


def fit_c(rows: list[tuple[tuple[float, int, float, bool], float]]) -> float:
    """The c >= 0 that minimises the squared relative errors of at_c against the published
    times; a grid of 0.01 ms to 100 ms (the asynchronous rows make the error piecewise, not
    linear, in c)."""
    return min((i * 1e-5 for i in range(10_001)), key=lambda c: sum((at_c(pt, c) / y - 1) ** 2 for pt, y in rows))


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
    async_table(preds, DECODE_STEP_OVERHEAD_S)


def async_table(on_policy: list, c_out: float) -> None:
    """The 1-step-off rows: out of sample at c_out (fitted on the on-policy rows alone), then
    in sample with c refitted on all rows, and leaving each row out of that refit."""
    print("\n| model | GPUs (generation + training) | published step s | predicted s (out of sample) | error | "
          "generation s (its GPUs) | log-probs + training + resync s (training GPUs) | side that sets the step | "
          "1-step-off / on-policy step: published, predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    on = {row[0]: (row[-1], p["step_time_s"]) for row, p, _, _ in on_policy}
    rows, out_err = [], []
    for row in ASYNC_ROWS:
        p = predict_async(row)
        n, n_gen, y = row[1], row[2], row[-1]
        if p is None:
            print(f"| {row[0]} | {n_gen} + {n - n_gen} | {y} | does not fit | | | | | |")
            continue
        pt = parts(p)
        pred = at_c(pt, c_out)
        gen = pt[0] + pt[1] * c_out
        out_err.append(pred / y - 1)
        rows.append((row, pt, y))
        print(f"| {row[0]} | {n_gen} + {n - n_gen} | {y} | {pred:.1f} | {pred / y - 1:+.0%} | {gen:.1f} | "
              f"{pt[2]:.1f} | {'generation' if gen >= pt[2] else 'training'} | "
              + (f"{y / on[row[0]][0]:.2f}, {pred / on[row[0]][1]:.2f} |" if row[0] in on else "|"))
    allrows = [(parts(p), row[-1]) for row, p, _, _ in on_policy] + [(pt, y) for _, pt, y in rows]
    c_in = fit_c(allrows)
    in_err = [at_c(pt, c_in) / y - 1 for pt, y in allrows]
    loo = [at_c(pt, fit_c(allrows[:i] + allrows[i + 1:])) / y - 1 for i, (pt, y) in enumerate(allrows)]
    n_on = len(on_policy)
    print(f"\n{len(rows)} of {len(ASYNC_ROWS)} 1-step-off rows predicted. Out of sample (c = {c_out * 1e3:.1f} ms, "
          f"fitted on the on-policy rows only): median error {_median(out_err):+.0%}, median |error| "
          f"{_median([abs(e) for e in out_err]):.0%}, range {min(out_err):+.0%} to {max(out_err):+.0%}")
    print(f"In sample, c refitted on all {len(allrows)} rows: {c_in * 1e3:.2f} ms; 1-step-off rows "
          + ", ".join(f"{r[0]} {e:+.0%}" for (r, _, _), e in zip(rows, in_err[n_on:]))
          + "; on-policy rows " + ", ".join(f"{r[0]} {e:+.0%}" for (r, _, _, _), e in zip(on_policy, in_err[:n_on]))
          + f"; all rows median |error| {_median([abs(e) for e in in_err]):.0%}")
    print(f"Leave one row out of the {len(allrows)}-row refit: median |error| {_median([abs(e) for e in loo]):.0%}, "
          f"range {min(loo):+.0%} to {max(loo):+.0%}; 1-step-off rows "
          + ", ".join(f"{r[0]} {e:+.0%}" for (r, _, _), e in zip(rows, loo[n_on:])))


if __name__ == "__main__":
    main()
