"""Training logs of four stacks, read back into numbers: per logged step the iteration time
(or the throughput it implies), TFLOP/s or MFU where the stack prints them, and the memory
lines each stack prints. `plan calibrate` fits the step-time model to them.

Formats, each as the code that prints it writes it (versions as installed in the project's
venv, or the repository commit named):

- torchtitan 0.3.0, torchtitan/components/metrics.py ``MetricsProcessor.log``:
  ``step: 10  loss:  7.12345  grad_norm:  1.2345  memory: 38.12GiB(40.15%)  tps: 6,789
  tflops: 393.21  mfu: 39.76%`` (ANSI colours around each field). ``tps`` is tokens per
  second per GPU (local tokens over time x the non-data-parallel size); ``memory`` is
  ``max_reserved_gib``: torch.cuda's ``reserved_bytes.all.peak`` in GiB (DeviceMemoryMonitor).
- Megatron-LM, NVIDIA/Megatron-LM megatron/training/training.py ``training_log``:
  `` iteration       10/     100 | consumed samples: ... | elapsed time per iteration (ms):
  1234.5 | throughput per GPU (TFLOP/s/GPU): 400.1 | ... | global batch size:   128 | ...``;
  megatron/training/utils.py ``report_memory`` (commit 00caa53):
  ``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max allocated: ... |
  reserved: ... | max reserved: ...``, torch.cuda's figures divided by 1024 x 1024.
- DeepSpeed 0.19.8, deepspeed/utils/timer.py ``ThroughputTimer.stop``:
  ``epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=...,
  MemAllocated=...GB, MaxMemAllocated=...GB``; its batch size is the engine's
  train_batch_size (runtime/engine.py), so CurrSamplesPerSec = global batch / step time;
  GB there is 1024**3. deepspeed/runtime/utils.py ``see_memory_usage``:
  ``MA 10.5 GB  Max_MA 12.3 GB  CA 13.0 GB  Max_CA 14 GB`` (CA: reserved; Max_CA rounded
  to whole GiB).
- Hugging Face Trainer (transformers 5.24.0), trainer.py ``_finalize_training`` ->
  trainer_utils.py ``speed_metrics``, printed by trainer_callback.py's ProgressCallback /
  PrinterCallback as a dict: ``{'train_runtime': '812.3', 'train_samples_per_second':
  '40.34', 'train_steps_per_second': '0.315', 'train_loss': '1.52', 'epoch': '1'}`` (floats
  as ``f"{v:.4g}"`` strings in 5.x, bare floats before). It covers the whole run, warm-up
  included: the Trainer prints no per-step time.

Warm-up: the first WARMUP_RECORDS logged step records of a log are left out of its mean
(they hold compilation, NCCL set-up and allocator growth); a log needs one more.
"""

from __future__ import annotations

import ast
import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from planner.errors import UserError
from planner.units import GiB, MiB

MAX_LOG_BYTES = 256 * MiB       # a training log of a long run; more is refused, not read
WARMUP_RECORDS = 3
STACKS = ("torchtitan", "megatron", "deepspeed", "hf-trainer")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)"

# Each pattern is matched from a fixed keyword (str.find), never across a line with ``.*?``:
# a search with a lazy gap restarts at every candidate start and is quadratic in the line's
# length (issue 32, H2: a 280 KB line of "step: 1 loss: " took 34 s).
_TITAN_STEP = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:")
_TITAN_TAIL = re.compile(r"memory:\s*" + _NUM + r"\s*GiB\(\s*" + _NUM + r"%\)\s+tps:\s*" + _NUM
                         + r"(?:\s+tflops:\s*" + _NUM + r")?(?:\s+mfu:\s*(?:" + _NUM + r"%|N/A))?")
_MEGATRON_HEAD = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|")
_MEGATRON_ELAPSED = "elapsed time per iteration (ms):"
_MEGATRON_TIME = re.compile(r"\s*" + _NUM)
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
_MEGATRON_BATCH = re.compile(r"global batch size:\s*(\d+)")
_MEGATRON_MEM = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated:\s*" + _NUM
                           + r" \| max allocated:\s*" + _NUM + r" \| reserved:\s*" + _NUM
                           + r" \| max reserved:\s*" + _NUM)
_DS_TIMER = re.compile(r"global_step=(\d+), RunningAvgSamplesPerSec=" + _NUM + r", CurrSamplesPerSec=" + _NUM
                       + r", MemAllocated=" + _NUM + r"GB, MaxMemAllocated=" + _NUM + r"GB")
_DS_MEM = re.compile(r"\bMA " + _NUM + r" GB\s+Max_MA " + _NUM + r" GB\s+CA " + _NUM + r" GB\s+Max_CA "
                     + _NUM + r" GB")
_HF_KEY = "'train_runtime'"
MAX_LOG_GLOBAL_BATCH = 1 << 24      # planner.training.setup.MAX_GLOBAL_BATCH, --global-batch's bound


class BadFigure(ValueError):
    """A figure of a step or memory line that no run can print (zero, negative, infinite,
    past a float): ``lineno`` (1-based) and what it is."""

    def __init__(self, lineno: int, what: str) -> None:
        super().__init__(what)
        self.lineno = lineno
        self.what = what


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    """One logged step: exactly one of the time measures is set, as the stack prints it."""

    step: int
    step_time_s: float | None = None            # Megatron; the Trainer's mean over the run
    samples_per_s: float | None = None          # DeepSpeed: global-batch sequences per second
    tokens_per_s_per_gpu: float | None = None   # torchtitan's tps
    tflops_per_gpu: float | None = None         # as the stack counts FLOPs (its own formula)
    mfu: float | None = None                    # a fraction (torchtitan prints a percentage)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRecord:
    """A memory line: torch.cuda's peak allocated and peak reserved bytes (None: not printed)."""

    max_allocated_bytes: int | None = None
    max_reserved_bytes: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingLog:
    """What one log file says, with the stack it came from."""

    path: str
    stack: str
    steps: tuple[StepRecord, ...]
    memory: tuple[MemoryRecord, ...]
    global_batch: int | None = None             # Megatron prints it on every iteration line
    warmup_records: int = 0                     # the step records left out of the mean

    @property
    def measured(self) -> tuple[StepRecord, ...]:
        """The step records after warm-up."""
        return self.steps[self.warmup_records:]

    def step_time_s(self, global_batch: int, seq_len: int, n_gpus: int) -> float:
        """Mean seconds per optimizer step over the records after warm-up, from whatever the
        stack prints: iteration time as is; DeepSpeed's samples/s as global batch / rate;
        torchtitan's tokens/s per GPU as (global batch x sequence) / (rate x GPUs)."""
        times = []
        for r in self.measured:
            if r.step_time_s is not None:
                times.append(r.step_time_s)
            elif r.samples_per_s is not None:
                times.append(global_batch / r.samples_per_s)
            elif r.tokens_per_s_per_gpu is not None:
                times.append(global_batch * seq_len / (r.tokens_per_s_per_gpu * n_gpus))
        return statistics.fmean(times)

    @property
    def max_reserved_bytes(self) -> int | None:
        vals = [r.max_reserved_bytes for r in self.memory if r.max_reserved_bytes is not None]
        return max(vals) if vals else None

    @property
    def max_allocated_bytes(self) -> int | None:
        vals = [r.max_allocated_bytes for r in self.memory if r.max_allocated_bytes is not None]
        return max(vals) if vals else None


def _f(text: str) -> float:
    return float(text.replace(",", ""))


def _figure(text: str, what: str, lineno: int) -> float:
    """A figure a step or memory line prints: positive and finite, else BadFigure (issue 32,
    E2: a step time of 0 divided by zero, 1e999 overflowed)."""
    x = _f(text)
    if not (math.isfinite(x) and x > 0):
        raise BadFigure(lineno, f"{what} {text} is not a positive finite figure")
    return x


def _bytes(value: str, unit: int, what: str, lineno: int) -> int:
    return round(_figure(value, what, lineno) * unit)


def _titan_match(line: str) -> tuple[re.Match[str], re.Match[str]] | None:
    """torchtitan's step line: the first step/loss head before its first ``memory:`` field, and
    the fields from there (linear in the line's length)."""
    at = line.find("memory:")
    if at < 0:
        return None
    head = _TITAN_STEP.search(line, 0, at)
    tail = _TITAN_TAIL.match(line, at)
    return (head, tail) if head is not None and tail is not None else None


def parse_torchtitan(lines: Iterable[str]) -> tuple[list[StepRecord], list[MemoryRecord], int | None]:
    steps, mem = [], []
    for lineno, line in enumerate(lines, start=1):
        if "memory:" not in line:
            continue
        found = _titan_match(_ANSI.sub("", line))
        if found is None:
            continue
        head, tail = found
        reserved, _pct, tps, tflops, mfu = tail.groups()
        steps.append(StepRecord(step=int(head.group(1)), tokens_per_s_per_gpu=_figure(tps, "tps", lineno),
                                tflops_per_gpu=_f(tflops) if tflops else None,
                                mfu=_f(mfu) / 100 if mfu else None))
        mem.append(MemoryRecord(max_reserved_bytes=_bytes(reserved, GiB, "memory (GiB)", lineno)))
    return steps, mem, None


def _megatron_iteration(line: str) -> tuple[re.Match[str], str] | None:
    """Megatron-LM's iteration line: its ``iteration N/ M |`` head and the elapsed time's
    figure (linear in the line's length)."""
    at = line.find(_MEGATRON_ELAPSED)
    if at < 0:
        return None
    head = _MEGATRON_HEAD.search(line, 0, at)
    ms = _MEGATRON_TIME.match(line, at + len(_MEGATRON_ELAPSED))
    return (head, ms.group(1)) if head is not None and ms is not None else None


def parse_megatron(lines: Iterable[str]) -> tuple[list[StepRecord], list[MemoryRecord], int | None]:
    steps, mem = [], []
    batch = None
    for lineno, line in enumerate(lines, start=1):
        found = _megatron_iteration(line)
        if found is not None:
            head, ms = found
            tf = _MEGATRON_TFLOPS.search(line)
            steps.append(StepRecord(step=int(head.group(1)),
                                    step_time_s=_figure(ms, "elapsed time per iteration (ms)", lineno) / 1000,
                                    tflops_per_gpu=_f(tf.group(1)) if tf else None))
            b = _MEGATRON_BATCH.search(line)
            if b is not None:
                batch = int(b.group(1)) if len(b.group(1)) < 10 else MAX_LOG_GLOBAL_BATCH + 1
                if not 1 <= batch <= MAX_LOG_GLOBAL_BATCH:      # issue 32, W6 and U8
                    raise BadFigure(lineno, f"global batch size {b.group(1)[:20]} is not from 1 to "
                                            f"{MAX_LOG_GLOBAL_BATCH:,} sequences")
        if "max reserved:" not in line:
            continue
        mm = _MEGATRON_MEM.search(line)
        if mm is not None:
            mem.append(MemoryRecord(max_allocated_bytes=_bytes(mm.group(4), MiB, "max allocated (MB)", lineno),
                                    max_reserved_bytes=_bytes(mm.group(6), MiB, "max reserved (MB)", lineno)))
    return steps, mem, batch


def parse_deepspeed(lines: Iterable[str]) -> tuple[list[StepRecord], list[MemoryRecord], int | None]:
    steps, mem = [], []
    for lineno, line in enumerate(lines, start=1):
        m = _DS_TIMER.search(line) if "global_step=" in line else None
        if m is not None:
            step, _avg, curr, _alloc, max_alloc = m.groups()
            steps.append(StepRecord(step=int(step), samples_per_s=_figure(curr, "CurrSamplesPerSec", lineno)))
            mem.append(MemoryRecord(max_allocated_bytes=_bytes(max_alloc, GiB, "MaxMemAllocated", lineno)))
        mm = _DS_MEM.search(line) if "Max_CA" in line else None
        if mm is not None:
            mem.append(MemoryRecord(max_allocated_bytes=_bytes(mm.group(2), GiB, "Max_MA", lineno),
                                    max_reserved_bytes=_bytes(mm.group(4), GiB, "Max_CA", lineno)))
    return steps, mem, None


def _hf_summaries(line: str) -> Iterable[str]:
    """Each ``{...}`` of a line (no brace inside) that holds 'train_runtime', found by
    str.find from brace to brace: linear in the line's length."""
    at = line.find(_HF_KEY)
    while at >= 0:
        start = line.rfind("{", 0, at)
        end = line.find("}", at)
        if start < 0 or end < 0:
            return
        if "}" not in line[start:at] and "{" not in line[at:end]:
            yield line[start:end + 1]
        at = line.find(_HF_KEY, end)


def parse_hf_trainer(lines: Iterable[str]) -> tuple[list[StepRecord], list[MemoryRecord], int | None]:
    steps = []
    for lineno, line in enumerate(lines, start=1):
        for text in _hf_summaries(line):
            try:
                d = ast.literal_eval(text)
                runtime, per_s = d["train_runtime"], d["train_steps_per_second"]
                float(runtime), float(per_s)
            except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
                continue
            runtime_s = _figure(str(runtime), "train_runtime", lineno)
            steps_per_s = _figure(str(per_s), "train_steps_per_second", lineno)
            steps.append(StepRecord(step=max(1, round(runtime_s * steps_per_s)), step_time_s=1 / steps_per_s))
    return steps, [], None


PARSERS = {"torchtitan": parse_torchtitan, "megatron": parse_megatron, "deepspeed": parse_deepspeed,
           "hf-trainer": parse_hf_trainer}


def parse_log(text: str, path: str = "<log>", warmup: int = WARMUP_RECORDS) -> TrainingLog:
    """The stack whose step lines the text holds (the one with the most), its records, and
    how many leading records are warm-up. UserError when no stack's step line is found."""
    lines = text.splitlines()
    best: tuple[str, list[StepRecord], list[MemoryRecord], int | None] | None = None
    for stack, parser in PARSERS.items():
        try:
            steps, mem, batch = parser(lines)
        except BadFigure as e:
            raise UserError(f"log {path}, line {e.lineno}: {e.what} ({stack}); fix or remove the line") from None
        if steps and (best is None or len(steps) > len(best[1])):
            best = (stack, steps, mem, batch)
    if best is None:
        raise UserError(f"log {path}: no step line of torchtitan, Megatron-LM, DeepSpeed or the Hugging Face "
                        f"Trainer found; give the training log itself (rank 0's stdout)")
    stack, steps, mem, batch = best
    # the Trainer's summary is one figure over the whole run: nothing to leave out
    skip = 0 if stack == "hf-trainer" else min(warmup, len(steps) - 1)
    if stack != "hf-trainer" and len(steps) <= warmup:
        raise UserError(f"log {path}: only {len(steps)} logged step(s) of {stack}, all warm-up (the first "
                        f"{warmup} are left out); log a longer run")
    return TrainingLog(path=path, stack=stack, steps=tuple(steps), memory=tuple(mem), global_batch=batch,
                       warmup_records=skip)


def read_log(path: Path | str, warmup: int = WARMUP_RECORDS) -> TrainingLog:
    """A log file, through planner.limits' checks (a regular file of at most MAX_LOG_BYTES)."""
    from planner.limits import read_input_file

    data = read_input_file(path, f"log {path}", MAX_LOG_BYTES)
    return parse_log(data.decode("utf-8", "replace"), str(path), warmup)
