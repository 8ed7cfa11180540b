"""BF16 matrix products on a CPU, run in FP32 beneath the memory trackers.

A real-tensor measurement on the CPU (``plan measure`` of a model that fake tensors cannot run,
bench/vision_accuracy.py, bench/megatron_core_memory.py) computes its bf16 matrix products with
PyTorch's CPU BLAS. On a CPU without AVX-512 BF16 or AMX that path is slow and depends on the
operands' layout: on the project's 2-core AVX2 machine, torch 2.13.0, one [2048, 1536] x
[1536, 512] product took 3.9 s in bf16 with both operands row-major, 9.2 s with both
transposed, 0.17 s with the first transposed, and 0.03 s in fp32. Two training steps of a
model with hidden size 512 spent 85% of their 183 s there.

``float32_cpu_matmuls`` is a dispatch mode that computes each bf16 ``mm``, ``addmm``, ``bmm``
and ``baddbmm`` of plain CPU tensors in fp32 and rounds the product to bf16: the same output
tensor (shape, dtype, contiguous strides) from an fp32-accumulated product, as PyTorch's bf16
CPU kernels accumulate in fp32 too (their opmath type). Entered *before* a memory tracker (which
is a dispatch mode too), it sits beneath it: the tracker sees the bf16 op and its bf16 output as
before, and the fp32 copies made here run with both modes off the stack, so no tracker counts
them. Autograd saves the op's own bf16 inputs (its key runs before any dispatch mode). What is
measured does not change; only the time does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def float32_cpu_matmuls(enabled: bool = True) -> Iterator[None]:
    """Within the block, bf16 matrix products of plain CPU tensors run in fp32 (module doc).
    Enter it before the tracker's mode; ``enabled=False`` (fake tensors, a GPU) does nothing."""
    if not enabled:
        yield
        return
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    bf16 = torch.bfloat16
    ops = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}

    def plain_bf16_cpu(t: Any) -> bool:
        return type(t) is torch.Tensor and t.dtype == bf16 and t.device.type == "cpu"

    class _Float32Matmuls(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if func in ops and tensors and all(plain_bf16_cpu(t) for t in tensors):
                widened = tuple(a.float() if isinstance(a, torch.Tensor) else a for a in args)
                return func(*widened, **kwargs).to(bf16)
            return func(*args, **kwargs)

    with _Float32Matmuls():
        yield
