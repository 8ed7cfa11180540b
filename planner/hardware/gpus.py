"""GPU specifications: the catalog in presets/gpus.toml, loaded once into frozen GpuSpec records.

Figures come from vendor data sheets and whitepapers; each entry's `source` names them. The loader
converts the file's units (MiB/GiB/GB, TFLOP/s, GB/s, Gbit/s) to bytes, FLOP/s and bytes/s once.
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import UserError, unknown_name
from planner.limits import (
    MAX_CONFIG_BYTES,
    check_gpu_types,
    check_keys,
    check_label,
    decode_text,
    load_toml,
    not_found,
    read_input_file,
)
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
    # the sustained training rate (sustained_rate() resolves inheritance): the GPU family whose
    # published runs it shares, and its own ceiling where one is given
    architecture: str | None = None
    training_mfu_ceiling: float | None = None
    training_mfu_ceiling_basis: str = "assumed"        # "measured" or "assumed"
    training_mfu_ceiling_source: str | None = None
    # streaming multiprocessors, where the file gives them (the GEMM tile model's SMs:
    # timing.kernels.gemm_tiles); None: no tile model on this GPU
    sms: int | None = None

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
    "name", "full_name", "fp16_tflops", "fp32_tflops", "hbm_gb_per_s", "gpus_per_node",
    "intra_node_link", "intra_node_gb_per_s", "inter_node_gbit_per_s", "tdp_w", "source",
}
_OPTIONAL = {"aliases", "memory_mib", "memory_gib", "memory_gb", "bf16_tflops", "fp8_tflops", "tf32_tflops",
             "default_topology", "architecture", "training_mfu_ceiling", "training_mfu_ceiling_basis",
             "training_mfu_ceiling_source", "sms"}
CEILING_BASES = ("measured", "assumed")
_MEMORY_UNITS = {"memory_mib": MiB, "memory_gib": GiB, "memory_gb": GB}


def _tflops(entry: dict[str, Any], key: str) -> float | None:
    return entry[key] * TFLOPS if key in entry else None


def _parse_gpu(entry: dict[str, Any], where: str) -> GpuSpec:
    if not isinstance(entry, dict):
        raise UserError(f"{where}: each [[gpu]] must be a table")
    check_keys(entry, _REQUIRED, _OPTIONAL, where)
    memory_keys = [k for k in _MEMORY_UNITS if k in entry]
    if len(memory_keys) != 1:
        raise UserError(f"{where}: give exactly one of {sorted(_MEMORY_UNITS)}, got {memory_keys}")
    bad = check_gpu_types(entry, where)
    if bad:
        raise UserError(bad)
    basis = entry.get("training_mfu_ceiling_basis", "assumed")
    if basis not in CEILING_BASES:
        raise UserError(f"{where}: training_mfu_ceiling_basis must be one of {', '.join(CEILING_BASES)}, "
                        f"got {str(basis)[:40]!r}")
    if ("training_mfu_ceiling_basis" in entry or "training_mfu_ceiling_source" in entry) \
            and "training_mfu_ceiling" not in entry:
        raise UserError(f"{where}: training_mfu_ceiling_basis / _source describe a training_mfu_ceiling; "
                        f"give it too, or drop them")
    for key in ("name", "full_name"):
        check_label(entry[key], f"{where}: {key}")      # written into launch files and answers
    for alias in entry.get("aliases", ()):
        check_label(alias, f"{where}: aliases")
    memory_key = memory_keys[0]
    ceiling_source = entry.get("training_mfu_ceiling_source")
    return GpuSpec(
        name=entry["name"],
        full_name=entry["full_name"],
        aliases=tuple(entry.get("aliases", ())),     # "other names accepted": none needed (issue 32, U11)
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
        architecture=entry.get("architecture"),
        training_mfu_ceiling=entry.get("training_mfu_ceiling"),
        training_mfu_ceiling_basis=basis,
        training_mfu_ceiling_source=" ".join(ceiling_source.split()) if ceiling_source is not None else None,
        sms=entry.get("sms"),
    )


def parse_gpus(text: str, where: str = "gpus.toml") -> dict[str, GpuSpec]:
    """Parse a GPU catalog (TOML text with [[gpu]] tables) into {name: GpuSpec}."""
    data = load_toml(text, where)
    if data.keys() - {"gpu"}:
        raise UserError(f"{where}: unknown top-level keys {sorted(data.keys() - {'gpu'})}; only [[gpu]] tables")
    gpus: dict[str, GpuSpec] = {}
    tables = data.get("gpu", [])
    if not isinstance(tables, list):
        raise UserError(f"{where}: `gpu` must be [[gpu]] tables")
    for i, entry in enumerate(tables):
        label = entry.get("name", "?") if isinstance(entry, dict) else "?"
        shown = str(label)[:40]
        if not shown.isprintable():         # the message stays one line; _parse_gpu names the character
            shown = repr(shown)
        gpu = _parse_gpu(entry, f"{where} [[gpu]] #{i + 1} ({shown})")
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


def is_gpu_file(name: str) -> bool:
    """``--gpus`` names a file (``./my-gpu.toml``) rather than a catalog entry."""
    return name.strip().lower().endswith(".toml") or ("/" in name and Path(name).exists())


def load_gpu_file(path_text: str) -> GpuSpec:
    """A user's own GPU: a TOML file with one [[gpu]] table of the catalog's schema (the keys
    and units at the top of presets/gpus.toml), checked like a topology file: a regular
    UTF-8 file of at most MAX_CONFIG_BYTES, unknown keys refused, every value typed and in
    range; each failure is one line naming the file. The file is read at every call (a
    Python API caller may rewrite it between two plans); only the parse is kept, per text."""
    check_label(path_text, "--gpus")
    path = Path(path_text)
    if not path.is_file():
        raise UserError(not_found("GPU file", path_text, "pass a GPU name (`plan gpus`) or a TOML file with one "
                                                         "[[gpu]] table"))
    what = f"GPU file {path_text!r}"
    return _parse_gpu_file(decode_text(read_input_file(path, what, MAX_CONFIG_BYTES), what, "TOML"), path_text)


@functools.lru_cache(maxsize=8)
def _parse_gpu_file(text: str, path_text: str) -> GpuSpec:
    """The one GPU of a GPU file's ``text`` (load_gpu_file), kept per text and path: the same
    file asked for again gives the same object (8 texts of at most MAX_CONFIG_BYTES: 128 MiB
    at worst)."""
    gpus = parse_gpus(text, path_text)
    if len(gpus) != 1:
        raise UserError(f"GPU file {path_text!r}: expected exactly one [[gpu]] table, found {len(gpus)}")
    return next(iter(gpus.values()))


def get_gpu(name: str) -> GpuSpec:
    """The GPU called `name` (short name or alias, any case), or the one in a TOML file."""
    if is_gpu_file(name):
        return load_gpu_file(name.strip())
    gpu = _by_lower_name().get(name.strip().lower())
    if gpu is None:
        raise unknown_name("GPU", name, load_gpus().keys(), "`plan gpus`")
    return gpu


def list_gpus() -> list[GpuSpec]:
    """Every GPU in the catalog, in file order."""
    return list(load_gpus().values())


@dataclass(frozen=True, kw_only=True, slots=True)
class SustainedRate:
    """The highest model-FLOPs utilisation (executed model FLOPs over the dense 16-bit peak) a
    training step may reach on a GPU: its sustained training rate (timing.fast.step_arrays
    predicts no step faster). ``measured``: False when ASSUMED (inherited from another GPU of
    its architecture, or the fallback); ``source`` says where it comes from."""

    mfu: float
    measured: bool
    source: str
    from_gpu: str        # the GPU whose data set it (the GPU itself when it carries its own)


def sustained_rate(gpu: GpuSpec) -> SustainedRate:
    """The GPU's sustained training rate: its own ``training_mfu_ceiling`` when its data sets one
    (the catalog's measured ones cite a published run); else the one of the first catalog GPU
    of the same ``architecture`` that sets one (ASSUMED: the same die or family, the same
    stacks); else the highest measured ceiling of any catalog GPU (ASSUMED: no published run
    is faster on any GPU)."""
    if gpu.training_mfu_ceiling is not None:
        return SustainedRate(mfu=gpu.training_mfu_ceiling, measured=gpu.training_mfu_ceiling_basis == "measured",
                             source=gpu.training_mfu_ceiling_source or f"set in the data of GPU {gpu.name}",
                             from_gpu=gpu.name)
    catalog = list_gpus()
    if gpu.architecture is not None:
        same = [g for g in catalog if g.architecture == gpu.architecture and g.training_mfu_ceiling is not None]
        same.sort(key=lambda g: g.training_mfu_ceiling_basis != "measured")      # measured first
        if same:
            ref = same[0]
            return SustainedRate(mfu=float(ref.training_mfu_ceiling or 0.0), measured=False, from_gpu=ref.name,
                                 source=f"inherited from {ref.name} ({gpu.architecture}): "
                                        f"{ref.training_mfu_ceiling_source or ''}".rstrip(": "))
    measured = [g for g in catalog if g.training_mfu_ceiling is not None and g.training_mfu_ceiling_basis == "measured"]
    top = max(measured, key=lambda g: float(g.training_mfu_ceiling or 0.0))
    why = (f"no catalog GPU of architecture {gpu.architecture!r} has one" if gpu.architecture
           else "its data names no architecture")
    return SustainedRate(mfu=float(top.training_mfu_ceiling or 0.0), measured=False, from_gpu=top.name,
                         source=f"{why}: the highest MFU a published run reached on any GPU ({top.name}, "
                                f"{top.training_mfu_ceiling_source or ''})")
