"""`plan explain`: the terms add up to what the models (and `plan`) report, for every kind
of layout the models distinguish, and each names its formula, inputs and source."""

import json
import math

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.explain import explain
from planner.finetune import FinetuneSpec
from planner.hardware import get_gpu
from planner.layouts import Layout
from planner.memory import CATEGORIES, per_rank_memory
from planner.model import load_model
from planner.timing import cluster_for, step_time
from planner.training import TrainingSetup


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
    "eager attention with dropout": ("gpt2", "h100", {"attention": "eager"}, lay(dp=2, zero_stage=0)),
    "lora": ("llama3.1-8b", "h100", {"finetune": FinetuneSpec.named("lora")}, lay(dp=1, zero_stage=0)),
    "qlora": ("llama3.1-70b", "h100", {"finetune": FinetuneSpec.named("qlora")}, lay(dp=1, zero_stage=0)),
    "freeze": ("llama3.1-8b", "h100", {"finetune": FinetuneSpec.named("freeze")}, lay(dp=2, zero_stage=0)),
    "offload optimizer": ("llama3.1-8b", "h100", {"offload_optimizer": "cpu"}, lay(zero_stage=2)),
    "offload params nvme": ("llama3.1-70b", "h100", {"offload_optimizer": "nvme", "offload_params": "nvme"},
                            lay()),
    "fsdp cpu offload": ("llama3.1-8b", "h100", {"offload_params": "cpu"}, lay(sharding="fsdp-full")),
}


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
        assert t.value >= 0 or t.section == "time", t


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
