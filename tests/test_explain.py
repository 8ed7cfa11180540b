"""`plan explain`: the terms add up to what the models (and `plan`) report, for every kind
of layout the models distinguish, and each names its formula, inputs and source."""

import json
import math

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.model import CATEGORIES, per_rank_memory
from planner.models.spec import count_params, load_model
from planner.report.explain import explain
from planner.report.explain_memory import MOMENTS, memory_terms
from planner.timing.model import cluster_for, step_time
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


def lay(**kw) -> Layout:
    base = {"dp": 8, "micro_batch": 1, "grad_accum": 4, "seq_len": 2048, "recompute": "none", "zero_stage": 3}
    return Layout(**{**base, **kw})


CASES = {
    "zero3": ("llama3.1-8b", "h100", {}, lay()),
    "zero0 one gpu, autocast": ("gpt2", "h100", {}, lay(dp=1, zero_stage=0)),
    "zero1 tp pp vp sp": ("llama3.1-70b", "h100", {}, lay(dp=2, tp=4, pp=4, vp=2, sp=True, zero_stage=1,
                                                         grad_accum=8, recompute="selective")),
    "zero2 full recompute": ("llama3.1-8b", "a100", {}, lay(zero_stage=2, recompute="full")),
    "fsdp full": ("llama3.1-8b", "h100", {}, lay(sharding="fsdp-full")),
    "fsdp grad-op": ("llama3.1-8b", "h100", {}, lay(sharding="fsdp-grad-op", zero_stage=2, grad_accum=1)),
    "fsdp hybrid": ("llama3.1-8b", "h100", {}, lay(dp=16, sharding="fsdp-hybrid")),
    "moe ep cp": ("mixtral-8x7b", "h100", {}, lay(dp=2, ep=4, cp=2, tp=2, sp=True, zero_stage=1)),
    "megatron block 4 of 20, vp 2": ("llama3.1-70b", "h100", {"stack": "megatron", "recompute_method": "block",
                                                             "recompute_num_layers": 4},
                                     lay(dp=2, tp=4, pp=4, vp=2, sp=True, zero_stage=1, grad_accum=8,
                                         recompute="full")),
    "megatron uniform 2": ("llama3.1-70b", "h100", {"stack": "megatron", "recompute_num_layers": 2},
                           lay(dp=2, tp=4, pp=4, sp=True, zero_stage=1, grad_accum=8, recompute="full")),
    "deepspeed cpu checkpointing": ("llama3.1-8b", "h100", {"stack": "deepspeed", "ds_checkpointing": "cpu"},
                                    lay(recompute="full")),
    "eager attention with dropout": ("gpt2", "h100", {"attention": "eager"}, lay(dp=2, zero_stage=0)),
    "lora": ("llama3.1-8b", "h100", {"finetune": FinetuneSpec.named("lora")}, lay(dp=1, zero_stage=0)),
    "qlora": ("llama3.1-70b", "h100", {"finetune": FinetuneSpec.named("qlora")}, lay(dp=1, zero_stage=0)),
    "freeze": ("llama3.1-8b", "h100", {"finetune": FinetuneSpec.named("freeze")}, lay(dp=2, zero_stage=0)),
    "offload optimizer": ("llama3.1-8b", "h100", {"offload_optimizer": "cpu"}, lay(zero_stage=2)),
    "offload params nvme": ("llama3.1-70b", "h100", {"offload_optimizer": "nvme", "offload_params": "nvme"},
                            lay()),
    "fsdp cpu offload": ("llama3.1-8b", "h100", {"offload_params": "cpu"}, lay(sharding="fsdp-full")),
}

# FSDP2 (planner.memory.model.fsdp_blocks_done, fsdp_forward_bytes): a case peaking at each moment, for
# shard-grad-op (ZeRO-2) and full shard (ZeRO-3), Mixtral-8x7B on 8 and 64 ranks and dense models.
# MEASURED is what docs/accuracy.md runs (planner.measure.accuracy.measured_setup: eager ops, single-tensor
# AdamW), one micro-batch per step unless grad_accum says otherwise; the rows marked "accuracy.md"
# are its measured configurations.
MEASURED = {"kernels": "eager", "optimizer_foreach": False}


def fsdp(sharding: str, dp: int, seq_len: int, micro_batch: int, recompute: str, grad_accum: int = 1) -> Layout:
    return Layout(dp=dp, sharding=sharding, zero_stage=3 if sharding == "fsdp-full" else 2, seq_len=seq_len,
                  micro_batch=micro_batch, grad_accum=grad_accum, recompute=recompute)


FSDP_CASES = {
    # accuracy.md rows: the peak in block 30's backward, one block resharded (a negative weight term)
    "mixtral grad-op dp8 backward-end": ("mixtral-8x7b", "h200", MEASURED, fsdp("fsdp-grad-op", 8, 1024, 1, "full"),
                                         "backward-end"),
    # accuracy.md: the last block's forward, two all-gather outputs
    "mixtral grad-op dp64 forward-end": ("mixtral-8x7b", "h200", MEASURED, fsdp("fsdp-grad-op", 64, 1024, 2, "none"),
                                         "forward-end"),
    "mixtral grad-op dp8 backward-start": ("mixtral-8x7b", "h200", MEASURED,
                                           fsdp("fsdp-grad-op", 8, 4096, 2, "none", grad_accum=4), "backward-start"),
    # accuracy.md rows: block 1's backward, 30 blocks' sharded gradients, padded experts on 64 ranks
    "mixtral full dp8 backward-end": ("mixtral-8x7b", "h200", MEASURED, fsdp("fsdp-full", 8, 1024, 1, "none"),
                                      "backward-end"),
    "mixtral full dp64 backward-end": ("mixtral-8x7b", "h200", MEASURED, fsdp("fsdp-full", 64, 4096, 1, "full"),
                                       "backward-end"),
    # with gradient accumulation a block done adds no gradients (they persist) and frees its
    # activations: the second block in backward holds the most, beside the last block's fp32
    # reduce-scatter input, which outweighs forward's second all-gather output (issue 17: these
    # two were forward-end cases while the planner took block 1's backward)
    "mixtral full dp8 ga4 backward-end": ("mixtral-8x7b", "h200", MEASURED,
                                          fsdp("fsdp-full", 8, 1024, 1, "none", grad_accum=4), "backward-end"),
    "mixtral full dp64 ga4 backward-end": ("mixtral-8x7b", "h200", MEASURED,
                                           fsdp("fsdp-full", 64, 1024, 4, "none", grad_accum=4), "backward-end"),
    # a frozen base reduces only the adapters' gradients: forward's two all-gather outputs peak
    "mixtral lora full dp8 forward-end": ("mixtral-8x7b", "h200", {"finetune": FinetuneSpec.named("lora")},
                                          fsdp("fsdp-full", 8, 1024, 1, "none"), "forward-end"),
    # foreach AdamW's fp32 temporaries at the step, the gathered weights resharded (negative)
    "mixtral full dp8 optimizer-step": ("mixtral-8x7b", "h200", {}, fsdp("fsdp-full", 8, 1024, 1, "none"),
                                        "optimizer-step"),
    "llama full dp8 backward-end": ("llama3.1-8b", "h100", {}, fsdp("fsdp-full", 8, 1024, 1, "full"), "backward-end"),
    # the second block in backward, one block reduced (issue 17: a backward-start case while the
    # planner took block 1's backward; docs/accuracy.md measures it at +0.7%, eager kernels)
    "llama full dp64 backward-end": ("llama3.1-8b", "h100", {}, fsdp("fsdp-full", 64, 1024, 1, "none"),
                                     "backward-end"),
    # eager attention's fp32 score gradients at 4096 tokens in the last block's backward (issue 17:
    # Llama-3-8B at 1024 tokens was this case while the planner took block 1's backward; the
    # second block in backward, with a reduce-scatter input and a prefetched block, holds more)
    "mistral full dp8 fp32 block-backward": ("mistral-7b", "h100", {"precision": "fp32", "attention": "eager",
                                                                    "kernels": "eager"},
                                             fsdp("fsdp-full", 8, 4096, 1, "none"), "block-backward"),
    "llama grad-op dp8 backward-end": ("llama3.1-8b", "h100", {}, fsdp("fsdp-grad-op", 8, 1024, 1, "none"),
                                       "backward-end"),
    "llama grad-op dp64 backward-end": ("llama3.1-8b", "h100", {}, fsdp("fsdp-grad-op", 64, 1024, 1, "none"),
                                        "backward-end"),
    "qwen grad-op dp8 backward-start": ("qwen2.5-1.5b", "h100", {}, fsdp("fsdp-grad-op", 8, 1024, 1, "none"),
                                        "backward-start"),
    "qwen full dp8 fp32 backward-end": ("qwen2.5-1.5b", "h100", {"precision": "fp32"},
                                        fsdp("fsdp-full", 8, 1024, 1, "full"), "backward-end"),
    # a frozen base: gathered blocks at their stored bytes, gradients for the adapters only
    "llama lora grad-op dp8 backward-start": ("llama3.1-8b", "h100", {"finetune": FinetuneSpec.named("lora")},
                                              fsdp("fsdp-grad-op", 8, 1024, 1, "none"), "backward-start"),
    "llama qlora full dp8 backward-start": ("llama3.1-8b", "h100", {"finetune": FinetuneSpec.named("qlora")},
                                            fsdp("fsdp-full", 8, 1024, 1, "full"), "backward-start"),
}
CASES.update({f"fsdp2 {k}": v[:4] for k, v in FSDP_CASES.items()})


@pytest.mark.parametrize("name", list(CASES))
def test_terms_add_up_to_the_models(name):
    model, gpu_name, extra, layout = CASES[name]
    m, gpu = load_model(model), get_gpu(gpu_name)
    setup = TrainingSetup(seq_len=layout.seq_len, global_batch=layout.global_batch, **extra)
    ex = explain(m, gpu, setup, layout)
    mem = per_rank_memory(m, setup, layout, gpus_per_node=gpu.gpus_per_node)
    assert ex.memory.breakdown == mem.breakdown
    terms = [t for t in ex.terms if t.section == "memory" and t.summed]
    assert not [t.name for t in terms if "not itemised" in t.name]
    for cat in CATEGORIES:       # each category of the breakdown is the sum of its terms
        assert sum(t.value for t in terms if t.category == cat) == getattr(mem.breakdown, cat), cat
    assert ex.summed("memory") == mem.total
    st = step_time(m, setup, layout, cluster_for(gpu))
    assert not [t.name for t in ex.terms if t.category == "unexplained"]
    assert ex.summed("time") == pytest.approx(st.step_time_s, rel=1e-9)
    for t in ex.terms:
        assert t.formula and t.source and math.isfinite(t.value), t
        # negative memory terms are what a moment frees (FSDP2 reshards, saved tensors freed)
        assert t.value >= 0 or t.section == "time" or t.name.startswith("minus "), t


def test_fsdp_cases_peak_where_they_are_meant_to():
    # each FSDP2 moment is covered at the peak by some case of each sharding
    for name, (model, gpu_name, extra, layout, phase) in FSDP_CASES.items():
        setup = TrainingSetup(seq_len=layout.seq_len, global_batch=layout.global_batch, **extra)
        got = per_rank_memory(load_model(model), setup, layout, gpus_per_node=get_gpu(gpu_name).gpus_per_node)
        assert got.phase == phase, name
    for sharding in ("grad-op", "full"):
        assert {c[4] for k, c in FSDP_CASES.items() if sharding in k} >= {"forward-end", "backward-start",
                                                                          "backward-end"}
    assert set(MOMENTS) == {c[4] for c in FSDP_CASES.values()}


@pytest.mark.parametrize("name", list(FSDP_CASES))
def test_fsdp_terms_add_up_at_every_moment(name):
    # at every moment per_rank_memory compares, not only the peak, each category is the sum of
    # its terms: the weights and optimizer states every moment holds plus the moment's parts
    model, gpu_name, extra, layout, _ = FSDP_CASES[name]
    m, gpu = load_model(model), get_gpu(gpu_name)
    pc = count_params(m)
    setup = TrainingSetup(seq_len=layout.seq_len, global_batch=layout.global_batch, **extra)
    mem = per_rank_memory(m, setup, layout, pc, gpu.gpus_per_node)
    tr = mem.terms.view(setup)
    bd, peak = mem.breakdown, tr.phases[tr.phase]
    assert set(tr.phases) == set(MOMENTS)
    for phase, (w_extra, grads, acts, logits, buffers, transient) in tr.phases.items():
        want = {"weights": bd.weights - peak[0] + w_extra, "gradients": grads,
                "optimizer": bd.optimizer - peak[5] + transient, "activations": acts, "logits": logits,
                "buffers": buffers}
        if phase == tr.phase:
            want["overhead"] = bd.overhead
            assert want == {c: getattr(bd, c) for c in CATEGORIES}
        terms = [t for t in memory_terms(m, setup, layout, pc, mem, phase=phase) if t.summed]
        assert not [t.name for t in terms if "not itemised" in t.name], phase
        for cat, total in want.items():
            assert sum(t.value for t in terms if t.category == cat) == total, (phase, cat)
        for t in terms:
            assert t.value >= 0 or t.name.startswith("minus "), (phase, t.name)
            assert t.formula and t.source, t


def test_fsdp_terms_name_the_moments_parts():
    # the shard-grad-op row of docs/accuracy.md: block 30's backward, one block resharded, one
    # block's sharded gradients, its reduce-scatter input; FSDP2 and the measurement are cited
    model, gpu_name, extra, layout, _ = FSDP_CASES["mixtral grad-op dp8 backward-end"]
    ex = explain(load_model(model), get_gpu(gpu_name), TrainingSetup(seq_len=1024, global_batch=8, **extra), layout)
    names = {t.name: t for t in ex.terms if t.section == "memory" and t.summed}
    freed = names["minus the first block in backward, resharded after it (freed, shard-grad-op)"]
    assert freed.value == ex.memory.breakdown.weights - sum(
        t.value for t in names.values() if t.category == "weights" and t is not freed) < 0
    assert "fully_shard" in freed.source and "docs/accuracy.md" in freed.source
    assert names["sharded gradients of the 1 block done in backward (the other blocks' are not made yet)"].value \
        == ex.memory.breakdown.gradients
    assert {"the previous block's reduce-scatter input", "the block's 16-bit gradients before its reduce-scatter",
            "the LM head's unsharded gradient, held through backward (FSDP2)",
            "minus the 1 block done in backward (their saved tensors freed)"} <= set(names)
    # full shard on 64 ranks: the block in backward gathered, the next prefetched, 30 blocks done
    model, gpu_name, extra, layout, _ = FSDP_CASES["mixtral full dp64 backward-end"]
    ex = explain(load_model(model), get_gpu(gpu_name), TrainingSetup(seq_len=4096, global_batch=64, **extra), layout)
    names = {t.name for t in ex.terms if t.section == "memory" and t.summed}
    assert {"the block in backward, gathered for it (full shard)",
            "the next block's all-gather, prefetched (full shard)",
            "minus the 30 blocks done in backward (their saved tensors freed)"} <= names


def test_cli_totals_equal_plan():
    args = ["--model", "8b", "--gpus", "h100", "--dp", "8", "--zero", "3", "--json"]
    p = run(*args)
    e = run("explain", *args)
    assert p.exit_code == 0 and e.exit_code == 0, e.output
    plan, ex = json.loads(p.output)["plan"], json.loads(e.output)
    assert ex["layout"] == plan["layout"]          # the layout `plan` picked for the same options
    terms = ex["terms"]
    mem = sum(t["value"] for t in terms if t["section"] == "memory" and t["summed"])
    assert mem == plan["memory_bytes"]["total"] == ex["memory"]["total_bytes"]
    for cat in CATEGORIES:
        assert sum(t["value"] for t in terms if t["section"] == "memory" and t["summed"]
                   and t["category"] == cat) == plan["memory_bytes"][cat]
    step = sum(t["value"] for t in terms if t["section"] == "time" and t["summed"])
    assert step == pytest.approx(plan["step_time_s"], rel=1e-9)
    assert ex["time"]["step_time_s"] == plan["step_time_s"]
    assert set(terms[0]) == {"section", "category", "name", "formula", "inputs", "value", "unit", "source", "summed"}


def test_cli_fixed_layout_pipeline_and_sources():
    r = run("explain", "--model", "70b", "--gpus", "h100", "--dp", "2", "--tp", "8", "--pp", "4", "--cp", "1",
            "--zero", "1", "--micro-batch", "1", "--recompute", "selective")
    assert r.exit_code == 0, r.output
    out = r.output
    for needle in ("Rajbhandari et al. 2019", "Korthikanti et al. 2022", "Narayanan et al. 2021",
                   "Kaplan et al. 2020", "H100 datasheet", "topology dgx-h100", "pipeline bubble",
                   "tensor-parallel all-reduces", "GiB", "at its peak", "step time (sum of the terms)"):
        assert needle.lower() in out.lower(), needle


@pytest.mark.parametrize("args, moment", [
    (("--fsdp", "grad-op", "--dp", "8", "--seq-len", "1024", "--micro-batch", "1", "--recompute", "full"),
     "backward end"),
    (("--fsdp", "grad-op", "--dp", "64", "--seq-len", "1024", "--micro-batch", "2", "--recompute", "none"),
     "forward end"),
    (("--fsdp", "full", "--dp", "64", "--seq-len", "4096", "--micro-batch", "1", "--recompute", "full"),
     "backward end"),
])
def test_cli_itemises_fsdp_moments(args, moment):
    # the layouts of docs/accuracy.md's Mixtral FSDP rows, fixed (explained even when they do not fit)
    dp = args[args.index("--dp") + 1]
    r = run("explain", "--model", "mixtral-8x7b", "--gpus", "h200", "--n-gpus", dp, "--tp", "1", "--pp", "1",
            "--cp", "1", "--ep", "1", "--grad-accum", "1", *args)
    assert r.exit_code == 0, r.output
    assert "not itemised" not in r.output
    assert f"at its peak ({moment}" in r.output
    assert "minus " in r.output and "fully_shard" in r.output


def test_cli_explains_the_least_memory_layout_when_nothing_fits():
    r = run("explain", "--model", "70b", "--gpus", "h100", "--n-gpus", "8", "--dp", "8", "--zero", "0",
            "--micro-batch", "1", "--recompute", "full", "--tp", "1", "--pp", "1", "--cp", "1")
    assert r.exit_code == 0, r.output        # a fixed layout is explained even when it does not fit
    assert "MEMORY" in r.output


def test_cli_explain_user_errors():
    r = run("explain", "--model", "8b", "--gpus", "h100", "--method", "auto")
    assert r.exit_code == 2 and "one method" in r.output
    r = run("explain", "--model", "nonesuch", "--gpus", "h100")
    assert r.exit_code == 2 and "unknown model" in r.output and "Traceback" not in r.output


def test_cli_explain_with_tokens_says_it_runs_no_cost_search():
    # plan --tokens picks the cheapest count; explain explains the smallest that fits, and says so
    r = run("explain", "--model", "8b", "--gpus", "h100", "--tokens", "1T")
    assert r.exit_code == 0, r.output
    assert "not the cost plan `plan --tokens` picks" in r.output
    assert "time to train on the tokens" in r.output
    fixed = run("explain", "--model", "8b", "--gpus", "h100", "--tokens", "1T", "--dp", "8", "--tp", "1",
                "--pp", "1", "--cp", "1", "--ep", "1", "--zero", "3", "--micro-batch", "1", "--recompute", "none")
    assert fixed.exit_code == 0, fixed.output
    assert "not the cost plan" not in fixed.output
