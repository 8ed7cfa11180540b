"""Issue 18: the sustained training rate (MFU ceiling) is data of the GPU, carried or inherited
by architecture (planner.hardware.gpus.sustained_rate), so a user's GPU file and every catalog
GPU have one, and the plan says when it is ASSUMED."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from planner.errors import UserError
from planner.hardware.gpus import get_gpu, list_gpus, sustained_rate
from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.timing.model import TRAINING_MFU_CEILING, cluster_for, step_time
from planner.training.setup import TrainingSetup

CEILING_KEYS = ("training_mfu_ceiling", "training_mfu_ceiling_basis", "training_mfu_ceiling_source")


def _h100_entry(name: str, drop: tuple[str, ...] = ()) -> str:
    """The shipped h100 [[gpu]] table under another name, without its default topology (a
    topology names its GPU) and without the keys in ``drop``."""
    text = resources.files("planner").joinpath("presets", "gpus.toml").read_text()
    start = text.index('[[gpu]]\nname = "h100"')
    entry = text[start:text.index("[[gpu]]", start + 7)]
    entry = entry.replace('name = "h100"', f'name = "{name}"').replace('default_topology = "dgx-h100"\n', "")
    entry = entry.replace('aliases = ["h100-sxm"', 'aliases = ["x-h100-sxm"')
    lines, skipping = [], False
    for line in entry.splitlines():
        if any(line.startswith(k + " ") for k in drop):
            skipping = line.rstrip().endswith("\\")
            continue
        if skipping:
            skipping = line.rstrip().endswith("\\")
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, text: str, name: str = "my-gpu.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_published_ceilings_are_unchanged_and_measured():
    # Megatron-LM README, Megatron-Core r0.8 weak scaling: 462B on 6,144 H100 at 459.9 model
    # TFLOP/s per GPU over the H100's dense peak (the catalog's, checked against its source
    # table in test_gpu_datasheets.py)
    h100 = sustained_rate(get_gpu("h100"))
    assert h100.measured and h100.mfu == pytest.approx(459.9e12 / get_gpu("h100").peak_flops_per_s("bf16"), abs=1e-3)
    a100 = sustained_rate(get_gpu("a100"))
    assert a100.measured and a100.mfu == 0.641
    # the same dies: the 40 GB A100 and the H200 inherit, ASSUMED; MI300X keeps its assumption
    assert sustained_rate(get_gpu("a100-40gb")).mfu == 0.641 and not sustained_rate(get_gpu("a100-40gb")).measured
    assert sustained_rate(get_gpu("h200")).mfu == h100.mfu and sustained_rate(get_gpu("h200")).from_gpu == "h100"
    assert sustained_rate(get_gpu("mi300x")).mfu == 0.35 and not sustained_rate(get_gpu("mi300x")).measured
    assert TRAINING_MFU_CEILING["h100"] == 0.465 and TRAINING_MFU_CEILING["mi300x"] == 0.35


def test_every_catalog_gpu_has_a_ceiling_not_below_a_published_run():
    # a ceiling below a published run would be no ceiling: BF16 Blackwell runs published by
    # NVIDIA (Megatron-Bridge docs/performance-summary.md, 25.11 container): DeepSeek-V3 on 256
    # GB300 at 961 and on 256 GB200 at 782 model TFLOP/s per GPU, GPT-OSS 120B on 64 GB300 at
    # 565; the dense peak of both is 2,500 TFLOP/s
    published = {"gb300": 961 / 2500, "gb200": 782 / 2500}
    for gpu in list_gpus():
        rate = sustained_rate(gpu)
        assert 0.2 < rate.mfu < 0.7, gpu.name
        assert rate.source, gpu.name
        assert rate.mfu >= published.get(gpu.name, 0.0), gpu.name
    for name in ("b200", "gb200", "b300", "gb300"):
        assert sustained_rate(get_gpu(name)).mfu == pytest.approx(0.465 * 0.647 / 0.711, abs=1e-3)


def test_a_copy_of_the_h100_plans_as_the_h100(tmp_path):
    # was 53.6% MFU for --model 8b where h100 gives 46.5%: the ceiling went by the GPU's name
    mine = get_gpu(_write(tmp_path, _h100_entry("my-h100")))      # carries the h100's ceiling
    assert sustained_rate(mine).mfu == 0.465 and sustained_rate(mine).measured
    # with only `architecture = "hopper"` it inherits the h100's, ASSUMED
    arch_only = _h100_entry("arch-only", drop=CEILING_KEYS)
    inherited = sustained_rate(get_gpu(_write(tmp_path, arch_only, "arch.toml")))
    assert inherited.mfu == 0.465 and inherited.from_gpu == "h100" and not inherited.measured
    m = load_model("llama3.1-8b")
    lay = Layout(dp=8, tp=1, pp=1, zero_stage=3, micro_batch=2, grad_accum=8, seq_len=4096, recompute="none")
    setup = TrainingSetup(seq_len=4096, global_batch=128)
    t_mine = step_time(m, setup, lay, cluster_for(mine))
    t_h100 = step_time(m, setup, lay, cluster_for(get_gpu("h100")))
    assert t_mine.mfu == pytest.approx(t_h100.mfu, rel=1e-9)
    assert t_mine.mfu <= 0.465 + 1e-9


def test_a_gpu_file_sets_or_falls_back(tmp_path):
    bare = get_gpu(_write(tmp_path, _h100_entry("bare", drop=("architecture", "training_mfu_ceiling",
                                                                "training_mfu_ceiling_basis",
                                                                "training_mfu_ceiling_source")), "bare.toml"))
    rate = sustained_rate(bare)
    assert not rate.measured and rate.mfu == 0.641 and "any GPU" in rate.source
    own = _h100_entry("own", drop=CEILING_KEYS)
    own += 'training_mfu_ceiling = 0.52\ntraining_mfu_ceiling_basis = "measured"\n'
    rate = sustained_rate(get_gpu(_write(tmp_path, own, "own.toml")))
    assert rate.measured and rate.mfu == 0.52


@pytest.mark.parametrize("extra, message", [
    ("training_mfu_ceiling = 1.5\n", "training_mfu_ceiling must be a number"),
    ('training_mfu_ceiling = "high"\n', "training_mfu_ceiling must be a number"),
    ('training_mfu_ceiling = 0.5\ntraining_mfu_ceiling_basis = "guessed"\n', "training_mfu_ceiling_basis must be"),
    ('training_mfu_ceiling_basis = "measured"\n', "describe a training_mfu_ceiling"),
])
def test_bad_ceilings_are_one_line(tmp_path, extra, message):
    text = _h100_entry("bad", drop=CEILING_KEYS)
    path = _write(tmp_path, text + extra, "bad.toml")
    with pytest.raises(UserError, match=message) as err:
        get_gpu(path)
    assert "\n" not in str(err.value) and "bad.toml" in str(err.value)


@pytest.mark.slow
def test_the_plan_names_an_assumed_ceiling():
    from click.testing import CliRunner

    from planner.cli.main import cli

    runner = CliRunner()
    for gpu, basis in (("b200", "assumed"), ("h100", "measured")):
        out = runner.invoke(cli, ["--model", "llama3.1-8b", "--gpus", gpu, "--n-gpus", "8", "--json"])
        assert out.exit_code == 0, out.output
        rate = json.loads(out.output)["assumptions"]["sustained_rate"]
        assert rate["basis"] == basis
        text = runner.invoke(cli, ["--model", "llama3.1-8b", "--gpus", gpu, "--n-gpus", "8"]).output
        assert ("sustained rate: at most 42.3% MFU, ASSUMED" in text) == (gpu == "b200")


def test_cli_fsdp_pipeline_grad_sync():
    # --fsdp-pipeline-grad-sync: FSDP under pp reduce-scatters once a step (PyTorch's pipeline
    # schedules hold the unsharded gradients until the last micro-batch: torch/distributed/
    # pipelining/stage.py backward_maybe_with_nosync) or every micro-batch into sharded ones
    # (Llama 3, arXiv:2407.21783 Sec. 3.3.2); the gradients held shrink by the dp degree
    from click.testing import CliRunner

    from planner.cli.main import cli

    runner = CliRunner()
    args = ["--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "16", "--dp", "8", "--pp", "2", "--tp", "1",
            "--fsdp", "full", "--micro-batch", "1", "--recompute", "none", "--global-batch", "64", "--json"]
    out = {}
    for sync in ("step", "micro-batch"):
        res = runner.invoke(cli, [*args, "--fsdp-pipeline-grad-sync", sync])
        assert res.exit_code == 0, res.output
        data = json.loads(res.output)
        assert data["assumptions"]["fsdp_pipeline_grad_sync"] == sync
        out[sync] = data["plan"]
    held, sharded = out["step"]["memory_bytes"]["gradients"], out["micro-batch"]["memory_bytes"]["gradients"]
    assert held / sharded == pytest.approx(8, rel=0.01)     # the same fp32 gradients, sharded over dp 8
    assert out["micro-batch"]["step_time_s"] >= out["step"]["step_time_s"]     # 32 reduce-scatters, not 1
    default = runner.invoke(cli, args)
    assert json.loads(default.output)["plan"]["step_time_s"] == out["step"]["step_time_s"]
    bad = runner.invoke(cli, [*args, "--fsdp-pipeline-grad-sync", "sometimes"])
    assert bad.exit_code == 2 and "--fsdp-pipeline-grad-sync" in bad.output and "Traceback" not in bad.output


def test_gb200_bf16_step_is_b200s_at_the_same_layout():
    # GB200 runs the B200 die; NVIDIA's published Megatron-Bridge runs of the same release and
    # layout on 8 GPUs of each ran GB200/B200 = 0.96-1.05 tokens/s, median 1.01
    # (tests/test_megatron_bridge_study.py reads the pairs from the corpus). So a BF16 step, capped
    # by the inherited B200 MFU, must not be timed faster on GB200's 10/9 higher data-sheet peak.
    import subprocess
    import sys
    steps = {}
    for gpu in ("b200", "gb200"):
        out = subprocess.run([sys.executable, "-m", "planner", "--model", "70b", "--gpus", gpu, "--n-gpus", "64",
                              "--json"], capture_output=True, text=True, check=True).stdout
        steps[gpu] = json.loads(out)["plan"]["step_time_s"]
    assert steps["gb200"] == pytest.approx(steps["b200"], rel=0.02)
