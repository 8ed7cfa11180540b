"""Set-ups that differ only in the global batch swept together (issue 32: `plan buy` of 256
jobs of one model, each its own global batch, swept 7,405 counts one set-up at a time):

- the valid layouts of several global batches from one grid are, batch by batch, the layouts
  enumerate_layouts() (layouts.layout, the rules walked one layout at a time) yields with no
  reject reason, in its order;
- memory.shapes.memory_grad_accum: every term of every layout's memory is the same with the
  accumulation count it gives as with the layout's own (what lets sweep_shared size a layout
  once for every global batch whose count the memory model does not tell apart);
- search.sweep.sweep_shared gives each ask exactly what sweep() gives it alone (the same
  layouts, memory and StepTime, compared with ==), in chunks of any size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from conftest import fast_one

from planner import api
from planner.cost.plan import without_terms
from planner.hardware.gpus import get_gpu
from planner.layouts.batch import LayoutArrays, rejected_layouts, valid_layouts_of_batches
from planner.layouts.layout import SearchSpace, enumerate_layouts
from planner.memory.peak import memory_batch
from planner.memory.shapes import memory_grad_accum
from planner.models.spec import count_params, load_model
from planner.search import sweep as sw
from planner.timing.model import cluster_for
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

BATCHES = (8, 96, 1024, 1032, 1536)      # 8: one micro-batch per step on many layouts; 1032 = 8 x 129


def _rows(a: LayoutArrays) -> list[tuple[int, ...]]:
    # the distributed-optimizer instances as every reader takes them (LayoutArrays.instances: an
    # absent field, or 0, is one instance; the grid leaves the field absent where it is one)
    return list(zip(*((a.instances if f == "optimizer_instances" else a.field(f)).tolist()
                      for f in LayoutArrays.FIELDS)))


@pytest.mark.parametrize("model, n, space", fast_one([
    ("llama3.1-8b", 16, SearchSpace(ep=1)),
    ("mixtral-8x7b", 32, SearchSpace()),
    ("llama3.1-70b", 64, SearchSpace(ep=1, micro_batches=(1, 2))),
], "llama3.1-8b", unpack=True))
def test_the_grid_of_batches_is_each_batch_enumerated(model, n, space):
    m = load_model(model)
    arrays, starts = valid_layouts_of_batches(m, TrainingSetup(), BATCHES, n, 8, space)
    assert starts[0] == 0 and starts[-1] == len(arrays)
    for b, lo, hi in zip(BATCHES, starts, starts[1:]):
        setup = TrainingSetup(global_batch=b)
        expected = LayoutArrays.from_layouts([lay for lay, why in enumerate_layouts(m, setup, n, 8, space)
                                              if why is None and not lay.ep_fold])
        assert _rows(arrays.take(slice(lo, hi))) == _rows(expected), b


@pytest.mark.parametrize("limit", fast_one([1, 2, 7, 10_000], 1, 10_000))
def test_the_rejected_layouts_are_enumerations_rejects(limit):
    """layouts.batch.rejected_layouts (the grid's cells, each once per recomputation mode, cut
    at ``limit``) against enumerate_layouts' rejects and reasons, in its order."""
    m, setup = load_model("mixtral-8x7b"), TrainingSetup(global_batch=100)
    got = rejected_layouts(m, setup, 24, 8, SearchSpace(), limit)
    expected = [(lay, why) for lay, why in enumerate_layouts(m, setup, 24, 8, SearchSpace())
                if why is not None and not lay.ep_fold][:limit]
    assert [(lay.key, why) for lay, why in got] == [(lay.key, why) for lay, why in expected]


def _leaves(x, path=""):
    """Every array and number of a memory batch, by path (dataclasses, tuples and dicts walked)."""
    if isinstance(x, np.ndarray):
        yield path, x
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _leaves(getattr(x, f.name), f"{path}.{f.name}")
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}[{k}]")
    elif isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, x


@pytest.mark.parametrize("setup", [
    TrainingSetup(),
    TrainingSetup(pp_balance="embedding-loss"),          # the exact interleaved schedule (vp > 1)
    TrainingSetup(pp_microbatch_group=2),                # a micro-batch group other than pp
    TrainingSetup(offload_optimizer="cpu"),
    TrainingSetup(finetune=FinetuneSpec.named("lora")),
])
def test_memory_is_the_same_at_the_accumulation_memory_reads(setup):
    m = load_model("llama3.1-8b")
    m = replace(m, n_layers=14)          # pp x vp up to 16 on 32 GPUs, with the embedding and loss too
    pc = count_params(m)
    arrays, _ = valid_layouts_of_batches(m, setup, (16, 32, 64, 96, 512, 2048), 32, 8, SearchSpace(ep=1))
    assert (arrays.vp > 1).any() and (arrays.pp >= 4).any() and (arrays.grad_accum == 1).any()
    ga = memory_grad_accum(arrays, setup)
    assert (ga < arrays.grad_accum).mean() > 0.3       # the saturation is what is shared
    own = memory_batch(m, setup, arrays, pc, 8)
    read = memory_batch(m, setup, replace(arrays, grad_accum=ga), pc, 8)
    a, b = dict(_leaves(own)), dict(_leaves(read))
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def _asks(setups, gpus, keep, host_bytes=None):
    """An Ask per set-up and GPU type (``host_bytes``: a node's host memory instead of the topology's)."""
    out = []
    for setup in setups:
        for g in gpus:
            gpu = get_gpu(g)
            cluster = cluster_for(gpu)
            host, nvme = api.host_capacities(cluster)
            out.append(sw.Ask(setup=setup, cluster=cluster, capacity_bytes=api.capacity_bytes(gpu, setup), keep=keep,
                              host_capacity_bytes=host if host_bytes is None else host_bytes, nvme_capacity_bytes=nvme))
    return out


def _alone(m, space, n, ask):
    (cb,) = sw.sweep(m, ask.setup, ask.cluster, [n], ask.capacity_bytes, space, ask.eff, ask.keep,
                     ask.host_capacity_bytes, ask.nvme_capacity_bytes)
    return without_terms(cb)


@pytest.mark.parametrize("model, n, base, space, keep, rows", [
    ("llama3.1-8b", 16, TrainingSetup(), SearchSpace(ep=1, max_tp=8), 1, sw.SHARED_ROWS),
    ("llama3.1-8b", 64, TrainingSetup(), SearchSpace(ep=1, max_tp=8), 3, 2000),     # in chunks
    ("llama3.1-70b", 32, TrainingSetup(pp_balance="embedding-loss"), SearchSpace(ep=1, max_tp=8), 2, sw.SHARED_ROWS),
    ("mixtral-8x7b", 16, TrainingSetup(), SearchSpace(max_tp=8), 1, 3000),
])
def test_sweeping_together_gives_each_ask_what_it_finds_alone(monkeypatch, model, n, base, space, keep, rows):
    m = load_model(model)
    monkeypatch.setattr(sw, "SHARED_ROWS", rows)
    setups = [replace(base, global_batch=b) for b in BATCHES]
    asks = _asks(setups, ("h100", "h200"), keep)
    together = sw.sweep_shared(m, space, n, 8, asks)
    for ask, cb in zip(asks, together):
        alone = _alone(m, space, n, ask)
        assert without_terms(cb) == alone, (ask.setup.global_batch, ask.cluster.gpu.name)
    assert any(cb.fastest for cb in together)


def test_sweeping_together_refuses_set_ups_that_differ_in_more_than_the_batch():
    m = load_model("llama3.1-8b")
    asks = _asks([TrainingSetup(), TrainingSetup(seq_len=8192)], ("h100",), 1)
    with pytest.raises(ValueError, match="more than the global batch"):
        sw.sweep_shared(m, SearchSpace(ep=1), 8, 8, asks)
