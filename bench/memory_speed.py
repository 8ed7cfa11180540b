"""Layouts per second of the batched memory model (planner.memory.peak.memory_batch).

Layouts: batch.valid_layouts of llama3.1-405b on every GPU count the search visits up to
16,384 H100s (8 per node), and of llama3.1-70b up to 2,048 (llm-analysis-like 70B layouts),
for full training, LoRA, QLoRA and freeze. Each figure is the median of several calls on
the concatenated batch, after one warm-up call (the per-shape tables are kept across calls,
as in a search). Run: python bench/memory_speed.py
"""

from __future__ import annotations

import statistics
import time

from planner.layouts.batch import LayoutArrays, valid_layouts
from planner.layouts.layout import SearchSpace
from planner.memory.peak import memory_batch
from planner.models.spec import count_params, load_model
from planner.search.search import gpu_counts
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

SETUPS = {
    "full": TrainingSetup(),
    "lora": TrainingSetup(finetune=FinetuneSpec.named("lora")),
    "qlora": TrainingSetup(finetune=FinetuneSpec.named("qlora")),
    "freeze": TrainingSetup(finetune=FinetuneSpec.named("freeze", trainable_layers=2)),
}


def rate(model: str, max_gpus: int, setup: TrainingSetup, repeats: int = 5) -> tuple[int, float]:
    m = load_model(model)
    pc = count_params(m)
    a = LayoutArrays.concat([valid_layouts(m, setup, n, 8, SearchSpace(max_tp=8)) for n in gpu_counts(8, max_gpus)])
    memory_batch(m, setup, a, pc)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        memory_batch(m, setup, a, pc)
        times.append(time.perf_counter() - t)
    return len(a), len(a) / statistics.median(times)


def main() -> None:
    for model, max_gpus in (("llama3.1-405b", 16_384), ("llama3.1-70b", 2_048)):
        for name, setup in SETUPS.items():
            n, per_s = rate(model, max_gpus, setup)
            print(f"{model:14s} {name:7s} {n:8,d} layouts  {per_s:12,.0f} layouts/s")


if __name__ == "__main__":
    main()
