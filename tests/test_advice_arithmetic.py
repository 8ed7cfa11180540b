"""Issue 20, "answers that mislead": a request no layout can run for arithmetic reasons
(batch not divisible, hybrid sharding inside one node) exits 2 naming the rule, not a
memory shortfall. The divisibility rule is Megatron-LM's: global batch = micro-batch x
data-parallel x accumulation steps (megatron/training/arguments.py, core_r0.x)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner", "--model", "8b", "--gpus", "h100", *args],
                          check=False, capture_output=True, text=True, timeout=60)


def test_batch_not_divisible_names_rule_and_neighbours() -> None:
    p = run("--global-batch", "100", "--dp", "8", "--n-gpus", "8")
    assert p.returncode == 2
    assert "not a memory limit" in p.stderr + p.stdout
    assert "96 or 104" in p.stderr + p.stdout          # 100 // 8 * 8 = 96, + 8 = 104
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_hybrid_in_one_node_names_rule() -> None:
    p = run("--fsdp", "hybrid", "--n-gpus", "4")
    assert p.returncode == 2
    assert "more than one node" in p.stderr + p.stdout


@pytest.mark.slow
def test_lora_on_4090_offers_the_cheap_ways_out() -> None:
    """8B LoRA at 4096 on one RTX 4090 (24 GB, NVIDIA data sheet) needs ~25 GiB: advice names
    QLoRA and a shorter sequence, and only GPUs of more than 24 GB."""
    import json
    p = subprocess.run([sys.executable, "-m", "planner", "--model", "8b", "--gpus", "4090", "--n-gpus", "1",
                        "--method", "lora", "--seq-len", "4096", "--json"],
                       check=False, capture_output=True, text=True, timeout=60)
    advice = " ".join(json.loads(p.stdout)["advice"])
    assert "--method qlora fits" in advice and "--seq-len 2048 fits" in advice   # re-planned (issue 20)
    assert "mi300x" not in advice or "enough memory" in advice
