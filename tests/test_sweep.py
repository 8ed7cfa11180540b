"""planner.search.sweep keeps the fastest fitting layouts per GPU count from one batch of step
times per count: it must find exactly what search() finds timing each fitting layout on its own,
and the memory floors must be floors."""

import random

import pytest

from planner import api
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import SearchSpace, enumerate_layouts
from planner.memory.model import (
    activation_floor_bytes,
    memory_floor_bytes,
    per_rank_memory,
)
from planner.models.spec import load_model
from planner.search.search import search
from planner.search.sweep import sweep
from planner.timing.model import cluster_for, step_time
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup


def brute(m, setup, gpu, cluster, space, n, keep):
    """Every fitting layout on n GPUs timed and ranked, as the plain search does."""
    res = search(m, setup, api.capacity_bytes(gpu, setup), gpu.gpus_per_node, [n], space,
                 timer=lambda lay: step_time(m, setup, lay, cluster))
    return [c.time.step_time_s for c in res.fitting[:keep]]


@pytest.mark.slow
@pytest.mark.parametrize("model, gpu_name, counts, setup", [
    ("70b", "h100", [16, 24, 64], TrainingSetup()),
    ("8b", "a100", [1, 4, 24], TrainingSetup()),
    ("8b", "l40s", [8, 48], TrainingSetup(seq_len=8192, global_batch=512)),
    ("mixtral-8x7b", "h100", [16, 32], TrainingSetup()),
    ("gpt2", "4090", [1, 2, 8], TrainingSetup(seq_len=1024)),
    ("8b", "h100", [2, 8], TrainingSetup(finetune=FinetuneSpec.named("lora"))),
    ("8b", "a100-40gb", [8], TrainingSetup(offload_optimizer="cpu")),
])
def test_sweep_finds_what_timing_everything_finds(model, gpu_name, counts, setup):
    m, gpu = load_model(model), get_gpu(gpu_name)
    cluster = cluster_for(gpu)
    space = SearchSpace(ep=None if m.is_moe else 1, max_tp=max(gpu.gpus_per_node, api.scale_up_domain_gpus(cluster)))
    found = sweep(m, setup, cluster, counts, api.capacity_bytes(gpu, setup), space, keep=3)
    for n, cb in zip(counts, found):
        assert cb.n_gpus == n
        assert [c.time.step_time_s for c in cb.fastest] == pytest.approx(brute(m, setup, gpu, cluster, space, n, 3),
                                                                         rel=1e-12)
        assert all(c.fits for c in cb.fastest)


def test_sweep_with_a_pinned_space():
    m, gpu = load_model("8b"), get_gpu("h100")
    cluster = cluster_for(gpu)
    space = SearchSpace(ep=1, tp=2, micro_batches=(2,), recomputes=("none",), max_tp=8)
    (cb,) = sweep(m, TrainingSetup(), cluster, [16], api.capacity_bytes(gpu, TrainingSetup()), space, keep=2)
    assert all(c.layout.tp == 2 and c.layout.micro_batch == 2 for c in cb.fastest)
    assert [c.time.step_time_s for c in cb.fastest] == pytest.approx(
        brute(m, TrainingSetup(), gpu, cluster, space, 16, 2))


SETUPS = [TrainingSetup(), TrainingSetup(precision="fp32"), TrainingSetup(optimizer="adafactor"),
          TrainingSetup(finetune=FinetuneSpec.named("qlora")), TrainingSetup(finetune=FinetuneSpec.named("freeze")),
          TrainingSetup(offload_optimizer="cpu"), TrainingSetup(attention="eager", kernels="eager")]


@pytest.mark.slow
@pytest.mark.parametrize("setup", SETUPS)
def test_memory_floors_are_floors(setup):
    rng = random.Random(5)
    for name in ("8b", "mixtral-8x7b", "gpt2"):
        m = load_model(name)
        for n in (1, 8, 32):
            lays = [lay for lay, reason in enumerate_layouts(m, setup, n, 8, SearchSpace()) if reason is None]
            for lay in rng.sample(lays, min(40, len(lays))):
                total = per_rank_memory(m, setup, lay).total
                assert activation_floor_bytes(m, setup, lay) <= total
                assert memory_floor_bytes(m, setup, lay) <= total


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "qlora", "freeze"])
@pytest.mark.parametrize("model, n", [("8b", 8), ("mixtral-8x7b", 16), ("70b", 64)])
def test_count_layouts_are_enumerate_layouts(method, model, n):
    # the sweep enumerates a fine-tuning set-up's layouts as arrays: the full-training
    # layouts, less those a quantized base rules out; the same layouts in the same order as
    # enumerate_layouts() keeps
    from planner.search.sweep import count_layouts
    m, setup = load_model(model), TrainingSetup(finetune=FinetuneSpec.named(method))
    space = SearchSpace(max_tp=8, ep=None if m.is_moe else 1)
    a = count_layouts(m, setup, n, 8, space)
    want = [lay for lay, reason in enumerate_layouts(m, setup, n, 8, space) if reason is None]
    assert [a.layout(i, setup.seq_len) for i in range(len(a))] == want


def test_rank_order_is_the_full_sort():
    # issue 32: the sweep sorts the rows no slower than the keep-th fastest first and the
    # rest only when asked; the referee is one np.lexsort of every row by rank_columns, on
    # random batches with tied and NaN step times, every keep from 1 to past the batch
    import numpy as np

    from planner.layouts.batch import RECOMPUTES, LayoutArrays
    from planner.search.search import RECOMPUTE_COST, rank_columns
    from planner.search.sweep import _rank_order

    rng = np.random.default_rng(32)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        a = LayoutArrays(*(rng.integers(0 if f in ("recompute", "zero_stage", "sharding", "sp") else 1,
                                        2 if f in ("sp",) else 3, n) for f in LayoutArrays.FIELDS))
        times = rng.choice([1.0, 2.0, 3.0, np.inf, np.nan], n)
        headroom = rng.integers(0, 3, n)
        rc = np.array([RECOMPUTE_COST[r] for r in RECOMPUTES])[a.recompute]
        full = np.lexsort(rank_columns(times, rc, a.pp, a.cp, a.tp, a.zero_stage, a.sharding > 0, a.micro_batch,
                                       a.vp, headroom)[::-1]).tolist()
        for keep in (1, 2, 3, n, n + 1):
            assert list(_rank_order(a, times, headroom, keep)) == full


@pytest.mark.parametrize("model, gpu_name, n, setup", [
    ("70b", "h100", 64, TrainingSetup()),
    ("deepseek-v3", "h200", 256, TrainingSetup(seq_len=4096)),
    ("8b", "a100", 8, TrainingSetup(finetune=FinetuneSpec.named("qlora"))),
    ("qwen3-next-80b-a3b", "b200", 32, TrainingSetup(seq_len=4096)),
])
def test_the_picked_rows_are_the_step_times_of_those_layouts_alone(model, gpu_name, n, setup):
    # step_times_picked reads the StepTime of the rows it is asked for off the batch it timed;
    # the referee is timing.step_times of those layouts as a batch of their own, as the sweep
    # did before (issue 32): equal in every field, and the times equal step_times_s's
    import numpy as np

    from planner.layouts.batch import valid_layouts
    from planner.timing.fast import step_times, step_times_picked, step_times_s
    from planner.timing.model import DEFAULT_EFFICIENCY

    m, gpu = load_model(model), get_gpu(gpu_name)
    cluster = cluster_for(gpu)
    a = valid_layouts(m, setup, n, gpu.gpus_per_node)
    assert len(a)
    picked = [0, len(a) - 1, len(a) // 2, len(a) // 3]
    times, rows = step_times_picked(m, setup, a, cluster, DEFAULT_EFFICIENCY, None, lambda t: picked)
    assert np.array_equal(times, step_times_s(m, setup, a, cluster), equal_nan=True)
    alone = step_times(m, setup, [a.layout(i, setup.seq_len) for i in picked], cluster)
    assert rows == alone
