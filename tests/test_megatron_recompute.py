"""Megatron-LM full recomputation by method and layer count (--recompute-method, --recompute-num-layers).

Checked against megatron-core 0.16.1 itself: its own TransformerBlock._checkpointed_forward
loop (transformer/transformer_block.py) runs on CPU over small layers, with its checkpoint
function standing in for torch's reentrant one (megatron's CheckpointFunction needs the CUDA
RNG tracker; both save the inputs and rerun the forward in backward), and the bytes autograd
saves are counted with saved-tensor hooks; its TransformerConfig validates what --out writes.
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from conftest import require

from planner.cli.main import cli
from planner.memory.activations import stage_block_bytes
from planner.training.setup import TrainingSetup


class _Layer:
    """A residual MLP layer with megatron's TransformerLayer call signature."""

    def __init__(self, torch, h: int):
        self.fc1 = torch.nn.Linear(h, 4 * h)
        self.fc2 = torch.nn.Linear(4 * h, h)
        self.norm = torch.nn.LayerNorm(h)
        self.gelu = torch.nn.functional.gelu

    def __call__(self, hidden_states, context=None, **_):
        x = hidden_states
        return x + self.fc2(self.gelu(self.fc1(self.norm(x)))), context


def _saved_bytes(torch, tb, layers, method: str | None, n: int) -> int:
    """Bytes autograd keeps for backward after megatron-core's forward (distinct storages;
    without a method: the plain loop, less the leaf input)."""
    x = torch.randn(4, 32, 64, requires_grad=True)
    live: dict[int, int] = {}

    def pack(t):
        live[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if method is None:
            y = x
            for layer in layers:
                y, _ = layer(hidden_states=y)
        else:
            cfg = types.SimpleNamespace(recompute_method=method, recompute_num_layers=n, fp8=None, fp4=None,
                                        distribute_saved_activations=False)
            block = types.SimpleNamespace(config=cfg, num_layers_per_pipeline_rank=len(layers),
                                          _get_layer=lambda i: layers[i])
            y = tb.TransformerBlock._checkpointed_forward(block, x, None, None, None, None, None, None, False)
        kept = sum(live.values())
    y.sum().backward()
    return kept - x.numel() * 4 * (method is None)


@pytest.fixture(scope="module")
def megatron_block():
    torch = require("torch")
    require("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.transformer.transformer_block as tb

    def checkpoint(fn, _distribute, *args):
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True, preserve_rng_state=False)

    torch.manual_seed(0)
    layers = [_Layer(torch, 64) for _ in range(8)]
    patch = pytest.MonkeyPatch()
    patch.setattr(tb.tensor_parallel, "checkpoint", checkpoint)
    yield torch, tb, layers
    patch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("method, n", [("uniform", 1), ("uniform", 2), ("uniform", 4), ("block", 3), ("block", 8)])
def test_stage_bytes_match_megatron_cores_checkpointed_forward(megatron_block, method, n):
    torch, tb, layers = megatron_block
    full_stage = _saved_bytes(torch, tb, layers, None, 0)
    one = _saved_bytes(torch, tb, layers, "uniform", 1)
    measured = _saved_bytes(torch, tb, layers, method, n)
    L = len(layers)
    kept, full = np.array([one // L]), np.array([full_stage // L])
    setup = TrainingSetup(stack="megatron", recompute_method=method, recompute_num_layers=n)
    held, _ = stage_block_bytes(setup, np.array([L]), np.array([1]), np.array([True]), kept, full)
    # measured on 8 layers of 64 wide: uniform 1, 2, 4 and block 8 to the byte; block 3 within 0.9%
    # (the first unchecked layer's input is the checkpoint's output, kept once)
    assert held[0] == pytest.approx(measured, rel=0.02)


def _run(*extra: str, json_out: bool = True):
    from click.testing import CliRunner

    argv = ["--model", "llama3.1-70b", "--gpus", "h100", "--n-gpus", "64", "--dp", "2", "--tp", "8", "--pp", "4",
            "--vp", "1", "--zero", "1", "--stack", "megatron", "--recompute", "full", "--seq-len", "8192",
            "--micro-batch", "1", "--global-batch", "64", *(["--json"] if json_out else []), *extra]
    return CliRunner().invoke(cli, argv)


def test_block_keeps_more_and_recomputes_less_than_uniform():
    import json

    def plan(*extra):
        r = _run(*extra)
        assert r.exit_code == 0, r.output
        best = json.loads(r.output)["plan"]
        return best["memory_bytes"]["activations"], best["step_time_s"]

    m1, t1 = plan()
    m_block, t_block = plan("--recompute-method", "block", "--recompute-num-layers", "4")
    m_u2, t_u2 = plan("--recompute-method", "uniform", "--recompute-num-layers", "2")
    assert m_block > m1 and t_block < t1          # 16 of 20 layers per stage keep everything, none rerun
    assert m_u2 < m1 and t_u2 == pytest.approx(t1)  # half the inputs kept; every layer reruns once


@pytest.mark.parametrize("extra, says", [
    (["--recompute-method", "block", "--stack", "hf"], "--stack megatron"),
    (["--recompute-method", "uniform", "--recompute-num-layers", "3"], "divisor of 20"),
    (["--recompute-num-layers", "21", "--recompute-method", "block"], "give 1 to 20"),
    (["--recompute-every", "2"], "--recompute-method block --recompute-num-layers N"),
])
def test_bad_combinations_exit_2_with_one_line(extra, says):
    r = _run(*extra)
    assert r.exit_code == 2 and says in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_emitted_args_pass_megatron_cores_transformer_config():
    require("megatron.core")
    from megatron_args import parse_args
    from test_emit_megatron import transformer_config

    from planner import api
    from planner.emit.megatron import to_megatron_args
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import Layout
    from planner.models.spec import load_model

    lay = Layout(dp=2, tp=8, pp=4, zero_stage=1, sp=True, micro_batch=1, grad_accum=32, recompute="full",
                 seq_len=8192)
    for method, n in (("block", 4), ("uniform", 2)):
        setup = TrainingSetup(seq_len=8192, global_batch=64, stack="megatron", recompute_method=method,
                              recompute_num_layers=n, recompute_chunk_layers=20)
        r = api.evaluate_layout(load_model("llama3.1-70b"), get_gpu("h100"), setup, lay)
        a = parse_args(to_megatron_args(r))
        assert (a.recompute_method, a.recompute_num_layers) == (method, n)
        cfg = transformer_config(a)      # raises on what megatron-core rejects
        assert (cfg.recompute_method, cfg.recompute_num_layers) == (method, n)


def test_what_the_planner_refuses_megatron_core_refuses(megatron_block):
    """Selective with a layer count: TransformerConfig's own ValueError; uniform with N not dividing a
    stage's layers: megatron-core's loop indexes past the last layer (IndexError)."""
    torch, tb, layers = megatron_block
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
        with pytest.raises(ValueError, match="recompute_num_layers must be None"):
            TransformerConfig(num_layers=8, hidden_size=64, num_attention_heads=4,
                              recompute_granularity="selective", recompute_num_layers=2)
    with pytest.raises(IndexError):
        _saved_bytes(torch, tb, layers, "uniform", 3)
    r = _run("--recompute", "selective", "--recompute-num-layers", "2")
    assert r.exit_code == 2 and "--recompute full" in r.output


def test_the_plan_names_the_method_in_its_assumptions():
    r = _run("--recompute-method", "block", "--recompute-num-layers", "4", json_out=False)
    assert r.exit_code == 0, r.output
    assert "--recompute-method block --recompute-num-layers 4" in " ".join(r.output.split())


@pytest.mark.slow
@pytest.mark.parametrize("method, n", [("block", 3), ("block", 8), ("uniform", 2)])
def test_hardware_flops_count_the_forwards_megatron_core_reruns(megatron_block, method, n):
    """The recomputation FLOPs of the hardware-FLOPs figure (timing.flops) against the layer
    forwards megatron-core's _checkpointed_forward runs in a forward and backward over 8
    layers: block N reruns N of them, uniform every one (issue 16)."""
    from planner.models.spec import load_preset
    from planner.timing.flops import hardware_flops_per_token, model_flops_per_token

    torch, tb, layers = megatron_block
    calls = {"n": 0}

    class Counted:
        def __init__(self, layer):
            self.layer = layer

        def __call__(self, *args, **kwargs):
            calls["n"] += 1
            return self.layer(*args, **kwargs)

    counted = [Counted(layer) for layer in layers]
    _saved_bytes(torch, tb, counted, method, n)
    reruns = calls["n"] - len(layers)
    share = TrainingSetup(stack="megatron", recompute_method=method, recompute_num_layers=n,
                          recompute_chunk_layers=len(layers)).recomputed_share
    m = load_preset("llama3.1-8b")
    base = model_flops_per_token(m, 4096)
    extra = hardware_flops_per_token(m, 4096, "full", share) - base
    assert extra / (hardware_flops_per_token(m, 4096, "full") - base) == pytest.approx(reruns / len(layers))
