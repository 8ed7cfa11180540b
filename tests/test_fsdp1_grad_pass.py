"""The FSDP1 gradient passes of planner.timing.efficiency.PYTORCH_FSDP1_BF16, checked against
torch's own FullyShardedDataParallel (one CPU process, gloo): the module's parameters are views
of the flat parameter, so autograd assembles the flat gradient in SplitWithSizesBackward (one
read and one write of the unsharded gradient in the parameter dtype), and the pre-divide factor
that makes _reduce_grad divide the unsharded gradient in place is above 1 at every data-parallel
size above 1."""

from __future__ import annotations

import socket

import pytest
from conftest import require

torch = require("torch")
dist = require("torch.distributed")


def _graph_names(fn, out: set[str], depth: int = 0) -> None:
    if fn is None or depth > 16:
        return
    out.add(type(fn).__name__ if not hasattr(fn, "name") else fn.name())
    for nxt, _ in fn.next_functions:
        _graph_names(nxt, out, depth + 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_fsdp1_flat_gradient_is_assembled_by_a_split_backward():
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        wrapped = FullyShardedDataParallel(model, device_id=torch.device("cpu"), mixed_precision=bf16)
        loss = wrapped(torch.randn(4, 8)).float().sum()
        names: set[str] = set()
        _graph_names(loss.grad_fn, names)
        assert "SplitWithSizesBackward0" in names
    finally:
        if started:
            dist.destroy_process_group()


def test_fsdp1_predivides_the_unsharded_gradient_at_every_data_parallel_size():
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    for n in (2, 3, 8, 64, 128, 1024):
        assert DefaultState._get_gradient_predivide_factor(n) > 1, n
    assert DefaultState._get_gradient_predivide_factor(1) == 1

