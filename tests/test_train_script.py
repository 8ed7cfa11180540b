"""train.py, written by `plan --out` for the DeepSpeed and Hugging Face stacks, trains on the CPU.

A tiny Llama config (2 layers, width 64, vocabulary 256) is planned, written with --out and
its train.py run for two optimizer steps on random tokens: alone in one process (the
quickest), under accelerate's own launcher
with the written accelerate_config.yaml (--cpu and --mixed_precision no are the only
overrides; on a CPU accelerate runs FSDP's config in one process, so this checks the script
and the config's loading, not the sharding), and under DeepSpeed
with the written ds_config.json (one process; DeepSpeed JIT-builds two C++ ops the first time,
about 150 s of CPU on a 2-core machine: ds_extensions_dir keeps them between runs). All three are marked `slow` (the
launcher runs take 30-40 s each on a loaded 2-core machine, the plain one 5-15 s; the fast
tier parses one plan's train.py arguments, tests/test_emit_examples.py). The referee is the stacks' own
code running the script: a step that does not run fails the test.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def ds_extensions_dir(deepspeed: ModuleType, torch_version: str) -> str:
    """Where DeepSpeed's JIT-built ops (torch.utils.cpp_extension.load, through its op builders)
    are kept for this test: the user's TORCH_EXTENSIONS_DIR where set, else a folder of the
    user's cache keyed by this DeepSpeed installation (its folder and version), torch's version
    and Python's.

    Why: on the CPU accelerator the script builds two ops, deepspeed_shm_comm (the CPU
    communication op, deepspeed/comm/torch.py build_shm_op, at init_distributed) and fused_adam
    (FusedAdam, which DeepSpeed's engine picks for the config's AdamW: runtime/engine.py
    get_optimizer_configuration; its CPU builder compiles csrc/cpu/adam/fused_adam.cpp and
    csrc/adam/cpu_adam_impl.cpp), about 150 s of CPU in all. torch keeps them in one folder per
    Python and device (~/.cache/torch_extensions/py311_cpu) whatever the installation, and its
    build.ninja names each source and include path absolutely: a run from another virtual
    environment rewrites build.ninja, ninja sees new commands and builds both ops again, and the
    next run from the first environment builds them once more. Keyed by the installation, each
    environment builds once and later runs load the built ops (ninja finds nothing to do)."""
    own = os.environ.get("TORCH_EXTENSIONS_DIR")
    if own:
        return own
    key = "|".join((os.path.dirname(os.path.abspath(str(deepspeed.__file__))), str(deepspeed.__version__),
                    torch_version, sys.version))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(cache / "torch_extensions" / f"planner-tests-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


@pytest.mark.slow
def test_deepspeed_train_script_runs_two_steps_with_the_written_config(tmp_path):
    deepspeed = require("deepspeed")
    require("transformers")
    torch = require("torch")
    out = write_plan(tmp_path, "--n-gpus", "1", "--stack", "deepspeed", "--zero", "0")
    cmd = [sys.executable, str(out / "train.py"), "--deepspeed", "--deepspeed_config", str(out / "ds_config.json"),
           "--steps", "2"]
    env = {**ENV, "MASTER_PORT": "29532", "TORCH_EXTENSIONS_DIR": ds_extensions_dir(deepspeed, torch.__version__)}
    trains_two_steps(cmd, tmp_path, env, timeout_s=420)
