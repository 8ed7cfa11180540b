"""--cross-entropy (Megatron-Core's cross_entropy_fusion_impl) on the last stage's loss.

- native: megatron-core 0.16.1's own fused vocab-parallel cross entropy, run on the CPU over a
  one-rank gloo group, keeps one fp32 tensor of the logits' shape for backward (its
  save_for_backward(exp_logits, ...), measured with saved_tensors_hooks): 4 B per logit, what the
  planner charges.
- te: Transformer Engine's parallel_cross_entropy keeps only its 16-bit input, into which its
  forward writes the gradient (transformer_engine/pytorch/cross_entropy.py, CrossEntropyFunction.
  forward: save_for_backward(_input, target, m_d_X_y)); Transformer Engine does not install
  without CUDA, so that side is read from its source: 2 B per logit under bf16.
- the Megatron-LM arguments the plan writes, against megatron-core's config field names.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_args import parse_args

from planner.cli.main import cli
from planner.emit.megatron import to_megatron_args
from planner.layouts.layout import Layout
from planner.memory.loss import logits_bytes
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup


def _megatron_core_saved_bytes_per_logit(monkeypatch) -> float:
    """Bytes megatron-core's fused vocab-parallel cross entropy saves for backward per logit:
    bf16 logits on one tensor-parallel rank (its two all-reduces are the identity there, so they
    are stubbed), saved tensors of the logits' size counted by saved_tensors_hooks."""
    import warnings
    from types import SimpleNamespace

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    s, b, v = 64, 2, 1000
    saved: list[int] = []

    def pack(t):
        saved.append(t.numel() * t.element_size() if t.numel() >= s * b * v else 0)
        return t

    x = torch.randn(s, b, v, dtype=torch.bfloat16, requires_grad=True)
    group = SimpleNamespace(rank=lambda: 0, size=lambda: 1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fused_vocab_parallel_cross_entropy(x, torch.randint(0, v, (s, b)), group)
    return sum(saved) / (s * b * v)


@pytest.mark.slow
def test_native_keeps_four_bytes_per_logit_as_megatron_core_measures(monkeypatch):
    require("megatron.core")
    measured = _megatron_core_saved_bytes_per_logit(monkeypatch)
    m = load_model("llama3-8b")
    lay = Layout(dp=1, tp=1, pp=1, micro_batch=2, grad_accum=1, seq_len=4096)
    native = logits_bytes(m, TrainingSetup(seq_len=4096, stack="megatron"), lay, "fused")
    te = logits_bytes(m, TrainingSetup(seq_len=4096, stack="megatron", cross_entropy="te"), lay, "fused")
    per_logit = 2 * 4096 * m.vocab_size
    assert measured == 4.0
    # the planner's two kernels differ by the fp32 copy less the 16-bit input: 4 - 2 B per logit
    assert native - te == per_logit * (measured - 2)


def test_megatron_args_name_transformer_engines_loss():
    from planner import api
    from planner.hardware.gpus import get_gpu
    m = load_model("llama3-8b")
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=1, grad_accum=16, seq_len=4096, zero_stage=1, recompute="full")
    for ce, flags in (("native", False), ("te", True)):
        setup = TrainingSetup(seq_len=4096, global_batch=128, stack="megatron", cross_entropy=ce)
        args = to_megatron_args(api.evaluate_layout(m, get_gpu("b200"), setup, lay))
        a = parse_args(args)
        # megatron-core 0.16.1 ModelParallelConfig cross_entropy_loss_fusion / cross_entropy_fusion_impl
        assert a.cross_entropy_loss_fusion is flags
        assert (a.cross_entropy_fusion_impl == "te") is flags


def test_cli_refuses_te_outside_megatron_and_names_it_in_json():
    base = ["--model", "llama3-8b", "--gpus", "h100", "--n-gpus", "8"]
    res = CliRunner().invoke(cli, [*base, "--cross-entropy", "te"])
    assert res.exit_code == 2 and "Traceback" not in res.output and "--stack megatron" in res.output
    res = CliRunner().invoke(cli, [*base, "--stack", "megatron", "--cross-entropy", "te", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["assumptions"]["cross_entropy"] == "te"
