"""Post-training plans (issue 34): distillation with a teacher and RL steps by phase.

Referees: PyTorch's MemTracker running a real distillation step (transformers' models, the
forward KL and hidden-state MSE written as torchtune's recipes run them); transformers' own KV
cache against vLLM's block arithmetic; TRL's own config classes for --out; the CLI's exit codes.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import plan_in_process, require

from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.distill import distill_memory
from planner.memory.inference import kv_elements_per_token
from planner.memory.rollout import VLLM_BLOCK_SIZE, engine_budget
from planner.models.families import spec_from_hf_config
from planner.models.spec import load_model
from planner.training.posttrain import DistillSetup, RLSetup
from planner.training.setup import TrainingSetup

STUDENT = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 8192, "max_position_embeddings": 2048,
           "tie_word_embeddings": False}
TEACHER = dict(STUDENT, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8)
# a second family: Qwen3 (QK norms, tied embeddings)
QWEN3_STUDENT = {"model_type": "qwen3", "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 8192,
                 "max_position_embeddings": 2048, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
QWEN3_TEACHER = dict(QWEN3_STUDENT, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                     num_attention_heads=8)


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    """``plan ARGS``: exit status, stdout and stderr, in this process (conftest.plan_in_process)."""
    return plan_in_process(*args)


@pytest.mark.slow
@pytest.mark.parametrize("student_cfg, teacher_cfg, kd_loss, hidden", [
    (STUDENT, TEACHER, "full", 0), (STUDENT, TEACHER, "chunked", 2), (QWEN3_STUDENT, QWEN3_TEACHER, "chunked", 2)])
def test_distillation_step_matches_memtracker(student_cfg: dict, teacher_cfg: dict, kd_loss: str, hidden: int) -> None:
    # the referee: MemTracker's peak of two real distillation steps of tiny transformers models
    # under fake tensors (planner.measure.distill); measured 2026-12-06: Llama -1.6% (full), -1.7%
    # (chunked + 2 hidden-state losses), Qwen3 -3.3% (chunked + 2); the issue asks for 10%
    require("transformers")
    from planner.measure.distill import compare_distill

    s = spec_from_hf_config(student_cfg, "tiny-student", "test")
    t = spec_from_hf_config(teacher_cfg, "tiny-teacher", "test")
    setup = TrainingSetup(seq_len=512, global_batch=2)
    lay = Layout(dp=1, tp=1, pp=1, zero_stage=0, micro_batch=2, grad_accum=1, seq_len=512, recompute="none")
    c = compare_distill(s, t, student_cfg, teacher_cfg, setup, DistillSetup(teacher="t", kd_loss=kd_loss,
                                                                             kd_hidden_layers=hidden), lay)
    assert abs(c.error) < 0.05
    assert abs(c.extra_error) < 0.10


def test_chunked_kd_loss_needs_less_than_full() -> None:
    # torchtune's chunked KL keeps 9 B per logit for its backward, the full one peaks at 17 B
    s, t = load_model("llama3.1-8b"), load_model("llama3.1-70b")
    lay = Layout(dp=8, tp=1, pp=1, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=1, seq_len=4096)
    full = distill_memory(s, t, TrainingSetup(), DistillSetup(teacher="t", kd_loss="full"), lay, "fsdp")
    chunked = distill_memory(s, t, TrainingSetup(), DistillSetup(teacher="t"), lay, "fsdp")
    assert full.kd_loss == 4096 * 128_256 * 17
    assert chunked.kd_loss < full.kd_loss
    # FSDP shards the 70B teacher's 16-bit weights over the 8 ranks (70,553,706,496 parameters)
    assert full.teacher_weights == pytest.approx(70_553_706_496 * 2 / 8, rel=1e-6)


def test_vllm_blocks_hold_transformers_cache() -> None:
    # vLLM's page (vllm/v1/kv_cache_interface.py: 2 x block_size x num_kv_heads x head_size x dtype
    # bytes per layer) times the blocks a sequence needs (ceil(L / block_size)) covers the cache
    # transformers builds for the same sequence, with less than one block of slack
    torch = require("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(STUDENT)
    model_type = cfg.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg))
    length = 100
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 8192, (1, length)), use_cache=True)
    cache = out.past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    m = spec_from_hf_config(STUDENT, "tiny", "test")
    per_layer_page = kv_elements_per_token(m) * VLLM_BLOCK_SIZE * 4       # fp32 cache here
    blocks = -(-length // VLLM_BLOCK_SIZE)
    paged = blocks * per_layer_page * m.n_layers
    assert measured == kv_elements_per_token(m) * length * m.n_layers * 4
    assert measured <= paged < measured + per_layer_page * m.n_layers


def test_engine_budget_qwen3_8b() -> None:
    # Qwen3-8B: 36 layers, 8 KV heads of 128, bf16: a 16-token page is 2 x 16 x 8 x 128 x 2 = 65,536 B
    # per layer (vLLM's real_page_size_bytes), 2,359,296 B over the layers; 5,120 tokens take 320 blocks
    m = load_model("qwen3-8b")
    b = engine_budget(m, get_gpu("h100"), RLSetup(task="grpo", prompt_len=1024, response_len=4096))
    assert b.page_bytes == 65_536 * 36
    assert b.blocks_per_sequence == 320
    assert b.kv_bytes == b.n_blocks * b.page_bytes
    assert b.reserved_bytes == int(0.9 * get_gpu("h100").memory_bytes)


def test_distill_plan_names_teacher_terms() -> None:
    r = _plan("--model", "llama3.1-8b", "--teacher", "llama3.1-70b", "--gpus", "h100", "--seq-len", "4096")
    assert r.returncode == 0, r.stderr
    for words in ("teacher weights", "teacher logits", "KD loss working set", "teacher forward"):
        assert words in r.stdout


@pytest.mark.slow
def test_grpo_plan_by_phase() -> None:
    r = _plan("--model", "qwen3-8b", "--task", "grpo", "--gpus", "h100", "--n-gpus", "8", "--prompt-len", "1024",
              "--response-len", "4096", "--group-size", "8", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["plan"]
    assert set(p["memory_by_phase"]) == {"generation", "scoring", "training"}
    assert p["memory_by_phase"]["scoring"]["reference weights"] > 0
    assert {"generation: decode", "log-prob passes", "training", "weight resync"} <= set(p["time_by_phase_s"])
    assert p["peak_phase"] in p["memory_by_phase"]


@pytest.mark.parametrize("args, words", [
    (["--model", "llama3.1-8b", "--teacher", "qwen3-8b", "--gpus", "h100"], "one tokenizer"),
    (["--model", "qwen3-8b", "--teacher", "qwen3-8b", "--task", "grpo", "--gpus", "h100"], "give one of them"),
    (["--model", "qwen3-8b", "--task", "grpo", "--gpus", "h100", "--kd-hidden-layers", "2"], "needs --teacher"),
])
def test_bad_posttrain_input(args: list[str], words: str) -> None:
    r = _plan(*args)
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr


def test_trl_configs_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # TRL's own config classes (trl 1.16) accept what --out writes
    trl = require("trl")
    out = tmp_path / "grpo"
    r = _plan("--model", "qwen3-8b", "--task", "grpo", "--gpus", "h100", "--n-gpus", "8", "--tp", "1", "--pp", "1",
              "--cp", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    kw = json.loads((out / "trl_grpo_config.json").read_text())
    cfg = trl.GRPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, **kw)   # bf16 needs a GPU to run, not to parse
    assert cfg.num_generations == 8 and cfg.vllm_mode == "colocate"
    out = tmp_path / "kd"
    r = _plan("--model", "llama3.1-8b", "--teacher", "llama3.1-70b", "--gpus", "h100", "--n-gpus", "8", "--tp", "1",
              "--pp", "1", "--cp", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    kw = json.loads((out / "trl_distillation_config.json").read_text())
    cfg = trl.DistillationConfig(output_dir=str(tmp_path / "run2"), use_cpu=True, **kw)
    assert cfg.beta == 0.0


def test_teacher_forward_flops_against_flop_counter() -> None:
    # the teacher's forward FLOPs (timing.rollout.forward_flops_per_token, the convention of
    # timing.flops: full s x s scores) against PyTorch's FlopCounterMode running transformers'
    # forward of the tiny teacher with eager attention (its two s x s matmuls are counted; the CPU
    # flash kernel of scaled_dot_product_attention has no FLOP formula and counts 0)
    torch = require("torch")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.timing.rollout import forward_flops_per_token

    cfg = dict(TEACHER)
    model_type = cfg.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg), attn_implementation="eager")
    b, s = 2, 256
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(input_ids=torch.randint(0, 8192, (b, s)))
    t = spec_from_hf_config(TEACHER, "tiny-teacher", "test")
    assert forward_flops_per_token(t, s) * b * s == pytest.approx(counter.get_total_flops(), rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("args, words", [
    (["--teacher-sharding", "fsdp", "--n-gpus", "8"], "FSDP-sharded over dp="),
    (["--kd-offline-topk", "64"], "offline: stored top-k logits"),
    (["--kd-hidden-layers", "4", "--n-gpus", "8"], "hidden-state projections (trained)"),
])
def test_distill_variants(args: list[str], words: str) -> None:
    r = _plan("--model", "llama3.1-8b", "--teacher", "llama3.1-70b", "--gpus", "h100", *args)
    assert r.returncode == 0, r.stderr
    assert words in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("task, key", [("ppo", "critic states"), ("dpo", "reference weights")])
def test_ppo_and_dpo(task: str, key: str) -> None:
    r = _plan("--model", "qwen3-8b", "--task", task, "--gpus", "h100", "--n-gpus", "8", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["plan"]
    assert p["memory_by_phase"]["training"][key] > 0
    if task == "dpo":       # stored pairs: nothing is generated
        assert p["memory_by_phase"]["generation"] == {}
        assert "generation: decode" not in p["time_by_phase_s"]


def test_trl_out_refuses_model_parallel_layouts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = _plan("--model", "qwen3-8b", "--task", "grpo", "--gpus", "h100", "--n-gpus", "8", "--tp", "2",
              "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "--tp 1 --pp 1 --cp 1" in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, words", [
    (["--model", "8b", "--gpus", "h100", "--group-size", "4"], "needs --task grpo, ppo or dpo"),
    (["--model", "8b", "--gpus", "h100", "--kd-loss", "full"], "needs --teacher"),
    (["--model", "8b", "--gpus", "h100", "--teacher", "70b", "--task", "load"], "give one of them"),
    (["measure", "--model", "8b", "--kd-hidden-layers", "2"], "needs --teacher"),
])
def test_post_training_options_need_their_task(args: list[str], words: str) -> None:
    # an option that would be ignored is refused, naming what it needs
    r = _plan(*args)
    assert r.returncode == 2 and words in r.stderr


@pytest.mark.slow
def test_logprob_pass_against_memtracker() -> None:
    # the scoring phase's no-grad forward with token log-probs (memory.rollout.logprob_pass_bytes)
    # against MemTracker's peak less the weights, a bf16 tiny Llama on the CPU; measured +3.1%
    torch = require("torch")
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.memory.rollout import logprob_pass_bytes

    cfg = dict(STUDENT)
    model_type = cfg.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg), dtype=torch.bfloat16,
                                             attn_implementation="sdpa")
    ids = torch.randint(0, 8192, (2, 512))
    tracker = MemTracker()
    tracker.track_external(model, ids)
    with tracker, torch.no_grad():
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1))
        del logits
    snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
    named = {str(getattr(k, "value", k)): v for k, v in snap.items()}
    measured = named["Total"] - named["Parameter"] - named["Buffer"]
    m = spec_from_hf_config(STUDENT, "tiny", "test")
    lay = Layout(dp=1, tp=1, pp=1, zero_stage=0, micro_batch=2, grad_accum=1, seq_len=512)
    assert logprob_pass_bytes(m, lay) == pytest.approx(measured, rel=0.10)


@pytest.mark.slow
def test_largest_engine_fraction_fits_and_one_step_more_does_not() -> None:
    # the largest --rollout-memory-fraction the plan reports beside training states kept on the GPU
    # (TRL's way): a plan at that fraction fits, one 0.05 above it does not (the same layout fixed)
    fixed = ["--model", "qwen3-8b", "--task", "grpo", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1",
             "--cp", "1", "--zero", "3", "--micro-batch", "1", "--recompute", "full", "--keep-train-states"]
    r = _plan(*fixed, "--rollout-memory-fraction", "0.3", "--json")
    assert r.returncode == 0, r.stderr
    largest = json.loads(r.stdout)["plan"]["largest_engine_fraction"]
    assert 0.3 < largest < 1.0
    ok = _plan(*fixed, "--rollout-memory-fraction", f"{largest - 0.005:.3f}", "-q")
    assert ok.returncode == 0, ok.stderr
    too_much = _plan(*fixed, "--rollout-memory-fraction", f"{min(1.0, largest + 0.05):.3f}", "-q")
    assert too_much.returncode == 2


@pytest.mark.slow
def test_run_length_in_steps_and_tokens() -> None:
    # --rl-steps x the step time; distillation: --tokens over the tokens of one step (global batch
    # 1,024 x 4,096 = 4,194,304 tokens: 10B tokens are 2,385 whole steps)
    r = _plan("--model", "qwen3-8b", "--task", "grpo", "--gpus", "h100", "--n-gpus", "8", "--rl-steps", "500", "--json")
    d = json.loads(r.stdout)
    assert d["steps"] == 500
    assert d["run_time_s"] == pytest.approx(500 * d["plan"]["step_time_s"])
    assert d["gpu_hours"] == pytest.approx(8 * d["run_time_s"] / 3600)
    r = _plan("--model", "llama3.1-8b", "--teacher", "llama3.1-70b", "--gpus", "h100", "--tokens", "10B", "--json")
    assert json.loads(r.stdout)["steps"] == 2385


def test_distinct_experts_matches_sampled_routing():
    """E(1 - (1 - k/E)^B) against routing sampled at random (uniform top-k without repeats per
    token, the assumption named in planner.timing.rollout.distinct_experts): Qwen3-30B-A3B's
    128 experts, top-8 (its config.json), at batch 1, 8 and 64."""
    import numpy as np

    from planner.timing.rollout import distinct_experts

    rng = np.random.default_rng(0)
    for batch in (1, 8, 64):
        touched = [len({int(e) for _ in range(batch) for e in rng.choice(128, 8, replace=False)})
                   for _ in range(400)]
        assert distinct_experts(128, 8, batch) == pytest.approx(np.mean(touched), rel=0.03)
    assert distinct_experts(128, 8, 256) > 0.99 * 128      # a decode batch of 256 reads all experts


def test_decode_weight_bytes_dense_is_the_shard_and_moe_grows_with_batch():
    from planner.models.load import load_model as get_model
    from planner.timing.rollout import decode_weight_bytes

    assert decode_weight_bytes(get_model("llama3.1-8b"), 16_000, 1) == 16_000
    moe = get_model("qwen3-30b-a3b")
    one, many = decode_weight_bytes(moe, 61_000, 1), decode_weight_bytes(moe, 61_000, 256)
    assert one < 0.2 * 61_000 and many > 0.99 * 61_000


def test_decode_steps_match_a_simulated_continuous_batch():
    """decode_steps against a step-by-step simulation of continuous batching (a slot freed by
    a finished sequence takes the next waiting one, as vLLM's scheduler admits it): responses
    uniform from 200 to 1,000 tokens (mean about 600) with one at the 1,000-token limit,
    admitted last (the order least likely to help), 64 slots."""
    import random

    from planner.timing.rollout import decode_steps

    def simulate(lengths: list[int], slots: int) -> int:
        waiting, running, steps = list(lengths), [], 0
        while waiting or running:
            while waiting and len(running) < slots:
                running.append(waiting.pop(0))
            steps += 1
            running = [n - 1 for n in running if n > 1]
        return steps

    rng = random.Random(0)
    for n in (32, 64, 200, 500):
        lengths = [rng.randint(200, 1000) for _ in range(n - 1)] + [1000]
        mean = round(sum(lengths) / n)
        got, want = decode_steps(n, 64, mean, 1000), simulate(lengths, 64)
        # the formula leaves out the start-up lag (every slot starts at once, so the first
        # sequences finish together late): -9% at 200 sequences, the largest miss here
        assert got == pytest.approx(want, rel=0.10), (n, got, want)


@pytest.mark.parametrize("model", ["qwen3-32b", "qwen3-235b-a22b"])
def test_rl_step_time_against_nemo_rl(model):
    """NeMo-RL's published GRPO step times (docs/about/performance-summary.md, v0.4, DGX-H100:
    Qwen3-32B 393 s on 32 GPUs, Qwen3-235B-A22B 506 s on 128 GPUs), predicted as
    bench/posttrain_nemo_rl.py predicts them (published layouts and lengths). Both -7% with the
    one fitted per-decode-step value; held within 15%. The leave-one-row-out errors of all five
    rows are in docs/post-training.md (-43% to +75%)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "posttrain_nemo_rl.py"
    spec = importlib.util.spec_from_file_location("posttrain_nemo_rl", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    row = next(r for r in bench.ROWS if r[0] == model)
    plan = bench.predict(row)
    assert plan["step_time_s"] == pytest.approx(row[-1], rel=0.15)
