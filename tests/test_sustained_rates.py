"""Issue 18's three optimistic cases: LoRA FLOPs that count only the matmuls that run, and
per-GPU sustained training rates bounded by published runs (planner.timing.efficiency)."""

from __future__ import annotations

from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.timing.flops import flops_per_step
from planner.timing.model import TRAINING_MFU_CEILING, cluster_for, step_time
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup


def test_lora_flops_are_the_matmuls_that_run():
    # A frozen weight runs forward and the input gradient (2 of full training's 3 GEMMs);
    # Hu et al. 2021 (arXiv:2106.09685, Sec. 4.2) measure LoRA's step at 0.8 of full
    # fine-tuning's on GPT-3 175B, so the work it does is at least 2/3 and below 0.8 of full
    # training's (the rest of the step does not shrink). Llama-2-7B, q/v adapters, s 4096.
    m = load_model("llama2-7b")
    full = flops_per_step(m, 4096, 8)
    lora = flops_per_step(m, 4096, 8, ft=FinetuneSpec.named("lora"))
    ratio = lora.model_flops / full.model_flops
    assert 2 / 3 <= ratio < 0.8
    # freeze with every block trained is full training
    every = FinetuneSpec.named("freeze", trainable_layers=m.n_layers)
    frozen_head = flops_per_step(m, 4096, 8, ft=every).model_flops
    assert frozen_head < full.model_flops       # only the frozen LM head's weight gradient is gone


def _mfu(model: str, gpu_name: str, lay: Layout, ft: FinetuneSpec = FinetuneSpec()) -> tuple[float, float]:
    m, gpu = load_model(model), get_gpu(gpu_name)
    setup = TrainingSetup(seq_len=lay.seq_len, global_batch=lay.micro_batch * lay.grad_accum * lay.dp,
                          finetune=ft)
    t = step_time(m, setup, lay, cluster_for(gpu))
    return t.mfu, t.tokens_per_s / t.n_gpus


def test_lora_7b_on_one_a100_is_below_the_published_a100_ceiling():
    # was 89.5% MFU (full training's FLOPs over LoRA's shorter step)
    lay = Layout(dp=1, tp=1, pp=1, micro_batch=4, grad_accum=4, seq_len=4096, recompute="none")
    mfu, _ = _mfu("llama2-7b", "a100", lay, FinetuneSpec.named("lora"))
    assert mfu <= TRAINING_MFU_CEILING["a100"] + 1e-9
    # llm-foundry's best A100 run: MPT-7B, 8 x A100, 4,641 tokens/s/GPU = 0.641 MFU
    assert TRAINING_MFU_CEILING["a100"] < 0.65


def test_8b_full_finetune_on_8_a100_is_not_above_published_a100_runs():
    # was 72% MFU; the best published A100 run in tests/data/published_runs_more.json is 64.1%
    lay = Layout(dp=4, tp=1, pp=1, cp=2, zero_stage=2, micro_batch=4, grad_accum=64, seq_len=4096,
                 recompute="none")
    mfu, _ = _mfu("llama3.1-8b", "a100", lay)
    assert 0.55 < mfu <= 0.641 + 1e-9


def test_mi300x_is_not_faster_per_gpu_than_h100():
    # SemiAnalysis (2024-12-22) find the MI300X slower per GPU than the H100 in training with
    # the public stack; its data-sheet peak is 1.32x the H100's
    lay = Layout(dp=8, tp=1, pp=1, zero_stage=3, micro_batch=2, grad_accum=8, seq_len=4096, recompute="none")
    _, mi = _mfu("llama3.1-8b", "mi300x", lay)
    _, h = _mfu("llama3.1-8b", "h100", lay)
    assert mi <= h
