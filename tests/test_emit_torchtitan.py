"""torchtitan jobs, loaded by torchtitan 0.3.0's own ConfigManager (torchtitan/config/manager.py).

torchtitan_job.py is imported the way torchtitan's trainer imports it (``--module
torchtitan_job --config planner_job``), the layout is read back from its ParallelismConfig
and TrainingConfig, and the model torchtitan would build (on the meta device) has the
planner's parameter count, which is transformers' (tests/test_param_counts.py; docs/facts.md:
Llama-3-8B 8,030,261,248, Llama-2-7B 6,738,415,616).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli
from planner.models.spec import count_params, load_model

require("torchtitan")
require("triton")     # torchtitan's models import it (docs/facts.md)

CASES = [
    # (plan arguments, parallelism expected, activation checkpointing)
    (["--model", "llama3.1-8b", "--gpus", "h200", "--n-gpus", "8", "--dp", "8", "--tp", "1", "--pp", "1",
      "--fsdp", "full", "--recompute", "selective", "--seq-len", "2048", "--micro-batch", "2",
      "--global-batch", "16"],
     dict(data_parallel_shard_degree=8, tensor_parallel_degree=1, pipeline_parallel_degree=1), "SelectiveAC"),
    (["--model", "llama2-7b", "--gpus", "h100", "--n-gpus", "16", "--dp", "4", "--tp", "2", "--pp", "2",
      "--fsdp", "full", "--recompute", "full", "--seq-len", "4096", "--micro-batch", "1", "--global-batch", "64"],
     dict(data_parallel_shard_degree=4, tensor_parallel_degree=2, pipeline_parallel_degree=2), "FullAC"),
    (["--model", "examples/07-own-config/my-3b/config.json", "--gpus", "h100", "--n-gpus", "16", "--dp", "8",
      "--tp", "1", "--pp", "1", "--cp", "2", "--fsdp", "full", "--recompute", "none", "--seq-len", "8192",
      "--micro-batch", "1", "--global-batch", "64"],
     dict(data_parallel_shard_degree=8, context_parallel_degree=2), "None"),
]


def _load(directory: Path):
    """torchtitan's ConfigManager on the job in ``directory``; its Trainer.Config."""
    from torchtitan.config import ConfigManager

    sys.modules.pop("torchtitan_job", None)
    sys.path.insert(0, str(directory))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ConfigManager().parse_args(["--module", "torchtitan_job", "--config", "planner_job"])
    finally:
        sys.path.remove(str(directory))
        sys.modules.pop("torchtitan_job", None)


def _n_params(config) -> int:
    import torch

    with torch.device("meta"):
        model = config.model_spec.model.build()
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("argv, parallel, ac", CASES)
def test_torchtitan_loads_the_job_with_the_plans_layout_and_model(argv, parallel, ac, tmp_path):
    out = tmp_path / "job"
    res = CliRunner().invoke(cli, [*argv, "--stack", "torchtitan", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert names == {"torchtitan_job.py", "launch.sh", "slurm.sbatch", "pytorchjob.yaml", "plan.json"}
    printed = json.loads(res.stdout)
    assert printed["stack"]["name"] == "torchtitan" and printed["stack"]["chosen"] == "--stack"
    assert json.loads((out / "plan.json").read_text())["stack"] == printed["stack"]
    config = _load(out)
    for key, value in parallel.items():
        assert getattr(config.parallelism, key) == value, key
    i = argv.index("--seq-len")
    assert config.training.seq_len == int(argv[i + 1])
    assert config.training.global_batch_size == int(argv[argv.index("--global-batch") + 1])
    assert type(config.activation_checkpoint).__qualname__.split(".")[0] == ac or (
        ac == "None" and config.activation_checkpoint is None)
    m = load_model(argv[1])
    assert _n_params(config) == count_params(m).total
    sh = out / "launch.sh"
    assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0
    assert "-m torchtitan.train" in " ".join(sh.read_text().split())


@pytest.mark.slow
def test_fsdp_with_pipeline_parallelism_writes_for_the_stack_its_memory_modelled(tmp_path):
    """The 70B plan with --usable-memory 0.9 (FSDP + tp + pp): without --stack its memory is
    modelled with Megatron's fused kernels, so --out writes Megatron-LM files (Megatron FSDP;
    validate_args refuses --use-torch-fsdp2 with pp); with --stack torchtitan the plan follows
    torchtitan's profile and torchtitan runs it. (Until the default followed the kernels,
    --out wrote torchtitan files for a Megatron memory figure.)"""
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, ["--model", "70b", "--gpus", "h100", "--usable-memory", "0.9", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "(stack: megatron)" in res.output and "stack: megatron by default" in res.output
    assert "megatron_args.txt" in {p.name for p in out.iterdir()}
    out2 = tmp_path / "o2"
    # (the layout pinned: torchtitan's own fastest is no longer FSDP with pp since the no-sync
    # gradients PyTorch's pipeline schedules hold are counted, memory.states.no_sync_gradient_bytes)
    res = CliRunner().invoke(cli, ["--model", "70b", "--gpus", "h100", "--usable-memory", "0.9", "--stack",
                                   "torchtitan", "--n-gpus", "24", "--dp", "2", "--tp", "4", "--pp", "3",
                                   "--fsdp", "full", "--out", str(out2)])
    assert res.exit_code == 0, res.output
    assert "(stack: torchtitan)" in res.output
    names = {p.name for p in out2.iterdir()}
    assert "megatron_args.txt" not in names and "torchtitan_job.py" in names
    config = _load(out2)
    assert config.parallelism.pipeline_parallel_degree == 3 and config.model_spec.flavor == "70B"


@pytest.mark.parametrize("argv, needle", [
    (["--model", "mixtral-8x7b", "--gpus", "h200", "--n-gpus", "8", "--dp", "8", "--tp", "1", "--pp", "1",
      "--fsdp", "full"], "Llama-architecture"),
    (["--model", "qwen2.5-0.5b", "--gpus", "h100", "--n-gpus", "8", "--dp", "8", "--tp", "1", "--pp", "1",
      "--zero", "2"], "qwen2"),
])
def test_torchtitan_refuses_what_it_does_not_build(argv, needle, tmp_path):
    res = CliRunner().invoke(cli, [*argv, "--stack", "torchtitan", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_plain_plan_does_not_import_torchtitan(tmp_path):
    code = ("import sys; from planner.cli.main import main; "
            f"sys.argv=['plan','--model','8b','--gpus','h100','--fsdp','full','--pp','2','--out',"
            f"{str(tmp_path / 'o')!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert not {'torch', 'torchtitan', 'megatron'} & set(sys.modules), 'heavy import'")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama3.1-8b", "examples/07-own-config/my-3b/config.json"])
def test_fp8_and_bf16_moments_reach_torchtitans_own_config_classes(model, tmp_path, monkeypatch):
    """--precision fp8 (rowwise) --optimizer adamw-bf16-states: torchtitan's ConfigManager loads
    the job; the model carries torchtitan's Float8LinearConverter with a recipe name its Config
    accepts (typing.Literal of torchtitan 0.3.0) and the LM head filtered out, and the optimizer
    container's implementation is one of torchtitan's. The converter needs torchao and an SM89+
    GPU to build, so here it records what it is given instead of swapping the linears."""
    import typing

    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.components.quantization import float8

    seen = []

    def fake_init(self, config):
        seen.append(config)

    monkeypatch.setattr(float8.Float8LinearConverter, "__init__", fake_init)
    monkeypatch.setattr(float8.Float8LinearConverter, "convert", lambda self, model_config: model_config)
    out = tmp_path / "job"
    res = CliRunner().invoke(cli, ["--model", model, "--gpus", "h100", "--n-gpus", "8", "--dp", "8", "--tp", "1",
                                   "--pp", "1", "--fsdp", "full", "--seq-len", "2048", "--micro-batch", "1",
                                   "--global-batch", "8", "--precision", "fp8", "--optimizer", "adamw-bf16-states",
                                   "--stack", "torchtitan", "--out", str(out)])
    assert res.exit_code == 0, res.output
    config = _load(out)
    assert len(seen) == 1 and isinstance(seen[0], float8.Float8LinearConverter.Config)
    hints = typing.get_type_hints(float8.Float8LinearConverter.Config)
    assert seen[0].recipe_name == "rowwise" and "rowwise" in typing.get_args(hints["recipe_name"])
    assert seen[0].filter_fqns == ["lm_head"]
    impl = typing.get_type_hints(OptimizersContainer.Config)["implementation"]
    assert config.optimizer.implementation == "fused_opt_states_bf16" in typing.get_args(impl)
    assert config.training.mixed_precision_param == "bfloat16"
    assert _n_params(config) == count_params(load_model(model)).total


@pytest.mark.parametrize("extra, needle", [
    (["--precision", "fp8", "--fp8-recipe", "tensorwise"], "rowwise"),
    (["--precision", "fp8", "--fp8-recipe", "delayed"], "rowwise"),
])
def test_torchtitan_refuses_fp8_recipes_it_cannot_name(extra, needle, tmp_path):
    res = CliRunner().invoke(cli, ["--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "8", *extra,
                                   "--stack", "torchtitan", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output
    assert not (tmp_path / "x").exists()
