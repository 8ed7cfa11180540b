"""train.py, written by `plan --out` for the DeepSpeed and Hugging Face stacks, trains on the CPU.

A tiny Llama config (2 layers, width 64, vocabulary 256) is planned, written with --out and
its train.py run for two optimizer steps on random tokens: alone in one process (the
quickest), under accelerate's own launcher
with the written accelerate_config.yaml (--cpu and --mixed_precision no are the only
overrides; on a CPU accelerate runs FSDP's config in one process, so this checks the script
and the config's loading, not the sharding), and under DeepSpeed
with the written ds_config.json (one process; DeepSpeed builds its CPU communication op the
first time, about two minutes on a 2-core machine). All three are marked `slow` (the
launcher runs take 30-40 s each on a loaded 2-core machine, the plain one 5-15 s; the fast
tier parses one plan's train.py arguments, tests/test_emit_examples.py). The referee is the stacks' own
code running the script: a step that does not run fails the test.
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

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "hidden_act": "silu", "torch_dtype": "bfloat16"}
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}


def write_plan(tmp_path: Path, *extra: str) -> Path:
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["--model", str(cfg), "--gpus", "h100", "--global-batch", "4", "--seq-len", "64",
                                   "--scheduler", "none", "--out", str(out), *extra], prog_name="plan")
    assert res.exit_code == 0, res.output
    return out


def steps_run(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("step ")]


def trains_two_steps(cmd: list[str], cwd: Path, env: dict[str, str] = ENV, timeout_s: int = 240) -> None:
    """Run ``cmd``; it exits 0 having logged optimizer steps 1/2 and 2/2."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [w.split()[1] for w in steps_run(r.stdout)] == ["1/2", "2/2"], r.stdout


@pytest.mark.slow
def test_hf_train_script_runs_two_steps_on_the_cpu(tmp_path):
    """The quickest: train.py alone in one process (accelerate's Accelerator without a launcher)."""
    require("accelerate")
    require("transformers")
    out = write_plan(tmp_path, "--n-gpus", "2", "--stack", "hf", "--fsdp", "full")
    trains_two_steps([sys.executable, str(out / "train.py"), "--steps", "2"], tmp_path)


@pytest.mark.slow
def test_hf_train_script_runs_two_steps_under_accelerate_launch(tmp_path):
    require("accelerate")
    require("transformers")
    out = write_plan(tmp_path, "--n-gpus", "2", "--stack", "hf", "--fsdp", "full")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(out / "accelerate_config.yaml"),
           "--cpu", "--mixed_precision", "no", "--main_process_ip", "127.0.0.1", "--main_process_port", "29531",
           str(out / "train.py"), "--steps", "2"]
    trains_two_steps(cmd, tmp_path)


@pytest.mark.slow
def test_deepspeed_train_script_runs_two_steps_with_the_written_config(tmp_path):
    require("deepspeed")
    require("transformers")
    out = write_plan(tmp_path, "--n-gpus", "1", "--stack", "deepspeed", "--zero", "0")
    cmd = [sys.executable, str(out / "train.py"), "--deepspeed", "--deepspeed_config", str(out / "ds_config.json"),
           "--steps", "2"]
    trains_two_steps(cmd, tmp_path, {**ENV, "MASTER_PORT": "29532"}, timeout_s=420)
