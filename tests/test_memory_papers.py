"""Per-rank memory against the papers' own numbers.

Sources: shared reference runs (published_runs.json):
- zero-fig1-7.5b-64gpu-model-states: Rajbhandari et al. 2019 (ZeRO), Fig. 1.
- korthikanti-t5-*: Korthikanti et al. 2022, Table 3 configurations; activation sizes
  from their Eqs. 1-6, in decimal GB as the reference file lists them.
"""

from dataclasses import replace

import pytest

from planner.layouts.layout import Layout
from planner.memory.model import in_flight_microbatches, layer_activation_bytes, model_state_bytes, stage_layers
from planner.models.spec import ModelSpec
from planner.training.setup import Precision, TrainingSetup, optimizer_state_bytes_per_param
from planner.units import GB


# ZeRO Fig. 1: Psi = 7.5B, N_d = 64, mixed-precision Adam (K = 12): 120, 31.4, 16.6, 1.9 GB
@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, expected_gb):
    lay = Layout(dp=64, zero_stage=stage)
    ms = model_state_bytes(7_500_000_000, 0, Precision.named("fp16-mixed"),
                           optimizer_state_bytes_per_param("adamw"), lay)
    assert ms.total / GB == pytest.approx(expected_gb, abs=0.05)


def paper_gpt(layers: int, hidden: int, heads: int) -> ModelSpec:
    """The GPT block of Korthikanti et al. (Table 3): LayerNorm, GeLU MLP of 4h, dropout."""
    return ModelSpec(name="gpt-paper", model_type="gpt2", n_layers=layers, d_model=hidden,
                     n_heads=heads, n_kv_heads=heads, head_dim=hidden // heads, d_ff=4 * hidden,
                     vocab_size=51200, max_positions=2048, position="learned", tied_embeddings=True,
                     gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
                     hidden_dropout=0.1, attention_dropout=0.1)


# The paper materialises attention scores and uses Megatron's fused kernels, 16-bit activations.
PAPER_SETUP = TrainingSetup(seq_len=2048, attention="eager", kernels="fused", precision="fp16-mixed")


def per_layer(m, tp, sp, recompute, b=4, s=2048):
    lay = Layout(tp=tp, sp=sp, micro_batch=b, seq_len=s, recompute=recompute)
    return layer_activation_bytes(m, PAPER_SETUP, lay, "fused")


@pytest.mark.parametrize("layers, hidden, heads", [(48, 6144, 64), (96, 12288, 96), (105, 20480, 128)])
def test_korthikanti_equations_per_layer(layers, hidden, heads):
    m = paper_gpt(layers, hidden, heads)
    s, b, h, a, t = 2048, 4, hidden, heads, 8
    # Eq. 1: no parallelism
    assert per_layer(m, 1, False, "none") == 34 * s * b * h + 5 * a * s * s * b
    # Eq. 2: tensor parallelism
    assert per_layer(m, t, False, "none") == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-9)
    # Eq. 4: tensor + sequence parallelism
    assert per_layer(m, t, True, "none") == pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=1e-9)
    # Eq. 5/6: + selective recomputation
    assert per_layer(m, t, True, "selective") == pytest.approx(s * b * h * 34 / t, rel=1e-9)
    # Sec. 4.3: full recomputation keeps the block input, 2sbh (2sbh/t with sp)
    assert per_layer(m, 1, False, "full") == 2 * s * b * h
    assert per_layer(m, t, True, "full") == 2 * s * b * h / t


@pytest.mark.parametrize("case, layers, hidden, heads, pp, b, eq6_gb, eq2_gb", [
    # korthikanti-t5-*: "activation_GB_first_stage_eq6_selective_sp" / "_eq2_tp_only_no_recompute"
    ("22b", 48, 6144, 64, 1, 4, 10.27, 63.62),
    ("175b", 96, 12288, 96, 8, 1, 10.27, 55.57),
    ("530b", 105, 20480, 128, 35, 1, 18.72, 92.48),
    ("1t", 128, 25600, 160, 64, 1, 28.52, 140.93),
])
def test_korthikanti_first_stage(case, layers, hidden, heads, pp, b, eq6_gb, eq2_gb):
    m = paper_gpt(layers, hidden, heads)
    base = Layout(tp=8, sp=True, pp=pp, micro_batch=b, grad_accum=max(pp, 1) * 4, seq_len=2048,
                  recompute="selective")
    first = stage_layers(layers, pp)[0]
    held = in_flight_microbatches(base, 0)
    eq6 = first * held * layer_activation_bytes(m, PAPER_SETUP, base, "fused")
    assert eq6 / GB == pytest.approx(eq6_gb, abs=0.01)
    tp_only = replace(base, sp=False, recompute="none")
    eq2 = first * held * layer_activation_bytes(m, PAPER_SETUP, tp_only, "fused")
    assert eq2 / GB == pytest.approx(eq2_gb, abs=0.01)


def test_interleaving_factor():
    # Korthikanti Sec. 4.2.3: the first stage of an interleaved schedule holds
    # (1 + (p-1)/(p m)) times the activations of the plain 1F1B schedule.
    plain = Layout(pp=8, grad_accum=64)
    inter = replace(plain, vp=3)
    assert in_flight_microbatches(inter, 0) / in_flight_microbatches(plain, 0) == pytest.approx(1 + 7 / 24)
