"""Cluster topologies: TOML descriptions of one scalable unit, read and checked.

The schema is documented in topologies/README.md. Shipped descriptions live in
planner/presets/topologies/ (package data); a user's own file is passed by path.
planner.hardware.graph turns a description into the graph that bandwidths are read from.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import UserError, unknown_name
from planner.hardware.gpus import get_gpu
from planner.limits import (
    MAX_CONFIG_BYTES,
    check_keys,
    check_label,
    check_name,
    check_topology_types,
    decode_text,
    not_found,
    parse_toml,
    read_input_file,
)
from planner.units import GB, GiB, hash_once, stored_hash, unpickle_hashed

US = 1e-6               # microseconds -> seconds
FABRICS = ("nvswitch", "mesh", "pcie")


# A hash worked out once (planner.units.hash_once): ClusterTopology and placement.Cluster
# hold it, as do ModelSpec and TrainingSetup.


@dataclass(frozen=True, kw_only=True, slots=True)
class IntraNodeFabric:
    """How GPUs inside a node (or NVLink domain) reach each other.

    fabric: "nvswitch" (every GPU to every switch chip), "mesh" (a direct link per GPU pair,
    e.g. AMD Infinity Fabric) or "pcie" (no GPU fabric; see PcieTree).
    """

    fabric: str
    gpu_link_bytes_per_s: float | None    # nvswitch: one GPU's total into the switches, per direction
    peer_link_bytes_per_s: float | None   # mesh: one GPU-to-GPU link, per direction
    switches: int                         # nvswitch: switch chips per NVLink domain
    domain_gpus: int                      # GPUs sharing one NVLink domain (1 for pcie)
    latency_s: float                      # one GPU-to-GPU hop
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PcieTree:
    """PCIe switches hosting GPUs and NICs (split evenly, in order), and the CPU sockets above them.

    On NVLink nodes only the GPU-NIC affinity matters (GPU-GPU traffic takes NVLink), so the
    uplink and socket fields are None there.
    """

    switches: int                           # per node; 0 = devices sit on CPU root ports
    link_bytes_per_s: float                 # device <-> switch or root port, per direction
    uplink_bytes_per_s: float | None        # switch <-> CPU socket, per direction
    sockets: int
    socket_link_bytes_per_s: float | None   # between CPU sockets, per direction
    latency_s: float                        # one GPU-to-GPU hop through PCIe
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleOutNetwork:
    """NICs and the leaf/spine fabric between nodes (spines are drawn as one non-blocking vertex)."""

    nics_per_node: int
    nic_bytes_per_s: float
    rail_optimized: bool          # NIC k of every node under a leaf goes to that leaf's rail-k switch
    nodes_per_leaf: int
    oversubscription: float       # leaf down-link / up-link bandwidth (1.0 = non-blocking)
    latency_s: float              # one GPU-to-GPU hop through NICs and a leaf
    switch_latency_s: float       # each further switch hop (leaf -> spine -> leaf)
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class HostMemory:
    """A node's CPU memory and local NVMe, where offloaded optimizer states and parameters go."""

    memory_bytes: int
    nvme_bytes: int | None        # None: not given
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalableUnits:
    """How scalable units connect: up to ``max_units`` of them under a spine/core layer.

    Only a non-blocking layer (non_blocking = true: a full fat tree, as in the DGX
    SuperPOD reference architectures) is modelled: the group bandwidths then equal the
    ones inside one unit's leaf/spine fabric (hardware/placement.axis_links folds
    placements onto one unit). A file asking for a blocking core is refused.
    """

    max_units: int
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterTopology:
    """One scalable unit of a cluster: up to max_nodes identical nodes of gpus_per_node GPUs;
    ``units`` says how many such units a plan may span (None: one)."""

    name: str
    description: str
    gpu: str
    gpus_per_node: int
    max_nodes: int
    intra_node: IntraNodeFabric
    pcie: PcieTree
    network: ScaleOutNetwork
    source: str
    host: HostMemory | None = None   # None: the file gives no CPU memory; offload is not checked
    units: ScalableUnits | None = None   # None: one unit; plans beyond max_nodes are refused
    # the hash of every field, worked out once: the ring bound's caches (placement._graph_link)
    # look a topology up for every axis of every layout's degrees, and a dataclass's hash
    # hashes every nested field each time (issue 32: 227,000 lookups in one `--tokens` plan)
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    __hash__, __setstate__ = stored_hash, unpickle_hashed

    def __post_init__(self) -> None:
        hash_once(self)


# ---------------------------------------------------------------------------------------------
# Loading


def _table(data: Mapping[str, Any], required: set[str], optional: set[str], where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise UserError(f"{where}: expected a table of keys, got {type(data).__name__}")
    check_keys(data, required, optional, where)
    bad = check_topology_types(data, where)
    if bad:
        raise UserError(bad)
    return dict(data)


def _clean(text: str) -> str:
    return " ".join(text.split())


def _parse_intra(t: Mapping[str, Any], gpus_per_node: int, where: str) -> IntraNodeFabric:
    fabric = t.get("fabric")
    if fabric not in FABRICS:
        raise UserError(f"{where}: fabric must be one of {FABRICS}, got {fabric!r}")
    if fabric == "nvswitch":
        t = _table(t, {"fabric", "gpu_link_gb_per_s", "switches", "latency_us", "source"}, {"domain_gpus"}, where)
        domain = t.get("domain_gpus", gpus_per_node)
        if t["switches"] < 1:
            raise UserError(f"{where}: an NVSwitch fabric needs switches >= 1")
        if domain % gpus_per_node:
            raise UserError(f"{where}: domain_gpus {domain} is not a multiple of gpus_per_node {gpus_per_node}")
    elif fabric == "mesh":
        t = _table(t, {"fabric", "peer_link_gb_per_s", "latency_us", "source"}, set(), where)
        domain = gpus_per_node
    else:
        t = _table(t, {"fabric", "source"}, set(), where)
        domain = 1
    return IntraNodeFabric(
        fabric=fabric,
        gpu_link_bytes_per_s=t["gpu_link_gb_per_s"] * GB if "gpu_link_gb_per_s" in t else None,
        peer_link_bytes_per_s=t["peer_link_gb_per_s"] * GB if "peer_link_gb_per_s" in t else None,
        switches=t.get("switches", 0),
        domain_gpus=domain,
        latency_s=t.get("latency_us", 0.0) * US,
        source=_clean(t["source"]),
    )


def _parse_pcie(t: Mapping[str, Any], fabric: str, where: str) -> PcieTree:
    required = {"switches", "link_gb_per_s", "latency_us", "source"}
    if fabric == "pcie":
        t = _table(t, required | {"sockets"}, {"uplink_gb_per_s", "socket_link_gb_per_s"}, where)
        if t["switches"] and "uplink_gb_per_s" not in t:
            raise UserError(f"{where}: uplink_gb_per_s is needed when switches > 0")
        if t["sockets"] > 1 and "socket_link_gb_per_s" not in t:
            raise UserError(f"{where}: socket_link_gb_per_s is needed when sockets > 1")
    else:
        t = _table(t, required, set(), where)
        if t["switches"] < 1:
            raise UserError(f"{where}: NVLink nodes need switches >= 1 (the GPU-NIC affinity groups)")
    return PcieTree(
        switches=t["switches"],
        link_bytes_per_s=t["link_gb_per_s"] * GB,
        uplink_bytes_per_s=t["uplink_gb_per_s"] * GB if "uplink_gb_per_s" in t else None,
        sockets=t.get("sockets", 1),
        socket_link_bytes_per_s=t["socket_link_gb_per_s"] * GB if "socket_link_gb_per_s" in t else None,
        latency_s=t["latency_us"] * US,
        source=_clean(t["source"]),
    )


def _parse_network(t: Mapping[str, Any], where: str) -> ScaleOutNetwork:
    t = _table(t, {"nics_per_node", "nic_gbit_per_s", "rail_optimized", "nodes_per_leaf", "oversubscription",
                   "latency_us", "switch_latency_us", "source"}, set(), where)
    if t["oversubscription"] < 1:
        raise UserError(f"{where}: oversubscription is down/up bandwidth and must be >= 1")
    return ScaleOutNetwork(
        nics_per_node=t["nics_per_node"],
        nic_bytes_per_s=t["nic_gbit_per_s"] * GB / 8,      # bits -> bytes
        rail_optimized=t["rail_optimized"],
        nodes_per_leaf=t["nodes_per_leaf"],
        oversubscription=float(t["oversubscription"]),
        latency_s=t["latency_us"] * US,
        switch_latency_s=t["switch_latency_us"] * US,
        source=_clean(t["source"]),
    )


def _parse_host(t: Mapping[str, Any], where: str) -> HostMemory:
    t = _table(t, {"memory_gib", "source"}, {"nvme_gb"}, where)
    if t["memory_gib"] <= 0 or t.get("nvme_gb", 1) <= 0:
        raise UserError(f"{where}: memory_gib and nvme_gb must be positive")
    nvme = t.get("nvme_gb")
    return HostMemory(memory_bytes=int(t["memory_gib"] * GiB), nvme_bytes=None if nvme is None else int(nvme * GB),
                      source=_clean(t["source"]))


MAX_UNITS = 100_000


def _parse_units(t: Mapping[str, Any], where: str) -> ScalableUnits:
    t = _table(t, {"max_units", "non_blocking", "source"}, set(), where)
    n = t["max_units"]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_UNITS:
        raise UserError(f"{where}: max_units must be an integer from 1 to {MAX_UNITS:,}, got {n!r}")
    if t["non_blocking"] is not True:
        raise UserError(f"{where}: only a non-blocking spine/core between scalable units is modelled "
                        f"(non_blocking = true); describe an oversubscribed cluster as one unit with "
                        f"max_nodes and its [network] oversubscription instead")
    return ScalableUnits(max_units=n, source=_clean(t["source"]))


def parse_topology(text: str, where: str = "<topology>") -> ClusterTopology:
    """Parse one topology description (TOML text); see topologies/README.md for the schema."""
    # check_tree: nesting, integers beyond int64 (float() overflows), huge strings
    data = parse_toml(text, where, "; see topologies/README.md for the schema")
    t = _table(data, {"name", "description", "gpu", "gpus_per_node", "max_nodes",
                                     "intra_node", "pcie", "network", "source"}, {"host", "units"}, where)
    try:
        gpu = get_gpu(t["gpu"]).name        # an unknown GPU name fails here, with suggestions
    except UserError as e:
        raise UserError(f"{where}: gpu = {t['gpu']!r}: {e}") from None
    check_label(t["name"], f"{where}: name")           # printed in answers
    gpn = t["gpus_per_node"]
    intra = _parse_intra(t["intra_node"], gpn, f"{where} [intra_node]")
    pcie = _parse_pcie(t["pcie"], intra.fabric, f"{where} [pcie]")
    network = _parse_network(t["network"], f"{where} [network]")
    for what, count in (("pcie.switches", pcie.switches), ("network.nics_per_node", network.nics_per_node)):
        if count and gpn % count and count % gpn:
            raise UserError(f"{where}: {what} = {count} must divide or be a multiple of gpus_per_node = {gpn}")
    if t["max_nodes"] < 1:
        raise UserError(f"{where}: max_nodes must be >= 1")
    if network.nodes_per_leaf % (intra.domain_gpus // gpn or 1):
        raise UserError(f"{where}: network.nodes_per_leaf must hold whole NVLink domains "
                        f"({intra.domain_gpus // gpn} nodes each)")
    return ClusterTopology(name=t["name"], description=_clean(t["description"]), gpu=gpu, gpus_per_node=gpn,
                           max_nodes=t["max_nodes"], intra_node=intra, pcie=pcie, network=network,
                           source=_clean(t["source"]),
                           host=_parse_host(t["host"], f"{where} [host]") if "host" in t else None,
                           units=_parse_units(t["units"], f"{where} [units]") if "units" in t else None)


def _shipped_dir() -> Any:
    return importlib.resources.files("planner") / "presets" / "topologies"


@functools.cache
def _shipped() -> dict[str, ClusterTopology]:
    tops = {}
    for f in sorted(_shipped_dir().iterdir(), key=lambda f: f.name):
        if f.name.endswith(".toml"):
            top = parse_topology(f.read_text(encoding="utf-8"), f"topologies/{f.name}")
            if f"{top.name}.toml" != f.name:
                raise UserError(f"topologies/{f.name}: name {top.name!r} does not match the file name")
            tops[top.name] = top
    return tops


def load_topology(name_or_path: str | Path) -> ClusterTopology:
    """A shipped topology by name (any case), or a TOML file by path."""
    check_name(str(name_or_path), "--topology")
    check_label(str(name_or_path), "--topology")
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.is_file() or ("/" in str(name_or_path) and path.exists()):
        if not path.is_file():
            raise UserError(not_found("topology file", path, "pass a shipped topology (`plan topologies`) or a "
                                                             "TOML file"))
        what = f"topology file {str(path)!r}"
        return parse_topology(decode_text(read_input_file(path, what, MAX_CONFIG_BYTES), what, "TOML"), str(path))
    top = _shipped().get(str(name_or_path).strip().lower())
    if top is None:
        raise unknown_name("topology", str(name_or_path), _shipped().keys(), "`plan topologies`")
    return top


def max_covered_gpus(top: ClusterTopology) -> int:
    """The most GPUs a plan on ``top`` may use: its nodes, times its scalable units."""
    units = top.units.max_units if top.units is not None else 1
    return top.max_nodes * units * top.gpus_per_node


def check_covers(top: ClusterTopology, n_gpus: int, flag: str = "--n-gpus") -> None:
    """Refuse a plan of ``n_gpus`` that runs past what ``top`` describes (UserError, one line)."""
    largest = max_covered_gpus(top)
    if n_gpus <= largest:
        return
    nodes = -(-n_gpus // top.gpus_per_node)
    units = top.units.max_units if top.units is not None else 1
    described = (f"{units:,} scalable units of {top.max_nodes} nodes" if units > 1
                 else f"{top.max_nodes} node{'s' if top.max_nodes > 1 else ''}")
    raise UserError(f"{n_gpus:,} GPUs need {nodes:,} nodes; topology {top.name} describes {described} "
                    f"({largest:,} GPUs): plan with {flag} {largest} or fewer, or describe a bigger "
                    f"cluster in a topology file (max_nodes, [units] max_units; topologies/README.md) "
                    f"and pass --topology PATH")


def list_topologies() -> list[ClusterTopology]:
    """Every shipped topology, by name."""
    return list(_shipped().values())
