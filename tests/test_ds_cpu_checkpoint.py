"""DeepSpeed's cpu_checkpointing: the host copy of the checkpointed block inputs is counted on
the host memory line (--stack deepspeed --recompute full --ds-checkpointing cpu|partitioned-cpu).

The per-block copy is what DeepSpeed's own functions make of a block input
(deepspeed/runtime/activation_checkpointing/checkpointing.py, 0.19.8: copy_to_device to the
CPU, partition_activations with CPU_CHECKPOINT), and the block kept on the GPU is the
offload engine's keep_last_count default (offload_activations.py)."""

from __future__ import annotations

import inspect
import json
import os
from unittest import mock

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli

B, S, H, L = 2, 8192, 4096, 32      # micro-batch, sequence, Llama 3.1 8B's width and layers


def _plan(mode: str) -> dict:
    r = CliRunner().invoke(cli, ["--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "8", "--dp", "8", "--zero",
                                 "3", "--stack", "deepspeed", "--recompute", "full", "--ds-checkpointing", mode,
                                 "--seq-len", str(S), "--micro-batch", str(B), "--global-batch", "64", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["plan"]


def _host_bytes(mode: str) -> int:
    return _plan(mode)["offload"]["host_bytes_per_rank"]


@pytest.mark.slow
def test_cpu_checkpointing_puts_one_block_input_per_block_on_the_host():
    torch = require("torch")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    require("deepspeed")
    from deepspeed.runtime.activation_checkpointing import checkpointing as ck
    from deepspeed.runtime.activation_checkpointing.offload_activations import _ActivationOffloadEngine

    x = torch.empty(B, 64, H, dtype=torch.bfloat16)        # a block input, 64 of the sequence's rows
    with mock.patch.object(ck.dist, "get_rank", return_value=0), \
            mock.patch.object(ck.dist, "get_world_size", return_value=1):
        ck.configure(None, partition_activations=True, checkpoint_in_cpu=True, contiguous_checkpointing=False)
        part = ck.partition_activations([x], True, False)[0]
        ck.configure(None, partition_activations=False, checkpoint_in_cpu=True, contiguous_checkpointing=False)
        plain = ck.copy_to_device((x,), device=torch.device("cpu"), criterion_func=ck.is_activation_to_checkpoint)[0]
    per_block = part.numel() * part.element_size() * (S // 64)
    assert plain.numel() * plain.element_size() * (S // 64) == per_block == B * S * H * 2
    keep_last = inspect.signature(_ActivationOffloadEngine).parameters["keep_last_count"].default
    assert _host_bytes("partitioned-cpu") == L * per_block           # partitioned: every block's input
    assert _host_bytes("cpu") == (L - keep_last) * per_block         # the engine keeps the last on the GPU
    assert _host_bytes("partitioned") == _host_bytes("none") == 0
    # the input the engine keeps stays on the GPU's activations (same peak moment, one micro-batch)
    cpu, part = _plan("cpu"), _plan("partitioned-cpu")
    assert cpu["peak"]["phase"] == part["peak"]["phase"]
    assert cpu["memory_bytes"]["activations"] - part["memory_bytes"]["activations"] == keep_last * per_block
