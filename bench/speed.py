"""How fast the planner answers, and how its cost grows.

    python bench/speed.py                  # everything but llm-analysis unless it is installed
    python bench/speed.py --quick          # fewer repeats, no llm-analysis
    python bench/speed.py --json out.json  # also write the numbers
    python bench/speed.py --only mission   # one section (repeatable)
    python bench/speed.py --install-llm-analysis   # make llm-analysis's venv first (minutes)

Prints, on this machine:
  0. the mission commands as a user runs them (fresh processes, median of several runs, with
     the CPU time and the load average): `plan --help`, `plan --model 70b --gpus h100`,
     `plan --model 405b --gpus h100,h200,b200,a100,mi300x --tokens 15T --deadline 90d` and
     `plan buy examples/jobs.yaml`;
  1. layouts scored per second through the code the sweep runs (planner.search.sweep):
     the memory model as arrays (planner.memory.peak.peak_bytes), the step-time model as
     arrays (planner.timing.fast.step_times_s), both together, and the same models one
     layout at a time (planner.memory.model.per_rank_memory, planner.timing.model.step_time);
     then the same for LoRA, QLoRA and freeze (the same batched models: planner.memory.peak
     and planner.timing.fast cover every set-up);
  2. the wall time of `plan --help` and of `plan --model 70b --gpus h100` (best of several
     runs, in fresh processes), and whether torch or deepspeed was imported;
  3. a full search for llama3.1-405b: every catalogued GPU type, every GPU count the search
     tries up to 16,384, every layout, micro-batch and recomputation option, sized by the
     memory model; then the plan (fastest fitting layout on the smallest count) per GPU type;
  4. how search time grows with the number of GPU counts and of layouts;
  5. llm-analysis (cli99/llm-analysis 0.2.2, in its own virtual environment under
     --cache-dir, since it pins transformers<5; skipped with a message when absent, made by
     --install-llm-analysis) scoring the same Llama-2-70B layouts (memory and step time, one
     call per layout), taking turns with the planner in rounds, so that both see the same
     machine; the ratio of layouts per second in each round, and the median round.

The process keeps freed heap memory for reuse, as `plan` does (planner.cli.alloc): the
batched models' temporaries would otherwise page-fault on every call.

Goals (issue 15): the 405B cost plan and `plan buy examples/jobs.yaml` < 1.5 s, the 70B plan
< 0.8 s, >= 1,000,000 layouts/s for memory and step time together. docs/performance.md
records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from planner import api
from planner.cli.alloc import keep_freed_memory
from planner.hardware.gpus import list_gpus
from planner.hardware.placement import Cluster, scale_up_domain_gpus
from planner.layouts.batch import LayoutArrays, valid_layouts
from planner.layouts.layout import Layout, SearchSpace, enumerate_layouts
from planner.memory.model import per_rank_memory
from planner.memory.peak import forget_states, memory_batch
from planner.memory.shapes import forget_tables as forget_memory_tables
from planner.models.spec import ModelSpec, ParamCount, count_params, load_model
from planner.search.search import gpu_counts
from planner.timing.fast import forget_tables as forget_time_tables
from planner.timing.fast import step_times_s
from planner.timing.model import cluster_for, step_time
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

LLM_ANALYSIS = "llm-analysis==0.2.2"
LLM_ANALYSIS_MODEL = "upstage_Llama-2-70b-instruct-v2"     # its own Llama-2-70B config
LLM_ANALYSIS_GPU = "h100-sxm-80gb"


def score(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, cluster: Cluster, pc: ParamCount
          ) -> tuple[np.ndarray, np.ndarray]:
    """Memory and step time of every layout of ``a``, as the sweep takes them on a count
    (planner.search.sweep: peak_bytes, then step_times_s)."""
    return peak_bytes(m, setup, a, pc), step_times_s(m, setup, a, cluster, pc=pc)


def peak_bytes(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
               gpus_per_node: int = 8) -> np.ndarray:
    """The peak bytes of every layout of ``a``: what the search and the sweep read."""
    return memory_batch(m, setup, a, pc, gpus_per_node).total


def forget_tables() -> None:
    """Drop the degree and state tables the batched models keep across calls."""
    forget_time_tables()
    forget_memory_tables()
    forget_states()


CPU_TIMES: list[float] = []     # CPU seconds of the last best_of's best run (this process and children)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (user + system)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The shortest wall time of ``repeats`` calls (the machine's other load only adds);
    the CPU time of that run goes to CPU_TIMES[-1], a figure other processes hardly move."""
    best, best_cpu = float("inf"), 0.0
    for _ in range(repeats):
        c, t = cpu_seconds(), time.perf_counter()
        fn()
        wall, cpu = time.perf_counter() - t, cpu_seconds() - c
        if wall < best:
            best, best_cpu = wall, cpu
    CPU_TIMES.append(best_cpu)
    return best


def row(label: str, value: str, goal: str = "") -> None:
    print(f"  {label:<58} {value:>16}  {goal}")


# ------------------------------------------------------------------ 1. scoring rates

def all_layouts(m, setup: TrainingSetup, gpus_per_node: int, max_tp: int, max_gpus: int = 16_384) -> LayoutArrays:
    counts = gpu_counts(gpus_per_node, max_gpus)
    return LayoutArrays.concat([valid_layouts(m, setup, n, gpus_per_node, SearchSpace(max_tp=max_tp))
                                for n in counts])


def scoring_rates(repeats: int) -> dict:
    print("1. layouts scored per second (llama3.1-405b on h100, 8-GPU nodes, counts up to 16,384)")
    m, setup = load_model("llama3.1-405b"), TrainingSetup()
    pc = count_params(m)
    cluster = cluster_for(load_gpu("h100"))
    arrays = all_layouts(m, setup, 8, 8)
    score(m, setup, arrays, cluster, pc)   # warm every table (per shape, links, degrees, states), as a search would
    out: dict = {"layouts": len(arrays)}
    for key, label, fn in (
            ("memory_vectorised", "memory model, as arrays", lambda: peak_bytes(m, setup, arrays, pc)),
            ("time_vectorised", "step-time model, as arrays", lambda: step_times_s(m, setup, arrays, cluster, pc=pc)),
            ("both_vectorised", "memory and step time, as arrays", lambda: score(m, setup, arrays, cluster, pc))):
        t = best_of(fn, repeats)
        out[f"{key}_per_s"], out[f"{key}_per_cpu_s"] = len(arrays) / t, len(arrays) / max(CPU_TIMES[-1], 1e-9)
        row(f"{label} ({len(arrays):,} layouts)", f"{len(arrays) / t:,.0f}/s",
            f"goal >= 1,000,000/s ({out[f'{key}_per_cpu_s']:,.0f} per CPU second)")

    def rebuilt() -> None:
        forget_tables()
        score(m, setup, arrays, cluster, pc)
    t = best_of(rebuilt, repeats)
    out["both_rebuilt_per_s"], out["both_rebuilt_per_cpu_s"] = len(arrays) / t, len(arrays) / max(CPU_TIMES[-1], 1e-9)
    row("both, degree and state tables rebuilt on every call", f"{len(arrays) / t:,.0f}/s",
        f"({out['both_rebuilt_per_cpu_s']:,.0f} per CPU second)")
    sample = [arrays.layout(i, setup.seq_len) for i in range(0, len(arrays), max(1, len(arrays) // 2000))]
    t_mem = best_of(lambda: [per_rank_memory(m, setup, lay, pc) for lay in sample], max(1, repeats // 2))
    timed = sample[:: max(1, len(sample) // 200)]
    step_time(m, setup, timed[0], cluster, pc=pc)
    t_time = best_of(lambda: [step_time(m, setup, lay, cluster, pc=pc) for lay in timed], 1)
    out["memory_per_layout_per_s"], out["time_per_layout_per_s"] = len(sample) / t_mem, len(timed) / t_time
    row(f"memory model, one layout at a time ({len(sample):,})", f"{out['memory_per_layout_per_s']:,.0f}/s")
    row(f"step-time model, one layout at a time ({len(timed):,})", f"{out['time_per_layout_per_s']:,.0f}/s")
    return out


def load_gpu(name: str):
    from planner.hardware.gpus import get_gpu
    return get_gpu(name)


# ------------------------------------------------------------- 0. the mission commands

MISSION = (("plan --help", ["--help"], None),
           ("plan --model 70b --gpus h100", ["--model", "70b", "--gpus", "h100"], 0.8),
           ("plan --model 405b --gpus h100,h200,b200,a100,mi300x --tokens 15T --deadline 90d",
            ["--model", "405b", "--gpus", "h100,h200,b200,a100,mi300x", "--tokens", "15T", "--deadline", "90d"], 1.5),
           ("plan buy examples/jobs.yaml", ["buy",
                                            str(Path(__file__).resolve().parent.parent / "examples" / "jobs.yaml")],
            1.5))


def mission(repeats: int) -> dict:
    print("0. the mission commands, fresh processes (median of several runs)")
    out = {}
    for label, args, goal in MISSION:
        cmd = plan_command() + args
        walls, cpus = [], []
        load = os.getloadavg()[0]
        for _ in range(repeats):
            c, t = cpu_seconds(), time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            walls.append(time.perf_counter() - t)
            cpus.append(cpu_seconds() - c)
        med = statistics.median(walls)
        out[label] = {"wall_median_s": med, "wall_s": walls, "cpu_median_s": statistics.median(cpus),
                      "load_average_1min": load}
        row(label[:58], f"{med:.2f} s", (f"goal < {goal} s; " if goal else "")
            + f"CPU {statistics.median(cpus):.2f} s; runs {min(walls):.2f}-{max(walls):.2f} s; load {load:.1f}")
    return out


def finetune_rates(repeats: int) -> dict:
    """Layouts per second of memory and step time together, as the sweep scores a count's
    layouts, for full training and for LoRA, QLoRA and freeze (Llama-3-8B on H100, every
    count up to 1,024 GPUs)."""
    print("1b. memory and step time together, by what trains (llama3-8b on h100, counts up to 1,024)")
    m, gpu = load_model("8b"), load_gpu("h100")
    cluster, pc = cluster_for(gpu), count_params(m)
    space = SearchSpace(max_tp=8)
    out = {}
    for method in ("full", "lora", "qlora", "freeze"):
        setup = TrainingSetup(finetune=FinetuneSpec.named(method)) if method != "full" else TrainingSetup()
        lays = [lay for n in gpu_counts(8, 1024) for lay, reason in enumerate_layouts(m, setup, n, 8, space)
                if reason is None]
        arrays = LayoutArrays.from_layouts(lays)
        tiled = ""
        if len(arrays) < 50_000:
            # QLoRA runs under data parallelism only (690 layouts): a call's fixed cost would
            # decide the rate, so its layouts are tiled to a full training-sized batch
            k = -(-50_000 // max(1, len(arrays)))
            arrays, tiled = LayoutArrays.concat([arrays] * k), f" (its {len(lays):,} layouts tiled {k}x)"
            lays = lays * k
        step_times_s(m, setup, arrays, cluster, pc=pc)
        def times(s_: TrainingSetup = setup, a_: LayoutArrays = arrays) -> None:
            step_times_s(m, s_, a_, cluster, pc=pc)

        def memory(s_: TrainingSetup = setup, a_: LayoutArrays = arrays) -> None:
            peak_bytes(m, s_, a_, pc)

        t_time = best_of(times, repeats)
        memory()
        t_mem = best_of(memory, repeats)
        how = "as arrays"
        both = len(lays) / (t_time + t_mem)
        out[method] = {"layouts": len(lays), "time_per_s": len(lays) / t_time, "memory_per_s": len(lays) / t_mem,
                       "memory": how, "both_per_s": both, "tiled": tiled}
        row(f"{method}: {len(lays):,} layouts{tiled}, memory {how}", f"{both:,.0f}/s",
            f"step time alone {len(lays) / t_time:,.0f}/s, memory alone {len(lays) / t_mem:,.0f}/s")
    return out


# --------------------------------------------------------------------- 2. start-up

def plan_command() -> list[str]:
    """`plan` as `python -m planner` (the `plan` script of a shared venv may import another
    checkout's planner; this one is the one on sys.path, as PYTHONPATH gives it)."""
    return [sys.executable, "-m", "planner"]


def startup(repeats: int) -> dict:
    print("2. wall time of a fresh process (best of several)")
    out: dict[str, Any] = {}
    for label, args, goal in (("plan --help", ["--help"], 0.3),
                              ("plan --model 70b --gpus h100", ["--model", "70b", "--gpus", "h100"], 1.5)):
        cmd = plan_command() + args
        def run(cmd: list[str] = cmd) -> None:
            subprocess.run(cmd, capture_output=True, check=True)
        t = best_of(run, repeats)
        out[label] = {"wall_s": t, "cpu_s": CPU_TIMES[-1]}
        row(label, f"{t:.3f} s", f"goal < {goal} s wall ({CPU_TIMES[-1]:.3f} s CPU)")
    probe = subprocess.run([sys.executable, "-X", "importtime", "-m", "planner", "--model", "70b", "--gpus", "h100"],
                           capture_output=True, text=True, check=False)
    heavy = sorted({line.split("|")[-1].strip().split(".")[0] for line in probe.stderr.splitlines()
                    if line.split("|")[-1].strip().split(".")[0] in ("torch", "deepspeed", "transformers")})
    out["heavy_imports"] = heavy
    row("torch / deepspeed / transformers imported by a plain plan", ", ".join(heavy) or "none")
    return out


# ------------------------------------------------------------- 3. the 405B full search

def full_search(repeats: int) -> dict:
    """Every GPU type, every count up to 16,384, every layout, micro-batch and
    recomputation option. Per-rank memory depends on the GPU type only through the GPUs
    per node and the widest tensor-parallel group (the NVLink domain), so GPU types that
    share those are sized once and compared with each one's capacity."""
    print("3. full search, llama3.1-405b, every GPU type x every count up to 16,384 x every layout")
    m = load_model("llama3.1-405b")
    pc = count_params(m)
    gpus = list_gpus()

    def memory_pass() -> dict:
        groups: dict[tuple, tuple] = {}
        found = {}
        for gpu in gpus:
            cluster = cluster_for(gpu)
            max_tp = max(gpu.gpus_per_node, scale_up_domain_gpus(cluster))
            precision = "bf16-mixed" if gpu.bf16_flops_per_s else "fp16-mixed"
            setup = TrainingSetup(precision=precision)
            key = (gpu.gpus_per_node, max_tp, precision)
            if key not in groups:
                counts = gpu_counts(gpu.gpus_per_node, 16_384)
                groups_seen[str(key)] = 0
                parts = [valid_layouts(m, setup, n, gpu.gpus_per_node, SearchSpace(max_tp=max_tp)) for n in counts]
                arrays = LayoutArrays.concat(parts)
                totals = peak_bytes(m, setup, arrays, pc, gpu.gpus_per_node)
                n_gpus = arrays.dp * arrays.tp * arrays.pp * arrays.cp * arrays.ep
                groups[key] = (arrays, totals, n_gpus)
                groups_seen[str(key)] = len(arrays)
            arrays, totals, n_gpus = groups[key]
            fits = totals <= api.capacity_bytes(gpu, TrainingSetup())
            found[gpu.name] = {"layouts": len(arrays), "fitting": int(fits.sum()),
                               "smallest_count": int(n_gpus[fits].min()) if fits.any() else None}
        return found

    groups_seen: dict[str, int] = {}

    memory_pass()                                   # warm caches (topologies, per-shape tables)
    t_mem = best_of(memory_pass, repeats)
    cpu_mem = CPU_TIMES[-1]
    found = memory_pass()
    n_layouts = sum(f["layouts"] for f in found.values())

    def plans() -> dict:
        out = {}
        for gpu in gpus:
            precision = "bf16-mixed" if gpu.bf16_flops_per_s else "fp16-mixed"
            r = api.plan(m, gpu, TrainingSetup(precision=precision))
            out[gpu.name] = r.best.n_gpus if r.fits and r.best is not None else None
        return out

    t_plans = best_of(plans, 1)
    row(f"memory over {n_layouts:,} layouts on {len(gpus)} GPU types", f"{t_mem:.2f} s",
        f"goal < 2 s ({cpu_mem:.2f} s CPU)")
    print(f"      ({len(groups_seen)} distinct layout sets sized, {sum(groups_seen.values()):,} layouts: GPU types "
          f"with the same GPUs per node, NVLink domain and precision share one)")
    row(f"plans (smallest count, fastest layout) for {len(gpus)} GPU types", f"{t_plans:.2f} s",
        f"({CPU_TIMES[-1]:.2f} s CPU)")
    for name, f in found.items():
        print(f"      {name:<10} {f['layouts']:>9,} layouts, {f['fitting']:>9,} fit; smallest count "
              f"{f['smallest_count']}")
    return {"layouts": n_layouts, "layouts_sized": sum(groups_seen.values()), "memory_s": t_mem,
            "memory_cpu_s": cpu_mem, "plans_s": t_plans,
            "plans_cpu_s": CPU_TIMES[-1], "per_gpu": found}


# ----------------------------------------------------------------- 4. how cost grows

def scaling(repeats: int) -> dict:
    print("4. search time against GPU counts and layouts (llama3.1-405b on h100, memory of every layout)")
    m, setup = load_model("llama3.1-405b"), TrainingSetup()
    pc = count_params(m)
    out: dict[str, list[dict]] = {"by_counts": [], "by_layouts": []}
    print(f"      {'max GPUs':>9} {'counts':>7} {'layouts':>10} {'seconds':>9} {'us/layout':>10}")
    for max_gpus in (64, 256, 1024, 4096, 16_384):
        counts = gpu_counts(8, max_gpus)

        def run(counts: list[int] = counts) -> int:
            a = LayoutArrays.concat([valid_layouts(m, setup, n, 8, SearchSpace(max_tp=8)) for n in counts])
            peak_bytes(m, setup, a, pc)
            return len(a)
        n = run()
        t = best_of(run, repeats)
        out["by_counts"].append({"max_gpus": max_gpus, "counts": len(counts), "layouts": n, "s": t})
        print(f"      {max_gpus:>9,} {len(counts):>7} {n:>10,} {t:>9.3f} {1e6 * t / max(n, 1):>10.2f}")
    print(f"      {'micro-batches':>22} {'layouts':>10} {'seconds':>9} {'us/layout':>10}")
    counts = gpu_counts(8, 16_384)
    for mbs in ((1,), (1, 2), (1, 2, 4, 8), (1, 2, 3, 4, 5, 6, 7, 8), tuple(range(1, 17))):
        space = SearchSpace(max_tp=8, micro_batches=mbs)

        def run_mb(space: SearchSpace = space) -> int:
            a = LayoutArrays.concat([valid_layouts(m, setup, n, 8, space) for n in counts])
            peak_bytes(m, setup, a, pc)
            return len(a)
        n = run_mb()
        t = best_of(run_mb, repeats)
        out["by_layouts"].append({"micro_batches": len(mbs), "layouts": n, "s": t})
        print(f"      {len(mbs):>22} {n:>10,} {t:>9.3f} {1e6 * t / max(n, 1):>10.2f}")
    return out


# ------------------------------------------------------------------ 5. llm-analysis

DRIVER = r'''
import json, sys, time
from llm_analysis.analysis import train
layouts = json.loads(sys.stdin.readline())
def score(lay):
    return train(model_name=MODEL, gpu_name=GPU, tp_size=lay["tp"], pp_size=lay["pp"], dp_size=lay["dp"],
                 ds_zero=lay["zero"], batch_size_per_gpu=lay["mb"], gradient_accumulation_steps=lay["ga"],
                 seq_len=lay["seq"], activation_recomputation=lay["rc"], flash_attn=True, log_level="ERROR")
def attempt(lay):
    # llm-analysis raises an AssertionError for a layout whose memory leaves no room for a
    # micro-batch: it has sized it by then, as the planner sizes layouts that do not fit
    try:
        score(lay)
        return 0
    except Exception:
        return 1
# the layouts it scores in full (memory and step time), not refused as not fitting
fits = [i for i, lay in enumerate(layouts) if attempt(lay) == 0]
print(json.dumps({"fits": fits}), flush=True)
subsets = {"all": list(range(len(layouts))), "fit": fits}
cursor = {"all": 0, "fit": 0}
for line in sys.stdin:          # one round: "all|fit seconds": score those layouts, in turn, for this long
    which, budget_s = line.split()
    subset, budget_s = subsets[which], float(budget_s)
    done = refused = 0
    t = time.perf_counter()
    while True:
        refused += attempt(layouts[subset[cursor[which] % len(subset)]])
        cursor[which] += 1
        done += 1
        if time.perf_counter() - t >= budget_s:
            break
    print(json.dumps({"scored": done, "refused": refused, "seconds": time.perf_counter() - t}), flush=True)
'''


def llm_analysis_python(cache_dir: Path, install: bool = False) -> Path | None:
    """The python of a virtual environment holding llm-analysis 0.2.2; made here only with
    ``install`` (otherwise None when absent)."""
    env = cache_dir / "llm-analysis-0.2.2"
    py = env / ("Scripts" if os.name == "nt" else "bin") / "python"
    ok = env / ".installed"
    if ok.exists():
        return py
    if not install:
        print(f"  llm-analysis is not installed under {env}: skipped (--install-llm-analysis makes it)")
        return None
    print(f"  installing {LLM_ANALYSIS} into {env} (its own venv: it pins transformers<5; minutes)...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", LLM_ANALYSIS], check=True, capture_output=True,
                       timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        tail = getattr(e, "stderr", b"") or b""
        print(f"  could not install {LLM_ANALYSIS}: {e}\n  {tail.decode(errors='replace')[-500:]}")
        return None
    ok.write_text(LLM_ANALYSIS)
    return py


def comparison_layouts() -> list[Layout]:
    """The Llama-2-70B layouts a planner search sizes that llm-analysis can express too:
    every GPU count the search tries up to 16,384 (8-GPU nodes), tp up to 8 (with sequence
    parallelism), every pp, DeepSpeed ZeRO 0-3 (ZeRO-2/3 without pipelining), micro-batches
    1-8, the three recomputation modes; global batch 1024 of 4,096 tokens. In a fixed
    shuffled order, so that the part llm-analysis gets through in its time budget is a fair
    sample of the whole."""
    m, setup = load_model("llama2-70b"), TrainingSetup()
    arrays = LayoutArrays.concat([valid_layouts(m, setup, n, 8, SearchSpace(max_tp=8, zero_stage=z, cp=1))
                                  for n in gpu_counts(8, 16_384) for z in range(4)])
    lays = [arrays.layout(i, setup.seq_len) for i in range(len(arrays))]
    lays = [x for x in lays if x.vp == 1]
    random.Random(0).shuffle(lays)
    return lays


def llm_analysis_comparison(cache_dir: Path, rounds: int, budget_s: float = 1.0, turns: int = 10,
                            install: bool = False) -> dict:
    """llm-analysis and the planner on the same layouts, taking turns: each of ``rounds``
    rounds is ``turns`` turns, and in each turn llm-analysis scores layouts for
    ``budget_s / turns`` seconds (in one process kept across rounds, cycling through the
    shuffled list), then the planner makes its calls (1 after the switch, timed apart, 2
    warm, 1 of memory or step time alone), then the same on the layouts llm-analysis
    scores in full (1 after the switch, 2 warm); every
    other turn, one call with the degree and state tables rebuilt. A round is so 20 warm
    calls on each set, 5 each of memory, step time and rebuilt tables, and ``budget_s``
    seconds of llm-analysis on each set. A shared machine's speed changes from one tenth of
    a second to the next; within a round both see about the same machine (and the same
    CPU: both are pinned to one), so each round gives a ratio, and the median round is the
    figure. Twice: on every layout (llm-analysis refuses most of them as not fitting,
    after sizing their memory, which is quicker than scoring them), and on the layouts
    llm-analysis scores in full (memory and step time), like for like."""
    print(f"5. llm-analysis ({LLM_ANALYSIS}) against the planner, the same Llama-2-70B layouts, taking turns")
    py = llm_analysis_python(cache_dir, install)
    if py is None:
        return {"installed": False}
    m, setup = load_model("llama2-70b"), TrainingSetup()
    pc = count_params(m)
    lays = comparison_layouts()
    payload = json.dumps([{"tp": x.tp, "pp": x.pp, "dp": x.dp, "zero": x.zero_stage, "mb": x.micro_batch,
                           "ga": x.grad_accum, "seq": x.seq_len,
                           "rc": {"none": 0, "selective": 1, "full": 2}[x.recompute]} for x in lays])
    driver = DRIVER.replace("MODEL", repr(LLM_ANALYSIS_MODEL)).replace("GPU", repr(LLM_ANALYSIS_GPU))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(driver)
    cluster = cluster_for(load_gpu("h100"))
    arrays = LayoutArrays.from_layouts(lays)
    # cold: the first call for this model, set-up and cluster builds every table (block
    # times, topology links, degree and state tables); one call, so one measurement
    c0, t0 = cpu_seconds(), time.perf_counter()
    score(m, setup, arrays, cluster, pc)
    cold_s, cold_cpu_s = time.perf_counter() - t0, cpu_seconds() - c0
    # both on one CPU, in turns: on a shared machine the CPUs are not equally loaded, and a
    # process moved between them would see another machine from one second to the next
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if affinity:
        os.sched_setaffinity(0, {min(affinity)})
    proc = subprocess.Popen([str(py), f.name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    theirs: dict[str, list[dict]] = {"all": [], "fit": []}
    calls: dict[str, list[list[float]]] = {}
    cpu: dict[str, float] = {}
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(payload + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        fits = json.loads(line)["fits"] if line else []
        fit_arrays = LayoutArrays.from_layouts([lays[i] for i in fits])
        score(m, setup, fit_arrays, cluster, pc)

        def rebuilt() -> None:
            forget_tables()
            score(m, setup, arrays, cluster, pc)
        # warm: every table kept (a search or sweep scoring the same GPU counts again);
        # rebuilt: the degree and state tables built again on every call, the per-shape
        # tables and links kept (what a call on GPU counts not scored before costs)
        ours = {"warm": lambda: score(m, setup, arrays, cluster, pc), "rebuilt": rebuilt,
                "switch": lambda: score(m, setup, arrays, cluster, pc),
                "fit_switch": lambda: score(m, setup, fit_arrays, cluster, pc),
                "memory": lambda: peak_bytes(m, setup, arrays, pc),
                "time": lambda: step_times_s(m, setup, arrays, cluster, pc=pc),
                "fit": lambda: score(m, setup, fit_arrays, cluster, pc)}
        calls = {k: [] for k in ours}
        cpu = {k: float("inf") for k in ours}

        def timed(k: str, walls: list[float]) -> None:
            c, t = cpu_seconds(), time.perf_counter()
            ours[k]()
            walls.append(time.perf_counter() - t)
            cpu[k] = min(cpu[k], cpu_seconds() - c)

        def theirs_for(which: str, seconds: float) -> dict | None:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{which} {seconds}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            return json.loads(line) if line else None

        # each round is `turns` short turns: llm-analysis on every layout, the planner's
        # calls on them, llm-analysis on the layouts it scores in full, the planner's on
        # those. A shared machine's speed changes within a second, so each tool's rate in a
        # round is taken over the same stretch of time, not over two neighbouring ones.
        # The planner's first call in a turn finds the CPU caches as llm-analysis left them,
        # which a search in its own process does not: it is timed apart ("switch"), as
        # llm-analysis's own first call in a turn is one of hundreds
        for _ in range(rounds if fits else 0):
            walls: dict[str, list[float]] = {k: [] for k in ours}
            got: dict[str, list[dict]] = {"all": [], "fit": []}
            for turn in range(turns):
                for which, mine in (("all", ("switch", "warm", "warm", "memory" if turn % 2 else "time")),
                                    ("fit", ("fit_switch", "fit", "fit"))):
                    r = theirs_for(which, budget_s / turns)
                    if r is None:
                        break
                    got[which].append(r)
                    for k in mine:
                        timed(k, walls[k])
                if turn % 2 == 0:           # the degree and state tables built anew, then every table warm again
                    timed("rebuilt", walls["rebuilt"])
                    ours["fit"]()
            if len(got["fit"]) < turns:     # llm-analysis stopped: reported below
                break
            for which, rs in got.items():
                theirs[which].append({"scored": sum(r["scored"] for r in rs), "refused": sum(r["refused"] for r in rs),
                                      "seconds": sum(r["seconds"] for r in rs)})
            for k in ours:
                calls[k].append(walls[k])
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.unlink(f.name)
        if affinity:
            os.sched_setaffinity(0, affinity)
    if len(theirs["fit"]) < rounds:
        err = proc.stderr.read()[-500:] if proc.stderr else ""
        print(f"  llm-analysis failed: {err}")
        return {"installed": True, "error": err}
    n, n_fit = len(lays), len(fits)
    rate = {w: [r["scored"] / r["seconds"] for r in theirs[w]] for w in theirs}
    overall = {w: sum(r["scored"] for r in theirs[w]) / sum(r["seconds"] for r in theirs[w]) for w in theirs}
    med = statistics.median

    def rates(k: str, size: int, against: str) -> tuple[float, float, list[float]]:
        """(median call's rate, best call's rate, each round's median call's rate over
        llm-analysis's rate in that round)."""
        flat = [w for walls in calls[k] for w in walls]
        per_round = [size / med(walls) / r for walls, r in zip(calls[k], rate[against])]
        return size / med(flat), size / min(flat), per_round

    warm, warm_best, warm_ratios = rates("warm", n, "all")
    switch, _, switch_ratios = rates("switch", n, "all")
    reb, _, reb_ratios = rates("rebuilt", n, "all")
    mem, _, mem_ratios = rates("memory", n, "all")
    tim, _, time_ratios = rates("time", n, "all")
    fit, fit_best, fit_ratios = rates("fit", n_fit, "fit")
    ours_mem = n / best_of(lambda: [per_rank_memory(m, setup, x, pc) for x in lays], 1)
    few = lays[:: max(1, n // 200)]
    for x in few:
        step_time(m, setup, x, cluster, pc=pc)
    ours_one = len(few) / best_of(lambda: [(per_rank_memory(m, setup, x, pc), step_time(m, setup, x, cluster, pc=pc))
                                           for x in few], 1)

    def spread(xs: list[float], unit: str = "x") -> str:
        return f"rounds {min(xs):,.0f}{unit}-{max(xs):,.0f}{unit}"
    scored_all = sum(r["scored"] for r in theirs["all"])
    refused_all = sum(r["refused"] for r in theirs["all"])
    row(f"llm-analysis, every layout, one call each ({scored_all:,} calls)", f"{overall['all']:,.0f}/s",
        f"({refused_all:,} refused as not fitting; {spread(rate['all'], '/s')})")
    row(f"planner, memory and step time as arrays, warm ({n:,})", f"{warm:,.0f}/s",
        f"{med(warm_ratios):,.0f}x  (goal >= 1,000x; {spread(warm_ratios)}; "
        f"best call {warm_best:,.0f}/s; {n / cpu['warm']:,.0f} per CPU second)")
    row("planner, the same, first call after llm-analysis's turn", f"{switch:,.0f}/s",
        f"{med(switch_ratios):,.0f}x  ({spread(switch_ratios)}; CPU caches as llm-analysis left them)")
    row("planner, the same, degree and state tables rebuilt", f"{reb:,.0f}/s",
        f"{med(reb_ratios):,.0f}x  ({spread(reb_ratios)}; {n / cpu['rebuilt']:,.0f} per CPU second)")
    row("planner, the same, first call (cold, one run)", f"{n / cold_s:,.0f}/s",
        f"{n / cold_s / overall['all']:,.1f}x  ({n / cold_cpu_s:,.0f} per CPU second)")
    row("planner, memory as arrays", f"{mem:,.0f}/s", f"{med(mem_ratios):,.0f}x")
    row("planner, step time as arrays", f"{tim:,.0f}/s", f"{med(time_ratios):,.0f}x")
    row("planner, memory one layout at a time", f"{ours_mem:,.0f}/s", f"{ours_mem / overall['all']:,.1f}x")
    row(f"planner, memory and step time one at a time ({len(few)})", f"{ours_one:,.0f}/s",
        f"{ours_one / overall['all']:,.1f}x")
    row(f"llm-analysis, the layouts it scores in full ({n_fit:,} of {n:,})", f"{overall['fit']:,.0f}/s",
        f"({spread(rate['fit'], '/s')})")
    row(f"planner, the same {n_fit:,} layouts, warm", f"{fit:,.0f}/s",
        f"{med(fit_ratios):,.0f}x  ({spread(fit_ratios)}; best call {fit_best:,.0f}/s)")
    return {"installed": True, "layouts": n, "rounds": rounds, "round_s": budget_s,
            "llm_analysis_per_s": overall["all"], "llm_analysis_round_per_s": rate["all"],
            "llm_analysis_scored": scored_all, "llm_analysis_refused": refused_all,
            "planner_memory_and_time_vectorised_per_s": warm, "planner_memory_and_time_best_call_per_s": warm_best,
            "planner_memory_and_time_vectorised_per_cpu_s": n / cpu["warm"],
            "ratio_memory_and_time_vectorised": med(warm_ratios), "ratio_memory_and_time_rounds": warm_ratios,
            "planner_warm_round_median_ms": [med(w) * 1e3 for w in calls["warm"]],
            "planner_after_switch_per_s": switch, "ratio_after_switch": med(switch_ratios),
            "ratio_after_switch_rounds": switch_ratios, "turns_per_round": turns,
            "planner_memory_and_time_rebuilt_per_s": reb,
            "planner_memory_and_time_rebuilt_per_cpu_s": n / cpu["rebuilt"],
            "ratio_memory_and_time_rebuilt": med(reb_ratios), "ratio_memory_and_time_rebuilt_rounds": reb_ratios,
            "planner_memory_and_time_cold_per_s": n / cold_s, "planner_memory_and_time_cold_per_cpu_s": n / cold_cpu_s,
            "ratio_memory_and_time_cold": n / cold_s / overall["all"],
            "planner_vectorised_per_s": mem, "ratio_vectorised": med(mem_ratios),
            "planner_time_vectorised_per_s": tim, "ratio_time_vectorised": med(time_ratios),
            "planner_memory_per_s": ours_mem, "planner_memory_and_time_per_s": ours_one,
            "fitting_layouts": n_fit, "llm_analysis_fitting_per_s": overall["fit"],
            "llm_analysis_fitting_round_per_s": rate["fit"],
            "planner_fitting_per_s": fit, "planner_fitting_best_call_per_s": fit_best,
            "ratio_fitting": med(fit_ratios), "ratio_fitting_rounds": fit_ratios}


SECTIONS = ("mission", "scoring", "finetune", "startup", "search", "scaling", "llm-analysis")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, and no llm-analysis")
    ap.add_argument("--no-llm-analysis", action="store_true", help="skip the llm-analysis comparison")
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "planner-bench",
                    help="where llm-analysis's virtual environment lives")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--install-llm-analysis", action="store_true",
                    help="make llm-analysis's virtual environment when it is absent (pip, minutes)")
    ap.add_argument("--only", choices=SECTIONS, action="append", help="run only this section (repeatable)")
    args = ap.parse_args()
    repeats = 2 if args.quick else 5
    run = set(args.only or SECTIONS) - ({"llm-analysis"} if args.quick or args.no_llm_analysis else set())
    # as `plan` does first (planner.cli.main): freed heap memory is kept for reuse
    kept = keep_freed_memory()
    print(f"planner speed, {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}; freed memory kept as plan keeps it: "
          f"{'yes' if kept else 'no (not glibc)'}\n")
    out: dict = {"python": platform.python_version(), "cpus": os.cpu_count(), "freed_memory_kept": kept}
    if "mission" in run:
        out["mission"] = mission(repeats)
    if "scoring" in run:
        out["scoring"] = scoring_rates(repeats)
    if "finetune" in run:
        out["finetune"] = finetune_rates(repeats)
    if "startup" in run:
        out["startup"] = startup(repeats)
    if "search" in run:
        out["full_search"] = full_search(repeats)
    if "scaling" in run:
        out["scaling"] = scaling(max(1, repeats // 2))
    if "llm-analysis" in run:
        out["llm_analysis"] = llm_analysis_comparison(args.cache_dir, rounds=2 * repeats,
                                                     install=args.install_llm_analysis)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
