"""Max flow with alike nodes merged (hardware/graph._node_classes: k copies of a sub-network
in parallel carry what one copy with k-fold capacities carries) equals networkx's max flow
on the graph as built, with every node and switch chip, for random sources and sinks on
shipped topologies and a rail-optimized, oversubscribed one of several leaf groups."""

import random
from dataclasses import replace

import networkx as nx
import pytest
from conftest import fast_one

from planner.hardware.graph import _solve_max_flow, build_graph
from planner.hardware.topology import load_topology


def reference(g, sources, sinks, one_island):
    kinds = g.graph["intra_kinds"] if one_island else ("scale_up", "pcie", "cpu", "network")
    involved = sources | sinks
    und = nx.Graph()
    for u, v, e in g.edges(data=True):
        usable = all(not isinstance(x, int) or x in involved for x in (u, v))
        if e["kind"] in kinds and usable:
            cap = e["bandwidth_bytes_per_s"]
            if und.has_edge(u, v):
                cap += und[u][v]["capacity"]
            und.add_edge(u, v, capacity=cap)
    und.add_edges_from(("_s", s) for s in sources)
    und.add_edges_from((t, "_t") for t in sinks)
    return nx.maximum_flow_value(und.to_directed(), "_s", "_t") if nx.has_path(und, "_s", "_t") else 0.0


def oversubscribed():
    top = load_topology("dgx-h100")
    return replace(top, max_nodes=8, network=replace(top.network, nodes_per_leaf=2, oversubscription=4.0))


@pytest.mark.parametrize("top", fast_one([load_topology("dgx-h100"), load_topology("l40s-8x-pcie-ethernet"),
                                          load_topology("mi300x-8x"), load_topology("gb200-nvl72"),
                                          oversubscribed()], load_topology("dgx-h100")),     # fast tier: DGX H100
                         ids=lambda t: t.name)
def test_merged_alike_nodes_keep_the_max_flow(top):
    rng = random.Random(7)
    g = build_graph(top, min(top.max_nodes, 6))
    n = g.graph["n_gpus"]
    gpn = top.gpus_per_node
    for _ in range(12):
        # a regular pattern repeated on several nodes (what groups placed by stride give),
        # sometimes with one GPU moved so that the nodes are no longer all alike
        local = rng.sample(range(gpn), rng.randint(2, gpn))
        cut = rng.randint(1, len(local) - 1)
        nodes = rng.sample(range(n // gpn), rng.randint(1, n // gpn))
        sources = {node * gpn + v for node in nodes for v in local[:cut]}
        sinks = {node * gpn + v for node in nodes for v in local[cut:]}
        if rng.random() < 0.3:
            sinks = {rng.choice(sorted(set(range(n)) - sources))} | set(sorted(sinks)[1:])
        one_island = len({g.nodes[v]["island"] for v in sources | sinks}) == 1
        assert _solve_max_flow(g, sources, sinks, one_island) == pytest.approx(
            reference(g, sources, sinks, one_island), rel=1e-9), (sorted(sources), sorted(sinks))
