"""Copies between a GPU and its host's memory: the link's achievable rate, and the time of
Megatron-Core's CPU activation offload that compute does not hide.

The link per GPU and per direction:

- PCIe Gen5 x16 (H100, B200 and every other GPU on a PCIe host): 64 GB/s per direction
  (PCI-SIG, PCIe 5.0 specification: 32 GT/s x 16 lanes, 128b/130b); pinned-memory copies reach
  about 50 GB/s on Gen5 hosts (ASSUMED: about 0.8 of the link, as NVIDIA's bandwidthTest reports
  on Gen5 hosts; HOST_COPY_BYTES_PER_S, which timing.rollout's offload of training states uses).
- NVLink-C2C on Grace superchips: GB200 and GB300 join one Grace CPU to two GPUs with 900 GB/s
  bidirectional (NVIDIA GB200 NVL72 and GB300 NVL72 data sheets, "NVLink-C2C: 900 GB/s"), so
  225 GB/s per GPU per direction when both GPUs copy at once, as every rank of a training step
  does; GH200 joins one Grace to one H100-class GPU at the same 900 GB/s (NVIDIA GH200 data
  sheet), 450 GB/s per direction. ASSUMED: the same share of the link as over PCIe is achievable
  (HOST_COPY_SHARE).
"""

from __future__ import annotations

from planner.hardware.gpus import GpuSpec
from planner.layouts.layout import Layout
from planner.memory.activations import activation_key, block_activations
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

PCIE_GEN5_X16_BYTES_PER_S = 64e9        # per direction, PCI-SIG PCIe 5.0
HOST_COPY_BYTES_PER_S = 50e9            # ASSUMED: pinned copies over PCIe Gen5 x16 (bandwidthTest)
HOST_COPY_SHARE = HOST_COPY_BYTES_PER_S / PCIE_GEN5_X16_BYTES_PER_S
# NVLink-C2C per GPU per direction: 900 GB/s bidirectional per Grace, shared by its GPUs
C2C_BYTES_PER_S = {"gb200": 900e9 / 2 / 2, "gb300": 900e9 / 2 / 2, "gh200": 900e9 / 2}


def host_copy_bytes_per_s(gpu: GpuSpec) -> float:
    """Achievable bytes/s of a pinned copy between one GPU and host memory, per direction,
    while every GPU of the node copies (module docstring: NVLink-C2C on Grace superchips,
    PCIe Gen5 x16 elsewhere)."""
    c2c = C2C_BYTES_PER_S.get(gpu.name)
    return HOST_COPY_BYTES_PER_S if c2c is None else HOST_COPY_SHARE * c2c


def offload_windows(n_layers: int, n_off: int) -> tuple[int, ...]:
    """The blocks of compute each offloaded layer's copy overlaps, in Transformer Engine's
    schedule (transformer_engine/pytorch/cpu_offload.py, AsyncDoubleBufferGroupOffloadHandler,
    which megatron-core 0.16.1 builds with num_offload_group = cpu_offloading_num_layers and
    num_model_group = the layers): the copy of offloaded layer i may run until the end of
    layer end_i = (L // N) (i + 1) - 1, plus i + 1 for the first L % N of them and L % N for
    the rest; the compute stream waits for it there, and the next copy starts. Layer 0's copy
    starts after layer 0 and overlaps end_0 blocks, each later one end_i - end_(i-1). The
    backward reloads the same groups in the mirrored windows."""
    if n_off <= 0:
        return ()
    base, extra = divmod(n_layers, n_off)
    ends = [base * (i + 1) - 1 + (i + 1 if i < extra else extra) for i in range(n_off)]
    return (ends[0], *(b - a for a, b in zip(ends, ends[1:])))


def activation_offload_exposed_s(m: ModelSpec, setup: TrainingSetup, key: Layout, kernels: str, gpu: GpuSpec,
                                 layer_fwd_s: float, layer_bwd_s: float, n_layers: int) -> tuple[float, float]:
    """Seconds per micro-batch that Megatron-Core's CPU activation offload adds to the forward
    and to the backward of a stage of ``n_layers`` blocks (TrainingSetup.offload_activations = N;
    (0.0, 0.0) without it).

    megatron-core 0.16.1 model_parallel_config.py cpu_offloading_num_layers, through Transformer
    Engine's get_cpu_offload_context (transformer_engine/pytorch/cpu_offload.py): the saved
    tensors of the first N layers go to pinned host memory on a side stream while the layers
    after them run their forward, and come back on another stream during the backward, each
    copy spread over the window of blocks offload_windows gives it. What shows is, per
    offloaded layer, max(0, copy - its window's forward) plus max(0, copy - its window's
    backward). The bytes are the block's saved activations as the memory model counts them
    (memory.activations.block_activations, the bytes it moves to the host line); the rate
    host_copy_bytes_per_s. Modelled, not measured: no published profile of the offload's
    exposed time was found; the two Megatron-Bridge recipes that offload (Llama 3 70B and
    Llama 3.1 405B on GB200) hide all but the first layer's copy by this account."""
    n_off = min(setup.offload_activations, n_layers)
    if n_off <= 0:
        return 0.0, 0.0
    kept, _ = block_activations(m, setup, activation_key(key), kernels)
    copy_s = kept / host_copy_bytes_per_s(gpu)
    windows = offload_windows(n_layers, n_off)
    return (sum(max(0.0, copy_s - w * layer_fwd_s) for w in windows),
            sum(max(0.0, copy_s - w * layer_bwd_s) for w in windows))
