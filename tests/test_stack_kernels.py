"""The stack decides the kernels for memory and time alike (planner.training.kernels): a plan
sized with the kernels a stack runs is timed with them too.

The bug this guards (issue 31): `--stack megatron` sized the blocks with Transformer Engine's
fused kernels (planner/stacks/catalog.toml, megatron: "Transformer Engine / fused kernels") but
timed them as eager PyTorch ops (3.80 s instead of --kernels fused's 3.14 s on the example
below); `--stack torchtitan` sized its per-op SelectiveAC and timed Megatron's.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.model import per_rank_memory
from planner.models.spec import load_model
from planner.stacks import STACKS, stack_refusal
from planner.timing.efficiency import stack_efficiency
from planner.timing.model import DEFAULT_EFFICIENCY, cluster_for, step_time
from planner.training.setup import TrainingSetup

LAYOUTS = (
    Layout(dp=8, zero_stage=1),
    Layout(dp=8, zero_stage=0),
    Layout(dp=8, sharding="fsdp-full", zero_stage=3),
    Layout(dp=4, tp=2, sp=True, sharding="fsdp-full", zero_stage=3),
    Layout(dp=2, tp=2, pp=2, zero_stage=1),
)


def _fixed(lay: Layout, setup: TrainingSetup, recompute: str) -> Layout:
    return replace(lay, seq_len=setup.seq_len, recompute=recompute,
                   grad_accum=setup.global_batch // (lay.dp * lay.micro_batch))


def test_memory_and_time_read_the_same_kernels_for_every_stack() -> None:
    """For every stack (and none), every layout it runs and every recomputation: the step time
    equals the one of a set-up without a stack whose --kernels are the memory model's kernels
    (torchtitan's: eager ops, or fused under torch.compile, with its per-op selective policy,
    Efficiency.selective_policy). The memory side is read from the memory model's own answer
    (RankMemory.kernels), not recomputed here."""
    m = load_model("llama3.1-8b")
    cluster = cluster_for(get_gpu("h100"))
    checked = set()
    for stack in ("auto", *STACKS):
        for compile_ in ((False, True) if stack == "torchtitan" else (False,)):
            for lay in LAYOUTS:
                if stack != "auto" and stack_refusal(stack, m, lay) is not None:
                    continue
                for recompute in ("none", "selective", "full"):
                    setup = TrainingSetup(seq_len=1024, global_batch=64, stack=stack, compile=compile_)
                    fixed = _fixed(lay, setup, recompute)
                    kernels = per_rank_memory(m, setup, fixed).kernels
                    eff = DEFAULT_EFFICIENCY
                    if kernels == "torchtitan":
                        kernels = "fused" if compile_ else "eager"
                        eff = replace(eff, selective_policy="torchtitan-op")
                    elif kernels == "amp":
                        kernels = "eager"       # autocast runs eager ops
                    plain = replace(setup, stack="auto", compile=False, kernels=kernels)
                    got = step_time(m, setup, fixed, cluster).step_time_s
                    want = step_time(m, plain, fixed, cluster, eff).step_time_s
                    assert got == want, (stack, compile_, lay.describe(), recompute, got, want)
                    checked.add((stack, kernels))
    # every stack was checked, and both kinds of kernels
    assert {s for s, _ in checked} == {"auto", *STACKS}
    assert {k for _, k in checked} == {"fused", "eager"}


def test_megatron_stack_is_timed_with_its_fused_kernels() -> None:
    """The issue's example: --stack megatron sizes with fused kernels and must time with them.
    Before the fix it was timed as eager ops (3.80 s, as --kernels eager); --stack megatron also
    takes Megatron-Core's overlap settings (timing.efficiency.stack_efficiency), so it is
    compared with fused kernels under those settings, and --kernels fused (3.14 s) with the
    defaults."""
    base = ["--model", "qwen2.5-0.5b", "--gpus", "h100", "--dp", "8", "--zero", "1", "--micro-batch", "1",
            "--recompute", "none", "--seq-len", "2048", "--global-batch", "1024", "--json"]
    runner = CliRunner()
    steps = {}
    for extra in (("--stack", "megatron"), ("--kernels", "fused"), ("--kernels", "eager")):
        r = runner.invoke(cli, [*base, *extra])
        assert r.exit_code == 0, r.output
        steps[extra[1]] = json.loads(r.output)["plan"]["step_time_s"]
    m = load_model("qwen2.5-0.5b")
    setup = TrainingSetup(seq_len=2048, global_batch=1024, kernels="fused")
    lay = Layout(dp=8, zero_stage=1, micro_batch=1, grad_accum=128, seq_len=2048, recompute="none")
    cluster = cluster_for(get_gpu("h100"))
    fused_megatron = step_time(m, setup, lay, cluster, stack_efficiency("megatron")).step_time_s
    assert steps["megatron"] == pytest.approx(fused_megatron, rel=1e-9)
    assert steps["fused"] == pytest.approx(step_time(m, setup, lay, cluster).step_time_s, rel=1e-9)
    assert round(steps["fused"], 2) == 3.14 and round(steps["eager"], 2) == 3.80
