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
from conftest import fast_one, require

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
    from deepspeed_config import validate_deepspeed_config

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
    from megatron_args import LaunchEnv, env_from_script, megatron_args_errors, parse_args
    from test_emit_megatron import transformer_config

    from planner.stacks.megatron import device_arch_major

    args = [w for w in (out / "megatron_args.txt").read_text().split()]
    env = env_from_script((out / "launch.sh").read_text())
    n = lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] * lay["ep"]
    errors = megatron_args_errors(args, LaunchEnv(world_size=n,
                                                  cuda_device_max_connections=env.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                                                  device_arch_major=device_arch_major(gpu)))
    assert errors == []
    transformer_config(parse_args(args))
    return "validate_args rules, megatron-core TransformerConfig"


SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def tokens_of(name: str) -> float | None:
    """The --tokens of a plan's command line (a number with a K/M/B/T suffix), or None."""
    words = PLANS[name].split()
    if "--tokens" not in words:
        return None
    w = words[words.index("--tokens") + 1]
    return float(w[:-1]) * SUFFIX[w[-1]] if w[-1] in SUFFIX else float(w)


def global_batch(lay: dict) -> int:
    """Sequences per step: micro-batch x accumulation x the data-parallel ranks (dp x ep)."""
    return lay["micro_batch"] * lay["grad_accum"] * lay["dp"] * lay["ep"]


def check_length(steps: int, lay: dict, tokens: float | None) -> None:
    """The written run trains on --tokens: the fewest whole steps of the global batch that
    cover them (1,000 steps without --tokens, said in the files)."""
    per_step = global_batch(lay) * lay["seq_len"]
    if tokens is None:
        assert steps == 1000
    else:
        assert steps * per_step >= tokens > (steps - 1) * per_step


def check_megatron_schedule(args: list[str]) -> None:
    """megatron-core's own OptimizerParamScheduler (0.16.1) accepts the sample-based schedule
    as Megatron-LM's get_optimizer_param_scheduler builds it (steps counted in samples):
    the peak after the warmup, the floor at the end."""
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron_args import parse_args

    a = parse_args(args)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=a.lr)
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=a.lr, min_lr=a.min_lr,
                                    lr_warmup_steps=a.lr_warmup_samples, lr_decay_steps=a.lr_decay_samples,
                                    lr_decay_style=a.lr_decay_style, start_wd=a.weight_decay,
                                    end_wd=a.weight_decay, wd_incr_steps=a.train_samples, wd_incr_style="constant")
    sched.step(a.lr_warmup_samples)
    assert opt.param_groups[0]["lr"] == pytest.approx(a.lr)
    sched.step(a.train_samples - a.lr_warmup_samples)
    assert opt.param_groups[0]["lr"] == pytest.approx(a.min_lr)


def check_train_script(out: Path, plan: dict, stack: str, tokens: float | None) -> str:
    """train.py parses the arguments launch.sh gives it and trains the planned steps; the
    DeepSpeed schedule in ds_config.json has the same length (its run is tests/test_train_script.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("written_train", out / "train.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lay = plan["plan"]["layout"]
    argv = ["--deepspeed", "--deepspeed_config", str(out / "ds_config.json")] if stack == "deepspeed" else []
    args = mod.parse_args(argv)
    check_length(args.steps, lay, tokens)
    assert (args.micro_batch, args.grad_accum, args.seq_len) == (lay["micro_batch"], lay["grad_accum"], lay["seq_len"])
    if stack == "deepspeed":
        sched = json.loads((out / "ds_config.json").read_text())["scheduler"]["params"]
        assert sched["total_num_steps"] == args.steps
    return "python (its argparse with launch.sh's arguments)"


def check_torchtitan(out: Path, lay: dict) -> str:
    from test_emit_torchtitan import _load

    config = _load(out)
    assert config.parallelism.pipeline_parallel_degree == lay["pp"]
    assert config.parallelism.tensor_parallel_degree == lay["tp"]
    return "torchtitan ConfigManager"


# the fast tier: one plan (the Hugging Face stack's files, train.py's arguments among them)
@pytest.mark.parametrize("name", fast_one(list(PLANS), "03-lora-8b-rtx4090"))
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
        args = (out / "megatron_args.txt").read_text().split()
        check_length(int(args[args.index("--train-samples") + 1]) // global_batch(lay), lay, tokens_of(name))
        check_megatron_schedule(args)
    else:
        require("torchtitan")
        accepted["torchtitan_job.py"] = check_torchtitan(out, lay)
        from test_emit_torchtitan import _load
        config = _load(out)
        check_length(config.training.steps, lay, tokens_of(name))
        assert config.lr_scheduler.decay_type == "cosine" and 0 < config.lr_scheduler.warmup_steps
    if stack in ("deepspeed", "hf"):
        accepted["train.py"] = check_train_script(out, plan, stack, tokens_of(name))
    assert set(accepted) == names, f"a file nobody checked: {names - set(accepted)}"
    print(f"\n{name}: stack {stack}: " + "; ".join(f"{k} <- {v}" for k, v in sorted(accepted.items())),
          file=sys.stderr)
