"""Group bandwidths on the topology graph answer within seconds at the topology limits
(issue 20): inside an NVSwitch domain or an Infinity Fabric mesh a cut's max flow has a
closed form, and elsewhere placements alike under the graph's symmetries share one max-flow
problem. Both are checked here against networkx's own max flow, computed cut by cut on the
graph as built (every parallel switch link separate, nothing merged, nothing cached), on
random small topologies and placements."""

import dataclasses
import math
import random
import time
from pathlib import Path

import networkx as nx
import pytest
from graph_groups import place_groups
from maxflow import networkx_flow, ring_blocks

from planner.hardware import placement
from planner.hardware.graph import build_graph, ring_bandwidth_bytes_per_s
from planner.hardware.topology import load_topology

EDGE = Path(__file__).parent / "data" / "topologies" / "limits-edge.toml"
ALL_KINDS = ("scale_up", "pcie", "cpu", "network")


def _flow(g: nx.Graph, sources: set[int], sinks: set[int]) -> float:
    """networkx's max flow from sources to sinks, on the intra-island links when all sit in one
    island (graph.ring_bandwidth_bytes_per_s)."""
    involved = sources | sinks
    one_island = len({g.nodes[v]["island"] for v in involved}) == 1
    return networkx_flow(g, sources, sinks, g.graph["intra_kinds"] if one_island else ALL_KINDS)


def _reference_ring_bandwidth(g: nx.Graph, groups) -> float:
    """The ring bound of ring_bandwidth_bytes_per_s's docstring, every cut by networkx."""
    rings, ring_of, blocks = ring_blocks(g, groups)
    if not rings:
        return math.inf
    best = math.inf
    for inside in blocks.values():
        islands = {g.nodes[v]["island"] for v in inside}
        near, far = {}, {}
        for i in {ring_of[v] for v in inside}:
            outside = [v for v in rings[i] if v not in inside]
            close = [v for v in outside if len(islands) == 1 and g.nodes[v]["island"] in islands]
            if close:
                near[i] = close
            elif outside:
                far[i] = outside
        for sinks in (near, far):
            if sinks:
                s = {v for v in inside if ring_of[v] in sinks}
                t = {v for grp in sinks.values() for v in grp}
                best = min(best, _flow(g, s, t) / len(sinks))
    return best


def _random_topology(rng: random.Random):
    fabric = rng.choice(["nvswitch", "mesh", "pcie"])
    base = load_topology({"nvswitch": "dgx-h100", "mesh": "mi300x-8x", "pcie": "l40s-8x-pcie-ethernet"}[fabric])
    gpn = rng.choice([2, 4, 8])
    intra = base.intra_node
    if fabric == "nvswitch":
        domain = gpn * rng.choice([1, 2])
        intra = dataclasses.replace(intra, switches=rng.choice([1, 2, 3, 4]), domain_gpus=domain,
                                    gpu_link_bytes_per_s=rng.choice([300e9, 450e9, 900e9]))
    elif fabric == "mesh":
        intra = dataclasses.replace(intra, domain_gpus=gpn, peer_link_bytes_per_s=rng.choice([32e9, 64e9]))
    else:
        intra = dataclasses.replace(intra, domain_gpus=1)
    hosts = rng.choice([h for h in (1, 2, 4, 8) if h <= gpn])
    pcie = dataclasses.replace(base.pcie, switches=hosts if fabric != "pcie" or rng.random() < 0.7 else 0,
                               link_bytes_per_s=rng.choice([32e9, 64e9]))
    if fabric == "pcie":
        pcie = dataclasses.replace(pcie, sockets=rng.choice([1, 2]), uplink_bytes_per_s=rng.choice([16e9, 64e9]),
                                   socket_link_bytes_per_s=rng.choice([20e9, 64e9]))
    domain_nodes = max(1, intra.domain_gpus // gpn)
    nics = rng.choice([1, 2, 4, 8])         # uneven over the hosts too (hosts then not alike)
    net = dataclasses.replace(base.network, nics_per_node=nics, rail_optimized=rng.random() < 0.6,
                              nodes_per_leaf=domain_nodes * rng.choice([1, 2]),
                              oversubscription=rng.choice([1.0, 2.0]), nic_bytes_per_s=rng.choice([12.5e9, 50e9]))
    return dataclasses.replace(base, name=f"random-{fabric}", gpus_per_node=gpn, max_nodes=8, intra_node=intra,
                               pcie=pcie, network=net)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_ring_bandwidth_equals_networkx_cut_by_cut(seed):
    rng = random.Random(seed)
    top = _random_topology(rng)
    n_nodes = rng.choice([1, 2, 3, 4])
    g = build_graph(top, n_nodes)
    n = n_nodes * top.gpus_per_node
    for _ in range(3):
        sizes, rest = {}, n
        for axis in ("tp", "cp", "dp"):
            divisors = [d for d in range(1, rest + 1) if rest % d == 0]
            sizes[axis] = rng.choice(divisors)
            rest //= sizes[axis]
        sizes["pp"] = rest
        order = rng.sample(["tp", "cp", "ep", "dp", "pp"], 5)
        groups = place_groups(n, order=order, **sizes)
        for axis, grps in groups.items():
            got = ring_bandwidth_bytes_per_s(g, grps)
            want = _reference_ring_bandwidth(g, grps)
            assert got == pytest.approx(want, rel=1e-9), (seed, top.intra_node.fabric, sizes, order, axis)


def test_a_group_at_the_topology_limits_answers_in_seconds():
    # 1,024 GPUs in one ring across two NVLink domains of 1,024 GPUs on 256-GPU nodes: it
    # cut 2,570 blocks, each a networkx max flow of seconds, before the closed form (the
    # whole `plan --tokens` over 16,384 GPUs ran past 10 minutes; 5.8 s after)
    top = load_topology(EDGE)
    start = time.process_time()         # CPU time: the bound holds beside other test workers
    link = placement.graph_link(top, 2, 1024, 2048, 8)
    assert time.process_time() - start < 10
    assert link.bus_bytes_per_s == pytest.approx(450e9)      # the GPU's NVLink share: NVLink-bound


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(30))
def test_pcie_tree_flow_equals_networkx(seed):
    """Inside one PCIe-only node the max flow is read off the PCIe tree in closed form
    (graph.py's PCIe tree); the ring bound with every cut by networkx's max flow must agree,
    for random rings, with and without PCIe switches, on one or two sockets."""
    rng = random.Random(seed)
    top = _random_topology(rng)
    while top.intra_node.fabric != "pcie":
        top = _random_topology(rng)
    g = build_graph(top, 2)
    node = list(range(top.gpus_per_node, 2 * top.gpus_per_node))      # the second node
    for _ in range(5):
        picked = rng.sample(node, rng.randint(2, len(node)))
        cut = rng.randint(1, len(picked) - 1)
        rings = [picked[:cut], picked[cut:]]          # one or two rings, all inside the node
        got = ring_bandwidth_bytes_per_s(build_graph(top, 2), rings)
        assert got == pytest.approx(_reference_ring_bandwidth(g, rings), rel=1e-9), (seed, top.pcie, rings)
