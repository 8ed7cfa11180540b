"""An RL plan whose rollout engine cannot hold one sequence is refused at once (issue 32's hunt
for inputs within the limits that take more than a few seconds).

`plan --model 70b --gpus h100 --task grpo` swept all 33 GPU counts up to 16,384 (about 100 s of
CPU on 2 cores) to print "nothing fits", advising more GPUs: the engine's 16-bit weights at
--rollout-tp 1 exceed its share of one GPU whatever the count. Referees: the parameter count
transformers gives Llama 3.1 70B (70,553,706,496; FACTS.md), at 2 bytes each, against 0.9
(vLLM's default gpu_memory_utilization, vllm/config/cache.py) of the H100's 81,559 MiB
(nvidia-smi memory.total, presets/gpus.toml's source); and the search itself, which finds no
plan where the refusal says none exists.
"""

from __future__ import annotations

import pytest
from conftest import plan_in_process

from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.models.spec import load_model
from planner.search.posttrain import plan_rl
from planner.training.posttrain import RLSetup
from planner.training.setup import TrainingSetup
from planner.units import GiB, MiB

LLAMA_70B_PARAMS = 70_553_706_496       # transformers' LlamaForCausalLM on the meta device (FACTS.md)


def test_the_70b_engine_on_one_h100_is_refused_with_its_way_out() -> None:
    weights = 2 * LLAMA_70B_PARAMS
    share = 0.9 * 81_559 * MiB
    assert weights > share > weights / 2          # one GPU cannot hold the weights; two can
    out = plan_in_process("--model", "70b", "--gpus", "h100", "--task", "grpo")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"{weights / GiB:,.2f} GiB of weights" in lines[0]      # 131.42 GiB
    assert f"{share / GiB:,.2f} GiB it may take" in lines[0]         # 71.68 GiB
    assert "--rollout-tp 2" in lines[0]
    assert "Traceback" not in out.stderr


def test_the_way_out_it_names_plans() -> None:
    out = plan_in_process("--model", "70b", "--gpus", "h100", "--task", "grpo", "--rollout-tp", "2", "-q")
    assert out.returncode == 0, out.stderr
    assert "x h100" in out.stdout


def test_the_search_finds_nothing_where_it_refuses() -> None:
    """The refusal anticipates the search: Mixtral 8x7B's 86.99 GiB of 16-bit weights at engine
    tp 1 (46,702,792,704 parameters, transformers' count) hold no sequence on any layout of 8 H100s."""
    m, gpu = load_model("mixtral-8x7b"), get_gpu("h100")
    rl = RLSetup(task="grpo")
    with pytest.raises(UserError, match="cannot hold one sequence"):     # the Python API too, before any sweep
        plan_rl(m, gpu, TrainingSetup(), rl, n_gpus=8)
    out = plan_in_process("--model", "mixtral-8x7b", "--gpus", "h100", "--task", "grpo", "--n-gpus", "8")
    assert out.returncode == 2 and "cannot hold one sequence" in out.stderr
    assert "--rollout-tp 2" in out.stderr


def test_dpo_generates_nothing_and_is_not_refused() -> None:
    out = plan_in_process("--model", "mixtral-8x7b", "--gpus", "h100", "--task", "dpo", "-q")
    assert out.returncode == 0, out.stderr


def test_an_engine_that_leaves_less_than_the_fixed_costs_is_refused() -> None:
    """`--rollout-memory-fraction 0.99` of an H100 (0.99 x 81,559 MiB = 78.85 GiB) and the 1 GiB of
    CUDA context and workspaces every rank holds (Overheads.fixed_bytes, ASSUMED there) pass its
    79.65 GiB: no GPU count fits (the sweep took over 120 s of CPU); 0.98 plans."""
    m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
    rl = RLSetup(task="grpo", engine_memory_fraction=0.99)
    with pytest.raises(UserError, match="0.98 or less"):
        plan_rl(m, gpu, TrainingSetup(), rl, n_gpus=2)
    out = plan_in_process("--model", "8b", "--gpus", "h100", "--task", "grpo", "--rollout-memory-fraction", "0.99")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"{0.99 * 81_559 * MiB / GiB:.2f} GiB" in out.stderr
    assert "--rollout-memory-fraction 0.98 or less" in out.stderr
    out = plan_in_process("--model", "8b", "--gpus", "h100", "--task", "grpo", "--rollout-memory-fraction", "0.98",
                          "-q")
    assert out.returncode == 0, out.stderr
    out = plan_in_process("--model", "8b", "--gpus", "h100", "--task", "grpo", "--rollout-memory-fraction", "1",
                          "--rollout", "separate", "-q")
    assert out.returncode == 0, out.stderr


def test_a_distillation_with_tokens_over_several_gpus_says_why_it_takes_one() -> None:
    """--teacher with --tokens and a GPU list was told to "give --tokens N", which it had given."""
    out = plan_in_process("--model", "70b", "--gpus", "h100,a100", "--teacher", "405b", "--tokens", "1T")
    assert out.returncode == 2 and "with --teacher" in out.stderr and "give --tokens" not in out.stderr
