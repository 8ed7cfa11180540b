"""GPU specifications: the catalog in presets/gpus.toml, loaded once into frozen GpuSpec records.

Figures come from vendor data sheets and whitepapers; each entry's `source` names them. The loader
converts the file's units (MiB/GiB/GB, TFLOP/s, GB/s, Gbit/s) to bytes, FLOP/s and bytes/s once.
"""

from __future__ import annotations

import functools
import importlib.resources
import tomllib
from dataclasses import dataclass
from typing import Any

from planner.errors import UserError, unknown_name
from planner.units import GB, GiB, MiB

TFLOPS = 10**12
_DTYPE_FIELDS = {
    "bf16": "bf16_flops_per_s",
    "fp16": "fp16_flops_per_s",
    "fp8": "fp8_flops_per_s",
    "tf32": "tf32_flops_per_s",
    "fp32": "fp32_flops_per_s",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One GPU model. Rates are dense (no 2:4 sparsity) peaks; fp32 is the non-tensor rate.

    memory_bytes is the capacity the driver reports (nvidia-smi memory.total) where cited,
    else the vendor capacity; usable memory is lower (see the planner's usable-memory fraction).
    Bandwidths are per GPU and per direction.
    """

    name: str
    full_name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    bf16_flops_per_s: float | None      # None: no bf16 tensor cores (V100)
    fp16_flops_per_s: float
    fp8_flops_per_s: float | None       # None before Hopper / Ada
    tf32_flops_per_s: float | None      # None before Ampere
    fp32_flops_per_s: float
    hbm_bytes_per_s: float
    gpus_per_node: int
    intra_node_link: str
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    tdp_w: float
    default_topology: str | None
    source: str

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for 'bf16', 'fp16', 'fp8', 'tf32' or 'fp32'."""
        field = _DTYPE_FIELDS.get(dtype)
        if field is None:
            raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPE_FIELDS)}")
        flops = getattr(self, field)
        if flops is None:
            raise UserError(f"GPU {self.name} ({self.full_name}) has no {dtype} tensor cores")
        return flops


_REQUIRED = {
    "name", "full_name", "aliases", "fp16_tflops", "fp32_tflops", "hbm_gb_per_s", "gpus_per_node",
    "intra_node_link", "intra_node_gb_per_s", "inter_node_gbit_per_s", "tdp_w", "source",
}
_OPTIONAL = {"memory_mib", "memory_gib", "memory_gb", "bf16_tflops", "fp8_tflops", "tf32_tflops",
             "default_topology"}
_MEMORY_UNITS = {"memory_mib": MiB, "memory_gib": GiB, "memory_gb": GB}


def _tflops(entry: dict[str, Any], key: str) -> float | None:
    return entry[key] * TFLOPS if key in entry else None


def _parse_gpu(entry: dict[str, Any], where: str) -> GpuSpec:
    unknown = entry.keys() - _REQUIRED - _OPTIONAL
    if unknown:
        raise UserError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_REQUIRED | _OPTIONAL)}")
    missing = _REQUIRED - entry.keys()
    if missing:
        raise UserError(f"{where}: missing keys {sorted(missing)}")
    memory_keys = [k for k in _MEMORY_UNITS if k in entry]
    if len(memory_keys) != 1:
        raise UserError(f"{where}: give exactly one of {sorted(_MEMORY_UNITS)}, got {memory_keys}")
    memory_key = memory_keys[0]
    return GpuSpec(
        name=entry["name"],
        full_name=entry["full_name"],
        aliases=tuple(entry["aliases"]),
        memory_bytes=int(entry[memory_key] * _MEMORY_UNITS[memory_key]),
        bf16_flops_per_s=_tflops(entry, "bf16_tflops"),
        fp16_flops_per_s=entry["fp16_tflops"] * TFLOPS,
        fp8_flops_per_s=_tflops(entry, "fp8_tflops"),
        tf32_flops_per_s=_tflops(entry, "tf32_tflops"),
        fp32_flops_per_s=entry["fp32_tflops"] * TFLOPS,
        hbm_bytes_per_s=entry["hbm_gb_per_s"] * GB,
        gpus_per_node=entry["gpus_per_node"],
        intra_node_link=entry["intra_node_link"],
        intra_node_bytes_per_s=entry["intra_node_gb_per_s"] * GB,
        inter_node_bytes_per_s=entry["inter_node_gbit_per_s"] * GB / 8,   # bits -> bytes
        tdp_w=entry["tdp_w"],
        default_topology=entry.get("default_topology"),
        source=" ".join(entry["source"].split()),
    )


def parse_gpus(text: str, where: str = "gpus.toml") -> dict[str, GpuSpec]:
    """Parse a GPU catalog (TOML text with [[gpu]] tables) into {name: GpuSpec}."""
    data = tomllib.loads(text)
    if data.keys() - {"gpu"}:
        raise UserError(f"{where}: unknown top-level keys {sorted(data.keys() - {'gpu'})}; only [[gpu]] tables")
    gpus: dict[str, GpuSpec] = {}
    for i, entry in enumerate(data.get("gpu", [])):
        gpu = _parse_gpu(entry, f"{where} [[gpu]] #{i + 1} ({entry.get('name', '?')})")
        if gpu.name in gpus:
            raise UserError(f"{where}: GPU {gpu.name!r} defined twice")
        gpus[gpu.name] = gpu
    return gpus


@functools.cache
def load_gpus() -> dict[str, GpuSpec]:
    """The shipped catalog, planner/presets/gpus.toml, keyed by short name (cached)."""
    text = (importlib.resources.files("planner") / "presets" / "gpus.toml").read_text(encoding="utf-8")
    return parse_gpus(text)


@functools.cache
def _by_lower_name() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in load_gpus().values():
        for key in (gpu.name, *gpu.aliases):
            other = index.setdefault(key.lower(), gpu)
            if other is not gpu:
                raise UserError(f"gpus.toml: name {key!r} is used by both {other.name} and {gpu.name}")
    return index


def get_gpu(name: str) -> GpuSpec:
    """The GPU called `name` (short name or alias, any case)."""
    gpu = _by_lower_name().get(name.strip().lower())
    if gpu is None:
        raise unknown_name("GPU", name, load_gpus().keys(), "`plan gpus`")
    return gpu


def list_gpus() -> list[GpuSpec]:
    """Every GPU in the catalog, in file order."""
    return list(load_gpus().values())
