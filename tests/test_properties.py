"""Properties across random models, GPUs, topologies and layouts (hypothesis).

- the memory and time models never raise on a valid layout, and give positive, finite
  numbers (memory in whole bytes, step times in seconds, MFU at most 1);
- monotonic: more usable memory never needs more GPUs, a deeper model never fewer, a
  larger global batch never a shorter step;
- the same input gives the same output (also across Python hash seeds);
- the vectorised layouts (planner.layouts.batch) equal enumerate_layouts, and the memory
  model on a batch (planner.memory.peak) equals it on a batch of one.

tests/test_solve.py checks the ILPs against brute force on random instances.

tests/test_memory_properties.py holds the per-layout memory orderings (ZeRO stages,
sharding degree, micro-batch, sequence, recomputation).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner import api
from planner.hardware.gpus import get_gpu, list_gpus
from planner.hardware.topology import list_topologies
from planner.layouts.layout import SearchSpace, enumerate_layouts, reject_reason
from planner.memory.model import per_rank_memory
from planner.models.spec import ModelSpec, count_params
from planner.report import terminal as term
from planner.report import text as report
from planner.report.screen import render
from planner.timing.model import cluster_for, step_time
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

# PLANNER_HYPOTHESIS_EXAMPLES=1000 for a long hunt with fresh random examples
EXAMPLES = int(os.environ.get("PLANNER_HYPOTHESIS_EXAMPLES", "30"))
PROPS = settings(max_examples=EXAMPLES, deadline=None, derandomize="PLANNER_HYPOTHESIS_EXAMPLES" not in os.environ,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
GPU_NAMES = [g.name for g in list_gpus()]
TOPOLOGY_NAMES = [t.name for t in list_topologies()]


@st.composite
def models(draw) -> ModelSpec:
    """Decoders of the families the loader reads: GQA or not, gated or GeLU MLPs, MoE,
    LayerNorm or RMSNorm, tied embeddings, dropout, parallel blocks, learned positions."""
    n_kv = draw(st.sampled_from([1, 2, 4, 8]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    moe = draw(st.booleans())
    n_experts = draw(st.sampled_from([4, 8])) if moe else 0
    learned = draw(st.booleans())
    return ModelSpec(
        name="random", model_type="llama", n_layers=draw(st.integers(1, 48)),
        d_model=n_heads * head_dim, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        d_ff=64 * draw(st.integers(1, 448)), vocab_size=draw(st.integers(1000, 160_000)),
        max_positions=4096 if learned else 0, position="learned" if learned else "rope",
        tied_embeddings=draw(st.booleans()), gated_mlp=draw(st.booleans()),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])), parallel_block=draw(st.booleans()),
        qkv_bias=draw(st.booleans()), activation=draw(st.sampled_from(["silu", "gelu", "gelu_new"])),
        n_experts=n_experts, n_experts_per_token=min(2, n_experts) if moe else 0,
        hidden_dropout=draw(st.sampled_from([0.0, 0.1])), attention_dropout=draw(st.sampled_from([0.0, 0.1])),
    )


@st.composite
def setups(draw, seq_len: int | None = None) -> TrainingSetup:
    return TrainingSetup(
        seq_len=seq_len or draw(st.sampled_from([256, 1024, 2048, 4096])),
        global_batch=draw(st.sampled_from([64, 128, 256, 1024])),
        precision=draw(st.sampled_from(["bf16-mixed", "fp16-mixed", "fp32", "bf16"])),
        optimizer=draw(st.sampled_from(["adamw", "sgd", "adam8bit", "adafactor"])),
        attention=draw(st.sampled_from(["flash", "eager"])),
        kernels=draw(st.sampled_from(["auto", "eager", "fused"])),
    )


@st.composite
def clusters(draw):
    """A GPU and its cluster: a shipped topology of that GPU, or none (the GPU's own figures)."""
    name = draw(st.sampled_from([None, *TOPOLOGY_NAMES]))
    if name is None:
        gpu = get_gpu(draw(st.sampled_from(GPU_NAMES)))
        return gpu, cluster_for(gpu, None) if gpu.default_topology is None else _bare(gpu)
    top = next(t for t in list_topologies() if t.name == name)
    gpu = get_gpu(top.gpu)
    return gpu, cluster_for(gpu, top)


def _bare(gpu):
    from planner.hardware.placement import Cluster
    return Cluster(gpu=gpu, topology=None)


@st.composite
def valid_cases(draw):
    """A model, set-up, GPU, cluster and one valid layout on up to 64 GPUs."""
    m, setup = draw(models()), draw(setups())
    gpu, cluster = draw(clusters())
    if setup.precision.startswith("bf16"):
        assume(gpu.bf16_flops_per_s is not None)
    n = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
    space = SearchSpace(micro_batches=(draw(st.sampled_from([1, 2, 4])),),
                        recomputes=(draw(st.sampled_from(["none", "selective", "full"])),),
                        max_tp=gpu.gpus_per_node)
    valid = [lay for lay, why in enumerate_layouts(m, setup, n, gpu.gpus_per_node, space) if why is None]
    assume(valid)
    return m, setup, gpu, cluster, draw(st.sampled_from(valid))


# ------------------------------------------------------------------ no exception, finite

@pytest.mark.slow
@PROPS
@given(valid_cases())
def test_memory_and_time_are_positive_and_finite(case):
    m, setup, gpu, cluster, lay = case
    mem = per_rank_memory(m, setup, lay, gpus_per_node=gpu.gpus_per_node)
    parts = mem.breakdown.as_dict()
    assert all(isinstance(v, int) and v >= 0 for v in parts.values()), parts
    assert mem.total > 0 and mem.breakdown.weights > 0
    t = step_time(m, setup, lay, cluster)
    for v in (t.step_time_s, t.compute_s, t.micro_batch_s, t.bubble_s, t.optimizer_s, *t.comm_s.values()):
        assert math.isfinite(v) and v >= 0, t
    assert t.step_time_s > 0 and t.compute_s > 0
    assert 0 < t.mfu <= 1, t.mfu
    assert t.tokens_per_step == lay.global_batch * lay.seq_len


@pytest.mark.slow
@PROPS
@given(valid_cases())
def test_evaluating_a_layout_never_raises(case):
    m, setup, gpu, cluster, lay = case
    r = api.evaluate_layout(m, gpu, setup, lay, cluster=cluster)
    assert r.best is not None and r.best.memory.total > 0
    if r.best.fits:
        assert r.best.time is not None and math.isfinite(r.best.time.step_time_s)
    json.loads(report.to_json(r))
    assert render(term.plan_view(r))


# ------------------------------------------------------------------------- monotonic

def smallest_count(m, gpu, setup, max_gpus=256):
    r = api.plan(m, gpu, setup, max_gpus=max_gpus)
    return r.best.n_gpus if r.fits else math.inf


@pytest.mark.slow
@PROPS
@given(m=models(), gpu=st.sampled_from(["h100", "a100-40gb", "4090", "mi300x"]),
       fractions=st.tuples(st.floats(0.3, 1.0), st.floats(0.3, 1.0)))
def test_more_usable_memory_never_needs_more_gpus(m, gpu, fractions):
    low, high = sorted(fractions)
    g = get_gpu(gpu)
    setup = TrainingSetup(seq_len=1024, global_batch=256)
    assert (smallest_count(m, g, replace(setup, usable_memory_fraction=high))
            <= smallest_count(m, g, replace(setup, usable_memory_fraction=low)))


@pytest.mark.slow
@PROPS
@given(m=models(), extra=st.integers(1, 16), gpu=st.sampled_from(["h100", "4090"]))
def test_a_deeper_model_never_needs_fewer_gpus(m, extra, gpu):
    g = get_gpu(gpu)
    setup = TrainingSetup(seq_len=1024, global_batch=256)
    deeper = replace(m, n_layers=m.n_layers + extra)
    assert count_params(deeper).total > count_params(m).total
    assert smallest_count(deeper, g, setup) >= smallest_count(m, g, setup)


@pytest.mark.slow
@PROPS
@given(valid_cases(), st.sampled_from([2, 4]))
def test_a_larger_global_batch_never_shortens_the_step(case, factor):
    m, setup, gpu, cluster, lay = case
    more = replace(lay, grad_accum=lay.grad_accum * factor)
    bigger = replace(setup, global_batch=setup.global_batch * factor)
    assume(reject_reason(m, bigger, more, gpu.gpus_per_node) is None)
    assert step_time(m, bigger, more, cluster).step_time_s >= step_time(m, setup, lay, cluster).step_time_s


@PROPS
@given(valid_cases())
def test_a_longer_sequence_never_takes_less_memory(case):
    m, setup, gpu, _cluster, lay = case
    longer = replace(lay, seq_len=lay.seq_len * 2)
    s2 = replace(setup, seq_len=longer.seq_len)
    assume(reject_reason(m, s2, longer, gpu.gpus_per_node) is None)
    assert (per_rank_memory(m, s2, longer, gpus_per_node=gpu.gpus_per_node).total
            >= per_rank_memory(m, setup, lay, gpus_per_node=gpu.gpus_per_node).total)


# ------------------------------------------------------------------- same in, same out

@pytest.mark.slow
@PROPS
@given(m=models(), gpu=st.sampled_from(["h100", "a100", "4090"]))
def test_the_same_input_gives_the_same_output(m, gpu):
    g = get_gpu(gpu)
    setup = TrainingSetup(seq_len=1024, global_batch=128)
    first = report.to_json(api.plan(m, g, setup, max_gpus=128))
    again = report.to_json(api.plan(m, g, setup, max_gpus=128))
    assert first == again


@pytest.mark.slow
def test_the_same_command_prints_the_same_bytes_under_any_hash_seed():
    outs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        p = subprocess.run([sys.executable, "-m", "planner", "--model", "mixtral-8x7b", "--gpus", "a100",
                            "--n-gpus", "16", "--json"], capture_output=True, text=True, env=env, timeout=120,
                           check=False)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]


# ------------------------------------- the batched model: a batch of one is a row of a batch

@st.composite
def fast_cases(draw):
    """A model, a set-up (full training, LoRA, QLoRA or freeze; any offload), a GPU count and a
    search space."""
    m = draw(models())
    setup = replace(draw(setups()), optimizer_foreach=draw(st.booleans()),
                    global_batch=draw(st.sampled_from([8, 24, 64, 96, 512])))
    if draw(st.booleans()):
        setup = replace(setup, optimizer_state_bytes=draw(st.sampled_from([2, 4.0, 6.5])))
    setup = replace(setup, finetune=draw(st.sampled_from(
        [FinetuneSpec(), FinetuneSpec(), FinetuneSpec.named("lora"), FinetuneSpec.named("qlora"),
         FinetuneSpec.named("freeze", trainable_layers=1)])))
    if draw(st.integers(0, 3)) == 0:
        setup = replace(setup, offload_optimizer=draw(st.sampled_from(["none", "cpu", "nvme"])),
                        offload_params=draw(st.sampled_from(["none", "cpu", "nvme"])))
    n = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128]))
    gpn = draw(st.sampled_from([4, 8]))
    space = SearchSpace(max_tp=gpn, micro_batches=tuple(draw(st.sets(st.sampled_from([1, 2, 3, 4, 8]), min_size=1))),
                        fsdp=draw(st.sampled_from([None, None, "full", "grad-op", "hybrid"])),
                        vp=draw(st.sampled_from([None, None, 2, 3])))
    return m, setup, n, gpn, space


@pytest.mark.slow
@settings(PROPS, max_examples=EXAMPLES * 3)
@given(fast_cases(), st.randoms(use_true_random=False))
def test_a_batch_of_one_is_a_row_of_the_batch_and_order_does_not_matter(case, rnd):
    # the rules table over a grid gives the layouts (and reasons) enumeration gives one by one;
    # memory_batch of all of them at once equals per_rank_memory (a batch of one) row by row,
    # and shuffling the batch shuffles the answers
    from planner.layouts import batch as layout_batch
    from planner.memory.model import rank_memories
    from planner.memory.peak import memory_batch

    m, setup, n, gpn, space = case
    enumerated = list(enumerate_layouts(m, setup, n, gpn, space))
    want = [lay for lay, why in enumerated if why is None]
    arrays = layout_batch.valid_layouts(m, setup, n, gpn, space)
    assert [arrays.layout(i, setup.seq_len) for i in range(len(arrays))] == want
    assert layout_batch.rejected_layouts(m, setup, n, gpn, space, 50) == [(x, r) for x, r in enumerated if r][:50]
    batch = rank_memories(memory_batch(m, setup, arrays, gpus_per_node=gpn))
    some = sorted(rnd.sample(range(len(want)), min(len(want), 12)))    # a batch of one each
    assert [batch[i] for i in some] == [per_rank_memory(m, setup, want[i], gpus_per_node=gpn) for i in some]
    order = list(range(len(want)))
    rnd.shuffle(order)
    shuffled = layout_batch.LayoutArrays.from_layouts([want[i] for i in order])
    assert rank_memories(memory_batch(m, setup, shuffled, gpus_per_node=gpn)) == [batch[i] for i in order]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3.1-405b", "mixtral-8x22b", "bert-large"])
def test_a_batch_of_one_is_a_row_of_the_batch_on_presets(name):
    from planner.layouts import batch as layout_batch
    from planner.memory.peak import memory_batch
    from planner.models.spec import load_model

    m = load_model(name)
    for setup in (TrainingSetup(), TrainingSetup(precision="fp32", optimizer="sgd", attention="eager",
                                                 seq_len=2048, global_batch=512),
                  TrainingSetup(finetune=FinetuneSpec.named("qlora"), global_batch=64)):
        for n in (16, 512):
            arrays = layout_batch.valid_layouts(m, setup, n, 8, SearchSpace(max_tp=8))
            lays = [arrays.layout(i, setup.seq_len) for i in range(0, len(arrays), 23)]
            totals = memory_batch(m, setup, arrays).total[::23].tolist()
            assert totals == [per_rank_memory(m, setup, lay).total for lay in lays]


@pytest.mark.slow
def test_the_search_gives_the_same_plans_as_layout_by_layout_sizing(monkeypatch):
    # size_count sizes a GPU count's layouts as one batch; enumerating and sizing them one by
    # one (per_rank_memory each) gives the same plans
    from planner.models.spec import load_model
    from planner.search import search

    def one_by_one(m, setup, n_gpus, gpus_per_node, space, capacity_bytes, pc, host_capacity_bytes=None,
                   nvme_capacity_bytes=None, rejected=None):
        valid = [lay for lay, why in enumerate_layouts(m, setup, n_gpus, gpus_per_node, space) if why is None]
        cands = [search.Candidate(layout=lay, memory=per_rank_memory(m, setup, lay, pc, gpus_per_node),
                                  capacity_bytes=capacity_bytes, host_capacity_bytes=host_capacity_bytes,
                                  nvme_capacity_bytes=nvme_capacity_bytes) for lay in valid]
        least = min(cands, key=lambda c: c.memory.total, default=None)
        return [c for c in cands if c.fits or c is least], least

    cases = [("llama3.1-8b", "h100", TrainingSetup(finetune=FinetuneSpec.named("lora"), global_batch=64)),
             ("mixtral-8x7b", "a100-40gb", TrainingSetup(seq_len=8192, global_batch=256)),
             ("gpt2-xl", "4090", TrainingSetup(seq_len=1024, attention="eager", usable_memory_fraction=0.5))]
    for name, gpu, setup in cases:
        m, g = load_model(name), get_gpu(gpu)
        batched = report.to_json(api.plan(m, g, setup))
        monkeypatch.setattr(search, "size_count", one_by_one)
        single = report.to_json(api.plan(m, g, setup))
        monkeypatch.undo()
        assert batched == single
