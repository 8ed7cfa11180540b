"""planner.measure.cpu_matmul: bf16 products computed in fp32 beneath the memory tracker change
what PyTorch's MemTracker and autograd's saved tensors report by not one byte, and give the
product PyTorch's own bf16 kernel gives (both accumulate in fp32)."""

from __future__ import annotations

import pytest
from conftest import require

torch = require("torch")

from planner.measure.cpu_matmul import float32_cpu_matmuls  # noqa: E402

pytestmark = pytest.mark.referee


def _step(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    y.float().sum().backward()


def _tracked_peak(fast: bool) -> dict:
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 64))
    x = torch.randn(4, 32, 96)
    tracker = MemTracker()
    tracker.track_external(model)
    with float32_cpu_matmuls(enabled=fast), tracker:
        _step(model, x)
    return {str(k): v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()}


def test_memtracker_sees_the_same_bytes():
    assert _tracked_peak(fast=True) == _tracked_peak(fast=False)


def test_autograd_saves_the_same_tensors():
    def saved(fast: bool) -> list[tuple]:
        torch.manual_seed(0)
        lin = torch.nn.Linear(64, 48)
        x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
        w = lin.weight.bfloat16().detach().requires_grad_()
        kept: list[tuple] = []
        with float32_cpu_matmuls(enabled=fast), torch.autograd.graph.saved_tensors_hooks(
                lambda t: kept.append((tuple(t.shape), t.dtype, t.untyped_storage().nbytes())) or t, lambda t: t):
            y = (torch.bmm(x.unsqueeze(0), w.t().unsqueeze(0)).squeeze(0) + torch.mm(x, w.t())
                 + torch.addmm(torch.zeros(48, dtype=torch.bfloat16), x, w.t()))
        y.float().sum().backward()
        return kept

    assert saved(True) == saved(False)


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm", "baddbmm"])
def test_products_match_the_bf16_kernel(op):
    torch.manual_seed(1)
    a = torch.randn(2, 40, 72).bfloat16()
    b = torch.randn(2, 72, 24).bfloat16()
    c = torch.randn(2, 40, 24).bfloat16()
    args = {"mm": (a[0], b[0]), "addmm": (c[0], a[0], b[0]), "bmm": (a, b), "baddbmm": (c, a, b)}[op]
    fn = getattr(torch, op)
    want = fn(*args)
    with float32_cpu_matmuls():
        got = fn(*args)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def test_other_dtypes_and_fake_tensors_pass_through():
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = torch.randn(8, 8)
    with float32_cpu_matmuls():
        assert torch.equal(torch.mm(a, a), a @ a)
    with FakeTensorMode(), float32_cpu_matmuls():
        out = torch.mm(torch.empty(4, 8, dtype=torch.bfloat16), torch.empty(8, 2, dtype=torch.bfloat16))
    assert out.shape == (4, 2) and out.dtype == torch.bfloat16


def test_entered_inside_the_tracker_its_copies_would_be_counted():
    """The order matters, and the first test sees it: beneath the tracker nothing moves, above
    it the fp32 copies count as temporaries."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 64))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker, float32_cpu_matmuls():
        _step(model, torch.randn(4, 32, 96))
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    assert peak["Total"] > _tracked_peak(fast=False)["Total"]
