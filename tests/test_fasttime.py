"""planner.timing.fast is the one step-time model, on a batch of layouts; timing.step_time()
is its batch of one. A layout's terms must not depend on what else is in the batch nor on its
order: on random models, set-ups, efficiencies, GPUs, topologies, GPU counts and search
spaces (hypothesis), each layout's step time and whole StepTime from a big batch equal its
batch of one's, exactly (the tests that allow a relative 1e-12 allow it all the same). The
referee tests (papers, published runs) are in tests/test_timing.py and bench/.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner.hardware.gpus import get_gpu, list_gpus, sustained_rate
from planner.hardware.placement import Cluster
from planner.hardware.topology import list_topologies
from planner.layouts import batch as layout_batch
from planner.layouts import groups as layout_groups
from planner.layouts.layout import SearchSpace, enumerate_layouts
from planner.memory.model import per_rank_memory
from planner.memory.peak import memory_batch
from planner.models.spec import ModelSpec, count_params, load_model
from planner.timing import fast as fasttime
from planner.timing.model import (
    MEGATRON_2021,
    MEGATRON_CORE,
    Efficiency,
    cluster_for,
    step_time,
)
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

EXAMPLES = int(os.environ.get("PLANNER_HYPOTHESIS_EXAMPLES", "40"))
PROPS = settings(max_examples=EXAMPLES, deadline=None, derandomize="PLANNER_HYPOTHESIS_EXAMPLES" not in os.environ,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
GPU_NAMES = [g.name for g in list_gpus()]
TOPOLOGIES = list_topologies()
REL = 1e-12


@st.composite
def models(draw) -> ModelSpec:
    """Decoders with GQA or not, gated or GeLU MLPs, MoE, tied embeddings, parallel blocks."""
    n_kv = draw(st.sampled_from([1, 2, 4, 8]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    moe = draw(st.booleans())
    n_experts = draw(st.sampled_from([4, 8])) if moe else 0
    return ModelSpec(
        name="random", model_type="llama", n_layers=draw(st.integers(1, 40)),
        d_model=n_heads * head_dim, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        d_ff=64 * draw(st.integers(1, 300)), vocab_size=draw(st.integers(1000, 160_000)),
        tied_embeddings=draw(st.booleans()), gated_mlp=draw(st.booleans()),
        parallel_block=draw(st.booleans()), causal=draw(st.booleans()),
        n_experts=n_experts, n_experts_per_token=min(2, n_experts) if moe else 0,
        hidden_dropout=draw(st.sampled_from([0.0, 0.1])), attention_dropout=draw(st.sampled_from([0.0, 0.1])),
    )


@st.composite
def setups(draw) -> TrainingSetup:
    method = draw(st.sampled_from(["full", "full", "lora", "qlora", "freeze"]))
    rank = draw(st.sampled_from([1, 8, 64]))
    targets = draw(st.sampled_from([None, ("all-linear",), ("mlp",)]))
    ft = FinetuneSpec.named(method, rank=rank, targets=targets, trainable_layers=draw(st.integers(1, 6)),
                            quant=draw(st.sampled_from([None, "int8"])) if method == "lora" else None)
    return TrainingSetup(
        seq_len=draw(st.sampled_from([256, 1024, 2048, 4096])),
        global_batch=draw(st.sampled_from([8, 24, 64, 256, 1024])),
        precision=draw(st.sampled_from(["bf16-mixed", "fp16-mixed", "fp32", "bf16"])),
        optimizer=draw(st.sampled_from(["adamw", "sgd", "adam8bit", "adafactor"])),
        attention=draw(st.sampled_from(["flash", "eager"])),
        kernels=draw(st.sampled_from(["auto", "eager", "fused"])),
        finetune=ft,
    )


@st.composite
def efficiencies(draw) -> Efficiency:
    base = draw(st.sampled_from([Efficiency(), MEGATRON_2021, MEGATRON_CORE]))
    if draw(st.booleans()):
        return base
    fraction = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])
    return replace(base, tp_overlap=draw(fraction), cp_overlap=draw(fraction), ep_overlap=draw(fraction),
                   pp_overlap=draw(fraction), dp_overlap=draw(fraction), param_gather_overlap=draw(fraction),
                   zero3_overlap=draw(fraction), overlap_slowdown=draw(st.sampled_from([0.0, 0.2, 0.5, 1.5])),
                   bus_fraction=draw(st.sampled_from([0.5, 0.8, 1.0])),
                   grad_reduce_bytes=draw(st.sampled_from([None, 2, 4])),
                   matmul_fraction=draw(st.sampled_from([None, 0.6])))


@st.composite
def clusters(draw) -> Cluster:
    """A shipped topology (its own GPU), or a GPU without one (the GpuSpec's figures)."""
    top = draw(st.sampled_from([None, *TOPOLOGIES]))
    if top is None:
        return Cluster(gpu=get_gpu(draw(st.sampled_from(GPU_NAMES))), topology=None)
    return cluster_for(get_gpu(top.gpu), top)


@st.composite
def cases(draw):
    """A model, set-up, efficiency, cluster, and the valid layouts of one search space on
    a GPU count (every sharding, vp, sp, cp and ep choice the space allows)."""
    m, setup, eff, cluster = draw(models()), draw(setups()), draw(efficiencies()), draw(clusters())
    gpu = cluster.gpu
    if setup.precision.startswith("bf16"):
        assume(gpu.bf16_flops_per_s is not None)
    n = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 96, 256, 1024]))
    space = SearchSpace(max_tp=draw(st.sampled_from([gpu.gpus_per_node, 2 * gpu.gpus_per_node])),
                        micro_batches=tuple(draw(st.sets(st.sampled_from([1, 2, 3, 4, 8]), min_size=1))),
                        fsdp=draw(st.sampled_from([None, None, "full", "grad-op", "hybrid"])),
                        vp=draw(st.sampled_from([None, None, 2, 3])), max_cp=draw(st.sampled_from([1, 2, 4])),
                        sp=draw(st.sampled_from([None, None, True, False])))
    lays = [lay for lay, why in enumerate_layouts(m, setup, n, gpu.gpus_per_node, space) if why is None]
    assume(lays)
    if len(lays) > 300:         # keep the scalar reference quick: a fixed sample
        lays = lays[:: len(lays) // 300 + 1]
    return m, setup, eff, cluster, lays


@pytest.mark.slow
@PROPS
@given(cases())
def test_step_times_equal_step_time(case):
    m, setup, eff, cluster, lays = case
    pc = count_params(m)
    got = fasttime.step_times_s(m, setup, layout_batch.LayoutArrays.from_layouts(lays), cluster, eff, pc)
    want = [step_time(m, setup, lay, cluster, eff, pc).step_time_s for lay in lays]
    assert got.tolist() == pytest.approx(want, rel=REL, abs=0)


@pytest.mark.slow
@PROPS
@given(cases(), st.sampled_from([(("tp", "cp", "ep", "dp", "pp"),), (("tp", "cp", "ep", "pp", "dp"),),
                                 (("pp", "dp", "ep", "cp", "tp"), ("tp", "cp", "ep", "dp", "pp"))]))
def test_other_placement_orders(case, orders):
    m, setup, eff, cluster, lays = case
    got = fasttime.step_times_s(m, setup, layout_batch.LayoutArrays.from_layouts(lays), cluster, eff, orders=orders)
    want = [step_time(m, setup, lay, cluster, eff, orders=orders).step_time_s for lay in lays]
    assert got.tolist() == pytest.approx(want, rel=REL, abs=0)


def search_layouts(m, setup, counts):
    """The layouts a search sizes on these GPU counts (8-GPU nodes, tp up to 8), as arrays."""
    return layout_batch.LayoutArrays.concat([layout_batch.valid_layouts(m, setup, n, 8, SearchSpace(max_tp=8))
                                          for n in counts])


def subset(a, idx):
    """The layouts of ``a`` at ``idx`` (indices or a mask)."""
    return layout_batch.LayoutArrays(*(getattr(a, f)[idx] for f in layout_batch.LayoutArrays.FIELDS))


@pytest.mark.slow
def test_memory_and_time_on_a_preset():
    # Llama-2-70B on the dgx-h100 topology, the layouts a search sizes on 96 and 1024 GPUs
    m, setup = load_model("llama2-70b"), TrainingSetup()
    cluster = cluster_for(get_gpu("h100"))
    pc = count_params(m)
    a = search_layouts(m, setup, (96, 1024))
    peak, step = memory_batch(m, setup, a, pc).total, fasttime.step_times_s(m, setup, a, cluster, pc=pc)
    sample = range(0, len(a), 37)
    lays = [a.layout(i, setup.seq_len) for i in sample]
    assert peak[list(sample)].tolist() == [per_rank_memory(m, setup, lay, pc).total for lay in lays]
    assert step[list(sample)].tolist() == pytest.approx(
        [step_time(m, setup, lay, cluster, pc=pc).step_time_s for lay in lays], rel=REL, abs=0)


@pytest.mark.slow
def test_kept_tables_give_the_same_answers():
    # the degree and state tables kept across calls: a second call on the same layouts, on
    # a subset (the same degrees, fewer states), on a shuffled copy, on the same degrees
    # with another set-up or efficiency, and after forget_tables(), answers as the first
    m, setup = load_model("llama2-70b"), TrainingSetup()
    cluster = cluster_for(get_gpu("h100"))
    pc = count_params(m)
    a = search_layouts(m, setup, (64, 96))
    fasttime.forget_tables()
    peak, step = memory_batch(m, setup, a, pc).total, fasttime.step_times_s(m, setup, a, cluster, pc=pc)

    for idx in (np.arange(len(a)), np.flatnonzero(a.zero_stage != 1), np.random.default_rng(0).permutation(len(a))):
        s2 = fasttime.step_times_s(m, setup, subset(a, idx), cluster, pc=pc)
        assert np.array_equal(memory_batch(m, setup, subset(a, idx), pc).total, peak[idx])
        assert np.array_equal(s2, step[idx])
    fasttime.forget_tables()
    s3 = fasttime.step_times_s(m, setup, a, cluster, pc=pc)
    assert np.array_equal(memory_batch(m, setup, a, pc).total, peak) and np.array_equal(s3, step)
    other, eff = TrainingSetup(global_batch=512), MEGATRON_CORE
    fasttime.step_times_s(m, setup, a, cluster, pc=pc)
    assert np.array_equal(fasttime.step_times_s(m, setup, a, cluster, eff, pc=pc),
                          [step_time(m, setup, a.layout(i, setup.seq_len), cluster, eff, pc=pc).step_time_s
                           for i in range(len(a))])
    b = layout_batch.valid_layouts(m, other, 96, 8, SearchSpace(max_tp=8))
    lays = [b.layout(i, other.seq_len) for i in range(0, len(b), 7)]
    assert memory_batch(m, other, b, pc).total[::7].tolist() == [per_rank_memory(m, other, x, pc).total
                                                                     for x in lays]


@pytest.mark.slow
def test_slowest_stages_kept_for_new_block_shapes():
    # the slowest stage per block shape and degrees is kept with the degree tables: a call
    # on one micro-batch size, then on all of them (the same degrees, new block shapes),
    # then on another micro-batch's layouts alone, answers as timing.step_time does
    m, setup = load_model("llama3.1-8b"), TrainingSetup(global_batch=64)
    cluster = cluster_for(get_gpu("h100"))
    pc = count_params(m)
    a = search_layouts(m, setup, (16, 32))

    def check(part):
        got = fasttime.step_times_s(m, setup, part, cluster, pc=pc)
        assert got[::5].tolist() == [step_time(m, setup, part.layout(i, setup.seq_len), cluster, pc=pc).step_time_s
                                     for i in range(0, len(part), 5)]

    fasttime.forget_tables()
    for part in (subset(a, a.micro_batch == 1), a, subset(a, a.micro_batch == 4)):
        check(part)
    # the block table starts afresh (layouts.groups.rows() does when it holds too many), the
    # degree tables stay: the kept stages are dropped, not read under new block numbers
    check(subset(a, a.recompute == 0))
    layout_groups.ROWS.clear()
    check(subset(a, a.recompute == 2))


def test_slowest_memo_holds_only_the_pairs_asked_for(monkeypatch):
    # issue 32: the memo of slowest stages held every block shape x every q_d of its degree
    # table (1.3 million places, 160 MB, for one DeepSeek-V3 count, grown by a copy per call);
    # it holds one place per (block shape, q_d) pair a batch asks for, and answers as
    # timing.step_time does (the referee: one layout at a time) on a MoE model over two calls
    from planner.timing import degrees

    m, setup = load_model("mixtral-8x7b"), TrainingSetup(global_batch=256)
    cluster = cluster_for(get_gpu("h100"))
    pc = count_params(m)
    a = search_layouts(m, setup, (32,))
    asked = []
    places = degrees.SlowestMemo.places

    def spy(self, blocks, block_rows, q_d):
        before = self.n_places if blocks is self.blocks else 0      # (another block table: a fresh memo)
        out = places(self, blocks, block_rows, q_d)
        pairs = set(zip(block_rows.tolist(), q_d.tolist()))
        asked.append(len(pairs))
        assert before <= self.n_places <= before + len(pairs) and len(self.keys) == self.n_places
        assert len(self.known) <= 2 * self.n_places and len(set(out.tolist())) == len(pairs)
        return out

    monkeypatch.setattr(degrees.SlowestMemo, "places", spy)
    fasttime.forget_tables()
    for part in (subset(a, a.micro_batch == 1), a):
        got = fasttime.step_times_s(m, setup, part, cluster, pc=pc)
        assert got[::37].tolist() == [step_time(m, setup, part.layout(i, setup.seq_len), cluster, pc=pc).step_time_s
                                      for i in range(0, len(part), 37)]
    assert asked


def test_no_layouts():
    m = load_model("llama3.1-8b")
    empty = layout_batch.LayoutArrays.from_layouts([])
    assert len(fasttime.step_times_s(m, TrainingSetup(), empty, cluster_for(get_gpu("a100")))) == 0


@pytest.mark.slow
@PROPS
@given(cases(), st.randoms(use_true_random=False))
def test_a_batch_of_one_is_a_row_of_the_batch_in_any_order(case, rng):
    # the batched step time of a layout does not depend on what else is in the batch, nor
    # on its order: each layout alone, and the batch shuffled, give the batch's own floats
    m, setup, eff, cluster, lays = case
    a = layout_batch.LayoutArrays.from_layouts(lays)
    whole = fasttime.step_times_s(m, setup, a, cluster, eff)
    for i in rng.sample(range(len(lays)), min(5, len(lays))):
        fasttime.forget_tables()
        alone = fasttime.step_times_s(m, setup, layout_batch.LayoutArrays.from_layouts([lays[i]]), cluster, eff)
        assert alone.tolist() == [whole[i]]
    order = list(range(len(lays)))
    rng.shuffle(order)
    shuffled = fasttime.step_times_s(m, setup, layout_batch.LayoutArrays.from_layouts([lays[i] for i in order]),
                                     cluster, eff)
    assert shuffled.tolist() == whole[order].tolist()


@pytest.mark.slow
@PROPS
@given(cases())
def test_batched_step_times_are_step_time(case):
    # fasttime.step_times (the search's batched timer) reads each layout's StepTime off a row
    # of the batch's named parts (step_arrays): the whole StepTime, every term and the
    # placement included, is step_time()'s (the batch of one)
    m, setup, eff, cluster, lays = case
    sample = lays[:: max(1, len(lays) // 40)]
    got = fasttime.step_times(m, setup, sample, cluster, eff)
    assert got == [step_time(m, setup, lay, cluster, eff) for lay in sample]


def test_search_with_the_batched_timer_finds_what_the_per_layout_timer_finds():
    # api.plan times a count's fitting layouts in one call (search(batch_timer=...)): the
    # same candidates, times and ranking as timing each with step_time() (search(timer=...))
    from planner import api
    from planner.search.search import search

    for name, gpu_name, setup in (("llama3.1-70b", "h100", TrainingSetup()),
                                  ("llama3.1-8b", "a100", TrainingSetup(global_batch=64)),
                                  ("llama3.1-8b", "h100", TrainingSetup(finetune=FinetuneSpec.named("qlora")))):
        m, gpu = load_model(name), get_gpu(gpu_name)
        r = api.plan(m, gpu, setup)
        cluster, pc = r.cluster, count_params(m)
        space = SearchSpace(max_tp=gpu.gpus_per_node)
        host, nvme = api.host_capacities(cluster)
        one_by_one = search(m, setup, r.capacity_bytes, gpu.gpus_per_node, r.result.counts_tried, space,
                            timer=lambda lay, m=m, setup=setup, cluster=cluster, eff=r.efficiency, pc=pc:
                            step_time(m, setup, lay, cluster, eff, pc),
                            host_capacity_bytes=host, nvme_capacity_bytes=nvme)
        assert one_by_one.n_gpus == r.result.n_gpus
        assert one_by_one.fitting == r.result.fitting


@pytest.mark.slow
@PROPS
@given(cases())
def test_named_parts_add_up_to_the_step(case):
    # StepArrays' terms are the step's (Narayanan et al. 2021, Sec. 2.2): m t_mb + bubble
    # + exposed data-parallel seconds + their overlap slowdown + optimizer, in that order
    # (so exactly); m t_mb is the compute, the exposed tp/cp/ep/pp seconds and the slowdown
    # of what they hide (>= 0); each data-parallel collective's exposed + hidden is itself
    m, setup, eff, cluster, lays = case
    p = fasttime.step_arrays(m, setup, layout_batch.LayoutArrays.from_layouts(lays), cluster, eff)
    ga = p.grad_accum.astype(np.float64)
    total = ga * p.micro_batch_s + p.bubble_s + p.comm_dp_s + p.dp_slowdown_s + p.optimizer_s
    # or, where the GPU's sustained rate binds (every GPU has one since issue 18; fp8 none),
    # the step is the model FLOPs at that rate: floored = its time, exactly as step_arrays sets it
    ceiling = eff.mfu_ceiling if eff.mfu_ceiling is not None else sustained_rate(cluster.gpu).mfu
    floor = (p.model_flops / (p.n_gpus * (p.peak_flops_per_s * ceiling)) if setup.precision_spec.fp8 is None
             else np.zeros_like(total))
    floored = floor > total
    assert np.where(floored, floor, total).tolist() == p.step_time_s.tolist()
    extra = np.where(floored, p.step_time_s - total, 0.0)      # the ceiling's time counts as compute
    pipe = (p.compute_s - extra) + p.comm_tp_s + p.comm_cp_s + p.comm_ep_s + p.comm_pp_s
    assert (ga * p.micro_batch_s >= pipe * (1 - 1e-12)).all()
    for i in range(0, len(lays), max(1, len(lays) // 10)):
        dp = p.dp_collectives(i)
        assert sum(c.exposed_s * c.times for c in dp) == pytest.approx(float(p.comm_dp_s[i]), rel=1e-12, abs=0)
        for c in dp:
            assert c.exposed_s + c.hidden_s == pytest.approx(c.seconds, rel=1e-12, abs=1e-300)
