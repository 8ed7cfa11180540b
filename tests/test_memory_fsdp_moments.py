"""FSDP2 full shard's backward moments over few, large MoE blocks (memory.buffers.
fsdp_two_block_bytes, fsdp_post_backward_bytes; memory.peak.fsdp_blocks_done and its early
block) against FSDPMemTracker's snapshots of real-width cuts of docs/accuracy.md (bench/configs/
*-2l.json on 8 ranks, micro-batch 1; qwen3-235b-a22b-8l.json on 64 ranks; bf16-mixed, sequence
1024, no recomputation; torch 2.13, transformers 5.24; ``python bench/accuracy.py --modules
NAME`` prints them). Figures in GiB, the tracker's categories at its peak. No torch needed: the
planner's prediction only.
"""

from pathlib import Path

import pytest

from planner.layouts.layout import Layout
from planner.measure import accuracy
from planner.memory.peak import largest_block_share
from planner.models.spec import count_params, load_model
from planner.training.setup import TrainingSetup

GiB = 2**30
CONFIGS = Path(__file__).resolve().parents[1] / "bench" / "configs"


def predict(name: str) -> tuple[dict[str, float], str]:
    m = load_model(str(CONFIGS / f"{name}.json"))
    setup = TrainingSetup(seq_len=1024, global_batch=8, precision="bf16-mixed")
    lay = Layout(dp=8, zero_stage=3, micro_batch=1, grad_accum=1, seq_len=1024, recompute="none")
    rows, phase = accuracy.predict(m, setup, lay)
    return {k: v / GiB for k, v in rows.items()}, phase


@pytest.mark.parametrize("name, peak, sharded_grads, all_gather, reduce_scatter, act_temp", [
    # the peak as block 0's backward starts (its all-gather output copied out beside its
    # gathered weights): block 1's sharded gradients and fp32 reduce-scatter input held
    ("qwen3-235b-a22b-2l", 32.235, 1.158, 4.634, 9.268, 1.533),
    ("llama4-scout-2l", 33.767, 1.025, 4.102, 8.203, 3.438),
])
def test_two_alike_blocks_peak_as_block_0_starts_its_backward(name, peak, sharded_grads, all_gather,
                                                          reduce_scatter, act_temp):
    got, phase = predict(name)
    assert phase == "backward-end"
    assert got["total"] == pytest.approx(peak, rel=0.005)
    assert got["gradients"] == pytest.approx(sharded_grads, rel=0.005)
    # block 1's reduce-scatter input. The tracker's buffers hold block 0's all-gather output
    # too; the planner's moment of equal total (block 0 in backward, the same gathered weights)
    # holds block 0's 16-bit gradients, the all-gather's size with blocks alike, instead
    assert got["buffers"] == pytest.approx(reduce_scatter, rel=0.005)
    # and block 0's activations with the LM head's gradient (the tracker's activations and temporaries)
    assert got["activations"] - all_gather == pytest.approx(act_temp, rel=0.01)


def test_dense_then_moe_block_peaks_in_the_moe_blocks_post_backward():
    # DeepSeek-V3 cut to its dense block 0 and MoE block 1: the tracker peaks in block 1's
    # post-backward: block 1 resharded (weights: sharded 6.49 + root 3.45), its unsharded
    # gradients 21.43 being copied into its fp32 reduce-scatter input 42.87, block 0 (dense)
    # prefetched 1.09, block 0's activations 0.49 and the LM head's gradient 1.74; no sharded
    # gradients yet. The mean block (11.26 GiB gathered) put the total 9.4% short.
    got, phase = predict("deepseek-v3-2l")
    assert phase == "backward-end"
    assert got["total"] == pytest.approx(90.546, rel=0.005)
    assert got["weights"] == pytest.approx(6.49 + 3.45, rel=0.005)
    assert got["gradients"] == 0
    assert got["buffers"] == pytest.approx(1.087 + 42.87, rel=0.005)
    assert got["activations"] == pytest.approx(21.434 + 0.49 + 1.74, rel=0.01)


def test_largest_block_share_is_the_moe_block_over_the_mean():
    # transformers' DeepseekV3ForCausalLM of bench/configs/deepseek-v3-2l.json on the meta
    # device: model.layers.0 583,483,392 parameters (dense MLP), model.layers.1 11,507,286,016
    # (256 routed experts, a shared one and the router)
    pc = count_params(load_model(str(CONFIGS / "deepseek-v3-2l.json")))
    assert largest_block_share(pc) == pytest.approx(11_507_286_016 / ((583_483_392 + 11_507_286_016) / 2), rel=1e-6)
    assert largest_block_share(count_params(load_model(str(CONFIGS / "qwen3-235b-a22b-2l.json")))) == 1.0


@pytest.mark.parametrize("mb, peak", [(2, 35.390), (4, 40.430)])
def test_eight_blocks_with_large_activations_peak_in_the_second_block_in_backward(mb, peak):
    # Qwen3-235B-A22B cut to 8 blocks, 64 ranks: a block's activations (0.73 / 1.46 GiB) outweigh
    # its sharded gradients (0.145), so the peak is in block 6's backward (the tracker's module
    # snapshots), not block 1's: block 7's sharded gradients 0.145 and reduce-scatter input 9.27,
    # block 5 prefetched 4.63, weights sharded 1.23 + root 2.32 + block 6 gathered 4.63
    m = load_model(str(CONFIGS / "qwen3-235b-a22b-8l.json"))
    setup = TrainingSetup(seq_len=1024, global_batch=64 * mb, precision="bf16-mixed")
    lay = Layout(dp=64, zero_stage=3, micro_batch=mb, grad_accum=1, seq_len=1024, recompute="none")
    rows, phase = accuracy.predict(m, setup, lay)
    got = {k: v / GiB for k, v in rows.items()}
    assert phase == "backward-end"
    assert got["total"] == pytest.approx(peak, rel=0.01)
    assert got["gradients"] == pytest.approx(0.145, rel=0.01)
    assert got["buffers"] == pytest.approx(4.634 + 9.268, rel=0.005)
    assert got["weights"] == pytest.approx(1.23 + 2.32 + 4.634, rel=0.005)


def test_dense_blocks_with_large_activations_peak_in_the_second_block_in_backward():
    # Llama-3-8B, 64 ranks, 1024 tokens, no recomputation (docs/accuracy.md): the tracker peaks at
    # 12.23 GiB with one block's sharded gradients (0.0127) and 1.219 GiB of buffers (block 30's
    # prefetch and block 31's fp32 reduce-scatter input); the start of backward gave -6.8%
    setup = TrainingSetup(seq_len=1024, global_batch=64, precision="bf16-mixed")
    lay = Layout(dp=64, zero_stage=3, micro_batch=1, grad_accum=1, seq_len=1024, recompute="none")
    rows, phase = accuracy.predict(load_model("llama3.1-8b"), setup, lay)
    got = {k: v / GiB for k, v in rows.items()}
    assert phase == "backward-end"
    assert got["total"] == pytest.approx(12.230, rel=0.01)
    assert got["gradients"] == pytest.approx(0.0127, rel=0.01)
    assert got["buffers"] == pytest.approx(1.219, rel=0.005)


def test_hybrid_blocks_done_are_decoder_layers_not_pattern_letters():
    # Qwen3-Next-80B-A3B cut to 4 decoder layers (bench/configs/qwen3-next-80b-a3b-4l.json: 8 letters
    # of the pattern, 2 per Qwen3NextDecoderLayer, the unit measure.build.shard wraps), 8 ranks,
    # bf16-mixed, 1024 tokens: FSDPMemTracker peaks in block 1's backward with blocks 2 and 3 done,
    # their sharded fp32 gradients 1,645,318,496 B (docs/accuracy.json). Counting letters as blocks
    # had taken 8 - 2 = 6 letters (three decoder layers) done: 2,470,376,856 B, +50%, and the
    # activations of three layers freed (4.09 GiB against the tracker's 4.59).
    got, phase = predict("qwen3-next-80b-a3b-4l")
    assert phase == "backward-end"
    assert got["gradients"] == pytest.approx(1_645_318_496 / GiB, rel=0.005)
    assert got["activations"] == pytest.approx(4_929_063_432 / GiB, rel=0.02)
    assert got["total"] == pytest.approx(31_822_505_424 / GiB, rel=0.005)
