"""Every file `plan --out` writes for the committed examples and the 405B, 70B, 8B, Mixtral and
LoRA plans, each accepted by the program that reads it:

    ds_config.json          DeepSpeed's DeepSpeedConfig at the plan's data-parallel size
    hostfile                DeepSpeed's launcher (_parse_hostfile)
    accelerate_config.yaml  accelerate's load_config_from_file
    config.json             transformers' AutoConfig (the model a DeepSpeed/accelerate script builds)
    megatron_args.txt       Megatron-LM's validate_args rules (planner/stacks/megatron.py) under
                            the launch.sh environment, and megatron-core's TransformerConfig
    torchtitan_job.py       torchtitan 0.3.0's ConfigManager
    launch.sh, slurm.sbatch bash -n
    pytorchjob.yaml         the shipped PyTorchJob JSON schema (jsonschema)
    plan.json               json, and names the stack

The plans are the examples' own command lines (examples/*/command.sh) plus --out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli

os.environ.setdefault("DS_ACCELERATOR", "cpu")

PLANS = {
    "01-pretrain-70b-h100": "--model llama3.1-70b --gpus h100 --tokens 1.4T --deadline 30d",
    "02-finetune-8b-a100-node": "--model llama3.1-8b --gpus a100 --n-gpus 8 --global-batch 128 --tokens 1B",
    "03-lora-8b-rtx4090": ("--model llama3.1-8b --gpus 4090 --n-gpus 1 --method lora --seq-len 2048 "
                           "--global-batch 16 --tokens 50M"),
    "04-qlora-70b-l40s": ("--model llama3.1-70b --gpus l40s --n-gpus 1 --method qlora --lora-rank 16 "
                          "--seq-len 512 --global-batch 16"),
    "05-mixtral-8x22b-h200": "--model mixtral-8x22b --gpus h200",
    "07-own-config": ("--model examples/07-own-config/my-3b/config.json --gpus h100,a100 --tokens 100B "
                      "--deadline 7d --max-gpus 64"),
    "405b": "--model 405b --gpus h100",
    "70b": "--model 70b --gpus h100",
    "70b-usable-0.9": "--model 70b --gpus h100 --usable-memory 0.9",
    "8b": "--model 8b --gpus h100",
    "mixtral-8x7b": "--model mixtral-8x7b --gpus h100",
}


def check_deepspeed(out: Path, lay: dict) -> str:
    from deepspeed.launcher.runner import _parse_hostfile

    from planner.emit.deepspeed import validate_deepspeed_config

    cfg = json.loads((out / "ds_config.json").read_text())
    parsed = validate_deepspeed_config(cfg, data_parallel=lay["dp"] * lay["ep"])
    assert parsed.zero_optimization_stage == lay["zero_stage"]
    pool = _parse_hostfile((out / "hostfile").read_text().splitlines())
    assert sum(pool.values()) == lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] * lay["ep"]
    return "DeepSpeedConfig, deepspeed _parse_hostfile"


def check_hf_config(out: Path, plan: dict) -> str:
    require("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(out))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == plan["model"]["n_params"]
    return "transformers AutoConfig + AutoModelForCausalLM (parameter count)"


def check_accelerate(out: Path, lay: dict) -> str:
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(out / "accelerate_config.yaml"))
    assert loaded.distributed_type.value == "FSDP"
    return "accelerate load_config_from_file"


def check_megatron(out: Path, lay: dict, gpu: str) -> str:
    from test_emit_megatron import transformer_config

    from planner.stacks.megatron import LaunchEnv, device_arch_major, env_from_script, megatron_args_errors, parse_args

    args = [w for w in (out / "megatron_args.txt").read_text().split()]
    env = env_from_script((out / "launch.sh").read_text())
    n = lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] * lay["ep"]
    errors = megatron_args_errors(args, LaunchEnv(world_size=n,
                                                  cuda_device_max_connections=env.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                                                  device_arch_major=device_arch_major(gpu)))
    assert errors == []
    transformer_config(parse_args(args))
    return "validate_args rules, megatron-core TransformerConfig"


def check_torchtitan(out: Path, lay: dict) -> str:
    from test_emit_torchtitan import _load

    config = _load(out)
    assert config.parallelism.pipeline_parallel_degree == lay["pp"]
    assert config.parallelism.tensor_parallel_degree == lay["tp"]
    return "torchtitan ConfigManager"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_every_emitted_file_is_accepted_by_its_reader(name, tmp_path):
    yaml = require("yaml")
    jsonschema = require("jsonschema")
    from test_emit_scheduler import schema

    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [*PLANS[name].split(), "--out", str(out)], prog_name="plan")
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    lay, gpu = plan["plan"]["layout"], plan["gpu"]["name"]
    stack = plan["stack"]["name"]
    accepted = {"plan.json": "json"}
    names = {p.name for p in out.iterdir()}
    for f in ("launch.sh", "slurm.sbatch"):
        r = subprocess.run(["bash", "-n", str(out / f)], capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        accepted[f] = "bash -n"
    jsonschema.validate(yaml.safe_load((out / "pytorchjob.yaml").read_text()), schema())
    accepted["pytorchjob.yaml"] = "PyTorchJob schema (jsonschema)"
    if stack in ("deepspeed", "hf"):
        accepted["config.json"] = check_hf_config(out, plan)
    if stack == "deepspeed":
        require("deepspeed")
        accepted["ds_config.json"] = accepted["hostfile"] = check_deepspeed(out, lay)
    elif stack == "hf":
        require("accelerate")
        accepted["accelerate_config.yaml"] = check_accelerate(out, lay)
    elif stack == "megatron":
        require("megatron.core")
        accepted["megatron_args.txt"] = check_megatron(out, lay, gpu)
    else:
        require("torchtitan")
        accepted["torchtitan_job.py"] = check_torchtitan(out, lay)
    assert set(accepted) == names, f"a file nobody checked: {names - set(accepted)}"
    print(f"\n{name}: stack {stack}: " + "; ".join(f"{k} <- {v}" for k, v in sorted(accepted.items())),
          file=sys.stderr)
