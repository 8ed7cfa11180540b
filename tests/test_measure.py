"""planner.measure.trackers: one real training step under PyTorch's memory trackers.

Reference numbers: docs/facts.md ("Measuring real per-rank memory on CPU"): transformers' Llama-3-8B,
8 ranks, FSDP2 full sharding, bf16 mixed precision, sequence 2048, micro-batch 1: 29.3 GiB peak
per rank, sharded params 3.74 GiB, optimizer states 7.48 GiB.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

require("torch")
require("transformers")

from planner.errors import UserError  # noqa: E402
from planner.measure.readout import CATEGORIES, MeasuredMemory  # noqa: E402
from planner.measure.trackers import MeasureSetup, measure  # noqa: E402

GiB = 2**30
REPO = Path(__file__).resolve().parents[1]

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
    "max_position_embeddings": 2048, "tie_word_embeddings": False,
}
# meta-llama/Meta-Llama-3-8B config.json (the fields that shape memory)
LLAMA3_8B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
}
TINY_PARAMS = 2_094_336  # 2 x 1000 x 256 embeddings + 2 x 791,040 per block + 256 final norm - see test


def tiny(**kw: object) -> MeasureSetup:
    return MeasureSetup(hf_config=TINY_LLAMA, **{"seq_len": 256, "micro_batch": 2, "precision": "fp32", **kw})


def test_import_does_not_import_torch():
    code = ("import sys, planner.measure.trackers; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_tiny_param_count():
    # per block: 4 x 256 x 256 attention + 3 x 256 x 688 MLP + 2 x 256 norms = 791,040
    assert 2 * 1000 * 256 + 2 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256) + 256 == TINY_PARAMS
    assert measure(tiny(n_steps=1)).n_params == TINY_PARAMS


@pytest.mark.slow
@pytest.mark.parametrize("kw", [
    {},                                                          # fp32, replicated
    {"precision": "bf16-mixed", "seq_len": 64},                  # autocast (bf16 matmuls are slow on CPU)
    {"sharding": "full", "dp": 8, "recompute": "full"},          # FSDP2 + activation checkpointing
])
def test_fake_equals_real(kw):
    fake = measure(tiny(**kw))
    real = measure(tiny(fake=False, **kw))
    assert fake.peak_bytes == pytest.approx(real.peak_bytes, rel=0.01)
    assert fake.raw == real.raw  # in practice byte for byte


@pytest.mark.parametrize("kw", [
    {},                                                          # MemTracker, replicated
    pytest.param({"sharding": "full", "dp": 4, "recompute": "full", "n_steps": 3},   # FSDPMemTracker,
                 marks=pytest.mark.slow),                        # recompute; the fast tier keeps kw0
])
def test_skipping_unchanged_updates_gives_torchs_tracker_result(kw, monkeypatch):
    """The tracker skips MemTracker's after-every-op update when nothing it reads changed
    (planner.measure.readout); with torch's update after every op the result is the same, to
    the byte, module peaks included."""
    import dataclasses

    import planner.measure.trackers as trackers

    skipped = dataclasses.asdict(measure(tiny(**kw)))
    made = trackers.make_tracker

    def every_op(*args, **kwargs):
        tracker = made(*args, **kwargs)
        tracker.skip_unchanged = False
        return tracker

    monkeypatch.setattr(trackers, "make_tracker", every_op)
    full = dataclasses.asdict(measure(tiny(**kw)))
    for result in (skipped, full):
        result.pop("wall_s")
    assert skipped == full


@pytest.mark.slow
def test_categories_sum_to_peak_and_bound_maxima():
    for setup in (tiny(), tiny(sharding="full", dp=4)):
        r = measure(setup)
        at_peak = [getattr(r, f"{c}_bytes") for c in CATEGORIES]
        assert sum(at_peak) == r.peak_bytes == r.raw["Total"]
        for cat in CATEGORIES:
            assert getattr(r, f"max_{cat}_bytes") >= getattr(r, f"{cat}_bytes")


@pytest.mark.slow
def test_replicated_model_states():
    r = measure(tiny())
    assert r.tracker == "MemTracker"
    assert r.raw["Parameter"] == TINY_PARAMS * 4             # fp32 weights
    assert r.max_gradients_bytes == TINY_PARAMS * 4          # fp32 grads, all alive before step()
    # AdamW: exp_avg + exp_avg_sq in fp32 + a 4-byte step count per tensor (21 tensors)
    assert r.raw["Optstate"] == TINY_PARAMS * 8 + 21 * 4


@pytest.mark.slow
def test_pure_bf16_halves_weights_and_optimizer_state():
    r = measure(tiny(precision="bf16"))
    assert r.peak_phase == "backward"  # else "Optstate" would hold the step's transients too
    assert r.raw["Parameter"] == TINY_PARAMS * 2
    # bf16 exp_avg + exp_avg_sq; the step counts stay 4-byte fp32 scalars
    assert r.raw["Optstate"] == TINY_PARAMS * 4 + 21 * 4
    short = measure(tiny(precision="bf16", seq_len=64, n_steps=1))
    assert short.peak_phase == "optimizer"  # few activations: grads + states + step transients win
    assert short.raw["Optstate"] > TINY_PARAMS * 4


@pytest.mark.slow
def test_peak_is_located():
    r = measure(tiny())
    assert (r.peak_step, r.peak_phase) == (2, "backward")  # loss gradient with all activations alive
    assert r.peak_module == "LlamaForCausalLM"
    assert "LlamaForCausalLM.model.layers.0" in r.by_module


@pytest.mark.slow
def test_full_sharding_divides_weights_by_dp():
    replicated = measure(tiny())
    sharded = measure(tiny(sharding="full", dp=8))
    assert sharded.tracker == "FSDPMemTracker"
    assert sharded.raw["Sharded Param"] == replicated.raw["Parameter"] // 8
    assert sharded.raw["OptState"] == pytest.approx(replicated.raw["Optstate"] / 8, rel=1e-3)


@pytest.mark.slow
def test_grad_op_keeps_unsharded_weights_until_backward():
    full = measure(tiny(sharding="full", dp=8))
    grad_op = measure(tiny(sharding="grad-op", dp=8))
    assert grad_op.max_weights_bytes > full.max_weights_bytes


@pytest.mark.slow
@pytest.mark.parametrize("sharding,precision,where", [("grad-op", "fp32", "Unsharded Grad"),
                                                       ("grad-op", "bf16-mixed", "Temp"),
                                                       ("full", "fp32", "Unsharded Grad")])
def test_no_sync_accumulation_holds_every_unsharded_gradient(sharding, precision, where):
    """FSDP2 shard-grad-op or full shard with a no-sync micro-batch before the synced one
    (what torch's pipeline schedules run for any FSDP2 module: stage.py
    backward_maybe_with_nosync): through the second micro-batch every parameter's unsharded
    gradient is held, 4 B each in fp32 and in bf16-mixed (upcast to the fp32 reduce dtype,
    which the tracker files as a temporary); no sharded gradient exists yet. The planner's
    term (memory.states.no_sync_gradient_bytes) for the same parameters under pp > 1, and none
    when the gradients are reduce-scattered every micro-batch (Llama 3's setting)."""
    import numpy as np

    from planner.layouts.batch import LayoutArrays
    from planner.layouts.layout import Layout
    from planner.memory.states import no_sync_gradient_bytes
    from planner.training.setup import Precision

    r = measure(tiny(sharding=sharding, dp=8, seq_len=64, micro_batch=1, precision=precision,
                     no_sync_micro_batches=1))
    assert r.raw["Sharded Grad"] == 0
    lay = LayoutArrays.from_layouts([Layout(dp=8, pp=2, sharding=f"fsdp-{sharding}")])
    prec = Precision.named(precision)
    planned = no_sync_gradient_bytes(np.array([TINY_PARAMS]), np.array([0]), prec, lay)
    assert r.raw[where] == int(planned[0]) == TINY_PARAMS * 4
    assert int(no_sync_gradient_bytes(np.array([TINY_PARAMS]), np.array([0]), prec, lay, "micro-batch")[0]) == 0


@pytest.mark.slow
def test_recompute_and_attention_change_activations():
    base = measure(tiny(n_steps=1))
    assert measure(tiny(n_steps=1, recompute="full")).max_activations_bytes < base.max_activations_bytes
    # eager attention keeps the (b, h, s, s) scores and probabilities: 2 x 8 x 256 x 256 x 4 B each
    assert measure(tiny(n_steps=1, attention="eager")).max_activations_bytes > base.max_activations_bytes


@pytest.mark.slow
def test_dropout_keeps_what_a_gpu_keeps():
    # CUDA's dropout keeps a 1-byte mask, and its flash / memory-efficient attention drops out
    # inside the kernel; fake CPU runs do the same (planner.measure.trackers._gpu_dropout_kernels). So
    # dropout 0.1 adds exactly two masks per block and one after the embeddings, b s h x 1 B
    # each: (2 x 2 + 1) x 2 x 256 x 128 = 327,680 B. (As the CPU runs them: 12.9 MB, fp32
    # noise and the math attention kernel's s x s probabilities.)
    def gpt2(p: float) -> MeasureSetup:
        cfg = {"model_type": "gpt2", "n_embd": 128, "n_head": 4, "n_layer": 2, "vocab_size": 1000,
               "n_positions": 512, "attn_pdrop": p, "resid_pdrop": p, "embd_pdrop": p,
               "bos_token_id": 0, "eos_token_id": 0}
        return MeasureSetup(hf_config=cfg, seq_len=256, micro_batch=2, precision="fp32")

    with_dropout, without = measure(gpt2(0.1)), measure(gpt2(0.0))
    assert with_dropout.peak_bytes - without.peak_bytes == (2 * 2 + 1) * 2 * 256 * 128


@pytest.mark.slow
def test_repeated_calls_leave_no_process_group():
    import torch.distributed as dist

    a = measure(tiny(sharding="full", dp=2, n_steps=1))
    assert not dist.is_initialized()
    b = measure(tiny(sharding="full", dp=2, n_steps=1))
    assert a.peak_bytes == b.peak_bytes


def test_bad_setups_are_user_errors():
    with pytest.raises(UserError, match="sharding"):
        MeasureSetup(hf_config=TINY_LLAMA, sharding="zero3")
    with pytest.raises(UserError, match="Adafactor"):
        MeasureSetup(hf_config=TINY_LLAMA, sharding="full", dp=8, optimizer="adafactor")
    with pytest.raises(UserError, match="model_type"):
        MeasureSetup(hf_config={"hidden_size": 8})
    with pytest.raises(UserError, match="unknown MeasureSetup keys"):
        MeasureSetup.from_json(json.dumps({"hf_config": TINY_LLAMA, "tp": 2}))


@pytest.mark.slow
def test_cli_prints_measured_memory_json():
    setup = tiny(seq_len=32, micro_batch=1, n_steps=1)
    out = subprocess.run([sys.executable, "-m", "planner.measure.trackers", setup.to_json()], check=True,
                         capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    result = MeasuredMemory.from_json(out)
    assert result.n_params == TINY_PARAMS
    assert result == MeasuredMemory.from_json(result.to_json())


@pytest.mark.slow
def test_llama3_8b_fsdp_full_bf16_mixed_matches_facts():
    """About 35 s on 2 CPU cores and 400 MiB of real memory (fake tensors)."""
    r = measure(MeasureSetup(hf_config=LLAMA3_8B, dp=8, sharding="full", precision="bf16-mixed",
                             seq_len=2048, micro_batch=1))
    assert r.n_params == 8_030_261_248
    assert r.raw["Sharded Param"] == 8_030_261_248 * 4 // 8            # 3.74 GiB fp32 shard
    assert r.raw["OptState"] == pytest.approx(8_030_261_248 * 8 / 8, rel=1e-4)  # 7.48 GiB
    # docs/facts.md: 29.3 GiB, measured with the bf16 logits (2048 x 128256 x 2 B = 0.49 GiB) still
    # referenced during backward; measure() drops them before backward, as training loops do.
    assert r.peak_bytes / GiB == pytest.approx(29.3 - 0.49, abs=0.15)


@pytest.mark.slow
def test_mla_attention_keeps_no_scores_under_fake_tensors():
    """DeepSeek-V3's value heads are narrower than its query heads; the CPU's flash kernel wants
    one head size and PyTorch would fall back to the math kernel's fp32 s x s scores, which no
    GPU keeps. The measurement pads V as transformers' flash-attention path does
    (planner.measure.trackers), so the activations grow linearly with the sequence."""
    import pathlib

    cfg = json.loads((pathlib.Path(__file__).resolve().parent.parent / "bench" / "configs"
                      / "tiny-deepseek-v3.json").read_text())

    def acts(seq: int) -> int:
        r = measure(MeasureSetup(hf_config=cfg, seq_len=seq, micro_batch=2, precision="bf16", n_steps=1))
        return r.max_activations_bytes

    short, long = acts(256), acts(1024)
    assert long / short < 4.2     # linear in s (4x) up to the fixed parts; the math kernel's scores: > 6x


@pytest.mark.slow
def test_module_snapshots_name_each_block_and_the_peak():
    """measure(..., module_snapshots): the tracker's per-module snapshots (FSDPMemTracker on 4
    fake ranks): every block has a backward peak, and the largest of them is the step's peak."""
    snaps: list = []
    r = measure(tiny(sharding="full", dp=4, n_steps=1), snaps)
    blocks = {m for m, _, _ in snaps if ".layers." in m}
    assert len(blocks) == 2
    peaks = [c["Total"] for m, state, c in snaps if state == "PEAK_BW"]
    assert max(peaks) == r.peak_bytes
