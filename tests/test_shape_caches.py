"""The per-block-shape caches of issue 32's fifth pass give the answers of a cold computation.

A sweep asks for each block shape under none, selective and full recomputation; the part of a
block's time and bytes that its recomputation does not change is now worked out once per shape
(timing.layer.layer_time_table's kernels.block_compute_s, memory.shapes' bytes without recomputation) and a block's
saved-tensor terms once per the fields they read (memory.activations.block_terms). The referee of
each test is the same model with every cache emptied before each call: the caches must change
no figure, whichever shape or recomputation is asked first."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
from conftest import fast_one

from planner.hardware.gpus import get_gpu
from planner.layouts.batch import LayoutArrays, valid_layouts
from planner.layouts.distinct import group
from planner.layouts.layout import Layout
from planner.memory import activations, peak, shapes
from planner.memory.activations import block_terms, layer_activation_terms, terms_key
from planner.memory.attention import attention_saved_delta_bytes, sink_eager_delta_bytes
from planner.memory.buffers import pipeline_buffer_bytes
from planner.memory.fp8 import saved_input_delta_bytes
from planner.memory.loss import logits_bytes
from planner.memory.moe import imbalance_extra_bytes, moe_block_delta_bytes
from planner.memory.norms import block_norm_delta_bytes
from planner.memory.peak import memory_batch
from planner.memory.recompute import module_recompute_delta_bytes
from planner.models.spec import count_params, load_model
from planner.timing import kernels
from planner.timing.flops import block_adapters
from planner.timing.layer import layer_time
from planner.timing.model import DEFAULT_EFFICIENCY
from planner.training.finetune import FinetuneSpec, lora_activation_terms
from planner.training.setup import TrainingSetup

MODELS = ("llama3.1-8b", "deepseek-v3", "mixtral-8x7b", "gpt-oss-20b", "qwen3-next-80b-a3b", "nemotron-3-nano",
          "gemma3-1b", "gpt2")
SETUPS = {
    "full": TrainingSetup(seq_len=2048),
    "lora": TrainingSetup(seq_len=2048, finetune=FinetuneSpec.named("lora", rank=16, targets=("attention",))),
    "qlora": TrainingSetup(seq_len=2048, finetune=FinetuneSpec.named("qlora", rank=16)),
    "fp8, imbalanced": TrainingSetup(seq_len=2048, precision="fp8", moe_imbalance=1.3),
    "torchtitan": TrainingSetup(seq_len=2048, stack="torchtitan"),
    "eager": TrainingSetup(seq_len=2048, attention="eager"),
}
RECOMPUTES = ("none", "selective", "full")
# the fast tier's case of each test parametrized over models (tests/conftest.py, fast_one): an MoE
# model with MLA, the richest of the cheap ones; the other models run in the full suite
FAST = "deepseek-v3"


def _forget() -> None:
    layer_time.cache_clear()
    activations.block_activations.cache_clear()
    activations._block_terms.cache_clear()
    shapes.forget_tables()
    peak.forget_states()
    kernels._block_gemms.cache_clear()
    kernels._LAST_RATES = None
    block_adapters.cache_clear()
    lora_activation_terms.cache_clear()


@pytest.mark.parametrize("name", fast_one(MODELS, FAST))
def test_a_block_time_does_not_depend_on_the_recomputation_asked_before(name: str) -> None:
    m, gpu = load_model(name), get_gpu("h100")
    for setup, kern in itertools.product(SETUPS.values(), ("fused", "eager", "torchtitan")):
        base: dict[str, Any] = dict(tp=2, sp=False, cp=1, ep=2, micro_batch=1, etp=0)
        variants = [base] + [{**base, k: v} for k, v in (("tp", 1), ("tp", 4), ("sp", True), ("cp", 2), ("ep", 1),
                                                        ("ep", 8), ("micro_batch", 2), ("etp", 1))]
        shapes_ = [Layout(seq_len=setup.seq_len, **v) for v in variants]     # each differs from one other in one field
        cold = {}
        for lay, rc in itertools.product(shapes_, RECOMPUTES):
            _forget()
            cold[lay, rc] = layer_time(m, setup, replace(lay, recompute=rc), kern, gpu, DEFAULT_EFFICIENCY)
        _forget()
        for lay, rc in itertools.product(shapes_, reversed(RECOMPUTES)):    # full first: the cache's first entry
            assert layer_time(m, setup, replace(lay, recompute=rc), kern, gpu, DEFAULT_EFFICIENCY) == cold[lay, rc]


@pytest.mark.parametrize("name", fast_one(MODELS, FAST))
def test_block_terms_read_only_their_key(name: str) -> None:
    # terms_key drops the recomputation, pp, dp, ep, vp, etp and the accumulation: the terms
    # of a layout must be those of its key (layer_activation_terms reads none of the others)
    m = load_model(name)
    for setup, kern in itertools.product(SETUPS.values(), ("fused", "eager", "amp", "torchtitan")):
        for rc, zero, sharding, tp, cp in itertools.product(RECOMPUTES, (0, 3), ("zero", "fsdp"), (1, 2), (1, 2)):
            lay = Layout(tp=tp, sp=tp > 1, cp=cp, ep=2, pp=4, dp=8, vp=2, etp=1, grad_accum=4, micro_batch=2,
                         seq_len=setup.seq_len, recompute=rc, zero_stage=zero, sharding=sharding)
            assert layer_activation_terms(m, setup, lay, kern) == layer_activation_terms(m, setup, terms_key(lay),
                                                                                           kern)
            assert block_terms(m, setup, lay, kern) == tuple(layer_activation_terms(m, setup, lay, kern))


@pytest.mark.parametrize("name", fast_one(("llama3.1-8b", "deepseek-v3", "gpt-oss-20b", "qwen3-next-80b-a3b"), FAST))
def test_sizing_a_batch_equals_sizing_each_layout_alone(name: str) -> None:
    # every layout of a count sized as one batch (its selective and full rows read the bytes
    # without recomputation that another row of their shape worked out), against layouts
    # sized alone with empty tables: rows of every recomputation, ep, tp, cp and micro-batch
    m = load_model(name)
    pc = count_params(m)
    for setup in (SETUPS["full"], SETUPS["lora"], SETUPS["fp8, imbalanced"]):
        a = valid_layouts(m, setup, 64, 8)
        assert len(a), "no layout: the comparison would check nothing"
        _forget()
        batch = memory_batch(m, setup, a, pc, 8).total
        picks = {0, len(a) - 1}
        for col in (a.recompute, a.ep, a.tp, a.cp, a.micro_batch, a.sp, a.pp):
            for v in np.unique(col):
                picks.add(int(np.flatnonzero(col == v)[-1]))    # the last row of each value
        for i in sorted(picks):
            _forget()
            alone = memory_batch(m, setup, LayoutArrays(*(a.field(f)[[i]] for f in LayoutArrays.FIELDS)), pc, 8)
            assert alone.total[0] == batch[i], (name, i)


# the seventh pass (issue 32): rates' last answer, a block's GEMMs per model, the adapters per
# (model, fine-tuning) and the unrecomputed key built without dataclasses.replace


def test_rates_follow_every_argument_after_an_earlier_call() -> None:
    """Each argument changed after a call gives the answer of the uncached computation
    (kernels._rates), never the last one's."""
    h100, h200 = get_gpu("h100"), get_gpu("h200")
    slower = replace(DEFAULT_EFFICIENCY, hbm_fraction=DEFAULT_EFFICIENCY.hbm_fraction / 2)
    asked = [(h100, "bf16", DEFAULT_EFFICIENCY), (h200, "bf16", DEFAULT_EFFICIENCY), (h200, "fp8", DEFAULT_EFFICIENCY),
             (h200, "fp8", slower), (h100, "fp8", slower), (h100, "bf16", DEFAULT_EFFICIENCY)]
    answers = [kernels.rates(*a) for a in asked]
    assert answers == [kernels._rates(*a) for a in asked]
    assert len(set(answers)) == len(answers) - 1 and answers[0] == answers[-1]    # each change changes them


def test_block_adapters_are_kept_per_fine_tuning() -> None:
    """The adapter list of one model under two LoRA ranks and targets: each its own (PEFT's
    rank r on every adapted linear layer, Hu et al. 2021 Sec. 4.1)."""
    m = load_model("llama3.1-8b")
    narrow = FinetuneSpec.named("lora", rank=16, targets=("attention",))
    wide = FinetuneSpec.named("lora", rank=64, targets=("attention", "mlp"))
    a, b = block_adapters(m, narrow), block_adapters(m, wide)
    assert {x.rank for x in a} == {16} and {x.rank for x in b} == {64}
    assert len(b) > len(a) == 4           # q, k, v, o; then the MLP's gate, up and down too
    assert block_adapters(m, FinetuneSpec.named("full")) == ()


@pytest.mark.parametrize("sharded", [False, True])
def test_the_unrecomputed_key_is_the_key_without_its_recomputation(sharded: bool) -> None:
    """block_activations' key for its bytes without recomputation equals dataclasses.replace's
    (the cache entry it reads is the one the shape under none wrote)."""
    lay = Layout(tp=4, sp=True, cp=2, micro_batch=2, seq_len=4096, zero_stage=3, sharding="fsdp", pp=4, ep=2)
    for rc in RECOMPUTES:
        key = activations.activation_key(replace(lay, recompute=rc), sharded)
        assert activations.activation_key(key, True, "none") == replace(key, recompute="none")


# the ninth pass (issue 32): memory.shapes sizes a block shape once for the layouts with and
# without a pipeline; each function it calls per shape must then give the same bytes at pp 1 and 4
# (and the loss, kept once per shape without its recomputation, the same under each)
SHAPE_FUNCTIONS = (attention_saved_delta_bytes, sink_eager_delta_bytes, block_norm_delta_bytes, moe_block_delta_bytes,
                   imbalance_extra_bytes, module_recompute_delta_bytes, activations.backward_working_bytes,
                   logits_bytes)


@pytest.mark.parametrize("name", fast_one(MODELS, FAST))
def test_a_block_shape_reads_no_pipeline_degree(name: str) -> None:
    m = load_model(name)
    setups = [*SETUPS.values(), TrainingSetup(seq_len=2048, recompute_modules=("core_attn",))]
    for setup, kern in itertools.product(setups, ("fused", "eager", "amp", "torchtitan")):
        for rc, zero, tp, cp in itertools.product(RECOMPUTES, (0, 3), (1, 2), (1, 2)):
            lay = Layout(tp=tp, sp=tp > 1, cp=cp, ep=2, micro_batch=2, seq_len=setup.seq_len, recompute=rc,
                         zero_stage=zero, sharding="fsdp-full" if zero == 3 else "zero")
            piped = replace(lay, pp=4)
            for f in SHAPE_FUNCTIONS:
                assert f(m, setup, piped, kern) == f(m, setup, lay, kern), (f.__name__, setup, kern, lay)
            assert saved_input_delta_bytes(m, setup, piped) == saved_input_delta_bytes(m, setup, lay)
            key = activations.activation_key(lay, setup.finetune.is_lora)
            assert activations.activation_key(piped, setup.finetune.is_lora) == key
            # the loss's bytes, kept beside a shape's bytes without recomputation, read no recomputation
            assert {logits_bytes(m, setup, replace(lay, recompute=r), kern) for r in RECOMPUTES} == {
                logits_bytes(m, setup, lay, kern)}
            full = activations.block_activations(m, setup, key, kern)[1]
            assert (activations.recompute_unit_bytes(m, setup, piped, kern, full)
                    == activations.recompute_unit_bytes(m, setup, lay, kern, full))


# the eleventh pass (issue 32): memory.shapes sizes a LoRA block shape once for every ZeRO stage and
# sharding that agree on activations.adapters_in_16_bits (at ZeRO-1 where they do, ZeRO-0 where not):
# each per-shape function must give the same bytes on the layout and on that stand-in
LORA_SETUPS = [TrainingSetup(seq_len=2048, precision=p,
                             finetune=FinetuneSpec.named(method, rank=16, targets=("attention",)))
               for p, method in itertools.product(("bf16-mixed", "bf16", "fp32"), ("lora", "qlora"))]


@pytest.mark.parametrize("name", fast_one(("llama3.1-8b", "deepseek-v3", "gpt-oss-20b", "qwen3-next-80b-a3b", "gpt2"),
                                         FAST))
def test_a_lora_shape_reads_the_sharding_only_through_the_adapters_dtype(name: str) -> None:
    m = load_model(name)
    differ = 0
    for setup, kern in itertools.product(LORA_SETUPS, ("fused", "eager", "amp", "torchtitan")):
        for rc, zero, sharding, tp in itertools.product(RECOMPUTES, (0, 1, 2, 3), ("zero", "fsdp-full",
                                                                                   "fsdp-grad-op", "fsdp-hybrid"),
                                                        (1, 2)):
            lay = Layout(tp=tp, sp=tp > 1, cp=1, ep=2, micro_batch=2, seq_len=setup.seq_len, recompute=rc,
                         zero_stage=zero, sharding=sharding)
            cast = activations.adapters_in_16_bits(setup, zero, lay.is_fsdp)
            stand_in = replace(lay, zero_stage=int(cast), sharding="zero")
            for f in (*SHAPE_FUNCTIONS, activations.layer_activation_terms):
                assert f(m, setup, stand_in, kern) == f(m, setup, lay, kern), (f.__name__, setup, kern, lay)
            assert (activations.block_activations(m, setup, activations.activation_key(lay, True), kern)
                    == activations.block_activations(m, setup, activations.activation_key(stand_in, True), kern))
            # the test can tell: somewhere the two classes keep different tensors (PEFT's cast copies)
            other = replace(lay, zero_stage=0 if cast else 1, sharding="zero")
            differ += layer_activation_terms(m, setup, other, kern) != layer_activation_terms(m, setup, lay, kern)
    assert differ > 0


@pytest.mark.parametrize("name", fast_one(("deepseek-v3", "mixtral-8x7b", "gpt-oss-20b"), FAST))
def test_an_imbalanced_moe_shape_reads_no_zero_stage_nor_sharding(name: str) -> None:
    # 165d8af stopped keying imbalanced MoE block shapes (memory.shapes) on the ZeRO stage and
    # sharding: outside LoRA, each per-shape function gives the same bytes under every stage and
    # sharding as under ZeRO-0 unsharded, and the imbalance does add bytes somewhere (not vacuous)
    m = load_model(name)
    added = 0
    for precision, kern in itertools.product(("bf16-mixed", "fp8", "fp32"), ("fused", "eager", "amp", "torchtitan")):
        setup = TrainingSetup(seq_len=2048, precision=precision, moe_imbalance=1.3)
        for rc, zero, sharding, ep in itertools.product(RECOMPUTES, (0, 1, 2, 3), ("zero", "fsdp-full", "fsdp-grad-op",
                                                                                   "fsdp-hybrid"), (1, 4)):
            lay = Layout(tp=2, sp=True, cp=1, ep=ep, micro_batch=2, seq_len=2048, recompute=rc, zero_stage=zero,
                         sharding=sharding)
            stand_in = replace(lay, zero_stage=0, sharding="zero")
            for f in (*SHAPE_FUNCTIONS, activations.layer_activation_terms):
                assert f(m, setup, stand_in, kern) == f(m, setup, lay, kern), (f.__name__, setup, kern, lay)
            added += imbalance_extra_bytes(m, setup, lay, kern) > 0
    assert added > 0


def test_pipeline_buffers_are_megatron_cores_p2p_tensors() -> None:
    """buffers.pipeline_buffer_bytes, now per layout over arrays: a send and a receive buffer of
    megatron-core's p2p tensor shape (pipeline_parallel/schedules.py, get_tensor_shapes: seq_length
    // cp, // tp under sequence parallelism, x micro_batch_size x hidden_size) in bf16; none at pp 1.
    Llama 3.1 8B (hidden 4096), sequence 8192."""
    m, setup = load_model("llama3.1-8b"), TrainingSetup(seq_len=8192)
    lays = [Layout(tp=2, sp=True, pp=2, micro_batch=1, seq_len=8192), Layout(tp=2, sp=False, pp=4, micro_batch=2,
                                                                           seq_len=8192, cp=2),
            Layout(tp=4, sp=True, pp=1, micro_batch=4, seq_len=8192)]
    expected = [2 * (8192 // 2) * 1 * 4096 * 2, 2 * (8192 // 2) * 2 * 4096 * 2, 0]
    got = pipeline_buffer_bytes(m, setup, LayoutArrays.from_layouts(lays), 8192)
    assert got.tolist() == expected and got.dtype == np.int64



@pytest.mark.parametrize("name", fast_one(("llama3.1-8b", "deepseek-v3", "mixtral-8x7b", "qwen3-next-80b-a3b"), FAST))
def test_state_terms_read_only_the_state_fields(name: str) -> None:
    # memory.peak keeps a batch's state terms per its states' STATE_FIELDS (the ninth pass):
    # each state sized through its first layout and through its last (another micro-batch,
    # accumulation, virtual stages or recomputation) must give the same terms
    m = load_model(name)
    pc = count_params(m)
    checked = 0
    for setup in (SETUPS["full"], SETUPS["lora"], SETUPS["fp8, imbalanced"], SETUPS["torchtitan"]):
        a = valid_layouts(m, setup, 64, 8)
        if not len(a):      # (torchtitan's stack runs no MoE model here)
            continue
        checked += 1
        inv, rep = group([a.field(f) for f in peak.STATE_FIELDS])
        first, last = np.full_like(rep, len(inv)), np.zeros_like(rep)
        np.minimum.at(first, inv, np.arange(len(inv)))
        np.maximum.at(last, inv, np.arange(len(inv)))
        differs = sum(int((a.field(f)[first] != a.field(f)[last]).any())
                      for f in ("micro_batch", "grad_accum", "vp", "recompute"))
        assert differs, "each state's first and last layouts alike: the comparison would check nothing"
        by_first, by_last = (peak.state_terms(m, setup, LayoutArrays(*(a.field(f)[r] for f in LayoutArrays.FIELDS)),
                                              pc, 8) for r in (first, last))
        _assert_same_terms(by_first, by_last)
    assert checked >= 3, "no layout: the comparison would check nothing"


def _assert_same_terms(x: Any, y: Any) -> None:
    if isinstance(x, np.ndarray):
        assert np.array_equal(x, y) and x.dtype == y.dtype
    elif isinstance(x, tuple):
        for u, v in zip(x, y, strict=True):
            _assert_same_terms(u, v)
    elif hasattr(x, "__dataclass_fields__"):
        for f in fields(x):
            _assert_same_terms(getattr(x, f.name), getattr(y, f.name))
    else:
        assert x == y


def test_kept_state_terms_are_read_only_and_follow_the_set_up() -> None:
    """A batch's kept state terms: the answer of a cold state_terms, read-only, and another
    set-up's (LoRA) not read off the first's."""
    m = load_model("llama3.1-8b")
    pc = count_params(m)
    a = valid_layouts(m, SETUPS["full"], 16, 8)
    _forget()
    first = memory_batch(m, SETUPS["full"], a, pc, 8)
    lora = memory_batch(m, SETUPS["lora"], a, pc, 8)
    again = memory_batch(m, SETUPS["full"], a, pc, 8)
    assert np.array_equal(again.total, first.total) and not np.array_equal(lora.total, first.total)
    _forget()
    assert np.array_equal(memory_batch(m, SETUPS["lora"], a, pc, 8).total, lora.total)
    kept = next(iter(peak._KEPT.values()))[0]
    assert not kept.base.flags.writeable
