"""What a step under FakeTensorMode needs to be measured right on CPU: DTensor's sharding
propagation outside the tracked mode, real tensors built outside the fake mode, and the
scalars a step reads with ``.item()`` stubbed (docs/facts.md, torchtitan traps 4 and
6). torch is imported inside functions only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def separate_dtensor_propagation(fake: bool) -> Iterator[None]:
    """Give DTensor's shape propagation its own FakeTensorMode, as it has in a real run.

    To learn an op's global output shape, DTensor runs the op on global-shape stand-ins inside
    ``detect_fake_mode() or FakeTensorMode()``. In a real run that is a fresh fake mode, which
    the trackers recognise and skip. Under our FakeTensorMode it finds ours, and the trackers
    count the stand-ins (whole unsharded tensors, freed at once): spikes of a full parameter's
    size in the optimizer step that a real run never has. A fake mode of its own removes them.
    """
    if not fake:
        yield
        return
    from unittest import mock

    import torch.distributed.tensor._sharding_prop as sharding_prop
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not hasattr(sharding_prop, "detect_fake_mode"):
        yield
        return
    propagation_mode = FakeTensorMode()
    with mock.patch.object(sharding_prop, "detect_fake_mode", lambda *args: propagation_mode):
        yield


@contextlib.contextmanager
def outside_fake_mode() -> Iterator[None]:
    """Leave any active FakeTensorMode (meta-device building must not produce fake tensors)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


def stub_scalars() -> Any:
    """A dispatch mode answering ``.item()`` with 1 inside the optimizer step under fake tensors.

    Fake tensors hold no values, so ``.item()`` raises there; Adafactor calls it for its step
    count and its relative step size (``param.norm(2).item()``). The value only scales the
    update, never changes a tensor's size, so any number gives the same memory.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _ScalarStub(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                dtype = args[0].dtype
                return True if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
            return func(*args, **(kwargs or {}))

    return _ScalarStub()
