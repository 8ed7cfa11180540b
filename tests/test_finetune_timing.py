"""Step time under LoRA, QLoRA and freeze (planner.timing.model with setup.finetune): frozen
weights need no weight gradient, only the adapters are updated and reduced, a quantized
base is dequantized before each GEMM, and freeze's frozen blocks run no backward."""

from dataclasses import replace

import pytest

from planner.hardware.gpus import get_gpu
from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout
from planner.memory.model import rank_params
from planner.models.spec import count_params, load_model
from planner.timing.model import (
    Efficiency,
    all_reduce_s,
    axis_links,
    cluster_for,
    frozen_block_extra_s,
    gemm_time_s,
    layer_key,
    layer_time,
    optimizer_update_bytes_per_param,
    rates,
    step_arrays,
    step_time,
    trained_split,
)
from planner.training.finetune import FinetuneSpec, n_trainable_params
from planner.training.setup import TrainingSetup

LORA16 = FinetuneSpec.named("lora", rank=16)
EFF = Efficiency()


def _setup(ft: FinetuneSpec, seq_len: int = 2048, global_batch: int = 16) -> TrainingSetup:
    return TrainingSetup(seq_len=seq_len, global_batch=global_batch, finetune=ft)


def test_lora_step_is_shorter_than_full_on_the_same_layout():
    # Hu et al. 2021 (LoRA, arXiv:2106.09685, Sec. 4.2) report a 25% training speed-up on
    # GPT-3 175B against full fine-tuning, from skipping the frozen weights' gradients:
    # full / LoRA = 1.25, LoRA / full = 0.8 measured. The model, from GEMMs alone (4 of 6
    # FLOPs per weight, plus attention and element-wise work that do not shrink), gives
    # 0.71 on a 70B layout on H100s: below the measured ratio, which also carries what
    # a real step does not save (kernel launches, data loading, the engine's own work).
    m, gpu = load_model("llama3.1-70b"), get_gpu("h100")
    lay = Layout(dp=1, tp=8, pp=1, micro_batch=1, grad_accum=16, seq_len=4096, recompute="none", sp=True)
    cluster = cluster_for(gpu)
    full = step_time(m, _setup(FinetuneSpec(), 4096), lay, cluster)
    lora = step_time(m, _setup(LORA16, 4096), lay, cluster)
    assert lora.step_time_s < full.step_time_s
    assert 0.65 < lora.step_time_s / full.step_time_s < 0.85


def test_frozen_gemms_run_one_backward_gemm():
    # a GEMM-bound shape (70B, short sequence, fused kernels, no recomputation): full
    # training's backward is about twice its forward; with a frozen base about once
    m, gpu = load_model("llama3.1-70b"), get_gpu("h100")
    key = layer_key(Layout(tp=1, micro_batch=4, seq_len=512, recompute="none"))
    full = layer_time(m, _setup(FinetuneSpec(), 512), key, "fused", gpu, EFF)
    lora = layer_time(m, _setup(LORA16, 512), key, "fused", gpu, EFF)
    assert full.bwd_s / full.fwd_s == pytest.approx(2.0, abs=0.15)
    assert lora.bwd_s / lora.fwd_s == pytest.approx(1.0, abs=0.15)
    # the adapters: rank 16 on q and v, a fraction of a percent of the block's forward
    r = rates(gpu, "bf16", EFF)
    adapters, dequant = frozen_block_extra_s(m, LORA16, key, r, 2)
    assert dequant == 0.0 and 0 < adapters < 0.01 * lora.fwd_s
    assert lora.fwd_s - full.fwd_s == pytest.approx(adapters, rel=1e-9)


def test_optimizer_updates_only_the_adapters():
    # 8B, LoRA rank 16 on q_proj and v_proj: 6,815,744 adapters x 28 B / (1008 GB/s x 0.7):
    # 0.27 ms, where updating all 8.03B parameters took 0.32 s
    m, gpu = load_model("llama3.1-8b"), get_gpu("4090")
    lay = Layout(dp=1, tp=1, pp=1, micro_batch=1, grad_accum=16, seq_len=2048, recompute="full")
    setup = _setup(LORA16)
    n = n_trainable_params(m, LORA16)
    assert n == 6_815_744          # 32 layers x 16 x (4096 + 4096 + 4096 + 1024)
    t = step_time(m, setup, lay, cluster_for(gpu))
    hbm = rates(gpu, "bf16", EFF).hbm_bytes_per_s
    assert t.optimizer_s == pytest.approx(n * 28 / hbm, rel=1e-12)
    assert t.optimizer_s < 1e-3
    full = step_time(m, _setup(FinetuneSpec()), lay, cluster_for(gpu))
    assert full.optimizer_s > 0.2
    assert t.step_time_s < full.step_time_s


def test_qlora_adds_the_dequantization_pass():
    # same adapters, same 16-bit adapter dtype: only the 4-bit base differs
    m, gpu = load_model("llama3.1-70b"), get_gpu("l40s")
    qlora = FinetuneSpec.named("qlora", rank=16)
    lora = replace(qlora, method="lora", quant="none")
    key = layer_key(Layout(tp=1, micro_batch=1, seq_len=512, recompute="full"))
    lq = layer_time(m, _setup(qlora, 512), key, "eager", gpu, EFF)
    ll = layer_time(m, _setup(lora, 512), key, "eager", gpu, EFF)
    r = rates(gpu, "bf16", EFF)
    _, dequant = frozen_block_extra_s(m, qlora, key, r, 2)
    # one block's 856M linear weights: read 0.5 + 1/64 + ... B, write 2 B, per GEMM call
    assert dequant == pytest.approx(855_638_016 * (2.5 + 1 / 64) / r.hbm_bytes_per_s, rel=1e-3)
    assert lq.fwd_s - ll.fwd_s == pytest.approx(dequant, rel=1e-9)
    # backward and the recomputed forward dequantize again
    assert lq.bwd_s - ll.bwd_s == pytest.approx(2 * dequant, rel=1e-9)
    # the paged 8-bit optimizer: 2 x (2 + 8/2048) + 2 + 2 bytes per adapter parameter
    assert optimizer_update_bytes_per_param(m, _setup(qlora)) == pytest.approx(8 + 16 / 2048)


def test_data_parallel_gradients_are_the_adapters():
    m, gpu = load_model("llama3.1-8b"), get_gpu("a100")
    pc = count_params(m)
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=1, grad_accum=2, seq_len=2048, zero_stage=0)
    setup = _setup(LORA16)
    sp = trained_split(m, pc, setup, lay, 0, m.n_layers)
    assert sp.trainable == n_trainable_params(m, LORA16)
    links = axis_links(cluster_for(gpu), (1, 1, 1, 8, 1))
    prec = setup.precision_spec
    (ar,) = step_arrays(m, setup, LayoutArrays.from_layouts([lay]), cluster_for(gpu), EFF, pc).dp_collectives(0)
    assert ar.window == "bwd" and ar.times == 1
    assert ar.seconds == all_reduce_s(sp.trainable * prec.grad_bytes, 8, links["dp"], EFF)
    # step arrays worked out without each collective (timing.fast.step_times_picked's rows: a
    # StepTime does not read them) refuse to give the collectives rather than give wrong ones
    parts = step_arrays(m, setup, LayoutArrays.from_layouts([lay]), cluster_for(gpu), EFF, pc)
    with pytest.raises(ValueError, match="without each data-parallel collective"):
        replace(parts, dp_each=None).dp_collectives(0)


def test_zero3_gathers_the_4bit_base():
    m, gpu = load_model("llama3.1-70b"), get_gpu("a100")
    pc = count_params(m)
    lay = Layout(dp=8, tp=1, pp=1, micro_batch=1, grad_accum=2, seq_len=512, zero_stage=3)
    qlora = FinetuneSpec.named("qlora", rank=16)
    sp = trained_split(m, pc, _setup(qlora), lay, 0, m.n_layers)
    # blocks at NF4 (about 0.5 B per weight), embedding and LM head in 16 bits
    assert 0.27 * 2 * pc.total < sp.frozen_bytes < 0.35 * 2 * pc.total
    # the forward all-gather of the 4-bit base against full training's 16-bit weights
    comms, full = (step_arrays(m, _setup(ft, seq_len=512), LayoutArrays.from_layouts([lay]), cluster_for(gpu), EFF,
                               pc).dp_collectives(0) for ft in (qlora, FinetuneSpec()))
    assert comms[0].window == "fwd" and comms[0].times == 2
    assert comms[0].seconds < 0.4 * full[0].seconds


def test_full_training_split_is_every_parameter():
    m = load_model("mixtral-8x7b")
    pc = count_params(m)
    lay = Layout(dp=2, tp=2, pp=2, ep=2, micro_batch=1, seq_len=4096)
    for stage in (0, 1):
        rp = rank_params(m, pc, lay, stage, 16)
        sp = trained_split(m, pc, TrainingSetup(), lay, stage, 16)
        assert (sp.trainable_dense, sp.trainable_expert, sp.frozen_bytes) == (rp.dense, rp.expert, 0)


def test_freeze_runs_backward_on_the_trainable_blocks_only():
    m, gpu = load_model("llama3.1-8b"), get_gpu("a100")
    lay = Layout(dp=1, tp=1, pp=1, micro_batch=1, grad_accum=4, seq_len=2048, recompute="none")
    cluster = cluster_for(gpu)
    freeze = step_time(m, _setup(FinetuneSpec.named("freeze", trainable_layers=2)), lay, cluster)
    full = step_time(m, _setup(FinetuneSpec()), lay, cluster)
    lt = layer_time(m, _setup(FinetuneSpec()), layer_key(lay), "eager", gpu, EFF)
    # 30 of 32 blocks skip their backward; the frozen LM head runs one backward GEMM, not two
    r = rates(gpu, "bf16", EFF)
    head_fwd = gemm_time_s(2048, m.vocab_size, m.d_model, r.matmul_flops_per_s, r.hbm_bytes_per_s, 2)
    assert full.compute_s - freeze.compute_s == pytest.approx(4 * (30 * lt.bwd_s + head_fwd), rel=1e-9)
    # 2 blocks' optimizer update out of 32 (no embedding, no head)
    pc = count_params(m)
    assert freeze.optimizer_s == pytest.approx(full.optimizer_s * 2 * pc.per_layer / pc.total, rel=1e-9)
