"""Sliding-window and chunked attention in the step time (timing.kernels.local_attention_share):
the closed form against a count of the masks' visible scores, and the effect on a block."""

from dataclasses import replace

import numpy as np
import pytest

from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.timing.kernels import local_attention_share
from planner.timing.layer import layer_time
from planner.timing.model import DEFAULT_EFFICIENCY
from planner.training.setup import TrainingSetup


def _visible_share(s: int, kind: str, w: int) -> float:
    """Visible (query, key) pairs over s x s: causal j <= i; sliding also i - j < w
    (transformers' sliding_window_causal mask); chunked also i // w == j // w (Llama 4)."""
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    mask = j <= i
    if kind == "sliding":
        mask &= (i - j) < w
    elif kind == "chunked":
        mask &= (i // w) == (j // w)
    return float(mask.mean())


@pytest.mark.parametrize("name, s", [("gpt-oss-20b", 1024), ("gemma3-1b", 2048), ("llama4-scout", 2048)])
def test_share_equals_the_masks(name, s):
    m = load_model(name)
    w = min(m.attention_window, s)
    if m.local_attention == "chunked":     # chunks shorter than the sequence, to exercise them
        m, w = replace(m, attention_window=256), 256
    n_local = min(m.n_local_layers, m.n_layers)
    want = (n_local * _visible_share(s, m.local_attention, w)
            + (m.n_layers - n_local) * _visible_share(s, "", 0)) / m.n_layers
    # the mask count includes the diagonal: s (s + 1) / 2 pairs for causal, the model's 1/2
    # ignores it, so they agree to 1/(2s)
    assert local_attention_share(m, s) == pytest.approx(want, abs=1 / s)


def test_local_layers_run_faster_fused_attention():
    m = load_model("gpt-oss-20b")
    key = Layout(micro_batch=1, seq_len=8192, recompute="none")
    setup, gpu = TrainingSetup(seq_len=8192), get_gpu("h100")
    local = layer_time(m, setup, key, "fused", gpu, DEFAULT_EFFICIENCY)
    full = layer_time(replace(m, local_attention="", attention_window=0, n_local_layers=0), setup, key, "fused",
                      gpu, DEFAULT_EFFICIENCY)
    assert local.attention_fwd_s < 0.6 * full.attention_fwd_s
