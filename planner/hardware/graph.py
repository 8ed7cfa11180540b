"""The graph of a cluster topology, the bandwidth of parallel groups read off it, and the
placement of those groups on GPU ids.

build_graph() turns a description (planner.hardware.topology) into a networkx graph (GPUs,
NVSwitches, PCIe switches, CPU sockets, NICs, leaf and spine switches; edges carry
bandwidth_bytes_per_s per direction and latency_s). Collective bandwidths are computed on
that graph with max-flow over cuts, not looked up. On NVSwitch and mesh clusters
hardware/rings.py computes the same ring bound in closed form without the graph (what
placement uses there); the graph stays the reference its tests check it against, and what
PCIe-only clusters are solved on. This is the only module that imports
networkx, inside the functions that build or solve a graph: a plan on a shipped topology reads
its links and its NVLink domain from planner/presets/links.json and never imports it.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.hardware.rings import leaf_uplink_bytes_per_s, scale_up_gpu_bytes_per_s
from planner.hardware.topology import ClusterTopology

if TYPE_CHECKING:
    import networkx as nx

# ---------------------------------------------------------------------------------------------
# The graph

SCALE_UP, PCIE, CPU, NETWORK = "scale_up", "pcie", "cpu", "network"     # edge kinds


def _present(value: float | None, what: str) -> float:
    """A bandwidth the fabric needs; the topology reader fills it for that fabric."""
    if value is None:
        raise ValueError(f"topology: {what} missing for a fabric that uses it")
    return value


def _link(g: nx.Graph, a: Any, b: Any, bytes_per_s: float, latency_s: float, kind: str) -> None:
    g.add_edge(a, b, bandwidth_bytes_per_s=bytes_per_s, latency_s=latency_s, kind=kind)


def _hosts_alike(top: ClusterTopology) -> bool:
    """Whether the PCIe switches (hosts) under one CPU socket are interchangeable in every
    max-flow problem, the same permutation on every node: each carries as many NICs (NIC k
    goes to rail k's leaf, so permuting hosts permutes rails, which are alike) and has the
    same uplink. Not when GPUs sit on the sockets' root ports (the hosts are then the
    sockets, which form a chain)."""
    if top.intra_node.fabric == "pcie" and top.pcie.switches == 0:
        return False
    return top.network.nics_per_node % top.pcie.switches == 0


def build_graph(top: ClusterTopology, n_nodes: int) -> nx.Graph:
    """The graph of n_nodes nodes of `top`. GPUs are the integers 0..n_gpus-1, node-major.

    Vertices have a `kind`: gpu, nvswitch, pcie_switch, cpu, nic, leaf, spine. Every GPU also
    carries `node`, `local` (index in its node), `island` (the GPUs it reaches without the
    network: its NVLink domain, or its node on PCIe-only machines), `leaf_group`, and `domains`
    (the nested blocks a ring can be cut at: node, NVLink domain, PCIe switch, socket, leaf group).
    Edges carry bandwidth_bytes_per_s (per direction; links are full duplex), latency_s and
    `kind` (scale_up, pcie, cpu, network). The spine layer is one non-blocking vertex.
    """
    if not 1 <= n_nodes <= top.max_nodes:
        raise UserError(f"topology {top.name} holds 1 to {top.max_nodes} nodes, not {n_nodes}")
    gpn, intra, pcie, net = top.gpus_per_node, top.intra_node, top.pcie, top.network
    n_gpus = n_nodes * gpn
    import networkx as nx

    g = nx.Graph(topology=top.name, n_gpus=n_gpus, fabric=intra.fabric, gpus_per_node=gpn,
                 domain_gpus=intra.domain_gpus,
                 leaf_of_node=[node // net.nodes_per_leaf for node in range(n_nodes)],
                 intra_kinds=(PCIE, CPU) if intra.fabric == "pcie" else (SCALE_UP,),
                 scale_up_gpu_bytes_per_s=scale_up_gpu_bytes_per_s(intra),
                 hosts_alike=_hosts_alike(top),
                 pcie_tree=(pcie.sockets if intra.fabric == "pcie" else 0, pcie.switches > 0, pcie.link_bytes_per_s,
                            pcie.uplink_bytes_per_s or 0.0, pcie.socket_link_bytes_per_s or 0.0))

    for node in range(n_nodes):
        leaf_group = node // net.nodes_per_leaf
        sockets = [f"n{node}/cpu{c}" for c in range(pcie.sockets)] if intra.fabric == "pcie" else []
        switches = [f"n{node}/pcie{s}" for s in range(pcie.switches)]
        g.add_nodes_from(sockets, kind="cpu")
        g.add_nodes_from(switches, kind="pcie_switch")
        for a, b in itertools.pairwise(sockets):
            _link(g, a, b, _present(pcie.socket_link_bytes_per_s, "socket_link_bytes_per_s"), 0.0, CPU)
        for s, sw in enumerate(switches):
            if sockets:
                _link(g, sw, sockets[s * len(sockets) // len(switches)],
                      _present(pcie.uplink_bytes_per_s, "uplink_bytes_per_s"), 0.0, PCIE)
        hosts = switches or sockets        # where GPUs and NICs plug in
        for local in range(gpn):
            gpu = node * gpn + local
            h = local * len(hosts) // gpn
            island = f"nvl{gpu // intra.domain_gpus}" if intra.fabric == "nvswitch" else f"node{node}"
            domains = [f"node{node}", island, f"n{node}/host{h}", f"leaf{leaf_group}"]
            if switches and sockets:
                domains.append(f"n{node}/cpu{h * len(sockets) // len(switches)}")
            socket = (h * len(sockets) // len(switches) if switches else h) if sockets else 0
            g.add_node(gpu, kind="gpu", node=node, local=local, host=h, socket=socket, island=island,
                       leaf_group=leaf_group, domains=tuple(dict.fromkeys(domains)))
            _link(g, gpu, hosts[h], pcie.link_bytes_per_s, pcie.latency_s / 2, PCIE)
        for k in range(net.nics_per_node):
            nic, leaf = f"n{node}/nic{k}", f"leaf{leaf_group}/rail{k}" if net.rail_optimized else f"leaf{leaf_group}"
            g.add_node(nic, kind="nic")
            g.add_node(leaf, kind="leaf")
            _link(g, nic, hosts[k * len(hosts) // net.nics_per_node], pcie.link_bytes_per_s, 0.0, PCIE)
            _link(g, nic, leaf, net.nic_bytes_per_s, net.latency_s / 2, NETWORK)
        if intra.fabric == "mesh":
            first = node * gpn
            for ga in range(first, first + gpn):
                for gb in range(ga + 1, first + gpn):
                    _link(g, ga, gb, _present(intra.peer_link_bytes_per_s, "peer_link_bytes_per_s"),
                          intra.latency_s, SCALE_UP)

    if intra.fabric == "nvswitch":
        # an nvswitch fabric always gives gpu_link_gb_per_s (checked where the topology is read)
        assert intra.gpu_link_bytes_per_s is not None
        # the same vertices and links, in the same order, as one add_node and _link per pair
        # (2.4 million of them at the limits of topologies/README.md: bulk inserts halve the time)
        per_link, half_latency = intra.gpu_link_bytes_per_s / intra.switches, intra.latency_s / 2
        for domain in range(-(-n_gpus // intra.domain_gpus)):
            chips = [f"nvl{domain}/nvswitch{sw_i}" for sw_i in range(intra.switches)]
            g.add_nodes_from(chips, kind="nvswitch")
            for gpu_i in range(domain * intra.domain_gpus, min(n_gpus, (domain + 1) * intra.domain_gpus)):
                g.add_edges_from((gpu_i, nvsw, {"bandwidth_bytes_per_s": per_link, "latency_s": half_latency,
                                                "kind": SCALE_UP}) for nvsw in chips)

    # A leaf's up-links to the spine carry its full down-link bandwidth / oversubscription.
    leaves = [v for v, kind in g.nodes(data="kind") if kind == "leaf"]
    if len(leaves) > 1:
        uplink = leaf_uplink_bytes_per_s(top)
        g.add_node("spine", kind="spine")
        for leaf in leaves:
            _link(g, leaf, "spine", uplink, net.switch_latency_s, NETWORK)
    return g


# ---------------------------------------------------------------------------------------------
# Bandwidth from the graph


def _max_flow_bytes_per_s(g: nx.Graph, sources: set[int], sinks: set[int]) -> float:
    """Max flow from `sources` to `sinks`, per direction, on the links NCCL would use.

    GPUs outside sources | sinks are not relays. When every GPU involved sits in one island,
    only intra-island links count (NVLink on NVLink machines, PCIe on PCIe ones), as NCCL never
    routes such traffic through the network; otherwise every link counts.

    Inside one NVSwitch domain or one Infinity Fabric mesh the value has a closed form
    (_one_island_flow_bytes_per_s). Otherwise nodes of a built graph are alike, so the value
    depends only on how many sources and sinks sit under each PCIe switch of each node, up to
    permutations of alike leaf groups, islands, nodes and switches (_placement_key): it is
    cached in g.graph under that key, and graphs from build_graph() must not be modified.
    """
    place = _gpu_places(g)
    islands = {place[v][1] for v in itertools.chain(sources, sinks)}
    one_island = len(islands) == 1
    if one_island:
        closed = _one_island_flow_bytes_per_s(g, len(sources), len(sinks))
        if closed is not None:
            return closed
    key = _placement_key(g, sources, sinks, one_island)
    cache = g.graph.setdefault("max_flow_cache", {})
    if key not in cache:
        if one_island and g.graph["fabric"] == "pcie":
            cache[key] = _pcie_tree_flow_bytes_per_s(g.graph["pcie_tree"], key)
        else:
            cache[key] = _solve_max_flow(g, sources, sinks, one_island=one_island)
    return cache[key]


def _pcie_tree_flow_bytes_per_s(tree: tuple[int, bool, float, float, float], key: tuple) -> float:
    """Max flow inside one PCIe-only node over its PCIe and CPU links, from the counts of
    _placement_key's "pcie" form: ((socket, ((sources, sinks) per PCIe switch)), ...).

    Those links form a tree (build_graph: GPUs on their switch, each switch on one socket,
    the sockets a chain; NICs hang off switches as leaves, and the network is not used inside
    an island), so by the max-flow min-cut theorem (Ford and Fulkerson 1956) the value is the
    cheapest way to put every vertex on the sources' or the sinks' side, each source GPU on
    the first and each sink GPU on the second, paying every link whose ends differ: one pass
    down the socket chain, each switch taking the cheaper of its own side and the other side
    plus its uplink. Switches and sockets holding neither side are free: a switch then costs
    nothing, a socket still relays along the chain. With GPUs on the sockets' root ports (no
    switches) the hosts are the sockets. tests/test_topology_flow.py checks ring bandwidths
    built on it against networkx's max flow, cut by cut."""
    n_sockets, switches, gpu_link, uplink, socket_link = tree
    hosts_of = dict(key[1:])
    below = (0.0, 0.0)          # cost of the chain past the socket, socket on the sources' / sinks' side
    for socket in reversed(range(n_sockets)):
        own = [0.0, 0.0]
        for n_s, n_t in hosts_of.get(socket, ()):
            host = (n_t * gpu_link, n_s * gpu_link)            # host on the sources' / sinks' side
            if switches:
                own[0] += min(host[0], host[1] + uplink)
                own[1] += min(host[1], host[0] + uplink)
            else:                                             # the GPUs sit on the socket itself
                own[0] += host[0]
                own[1] += host[1]
        below = (own[0] + min(below[0], below[1] + socket_link), own[1] + min(below[1], below[0] + socket_link))
    return min(below)


def _gpu_places(g: nx.Graph) -> dict[int, tuple]:
    """(leaf group, island, node, socket, host) of every GPU, read once per graph and cached
    in g.graph (graphs from build_graph() are not modified): the cut keys read them for
    every GPU of every cut, millions of attribute look-ups on a graph at the limits."""
    cached = g.graph.get("gpu_places")
    if cached is None:
        cached = g.graph["gpu_places"] = {
            v: (a["leaf_group"], a["island"], a["node"], a["socket"], a["host"])
            for v, a in g.nodes(data=True) if a["kind"] == "gpu"}
    return cached


def _one_island_flow_bytes_per_s(g: nx.Graph, n_sources: int, n_sinks: int) -> float | None:
    """Max flow between disjoint sets of GPUs of one island over its scale-up links alone, in
    closed form where the island's fabric is symmetric; None for a PCIe tree.

    NVSwitch domain: every GPU links to the domain's (merged) switch vertex with the same
    capacity c, a star, so the min cut takes all source links or all sink links:
    min(|S|, |T|) x c. Full mesh (Infinity Fabric): only the involved GPUs take part and each
    pair has one link of capacity p, so every cut is the S-T edges: |S| x |T| x p. Both are
    the max-flow min-cut theorem (Ford and Fulkerson 1956) on these graphs;
    tests/test_topology_flow.py checks them against networkx's max flow."""
    fabric = g.graph["fabric"]
    if fabric == "nvswitch":
        return min(n_sources, n_sinks) * g.graph["scale_up_gpu_bytes_per_s"]
    if fabric == "mesh":
        return n_sources * n_sinks * g.graph["scale_up_gpu_bytes_per_s"]
    return None


def _placement_key(g: nx.Graph, sources: set[int], sinks: set[int], one_island: bool) -> tuple:
    """Where sources and sinks sit, up to the graph's symmetries: GPUs under one PCIe switch
    (host) of a node are alike (each has one equal link to it), so only the counts per host
    matter; alike leaf groups, islands and nodes permute; and where every host of a node
    carries as many NICs (_hosts_alike), the hosts under one CPU socket permute too, the
    same permutation on every node (rail k's leaf serves NIC k of every node), so host
    labels are renumbered per socket in order of first appearance. Inside one PCIe-only node, hosts under the same
    CPU socket permute (each has the same uplink to it); sockets keep their order (a chain)."""
    place = _gpu_places(g)
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for side, members in ((0, sources), (1, sinks)):
        for v in members:
            counts[place[v]][side] += 1
    if one_island and g.graph["fabric"] == "pcie":
        sockets: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for (_, _, _, socket, _), (n_s, n_t) in counts.items():
            sockets[socket].append((n_s, n_t))
        return ("pcie",) + tuple((socket, tuple(sorted(h))) for socket, h in sorted(sockets.items()))
    relabel: dict[tuple[int, int], int] = {}
    if g.graph["hosts_alike"]:
        per_socket: dict[int, int] = defaultdict(int)
        for k in sorted(counts):
            if (k[3], k[4]) not in relabel:
                relabel[k[3], k[4]] = per_socket[k[3]]
                per_socket[k[3]] += 1
    tree: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for (leaf, island, node, socket, host), (n_s, n_t) in counts.items():
        tree[leaf][island][node].append((socket, relabel.get((socket, host), host), n_s, n_t))
    return tuple(sorted(
        tuple(sorted(tuple(sorted(tuple(sorted(hosts)) for hosts in nodes_.values())) for nodes_ in isl.values()))
        for isl in tree.values()))


def _solve_max_flow(g: nx.Graph, sources: set[int], sinks: set[int], one_island: bool) -> float:
    involved = sources | sinks
    kinds = g.graph["intra_kinds"] if one_island else (SCALE_UP, PCIE, CPU, NETWORK)
    import networkx as nx

    und = nx.Graph()
    def usable(v: Any) -> bool:     # GPUs are the int vertices; only involved ones take part
        return v in involved or not isinstance(v, int)

    # The switch chips of one NVLink domain are alike (each GPU has one equal link to each), so
    # they are merged into one vertex whose link to a GPU carries the sum of that GPU's links:
    # the same cuts, so the same max flow, on a graph `switches` times smaller (64 chips x 1,024
    # GPUs in a domain at the limits of topologies/README.md). Nodes alike in this problem are
    # merged too (_node_classes): one node stands for its class, its links times the class size.
    weight = _node_classes(g, sources, sinks)
    und.add_edges_from((a, b, {"capacity": c * weight[owner]})
                       for (a, b, kind, c), owner in zip(_merged_edges(g), _edge_owners(g))
                       if owner in weight and kind in kinds and usable(a) and usable(b))
    und.add_edges_from(("_source", s) for s in sources if _owner(g, s) in weight)   # unbounded: no capacity
    und.add_edges_from((t, "_sink") for t in sinks if _owner(g, t) in weight)
    # Drop dead ends (a vertex with one neighbour can only send flow back): smaller flow problem, same value.
    terminals = {"_source", "_sink"}
    stack = [v for v in und if und.degree(v) < 2 and v not in terminals]
    while stack:
        v = stack.pop()
        if v in und:
            neighbours = list(und[v])
            und.remove_node(v)
            stack.extend(u for u in neighbours if u not in terminals and und.degree(u) < 2)
    if not nx.has_path(und, "_source", "_sink"):
        return 0.0
    # und.to_directed() without its deep copies of every attribute dict (the same vertices and
    # arcs in the same order, so the same flow computation and value)
    directed = nx.DiGraph()
    directed.add_nodes_from(und.nodes(data=True))
    directed.add_edges_from((u, v, data) for u, nbrs in und.adj.items() for v, data in nbrs.items())
    return nx.maximum_flow_value(directed, "_source", "_sink")


def _owner(g: nx.Graph, v: Any) -> int:
    """The node a vertex sits in (GPUs, and the n<node>/... PCIe switches, sockets and NICs),
    or -1 for the vertices shared by nodes (an NVLink domain's switch, leaves, the spine)."""
    if isinstance(v, int):
        return int(_gpu_places(g)[v][2])
    if v[0] == "n" and v[1:2].isdigit():
        return int(v[1:v.index("/")])
    if v.startswith("nvl"):           # an NVLink domain's (merged) switch: its node's when inside one
        return _domain_node(g, int(v[3:v.index("/")]))
    return -1


def _domain_node(g: nx.Graph, domain: int) -> int:
    """The node holding every GPU of NVLink domain ``domain``, or -1 when it spans nodes."""
    size, gpn = g.graph["domain_gpus"], g.graph["gpus_per_node"]
    first, last = domain * size // gpn, ((domain + 1) * size - 1) // gpn
    return first if first == last else -1


def _edge_owners(g: nx.Graph) -> list[int]:
    """For each link of _merged_edges, the node it belongs to (a link inside a node, or from
    one of its vertices to a shared one: -1 for a link between shared vertices); cached."""
    cached = g.graph.get("edge_owners")
    if cached is None:
        cached = g.graph["edge_owners"] = [max(_owner(g, a), _owner(g, b)) for a, b, _, _ in _merged_edges(g)]
    return cached


def _node_classes(g: nx.Graph, sources: set[int], sinks: set[int]) -> dict[int, int]:
    """One node per class of nodes alike in a max-flow problem, with the size of its class
    ({node: n, ..., -1: 1} for the shared vertices).

    Nodes are alike when they sit in the same leaf group, hold sources and sinks at the same
    local GPU indices and share the same NVLink domains with other nodes (a domain inside a
    node goes with it): then each is a copy of the same sub-network joined to the same shared
    vertices (a shared domain's switch, leaves, the super source and sink).
    k copies of a network in parallel between the same vertices carry exactly what one copy
    with every capacity times k carries (the feasible flows of the copies add up, and a
    convex set added to itself k times is the set scaled by k), so the max flow is unchanged;
    tests/test_topology.py checks it against networkx's max flow on the unmerged graph."""
    place = _gpu_places(g)
    gpn, nvswitch = g.graph["gpus_per_node"], g.graph["fabric"] == "nvswitch"
    pattern: dict[int, list[tuple[int, int, Any]]] = defaultdict(list)
    for role, members in ((0, sources), (1, sinks)):
        for v in members:
            # an island inside the node goes with the node (its local GPU indices say which);
            # one shared with other nodes is a shared vertex, named
            shared = nvswitch and _domain_node(g, v // g.graph["domain_gpus"]) < 0
            pattern[place[v][2]].append((v % gpn, role, place[v][1] if shared else ""))
    leaf_of = g.graph["leaf_of_node"]
    first: dict[tuple, int] = {}
    weight: dict[int, int] = {-1: 1}
    for node, leaf in enumerate(leaf_of):
        key = (leaf, tuple(sorted(pattern.get(node, ()))))
        rep = first.setdefault(key, node)
        weight[rep] = weight.get(rep, 0) + 1
    return weight


def _merged_edges(g: nx.Graph) -> list[tuple[Any, Any, str, float]]:
    """The graph's links with each NVLink domain's switch chips merged into one vertex
    (_merged), parallel links summed in the graph's edge order: (a, b, kind, bytes/s).
    Built once per graph and cached in g.graph (graphs from build_graph() are not modified)."""
    cached = g.graph.get("merged_edges")
    if cached is None:
        capacity: dict[tuple[Any, Any, str], float] = {}
        stand_for = {v: _merged(g, v) for v, kind in g.nodes(data="kind") if kind == "nvswitch"}
        for a, b, e in g.edges(data=True):
            key = (stand_for.get(a, a), stand_for.get(b, b), e["kind"])
            capacity[key] = capacity.get(key, 0.0) + e["bandwidth_bytes_per_s"]
        cached = g.graph["merged_edges"] = [(a, b, kind, c) for (a, b, kind), c in capacity.items()]
    return cached


def _merged(g: nx.Graph, v: Any) -> Any:
    """The vertex standing for ``v`` in a max-flow problem: one per NVLink domain's switches."""
    if isinstance(v, str) and g.nodes[v]["kind"] == "nvswitch":
        return v.rpartition("/")[0] + "/nvswitch"
    return v


def ring_bandwidth_bytes_per_s(g: nx.Graph, groups: Iterable[Sequence[int]]) -> float:
    """Bus bandwidth per GPU of ring collectives run at once, one per group, in bytes/s.

    "Bus bandwidth" as nccl-tests define it (NVIDIA/nccl-tests doc/PERFORMANCE.md): the rate at
    which each GPU sends to its ring neighbour, comparable to a link's per-direction bandwidth.

    A ring over a group, ordered by GPU id, enters and leaves every contiguous block of it (a
    GPU, PCIe switch, socket, node, NVLink domain, leaf group) once in each direction, so each
    GPU can send at most  max_flow(block -> its groups' other GPUs) / (groups crossing the block).
    As in NCCL's rings, a block inside an island (NVLink domain, or PCIe-only node) is cut against
    the group's GPUs in the same island over intra-island links; a block holding all of its
    groups' GPUs in its island is cut against the rest over every link (NICs and network).
    The answer is the smallest bound; a ring with one channel per NIC reaches it on the
    symmetric placements placement._axis_groups makes. Time for an all-reduce of S bytes is then
    2 (n-1)/n * S / busbw; for all-gather or reduce-scatter (n-1)/n * S / busbw.

    Bounds each GPU's NVLink use by its NVLink bandwidth alone, which is slightly conservative
    when the same GPU also sends through its NIC. Returns math.inf when no group has two GPUs.
    """
    rings = [sorted(set(grp)) for grp in groups if len(set(grp)) > 1]
    if not rings:
        return math.inf
    place = _gpu_places(g)          # exactly the graph's GPUs
    ring_of: dict[int, int] = {}
    for i, ring in enumerate(rings):
        for gpu in ring:
            if gpu not in place:
                _check_gpu(g, gpu)
            if ring_of.setdefault(gpu, i) != i:
                raise UserError(f"GPU {gpu} is in two groups of the same axis")

    nodes = g.nodes
    island_of = {v: place[v][1] for v in ring_of}
    per_island = Counter((ring_of[v], island_of[v]) for v in ring_of)     # (group, island) -> GPUs
    blocks: dict[Any, set[int]] = defaultdict(set)
    for gpu in ring_of:
        for label in nodes[gpu]["domains"]:
            blocks[label].add(gpu)
    closed = g.graph["fabric"] in ("nvswitch", "mesh")
    bound, cuts = math.inf, set()
    # each GPU is a block of its own: the loop below, written out for one GPU (most blocks)
    for gpu, i in ring_of.items():
        others = per_island[i, island_of[gpu]] - 1         # its group's other GPUs in its island
        if others and closed:
            flow = _one_island_flow_bytes_per_s(g, 1, others)
            assert flow is not None
            bound = min(bound, flow)
        else:       # against its group's GPUs in its island (near), or its whole group (far)
            home = island_of[gpu] if others else None
            cuts.add((frozenset((gpu,)),
                      frozenset(v for v in rings[i] if v != gpu and home in (None, island_of[v])), 1))
    for inside in blocks.values():
        islands = set(map(island_of.__getitem__, inside))
        island = next(iter(islands)) if len(islands) == 1 else None
        held = Counter(map(ring_of.__getitem__, inside))      # group -> its GPUs in the block
        # groups with GPUs outside the block in the same island (near), or only elsewhere (far)
        near = [i for i, k in held.items() if island is not None and per_island[i, island] > k]
        near_set = set(near)
        far = [i for i, k in held.items() if len(rings[i]) > k and i not in near_set]
        if near and closed:         # counts suffice: _one_island_flow_bytes_per_s
            n_sources = sum(held[i] for i in near)
            n_sinks = sum(per_island[i, island] - held[i] for i in near)
            flow = _one_island_flow_bytes_per_s(g, n_sources, n_sinks)
            assert flow is not None
            bound = min(bound, flow / len(near))
        elif near:
            cuts.add(_cut(inside, ring_of, {i: [v for v in rings[i] if v not in inside and island_of[v] == island]
                                            for i in near}))
        if far:
            cuts.add(_cut(inside, ring_of, {i: [v for v in rings[i] if v not in inside] for i in far}))
    return min([bound] + [_max_flow_bytes_per_s(g, set(s), set(t)) / n for s, t, n in cuts])


def _cut(inside: set[int], ring_of: Mapping[int, int], sinks: Mapping[int, list[int]]) -> tuple:
    """(sources, sinks, groups) of one cut: the block's GPUs of the groups in ``sinks``
    against those groups' GPUs in ``sinks``."""
    return (frozenset(v for v in inside if ring_of[v] in sinks),
            frozenset(v for grp in sinks.values() for v in grp), len(sinks))


def _check_gpu(g: nx.Graph, gpu: int) -> None:
    if gpu not in g or g.nodes[gpu]["kind"] != "gpu":
        raise UserError(f"GPU {gpu} is not in this graph of {g.graph['n_gpus']} GPUs")


def nvlink_domain_size(top: ClusterTopology) -> int:
    """GPUs reachable from GPU 0 over NVLink / Infinity Fabric alone, read from the graph (1 on PCIe-only machines)."""
    per_domain_nodes = max(1, top.intra_node.domain_gpus // top.gpus_per_node)
    g = build_graph(top, min(top.max_nodes, per_domain_nodes + 1))
    import networkx as nx

    scale_up = g.edge_subgraph((a, b) for a, b, k in g.edges(data="kind") if k == SCALE_UP)
    if 0 not in scale_up:
        return 1
    return sum(1 for v in nx.node_connected_component(scale_up, 0) if g.nodes[v]["kind"] == "gpu")
