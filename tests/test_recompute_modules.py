"""Megatron-Core's moe_act recomputation (--recompute-modules moe_act) against megatron-core's own
code, for experts whose activation is not gated (Nemotron 3's squared ReLU).

megatron-core 0.16.1 transformer/moe/experts.py (TEGroupedMLP.forward, GroupedMLP.forward) wraps the
experts' activation in tensor_parallel.CheckpointWithoutOutput and discards its output once the
second projection has consumed it, whatever the activation function. The bytes it takes off the
saved tensors are measured here with megatron-core's own CheckpointWithoutOutput and squared_relu
(autograd's saved-tensor hooks, CPU), not restated from the planner's formula.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from unittest import mock

import pytest

from planner.layouts.layout import Layout
from planner.memory.recompute import module_recompute_delta_bytes
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

pytest.importorskip("megatron.core")


def _megatron_saved_bytes(tokens: int, d_model: int, d_ff: int, recompute: bool) -> int:
    """Bytes autograd keeps for one expert's fc1 -> squared ReLU -> fc2 in bf16 (weights and the
    input excluded), with or without megatron-core's moe_act checkpoint."""
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.tensor_parallel.random as rng
        from megatron.core.activations import squared_relu
        from megatron.core.tensor_parallel import CheckpointWithoutOutput

    x = torch.randn(tokens, d_model, dtype=torch.bfloat16, requires_grad=True)
    w1 = torch.randn(d_model, d_ff, dtype=torch.bfloat16, requires_grad=True)
    w2 = torch.randn(d_ff, d_model, dtype=torch.bfloat16, requires_grad=True)
    kept: list = []
    # CheckpointWithoutOutput saves and restores the CUDA RNG state: the CPU's stands in for it.
    # (fp8=None: its constructor reads `fp8 is not None` as FP8 on.)
    with mock.patch.object(rng, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state()), \
            mock.patch.object(rng, "_set_cuda_rng_state", lambda *a, **k: None):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: (kept.append(t), t)[1], lambda t: t):
            fc1 = x @ w1
            if recompute:
                ck = CheckpointWithoutOutput(fp8=None)
                out = ck.checkpoint(squared_relu, fc1) @ w2
                ck.discard_output_and_register_recompute(out)
            else:
                out = squared_relu(fc1) @ w2
        # storages still held after the forward (the discarded output is resized to 0)
        leaves = {t.untyped_storage().data_ptr() for t in (x, w1, w2)}
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}
        nbytes = sum(n for p, n in held.items() if p not in leaves)
        out.float().sum().backward()          # the recomputation runs: the checkpoint is sound
    assert x.grad is not None and w1.grad is not None
    return nbytes


def test_moe_act_drops_one_d_ff_tensor_per_routed_token_in_megatron_core():
    kept = _megatron_saved_bytes(64, 32, 96, recompute=False)
    recomputed = _megatron_saved_bytes(64, 32, 96, recompute=True)
    assert (kept, recomputed) == (2 * 64 * 96 * 2, 64 * 96 * 2)


def test_moe_act_recompute_counts_for_squared_relu_experts():
    """Nemotron 3 Ultra (squared-ReLU experts; bug: its moe_act recomputation took nothing off
    before): per mean block, the MoE layers' share of tokens x top-k routed copies, each one
    d_ff-wide bf16 tensor (the drop measured above), over tp."""
    m = load_model("nemotron-3-ultra")
    assert not m.gated_mlp and m.is_moe
    per_routed_token = (_megatron_saved_bytes(64, 32, 96, False) - _megatron_saved_bytes(64, 32, 96, True)) / 64
    per_routed_token_per_d_ff = per_routed_token / 96      # bytes per d_ff element: bf16
    setup = TrainingSetup(stack="megatron", recompute_modules=("moe_act",), precision="bf16-mixed")
    lay = Layout(dp=1, tp=2, pp=1, micro_batch=1, seq_len=4096, recompute="selective")
    delta = module_recompute_delta_bytes(m, setup, lay, "fused")
    tokens = 4096
    expected = m.n_moe_layers / m.n_layers * tokens * m.n_experts_per_token * m.d_ff * per_routed_token_per_d_ff / 2
    assert delta == pytest.approx(-expected, rel=1e-6)
    assert module_recompute_delta_bytes(m, replace(setup, recompute_modules=()), lay, "fused") == 0


def test_assumptions_name_the_recompute_modules_that_out_writes():
    """The plan's Assumptions line names the --recompute-modules given, as --out megatron writes
    them (bug: it named Megatron's default core_attn whatever the modules)."""
    from planner.emit.megatron import _recompute_args
    from planner.stacks import memory_profile_line

    mods = ("layernorm", "moe_act")
    line = memory_profile_line("megatron", "selective", recompute_modules=mods)
    assert " ".join(_recompute_args("selective", modules=mods)[2:5]) in line
    assert "core_attn" in memory_profile_line("megatron", "selective")
