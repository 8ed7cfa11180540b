"""Where parallel groups sit on the cluster and what bandwidth each axis's collectives get.

Placement puts the first axis of an order innermost (tp, then cp, ep, dp, pp by default, as
Megatron-LM's and torchtitan's device meshes do: _axis_groups); the bus bandwidth of each
axis is read off the topology graph with every group of the axis running at once
(graph.ring_bandwidth_bytes_per_s). Graphs and per-axis bandwidths are cached: the search
asks for the same few placements thousands of times.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from planner.errors import UserError
from planner.hardware.axes import AXES
from planner.hardware.gpus import GpuSpec
from planner.hardware.graph import build_graph, ring_bandwidth_bytes_per_s
from planner.hardware.rings import (
    Fabric,
    domain_gpus,
    fabric_of,
    island_of,
    ring_bound_bytes_per_s,
    scale_up_gpu_bytes_per_s,
)
from planner.hardware.topology import ClusterTopology, hash_once, load_topology, stored_hash, unpickle_hashed


@dataclass(frozen=True, kw_only=True, slots=True)
class AxisLink:
    """What one parallel axis's collectives see: bus bandwidth per GPU, per direction
    (nccl-tests' busbw), and the latency of one hop between neighbouring ranks."""

    bus_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The GPU and, when known, the topology whose graph gives the group bandwidths.
    Without a topology, a group inside a node gets the GPU's intra-node bandwidth and a
    group across nodes its per-GPU NIC bandwidth times the GPUs per node it can share."""

    gpu: GpuSpec
    topology: ClusterTopology | None = None
    # the hash of every field, worked out once: the link caches (axis_links and the timing's
    # tables) look a cluster up tens of thousands of times per plan, and a dataclass's hash
    # hashes every field of the GPU and the topology each time (issue 32: 2.4 million hash
    # calls, about a sixth of `--tokens` over the catalog with an MoE model)
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    __hash__, __setstate__ = stored_hash, unpickle_hashed

    def __post_init__(self) -> None:
        hash_once(self)


# NCCL's per-hop latencies (NVIDIA/nccl src/graph/tuning.cc, hwLat, Ring/LL) for clusters
# without a topology file.
FALLBACK_INTRA_LATENCY_S = 0.6e-6
FALLBACK_INTER_LATENCY_S = 3.7e-6


@lru_cache(maxsize=64)
def _graph(top: ClusterTopology, n_nodes: int):
    return build_graph(top, n_nodes)


def _axis_groups(stride: int, size: int, n_gpus: int) -> list[list[int]]:
    """The groups of one axis laid out with ``stride`` (the product of the inner axes'
    sizes) on GPUs 0..n_gpus-1: GPU id = sum over axes of index x stride, the strides growing
    from the innermost axis of the order (the one placement rule; tests/graph_groups.py builds
    every axis's groups with it)."""
    return [[first + i * stride for i in range(size)]
            for first in range(n_gpus) if (first // stride) % size == 0]


def _fold_axis(stride: int, size: int, n_gpus: int, gpus_per_node: int, unit_gpus: int,
               cap_gpus: int) -> tuple[int, int, int]:
    """(stride, size, GPUs) of a smaller placement in which one axis's groups have the
    same bandwidth as in the full one.

    A group's ring bandwidth depends only on which node (NVLink domain, leaf group)
    boundaries its rings cross and how many rings of the axis share each crossing
    (graph.ring_bandwidth_bytes_per_s); the spine does not block, so replicas of the
    pattern further out change nothing. So: a stride of whole units (nodes, or NVLink
    domains when a domain spans nodes) folds to one unit (one GPU of the group per unit,
    every GPU of the unit in a different group); a group
    wider than cap_gpus (two nodes, or two NVLink domains or leaf groups when those
    matter) keeps cap_gpus of it; and the GPUs laid out are the fewest that hold whole
    units and whole groups. Strides that are neither a divisor nor a multiple of the unit
    (3, 6, 12 GPUs on 8-GPU nodes) are laid out in full. Keeps the graphs small for clusters of
    thousands of GPUs.
    """
    if stride >= unit_gpus and stride % unit_gpus == 0:
        stride = unit_gpus
    regular = unit_gpus % stride == 0 or stride % unit_gpus == 0
    if regular and stride * size > cap_gpus:        # cap_gpus holds whole units
        size = max(2, cap_gpus // stride)
    span = stride * size
    whole = math.lcm(span, unit_gpus)                 # whole units, whole groups
    return stride, size, whole if whole <= n_gpus or not regular else span


LINK_TABLE = "links.json"      # under planner/presets/: graph links of the shipped topologies


def topology_fingerprint(top: ClusterTopology) -> str:
    """A digest of every field of ``top``: a link table entry answers only for the very
    topology it was computed on."""
    return hashlib.sha256(repr(top).encode()).hexdigest()[:16]


@lru_cache(maxsize=64)
def shipped_links(top: ClusterTopology) -> dict[tuple[int, int, int, int], AxisLink]:
    """The links graph_link() gave on a shipped topology, as recorded in
    planner/presets/links.json (bench/link_table.py writes it; tests/test_link_table.py
    recomputes its entries), keyed by (stride, size, n_gpus, min_nodes); empty when ``top``
    is not the topology the table was recorded on (another file, or an edited one)."""
    path = importlib.resources.files("planner") / "presets" / LINK_TABLE
    if not path.is_file():
        return {}
    entry = json.loads(path.read_text(encoding="utf-8")).get(top.name)
    if entry is None or entry["fingerprint"] != topology_fingerprint(top):
        return {}
    return {(st, sz, n, mn): AxisLink(bus_bytes_per_s=bw, latency_s=lat) for st, sz, n, mn, bw, lat in entry["links"]}


@lru_cache(maxsize=64)
def shipped_domain_gpus(top: ClusterTopology) -> int | None:
    """graph.nvlink_domain_size() of a shipped topology as planner/presets/links.json records
    it (bench/link_table.py), or None when the table does not answer for ``top``."""
    path = importlib.resources.files("planner") / "presets" / LINK_TABLE
    if not path.is_file():
        return None
    entry = json.loads(path.read_text(encoding="utf-8")).get(top.name)
    if entry is None or entry["fingerprint"] != topology_fingerprint(top):
        return None
    return entry.get("domain_gpus")


@lru_cache(maxsize=4096)
def _graph_link(top: ClusterTopology, stride: int, size: int, n_gpus: int, min_nodes: int) -> AxisLink:
    """graph_link(), read off the shipped table where it has the answer: the max-flow
    problems behind one link take milliseconds each, and a cost sweep over five GPU
    types asks for about eighty links (half its time without the table)."""
    known = shipped_links(top).get((stride, size, n_gpus, min_nodes))
    return known if known is not None else graph_link(top, stride, size, n_gpus, min_nodes)


def graph_link(top: ClusterTopology, stride: int, size: int, n_gpus: int, min_nodes: int) -> AxisLink:
    """One axis's link on a graph of at least ``min_nodes`` nodes: GPUs beyond n_gpus sit
    idle and relay nothing, so every placement can share one graph and its max-flow cache.
    On NVSwitch and mesh clusters the ring bound is read off the counts in closed form
    (hardware/rings.py), the graph never built; PCIe-only clusters build it."""
    gpn = top.gpus_per_node
    n_nodes = max(min_nodes, -(-n_gpus // gpn))
    intra = top.intra_node.latency_s if top.intra_node.fabric != "pcie" else top.pcie.latency_s
    inter = top.network.latency_s + top.pcie.latency_s
    fabric = fabric_of(top, n_nodes)
    if fabric is not None:
        bus_bytes_per_s, one_island = _closed_link(fabric, stride, size, n_gpus)
        return AxisLink(bus_bytes_per_s=bus_bytes_per_s, latency_s=intra if one_island else inter)
    g = _graph(top, n_nodes)
    groups = _axis_groups(stride, size, n_gpus)
    one_island = all(len({g.nodes[v]["island"] for v in grp}) == 1 for grp in groups)
    return AxisLink(bus_bytes_per_s=ring_bandwidth_bytes_per_s(g, groups), latency_s=intra if one_island else inter)


@lru_cache(maxsize=4096)
def _closed_link(fabric: Fabric, stride: int, size: int, n_gpus: int) -> tuple[float, bool]:
    """(bus bandwidth, every group inside one island) of one axis in closed form; graphs of
    different sizes with the same Fabric (only whether a spine exists tells them apart) share it."""
    groups = _axis_groups(stride, size, n_gpus)
    one_island = all(island_of(fabric, grp[0]) == island_of(fabric, grp[-1]) for grp in groups)
    return ring_bound_bytes_per_s(fabric, groups, n_gpus), one_island


def _fallback_table(gpu: GpuSpec, sizes: np.ndarray, order: Sequence[str]) -> np.ndarray:
    """Group bandwidths from the GpuSpec alone, per column of ``sizes`` (AXES rows), as
    axis_link_table's (bandwidth, latency) rows: inside a node the intra-node link; a ring
    that leaves a node shares the node's NICs (gpus_per_node x per-GPU NIC bandwidth) with
    the other groups of the same axis that leave it."""
    gpn = gpu.gpus_per_node
    out = np.empty((2 * len(AXES), sizes.shape[1]))
    stride = np.ones(sizes.shape[1], dtype=np.int64)
    with np.errstate(divide="ignore"):
        for axis in order:
            i = AXES.index(axis)
            n = sizes[i]
            inside = stride * n <= gpn
            crossing = np.minimum(stride, gpn)          # groups of this axis leaving each node
            bw = np.minimum(gpu.intra_node_bytes_per_s, gpn * gpu.inter_node_bytes_per_s / crossing)
            out[2 * i] = np.where(n == 1, math.inf, np.where(inside, gpu.intra_node_bytes_per_s, bw))
            out[2 * i + 1] = np.where(n == 1, 0.0, np.where(inside, FALLBACK_INTRA_LATENCY_S,
                                                            FALLBACK_INTER_LATENCY_S))
            stride = stride * n
    return out


def _distinct_columns(columns: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
    """(the distinct columns of ``columns`` (non-negative int64 rows) as lists of ints, each
    column's number among them), through one packed int64 key where the rows fit in one."""
    key, scale = np.zeros(columns.shape[1], dtype=np.int64), 1
    for row in columns:
        span = int(row.max()) + 1
        if scale * span >= 2**62:
            distinct, inverse = np.unique(columns, axis=1, return_inverse=True)
            return distinct.T.tolist(), inverse.reshape(-1)
        key, scale = key + row * scale, scale * span
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return columns[:, first].T.tolist(), inverse.reshape(-1)


def axis_link_table(cluster: Cluster, sizes: np.ndarray, order: tuple[str, ...] = AXES) -> np.ndarray:
    """axis_links of each column of ``sizes`` (int64, (5, N): tp, cp, ep, dp, pp rows, AXES
    order) as a (10, N) array: each axis's bus bandwidth and hop latency, in AXES order.
    The layouts of one GPU count share their axes' strides and sizes far more often than all
    five degrees, so each axis's link is looked up once per distinct (stride, size, GPUs)
    (issue 32: 59,000 axis_links calls in one --tokens plan over the catalog)."""
    top = cluster.topology
    if top is None:
        return _fallback_table(cluster.gpu, sizes, order)
    n_cols = sizes.shape[1]
    n_gpus = np.prod(sizes, axis=0)
    out = np.empty((2 * len(AXES), n_cols))
    falls_back = np.zeros(n_cols, dtype=bool)
    stride = np.ones(n_cols, dtype=np.int64)
    for axis in order:
        i = AXES.index(axis)
        n = sizes[i]
        out[2 * i], out[2 * i + 1] = math.inf, 0.0
        split = np.flatnonzero((n != 1) & ~falls_back)    # a layout that falls back asks no further
        if len(split):
            distinct, inverse = _distinct_columns(np.stack([stride[split], n[split], n_gpus[split]]))
            links = [_topology_axis_link(top, st, k, g) for st, k, g in distinct]
            none = np.array([lk is None for lk in links])
            out[2 * i, split] = np.array([math.nan if lk is None else lk.bus_bytes_per_s for lk in links])[inverse]
            out[2 * i + 1, split] = np.array([math.nan if lk is None else lk.latency_s for lk in links])[inverse]
            falls_back[split] |= none[inverse]
        stride = stride * n
    if falls_back.any():
        out[:, falls_back] = _fallback_table(cluster.gpu, sizes[:, falls_back], order)
    return out


@lru_cache(maxsize=16384)
def axis_links(cluster: Cluster, sizes: tuple[int, ...], order: tuple[str, ...] = AXES) -> dict[str, AxisLink]:
    """Bus bandwidth and hop latency of each axis (tp, cp, ep, dp, pp sizes in AXES order)
    when the groups are placed innermost-first along ``order`` (_axis_groups: Megatron-LM's
    and torchtitan's device-mesh order by default).

    With a topology, each axis's bandwidth is the graph's ring bandwidth with every group
    of that axis running at once (graph.ring_bandwidth_bytes_per_s), on a folded
    placement (_fold_axis). Clusters larger than one scalable unit of the topology are
    taken as several units under a non-blocking spine; when even the folded placement
    needs more nodes than the topology holds, the GpuSpec model (_fallback_table) answers.
    """
    table = axis_link_table(cluster, np.array(sizes, dtype=np.int64)[:, None], order)[:, 0].tolist()
    return {ax: AxisLink(bus_bytes_per_s=table[2 * AXES.index(ax)], latency_s=table[2 * AXES.index(ax) + 1])
            for ax in order}


@lru_cache(maxsize=65536)
def _topology_axis_link(top: ClusterTopology, stride: int, n: int, n_gpus: int) -> AxisLink | None:
    """One axis's link in axis_links: its ``n`` GPUs a group at ``stride`` among ``n_gpus``, on
    a folded placement (_fold_axis); None where even that needs more nodes than ``top`` holds
    (axis_links then answers from the GpuSpec). Kept per axis: the layouts of one count share
    their axes' strides and sizes far more often than all five degrees (issue 32: 59,000
    axis_links calls in one --tokens plan over the catalog, each folding every axis again)."""
    gpn = top.gpus_per_node
    domain_nodes = max(1, top.intra_node.domain_gpus // gpn)
    cap_nodes = max(2, 2 * domain_nodes)
    if top.network.oversubscription > 1:
        cap_nodes = max(cap_nodes, 2 * top.network.nodes_per_leaf)
    cap_gpus = min(cap_nodes, top.max_nodes) * gpn
    s_f, n_f, n_eval = _fold_axis(stride, n, n_gpus, gpn, domain_nodes * gpn, cap_gpus)
    if -(-n_eval // gpn) > top.max_nodes:
        return None
    return _graph_link(top, s_f, n_f, n_eval, min(cap_gpus // gpn, -(-n_gpus // gpn)))


def remote_share_deduplicated(k: int, domains: int, groups: int = 0, group_limit: int = 0) -> float:
    """Of a token's k expert copies that an all-to-all sends to other NVLink domains (k (D-1)/D
    of them, experts spread evenly over the D domains of the expert group), the share a dispatcher
    that sends each token once per remote domain sends (DeepEP and HybridEP: one RDMA copy per
    destination node, forwarded over NVLink inside it; DeepSeek-V3, arXiv:2412.19437, Sec. 3.2.2):
    E[distinct domains] / k. Under group-limited routing (the experts in ``groups`` equal groups,
    a token's in at most ``group_limit`` of them, DeepSeek-V3's router choosing its groups by their
    best experts' scores) every chosen group receives one of the k: where groups split domains
    (G/D groups each), the L distinct groups reach D (1 - C(G - G/D, L) / C(G, L)) domains (L where
    a group is a domain); where a group spans D/G domains, the k experts fall among M = L D/G
    candidate domains. Without a limit, M = D. E[distinct among M] = M (1 - (1 - 1/M)^k) (experts
    drawn uniformly, with replacement).
    Checked against the routing simulated (tests/test_all_to_all_link.py)."""
    if k <= 0 or domains <= 1:
        return 1.0
    limited = 0 < group_limit < groups
    if limited and groups >= domains and groups % domains == 0:
        per = groups // domains
        distinct = domains * (1 - math.comb(groups - per, group_limit) / math.comb(groups, group_limit))
    else:
        m = min(domains, group_limit * domains / groups) if limited else domains
        distinct = m * (1 - (1 - 1 / m) ** k) if m > 1 else 1.0
    return min(1.0, distinct / k)


# kept per arguments: --tokens over the catalog with DeepSeek-V3 asked 59,450 times for 19,386
# distinct ones (degree tuples of one expert grid, issue 32)
@lru_cache(maxsize=32768)
def all_to_all_link(cluster: Cluster, sizes: tuple[int, ...], order: tuple[str, ...] = AXES,
                    routing: tuple[int, int, int] | None = None) -> AxisLink:
    """The expert-parallel all-to-all's link, as the bus bandwidth the ring time
    (n-1)/n x S / (B x bus fraction) reads, for the ep axis of ``sizes`` placed along ``order``.

    In an all-to-all each of the n ranks sends 1/n of its S bytes to every other rank (NCCL's
    alltoall: one send and one receive per peer, NVIDIA/nccl-tests doc/PERFORMANCE.md, "AllToAll").
    A ring's bandwidth says nothing of it where a group leaves its NVLink domain: the g - 1 peers in
    the rank's own domain get theirs over NVLink at the GPU's scale-up rate, the n - g outside
    through the NICs, at the node's NIC bandwidth over its GPUs (each GPU's own rail on a
    rail-optimised fabric, NCCL's PXN), both at once:
    time = max((g - 1)/n x S / B_up, (n - g)/n x S / B_nic), so B = (n - 1)/n / max(...).
    An ep group of stride k (the inner axes' sizes) holds g = min(n, domain / k) GPUs of one
    domain (1 where k spans a domain). Where the whole group lies in one domain, or on PCIe-only
    nodes, the axis's ring link (axis_links) answers. Latency: one network hop where it leaves.
    Without a topology, the GpuSpec's intra- and inter-node rates over a node's GPUs.
    ``routing`` (k, groups, group limit) where the dispatcher sends a token once per remote domain
    (training.moe_runtime.dedup_routing): the remote part scaled by remote_share_deduplicated."""
    bw, lat = all_to_all_table(cluster, np.array(sizes, dtype=np.int64)[:, None], order, routing)[:, 0].tolist()
    return AxisLink(bus_bytes_per_s=bw, latency_s=lat)


def all_to_all_table(cluster: Cluster, sizes: np.ndarray, order: tuple[str, ...] = AXES,
                     routing: tuple[int, int, int] | None = None) -> np.ndarray:
    """all_to_all_link of each column of ``sizes`` (int64, (5, N), AXES rows) as a (2, N) array:
    bus bandwidth and latency."""
    ep_row = 2 * AXES.index("ep")
    ring = axis_link_table(cluster, sizes, order)[ep_row:ep_row + 2]
    n = sizes[AXES.index("ep")]
    if (n == 1).all():
        return ring
    stride = np.ones(sizes.shape[1], dtype=np.int64)
    for a in order[:order.index("ep")]:
        stride = stride * sizes[AXES.index(a)]
    top = cluster.topology
    if top is None:
        domain, up, nic = cluster.gpu.gpus_per_node, cluster.gpu.intra_node_bytes_per_s, \
            cluster.gpu.inter_node_bytes_per_s
        latency = FALLBACK_INTER_LATENCY_S
    else:
        if top.intra_node.fabric == "pcie":
            return ring
        domain = domain_gpus(top)
        up = scale_up_gpu_bytes_per_s(top.intra_node)
        nic = top.network.nics_per_node * top.network.nic_bytes_per_s / top.gpus_per_node
        latency = top.network.latency_s + top.pcie.latency_s
    g = np.where(stride >= domain, 1, np.minimum(n, domain // stride))
    leaves = (n != 1) & (g < n)
    if not leaves.any():
        return ring
    # on a mesh, a link to each peer of the node, all at once
    up_g = up * np.maximum(1, g - 1) if top is not None and top.intra_node.fabric == "mesh" else up
    remote: np.ndarray | float = 1.0
    if routing:
        pairs, inverse = _distinct_columns(np.stack([n[leaves], g[leaves]]))
        shares = np.array([remote_share_deduplicated(routing[0], -(-n_ // g_), routing[1], routing[2])
                           for n_, g_ in pairs])
        remote = np.ones(len(n))
        remote[leaves] = shares[inverse]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_byte_s = np.maximum((g - 1) / n / up_g, (n - g) / n * remote / nic)
        bus = np.minimum(ring[0], (n - 1) / n / per_byte_s)
    return np.stack([np.where(leaves, bus, ring[0]), np.where(leaves, latency, ring[1])])


# ------------------------------------------------------------------ clusters


def cluster_for(gpu: GpuSpec, topology: str | ClusterTopology | None = None) -> Cluster:
    """The cluster a plan runs on: ``topology`` (a ClusterTopology, or a shipped name or a
    path), else the GPU's default topology, else no topology (group bandwidths from the
    GpuSpec alone). A topology built for another GPU is an error."""
    if topology is None:
        top = load_topology(gpu.default_topology) if gpu.default_topology else None
    elif isinstance(topology, ClusterTopology):
        top = topology
    else:
        top = load_topology(topology)
    if top is not None and top.gpu != gpu.name:
        raise UserError(f"topology {top.name} is a cluster of {top.gpu}, not {gpu.name}; "
                        f"pass --gpus {top.gpu} or a topology of {gpu.name} GPUs (`plan topologies`)")
    return Cluster(gpu=gpu, topology=top)


@lru_cache(maxsize=64)
def scale_up_domain_gpus(cluster: Cluster) -> int:
    """GPUs one NVLink (or Infinity Fabric) domain holds, read from the topology graph
    (rings.domain_gpus: graph.nvlink_domain_size without the graph; 8 on a DGX, 72 on an
    NVL72 rack, 1 without NVLink);
    without a topology, the GPUs of a node when the GPU has an NVLink-class link."""
    if cluster.topology is not None:
        shipped = shipped_domain_gpus(cluster.topology)
        return shipped if shipped is not None else domain_gpus(cluster.topology)
    return cluster.gpu.gpus_per_node if "pcie" not in cluster.gpu.intra_node_link else 1
