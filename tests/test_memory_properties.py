"""Properties that must hold for every model and layout (hypothesis)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.layouts.layout import Layout
from planner.memory.model import (
    layer_activation_bytes,
    model_state_bytes,
    per_rank_memory,
    rank_params,
)
from planner.models.spec import ModelSpec, count_params
from planner.training.kernels import layout_kernels
from planner.training.setup import TrainingSetup, optimizer_state_bytes_per_param


@st.composite
def models(draw) -> ModelSpec:
    n_kv = draw(st.sampled_from([1, 2, 4, 8]))
    n_heads = n_kv * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    moe = draw(st.booleans())
    n_experts = draw(st.sampled_from([4, 8, 16])) if moe else 0
    return ModelSpec(
        name="random", model_type="llama", n_layers=draw(st.integers(1, 96)),
        d_model=n_heads * head_dim, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        d_ff=64 * draw(st.integers(1, 512)), vocab_size=draw(st.integers(1000, 256_000)),
        tied_embeddings=draw(st.booleans()), gated_mlp=draw(st.booleans()),
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
        n_experts=n_experts, n_experts_per_token=min(2, n_experts) if moe else 0,
        hidden_dropout=draw(st.sampled_from([0.0, 0.1])),
        attention_dropout=draw(st.sampled_from([0.0, 0.1])),
    )


@st.composite
def cases(draw):
    m = draw(models())
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if m.n_kv_heads % d == 0 or d % m.n_kv_heads == 0]))
    pp = draw(st.integers(1, min(8, m.n_layers)))
    lay = Layout(
        dp=draw(st.sampled_from([1, 2, 8, 64])), tp=tp, pp=pp, sp=tp > 1 and draw(st.booleans()),
        micro_batch=draw(st.integers(1, 8)), grad_accum=draw(st.integers(1, 16)),
        seq_len=draw(st.sampled_from([512, 1024, 2048, 4096])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        zero_stage=draw(st.integers(0, 3)),
    )
    setup = TrainingSetup(seq_len=lay.seq_len,
                          precision=draw(st.sampled_from(["bf16-mixed", "fp32", "bf16"])),
                          optimizer=draw(st.sampled_from(["adamw", "sgd", "adam8bit", "adafactor"])),
                          attention=draw(st.sampled_from(["flash", "eager"])),
                          kernels=draw(st.sampled_from(["eager", "fused"])))
    return m, setup, lay


def states(m, setup, lay):
    pc = count_params(m)
    rp = rank_params(m, pc, lay, 0, m.n_layers // lay.pp)
    return model_state_bytes(rp.dense, rp.expert, setup.precision_spec,
                             optimizer_state_bytes_per_param("adamw"), lay).total


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(cases())
def test_zero_stages_are_ordered(case):
    m, setup, lay = case
    by_stage = [states(m, setup, replace(lay, zero_stage=z)) for z in range(4)]
    assert by_stage[3] <= by_stage[2] <= by_stage[1] <= by_stage[0]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(cases(), st.sampled_from([2, 4, 8]))
def test_more_sharding_never_raises_model_states(case, factor):
    m, setup, lay = case
    assert states(m, setup, replace(lay, dp=lay.dp * factor)) <= states(m, setup, lay)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(cases())
def test_activations_grow_with_micro_batch_and_sequence(case):
    m, setup, lay = case
    base = per_rank_memory(m, setup, lay).breakdown
    bigger_b = per_rank_memory(m, setup, replace(lay, micro_batch=lay.micro_batch * 2)).breakdown
    longer = replace(lay, seq_len=lay.seq_len * 2)
    bigger_s = per_rank_memory(m, replace(setup, seq_len=longer.seq_len), longer).breakdown
    kernels = layout_kernels(setup, lay)
    kept = layer_activation_bytes(m, setup, lay, kernels)
    assert layer_activation_bytes(m, setup, replace(lay, micro_batch=lay.micro_batch * 2), kernels) >= kept
    assert layer_activation_bytes(m, replace(setup, seq_len=longer.seq_len), longer, kernels) >= kept
    for other in (bigger_b, bigger_s):
        assert other.total >= base.total


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(cases())
def test_recompute_ordering(case):
    m, setup, lay = case
    modes = ("none", "selective", "full")
    kernels = layout_kernels(setup, lay)
    kept = {r: layer_activation_bytes(m, setup, replace(lay, recompute=r), kernels) for r in modes}
    assert kept["full"] <= kept["selective"] <= kept["none"]
    tot = {r: per_rank_memory(m, setup, replace(lay, recompute=r)).breakdown for r in modes}
    assert tot["full"].total <= tot["selective"].total <= tot["none"].total


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(cases())
def test_memory_is_positive_and_consistent(case):
    m, setup, lay = case
    r = per_rank_memory(m, setup, lay)
    bd = r.breakdown
    assert all(v >= 0 for v in bd.as_dict().values())
    assert bd.total == sum(bd.as_dict()[c] for c in bd.as_dict() if c != "total")
    assert bd.weights > 0 and bd.total > 0
