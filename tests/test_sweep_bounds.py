"""The sweep times exactly only the layouts whose lower bound is within their segment's limit
(search.sweep._timed_together, timing.fast.BoundedTimes; issue 32: the 8-model `plan buy`):

- the bound (the pipeline, floored) is at most the step time the whole batch gives each layout
  (timing.fast.step_times_s, the batch evaluated whole, as the sweep did before), and the exact
  times and StepTimes BoundedTimes gives any rows are those of the whole batch, to the bit;
- a sweep that prunes by the bound keeps what the sweep that times every layout keeps (the same
  layouts, memory and StepTime, compared with ==), with one and several layouts kept, where a
  fast layout overflows the host's memory (the walk passes the limit and the segment is walked
  again over all its rows), and where the efficiencies make the bound -inf.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_sweep_shared import _asks  # an Ask per set-up and GPU type

from planner.cost.plan import without_terms
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import SearchSpace
from planner.models.spec import count_params, load_model
from planner.search import sweep as sw
from planner.timing.context import layout_context
from planner.timing.efficiency import DEFAULT_EFFICIENCY
from planner.timing.fast import step_time_bounds, step_times, step_times_s
from planner.timing.model import cluster_for
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

BATCHES = (96, 1024, 1032, 1536)


@pytest.mark.parametrize("model, n, setup, space, gpu", [
    ("llama3.1-8b", 64, TrainingSetup(), SearchSpace(ep=1), "h100"),
    ("llama3.1-70b", 32, TrainingSetup(pp_balance="embedding-loss"), SearchSpace(ep=1), "b200"),
    ("mixtral-8x7b", 32, TrainingSetup(), SearchSpace(), "h200"),
    ("llama3.1-8b", 16, TrainingSetup(finetune=FinetuneSpec.named("lora")), SearchSpace(ep=1), "a100"),
    ("llama3.1-8b", 16, TrainingSetup(offload_optimizer="cpu"), SearchSpace(ep=1), "h100"),
])
def test_the_bound_is_below_the_whole_batchs_step_time(model, n, setup, space, gpu):
    m = load_model(model)
    cluster = cluster_for(get_gpu(gpu))
    a = sw.count_layouts(m, setup, n, 8, space)
    whole = step_times_s(m, setup, a, cluster)          # the batch evaluated whole
    bounds = step_time_bounds(layout_context(m, setup, a, count_params(m)), cluster, DEFAULT_EFFICIENCY)
    rows = np.arange(len(a))
    lower = bounds.lower_s(rows)
    assert ((lower <= whole) | np.isnan(whole)).all()
    assert (lower > 0).all() and (lower == whole).any()
    some = np.random.default_rng(0).choice(len(a), size=min(300, len(a)), replace=False)
    some.sort()
    assert np.array_equal(bounds.times_s(some), whole[some], equal_nan=True)
    picked = some[:5]
    times, kept = bounds.picked(some, lambda t: list(range(5)))
    assert np.array_equal(times, whole[some], equal_nan=True)
    assert kept == step_times(m, setup, [a.layout(i, setup.seq_len) for i in picked], cluster)


def _swept(monkeypatch, m, space, n, asks, prune_rows):
    monkeypatch.setattr(sw, "PRUNE_ROWS", prune_rows)
    return [without_terms(cb) for cb in sw.sweep_shared(m, space, n, 8, asks)]


@pytest.mark.parametrize("model, n, base, space, keep", [
    ("llama3.1-8b", 64, TrainingSetup(), SearchSpace(ep=1), 1),
    ("llama3.1-8b", 32, TrainingSetup(), SearchSpace(ep=1), 3),
    ("mixtral-8x7b", 16, TrainingSetup(), SearchSpace(), 2),
])
def test_a_pruned_sweep_keeps_what_the_whole_sweep_keeps(monkeypatch, model, n, base, space, keep):
    m = load_model(model)
    asks = _asks([replace(base, global_batch=b) for b in BATCHES], ("h100", "b200"), keep)
    whole = _swept(monkeypatch, m, space, n, asks, 10**9)
    pruned = _swept(monkeypatch, m, space, n, asks, 0)
    assert pruned == whole
    assert sum(len(cb.fastest) for cb in whole) >= len(asks)


def test_a_layout_over_the_hosts_memory_walks_its_segment_again(monkeypatch):
    """Optimizer states offloaded to a host of 200 GB per node: the fastest layouts that fit the
    GPU overflow the host, the walk passes its limit, and the segment is walked over all rows."""
    m = load_model("llama3.1-8b")
    setups = [TrainingSetup(offload_optimizer="cpu", global_batch=b) for b in BATCHES]
    asks = _asks(setups, ("h100",), 1, host_bytes=200 * 10**9)
    again = []
    whole_walk = sw._timed_together

    def counted(*args, **kw):
        if args[-1] is False:
            again.append(len(args[4]))
        return whole_walk(*args, **kw)

    whole = _swept(monkeypatch, m, SearchSpace(ep=1), 8, asks, 10**9)
    monkeypatch.setattr(sw, "_timed_together", counted)
    pruned = _swept(monkeypatch, m, SearchSpace(ep=1), 8, asks, 0)
    assert pruned == whole
    assert again, "no segment walked past its limit"
    assert all(cb.fastest for cb in whole)


def test_efficiencies_that_void_the_bound_prune_nothing(monkeypatch):
    m = load_model("llama3.1-8b")
    eff = replace(DEFAULT_EFFICIENCY, overlap_slowdown=-0.1)
    asks = [replace(a, eff=eff) for a in _asks([TrainingSetup(global_batch=b) for b in BATCHES], ("h100",), 1)]
    a = sw.count_layouts(m, asks[0].setup, 32, 8, SearchSpace(ep=1))
    bounds = step_time_bounds(layout_context(m, asks[0].setup, a), asks[0].cluster, eff)
    assert (bounds.lower_s(np.arange(len(a))) == -np.inf).all()
    assert _swept(monkeypatch, m, SearchSpace(ep=1), 32, asks, 0) == \
        _swept(monkeypatch, m, SearchSpace(ep=1), 32, asks, 10**9)


@pytest.mark.parametrize("model, ns, space", [
    ("llama3.1-8b", (1, 2, 4, 8, 16), SearchSpace(ep=1)),
    ("mixtral-8x7b", (8, 16, 32), SearchSpace()),
])
def test_several_counts_swept_together_give_each_what_it_finds_alone(model, ns, space):
    """search.sweep.sweep_shared_counts (cost.plan.sweep_counts_until's counts swept ahead)
    against sweep_shared of each count on its own, compared with ==."""
    m = load_model(model)
    asks = _asks([TrainingSetup(global_batch=b) for b in (96, 1024)], ("h100", "h200"), 1)
    together = sw.sweep_shared_counts(m, space, list(ns), 8, asks)
    for n, cbs in zip(ns, together):
        assert [without_terms(cb) for cb in cbs] == [without_terms(cb) for cb in sw.sweep_shared(m, space, n, 8, asks)]
        assert all(cb.n_gpus == n for cb in cbs)
    assert any(cb.fastest for cbs in together for cb in cbs)


def test_a_step_time_below_its_bound_is_an_internal_error_not_passed_over(monkeypatch, capsys):
    """A bound above a timed row's step time (here every bound doubled) would prune layouts that
    can win: the sweep raises, with `python -O` too (no bare assert), and under the CLI's guard
    (cli.common.run_safely) that ends on one line "internal error: ..." with status 1, never an
    answer that skipped them."""
    from planner.cli.common import run_safely
    from planner.timing.fast import BoundedTimes

    lower_s = BoundedTimes.lower_s
    monkeypatch.setattr(BoundedTimes, "lower_s", lambda self, rows: 2 * lower_s(self, rows))
    m = load_model("llama3.1-8b")
    asks = _asks([TrainingSetup(global_batch=b) for b in BATCHES], ("h100",), 1)
    with pytest.raises(AssertionError, match="a step time below its lower bound"):
        _swept(monkeypatch, m, SearchSpace(ep=1), 32, asks, 0)
    with pytest.raises(SystemExit) as stop:
        run_safely(lambda: _swept(monkeypatch, m, SearchSpace(ep=1), 32, asks, 0))
    err = capsys.readouterr().err
    assert stop.value.code == 1
    assert err.startswith("internal error: AssertionError: a step time below its lower bound") and err.count("\n") == 1


@pytest.mark.slow   # python -O subprocess, 2 s; fast: test_a_pruned_sweep_keeps_what_the_whole_sweep_keeps
def test_under_python_O_a_segment_keeps_each_layout_once():
    """The walk past a segment's head skipped the head with `assert next(walk) == head`, which
    `python -O` drops: the fastest layout was then kept twice (3 kept, 2 distinct, for 32 GPUs of
    Llama 3.1 8B with keep 3). Run here under -O, each kept layout is distinct."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.path.insert(0, sys.argv[1]); from test_sweep_shared import _asks; "
            "from planner.layouts.layout import SearchSpace; from planner.models.spec import load_model; "
            "from planner.search import sweep as sw; from planner.training.setup import TrainingSetup; "
            "asks = _asks([TrainingSetup(global_batch=b) for b in (96, 1024)], ('h100',), 3); "
            "kept = [[repr(c.layout) for c in cb.fastest] for cb in "
            "sw.sweep_shared(load_model('llama3.1-8b'), SearchSpace(ep=1), 32, 8, asks)]; "
            "print(all(len(k) == 3 == len(set(k)) for k in kept))")
    out = subprocess.run([sys.executable, "-O", "-c", code, str(Path(__file__).parent)], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stdout + out.stderr
