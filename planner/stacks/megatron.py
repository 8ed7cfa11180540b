"""What Megatron-LM's launch needs from the planner's launch.sh: CUDA_DEVICE_MAX_CONNECTIONS.

The referee for the files --out writes for Megatron-LM (a cited copy of its argument parser
and of the validate_args rules that concern our flags) lives with the tests:
tests/megatron_args.py.
"""

from __future__ import annotations


def needs_one_connection(tp: int, cp: int, fsdp: bool, device_arch_major: int) -> bool:
    """Whether launch.sh must export CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args: tp or cp
    before Blackwell, without torch or Megatron FSDP, which need it unset or > 1)."""
    return (tp > 1 or cp > 1) and device_arch_major < 10 and not fsdp


# CUDA compute capability (major) per GPU of planner/presets/gpus.toml: what Megatron's
# get_device_arch_version() returns (torch.cuda.get_device_properties().major). Source:
# NVIDIA's compute capability table, developer.nvidia.com/cuda-gpus (H100/H200 9.0,
# B200/GB200 10.0, A100 8.0, L40S and RTX 4090 8.9, A10G 8.6, V100 7.0). MI300X runs
# ROCm, where the same variable limits hardware queues: treated as pre-Blackwell.
DEVICE_ARCH_MAJOR = {"h100": 9, "h100-pcie": 9, "h200": 9, "b200": 10, "gb200": 10, "a100": 8, "a100-40gb": 8,
                     "l40s": 8, "a10g": 8, "4090": 8, "v100": 7, "mi300x": 9}


def device_arch_major(gpu_name: str) -> int:
    """The GPU's CUDA major architecture version; 9 (pre-Blackwell, the safe side) when unknown."""
    return DEVICE_ARCH_MAJOR.get(gpu_name, 9)
