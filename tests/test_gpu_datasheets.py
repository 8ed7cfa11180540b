"""The GPU catalog (planner/presets/gpus.toml) checked once against its source table,
tests/data/gpu_specs.json: GPU specifications gathered from public tables that cite the
vendors' data sheets, each row naming its sources (dense TFLOP/s, decimal GB/s). Every figure
the table gives for a catalog GPU is compared here, rather than re-typed in tests.

The table rounds some figures (BF16 756 for the H100 PCIe's 756.5, 362 for the L40S's
362.05): compared within 0.2%. Its memory is the vendor's nominal "GB" (binary GiB), the catalog's
the driver's memory.total where one is cited: at most the nominal size, at least 93% of it.
Its NVLink figure counts both directions; the catalog's intra_node_gb_per_s one direction.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.hardware.gpus import get_gpu, list_gpus
from planner.units import GB, TB, GiB

TFLOPS = TB      # 1e12 FLOP/s: decimal, as the table

TABLE = json.loads((Path(__file__).parent / "data" / "gpu_specs.json").read_text())["gpus"]
# the table's rows for the catalog's GPUs (the others, H100 96GB and H800, are no catalog entry)
ROW_OF = {
    "a100-40gb": "NVIDIA A100 SXM4 40GB",
    "a100": "NVIDIA A100 SXM4 80GB",
    "h100": "NVIDIA H100 SXM5 80GB",
    "h100-pcie": "NVIDIA H100 PCIe 80GB",
    "h200": "NVIDIA H200 SXM 141GB",
    "b200": "NVIDIA B200 (HGX/DGX B200)",
    "l40s": "NVIDIA L40S 48GB",
    "a10g": "NVIDIA A10G 24GB (AWS G5)",
    "4090": "NVIDIA GeForce RTX 4090 24GB",
    "mi300x": "AMD Instinct MI300X 192GB",
    "v100": "NVIDIA V100 SXM2 32GB (for ZeRO-era cases)",
}
ROWS = {r["gpu"]: r for r in TABLE}


def _number(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def test_every_row_named_is_in_the_table_and_the_catalog() -> None:
    names = {g.name for g in list_gpus()}
    for name, row in ROW_OF.items():
        assert name in names and row in ROWS, name
        assert get_gpu(name).full_name.split(" (")[0].split(" 24GB")[0] in row or name in ("a10g", "v100"), name


@pytest.mark.parametrize("name", sorted(ROW_OF))
def test_peak_flops_are_the_tables(name: str) -> None:
    gpu, row = get_gpu(name), ROWS[ROW_OF[name]]
    checked = 0
    for dtype in ("bf16", "fp16", "tf32", "fp8"):
        table = _number(row.get(f"{dtype}_dense_tflops"))
        if table is None:
            continue
        assert gpu.peak_flops_per_s(dtype) == pytest.approx(table * TFLOPS, rel=2e-3), (name, dtype)
        checked += 1
    assert checked or name in ("a10g", "v100")      # the table gives no tensor-core figure for these two


@pytest.mark.parametrize("name", sorted(ROW_OF))
def test_memory_and_bandwidth_are_the_tables(name: str) -> None:
    gpu, row = get_gpu(name), ROWS[ROW_OF[name]]
    assert gpu.hbm_bytes_per_s == pytest.approx(row["hbm_bandwidth_GBps"] * GB)
    # nvidia-smi's memory.total sits below the nominal size (driver reservations; on GDDR parts
    # with ECC, as the L40S and A10G, about 6%)
    assert 0.93 * row["memory_GB"] * GiB <= gpu.memory_bytes <= row["memory_GB"] * GiB, name


@pytest.mark.parametrize("name", sorted(ROW_OF))
def test_power_nvlink_and_node_are_the_tables(name: str) -> None:
    gpu, row = get_gpu(name), ROWS[ROW_OF[name]]
    tdp = _number(row.get("tdp_w"))
    if tdp is not None:
        assert gpu.tdp_w == tdp, name
    nvlink = _number(row.get("nvlink_GBps_per_gpu"))
    if nvlink and gpu.intra_node_link.startswith("nvlink"):
        assert gpu.intra_node_bytes_per_s == pytest.approx(nvlink / 2 * GB), name
    per_node = row.get("gpus_per_node")
    if isinstance(per_node, int):
        assert gpu.gpus_per_node == per_node, name
