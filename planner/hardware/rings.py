"""The ring bound of graph.ring_bandwidth_bytes_per_s on NVSwitch and mesh clusters, in closed
form: the same blocks and the same cuts, each cut's max flow read off the counts of its GPUs
per PCIe switch, with no graph built.

graph.ring_bandwidth_bytes_per_s bounds a ring's bus bandwidth by cuts of two kinds. A cut
inside one island (NVLink domain, Infinity Fabric mesh) already has a closed form there
(graph's one-island flow: min(|S|, |T|) x c on a switch, |S| x |T| x p on a mesh). The others,
"far" cuts, put every source in islands that hold no sink. On an NVSwitch or mesh cluster
their max flow then never uses a scale-up link: those links join only GPUs of one island, so
only sources or only sinks, and a source (sink) has unbounded supply (demand) already. What is
left (build_graph's links) is GPU - PCIe switch (host) - NIC - leaf - spine, so by the
max-flow min-cut theorem (Ford and Fulkerson 1956) the value is the cheapest side for every
host, NIC and leaf:

- a NIC costs min(p, b) (its host link p, its leaf link b) when its host and leaf differ;
- a host with s sources on the sinks' side pays s x p; one with t sinks on the sources'
  side t x p; an idle host, or one without NICs, costs nothing;
- rails: the NICs of one host on every node (rail_optimized: NIC k goes to rail k's leaf)
  are interchangeable, so their leaves take one side in the minimal min cut (unique: the
  vertices the source reaches in the residual graph of any max flow, so every symmetry of
  the network fixing the sources and sinks maps it to itself). Per leaf group and host (per
  leaf group without rails), with leaves on side L and the spine on side P:
  [L != P] x uplinks + the sum over its hosts of the cost above;
- the spine (one vertex, build_graph: present when there are two leaves or more) takes the
  cheaper side.

tests/test_ring_closed_form.py checks every far cut against networkx's max flow on the graph
as built, and the whole bound against graph.ring_bandwidth_bytes_per_s, on random small
topologies and placements.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from planner.errors import UserError
from planner.hardware.topology import ClusterTopology, IntraNodeFabric

Host = tuple[int, int]          # (node, PCIe switch index inside the node)


def scale_up_gpu_bytes_per_s(intra: IntraNodeFabric) -> float:
    """One GPU's scale-up capacity to its island as the max-flow graph sees it: the sum of
    its links to the merged switch vertex (graph's merged edges add them in order) on
    NVSwitch, the one peer link on a mesh, 0 on PCIe."""
    if intra.fabric == "nvswitch":
        assert intra.gpu_link_bytes_per_s is not None
        total = 0.0
        for _ in range(intra.switches):
            total += intra.gpu_link_bytes_per_s / intra.switches
        return total
    if intra.fabric == "mesh":
        assert intra.peer_link_bytes_per_s is not None
        return intra.peer_link_bytes_per_s
    return 0.0


def leaf_uplink_bytes_per_s(top: ClusterTopology) -> float:
    """One leaf's up-link to the spine (build_graph): its full down-link bandwidth divided by
    the oversubscription (one NIC per node on a rail's leaf, every NIC without rails)."""
    net = top.network
    nics_per_leaf_per_node = 1 if net.rail_optimized else net.nics_per_node
    return net.nodes_per_leaf * nics_per_leaf_per_node * net.nic_bytes_per_s / net.oversubscription


@dataclass(frozen=True, kw_only=True, slots=True)
class Fabric:
    """The numbers of a topology's graph of some nodes that the closed forms read."""

    mesh: bool                      # Infinity Fabric mesh (else NVSwitch)
    gpus_per_node: int
    island_gpus: int                # GPUs of one island: an NVLink domain, a mesh node
    hosts: int                      # PCIe switches a node
    nics_on_host: tuple[int, ...]   # NICs under each PCIe switch (NIC k on switch k * hosts // nics)
    rail: bool
    nodes_per_leaf: int
    gpu_link_bytes_per_s: float     # GPU - PCIe switch
    nic_path_bytes_per_s: float     # PCIe switch - NIC - leaf: min of the two links
    uplink_bytes_per_s: float       # one leaf to the spine
    spine: bool                     # the graph has two leaves or more
    scale_up_bytes_per_s: float     # scale_up_gpu_bytes_per_s


def fabric_of(top: ClusterTopology, n_nodes: int) -> Fabric | None:
    """The Fabric of build_graph(top, n_nodes); None on a PCIe-only cluster (graph's PCIe tree)."""
    intra, pcie, net = top.intra_node, top.pcie, top.network
    if intra.fabric == "pcie":
        return None
    nics = [0] * pcie.switches
    for k in range(net.nics_per_node):
        nics[k * pcie.switches // net.nics_per_node] += 1
    leaf_groups = -(-n_nodes // net.nodes_per_leaf)
    return Fabric(mesh=intra.fabric == "mesh", gpus_per_node=top.gpus_per_node,
                  island_gpus=intra.domain_gpus if intra.fabric == "nvswitch" else top.gpus_per_node,
                  hosts=pcie.switches, nics_on_host=tuple(nics), rail=net.rail_optimized,
                  nodes_per_leaf=net.nodes_per_leaf, gpu_link_bytes_per_s=pcie.link_bytes_per_s,
                  nic_path_bytes_per_s=min(pcie.link_bytes_per_s, net.nic_bytes_per_s),
                  uplink_bytes_per_s=leaf_uplink_bytes_per_s(top),
                  spine=leaf_groups * (net.nics_per_node if net.rail_optimized else 1) > 1,
                  scale_up_bytes_per_s=scale_up_gpu_bytes_per_s(intra))


def domain_gpus(top: ClusterTopology) -> int:
    """graph.nvlink_domain_size without the graph: GPU 0's NVLink domain on the graph of one
    domain and a node more (cut at max_nodes), a node on a mesh, 1 on PCIe."""
    if top.intra_node.fabric == "nvswitch":
        return min(top.intra_node.domain_gpus, top.max_nodes * top.gpus_per_node)
    if top.intra_node.fabric == "mesh" and top.gpus_per_node > 1:
        return top.gpus_per_node
    return 1


def host_of(f: Fabric, gpu: int) -> Host:
    node, local = divmod(gpu, f.gpus_per_node)
    return node, local * f.hosts // f.gpus_per_node


def island_of(f: Fabric, gpu: int) -> int:
    return gpu // f.island_gpus


def far_flow_bytes_per_s(f: Fabric, sources: Mapping[Host, int], sinks: Mapping[Host, int]) -> float:
    """Max flow from GPUs to GPUs in other islands (GPUs counted per host: {(node, switch):
    GPUs}), per direction, GPUs outside them relaying nothing: the module's closed form."""
    p, m = f.gpu_link_bytes_per_s, f.nic_path_bytes_per_s
    # per leaf group and PCIe switch (rails) or leaf group (no rails, switch -1): leaves on S / T side
    costs: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for side, hosts in ((1, sources), (0, sinks)):
        for (node, h), n in hosts.items():
            r = f.nics_on_host[h]
            if r:
                costs[node // f.nodes_per_leaf, h if f.rail else -1][side] += min(n * p, r * m)
    if not f.spine:
        return sum(min(a, b) for a, b in costs.values())
    by_spine = [0.0, 0.0]           # spine on the sources' / the sinks' side
    for (_, h), (a, b) in costs.items():
        up = f.nics_on_host[h] * f.uplink_bytes_per_s if f.rail else f.uplink_bytes_per_s
        by_spine[0] += min(a, b + up)
        by_spine[1] += min(a + up, b)
    return min(by_spine)


def ring_bound_bytes_per_s(f: Fabric, groups: Iterable[Sequence[int]], n_gpus: int) -> float:
    """graph.ring_bandwidth_bytes_per_s(build_graph(top, n_nodes), groups) for f =
    fabric_of(top, n_nodes) and n_gpus = its GPUs: the same blocks (a GPU, a PCIe switch,
    a node, an island, a leaf group) and cuts, each in closed form."""
    rings = [sorted(set(grp)) for grp in groups if len(set(grp)) > 1]
    if not rings:
        return math.inf
    ring_of: dict[int, int] = {}
    for i, ring in enumerate(rings):
        for gpu in ring:
            if not 0 <= gpu < n_gpus:
                raise UserError(f"GPU {gpu} is not in this graph of {n_gpus} GPUs")
            if ring_of.setdefault(gpu, i) != i:
                raise UserError(f"GPU {gpu} is in two groups of the same axis")
    host = {v: host_of(f, v) for v in ring_of}
    island = {v: island_of(f, v) for v in ring_of}
    per_island = Counter((ring_of[v], island[v]) for v in ring_of)
    ring_host_lists = [[host[v] for v in ring] for ring in rings]
    ring_hosts = [Counter(hosts) for hosts in ring_host_lists]
    c = f.scale_up_bytes_per_s

    def near_flow(n_sources: int, n_sinks: int) -> float:       # graph's one-island closed form
        return n_sources * n_sinks * c if f.mesh else min(n_sources, n_sinks) * c

    bound = math.inf
    # Far cuts of one GPU, alone in its island (so on its host) against the rest of its ring:
    # the closed form reads the host only through its leaf group and its NICs (its rails
    # with rails), so one cut per ring and such a place answers for all its GPUs there.
    lone: dict[tuple[int, int, int], Host] = {}
    for gpu, i in ring_of.items():
        others = per_island[i, island[gpu]] - 1
        if others:
            bound = min(bound, near_flow(1, others))
        else:
            node, h = host[gpu]
            lone.setdefault((i, node // f.nodes_per_leaf, h if f.rail else f.nics_on_host[h]), (node, h))
    for (i, _, _), at in lone.items():
        bound = min(bound, far_flow_bytes_per_s(f, {at: 1}, {k: n for k, n in ring_hosts[i].items() if k != at}))

    blocks: dict[tuple, list[int]] = defaultdict(list)
    gpn, hosts_hold_many = f.gpus_per_node, f.gpus_per_node > f.hosts
    same_island_node = f.island_gpus == gpn
    for gpu in ring_of:
        node, h = host[gpu]
        blocks["node", node].append(gpu)
        if not same_island_node:         # else the same GPUs as its node: the same cuts
            blocks["island", island[gpu]].append(gpu)
        if hosts_hold_many:              # else the GPU alone: the cuts of the loop above
            blocks["host", node, h].append(gpu)
        blocks["leaf", node // f.nodes_per_leaf].append(gpu)
    for (kind, *_), inside in blocks.items():
        # a node, switch or island lies in one island; a leaf group when its GPUs here do
        islands = {island[v] for v in inside} if kind == "leaf" else {island[inside[0]]}
        held = Counter([ring_of[v] for v in inside])
        near: list[int] = []
        if len(islands) == 1:
            one = next(iter(islands))
            near = [i for i, k in held.items() if per_island[i, one] > k]
        if near:
            n_sources = sum(held[i] for i in near)
            bound = min(bound, near_flow(n_sources, sum(per_island[i, one] for i in near) - n_sources) / len(near))
        near_set = set(near)
        far = [i for i, k in held.items() if len(rings[i]) > k and i not in near_set]
        if far:
            far_set = set(far)
            sources = Counter(host[v] for v in inside if ring_of[v] in far_set)
            sinks = Counter(itertools.chain.from_iterable(ring_host_lists[i] for i in far))
            for k in sources:           # a block holds whole hosts: the sinks are the rest
                del sinks[k]
            bound = min(bound, far_flow_bytes_per_s(f, sources, sinks) / len(far))
    return bound
