"""networkx's max flow between GPU sets on a topology graph: the reference the ring-bound tests
check the planner's own max flow and closed forms against (tests/test_topology_flow.py,
tests/test_ring_closed_form.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

import networkx as nx


def networkx_flow(g: nx.Graph, sources: set[int], sinks: set[int], kinds: Collection[str] | None = None) -> float:
    """Max flow from ``sources`` to ``sinks`` over the links of ``kinds`` (None: every link), GPUs
    outside the two sets relaying nothing; each direction of a full-duplex link has its own
    capacity. 0 when no path joins them."""
    involved = sources | sinks
    d = nx.DiGraph()
    for a, b, e in g.edges(data=True):
        if kinds is not None and e["kind"] not in kinds:
            continue
        if any(isinstance(v, int) and v not in involved for v in (a, b)):
            continue
        for u, v in ((a, b), (b, a)):
            cap = e["bandwidth_bytes_per_s"] + (d[u][v]["capacity"] if d.has_edge(u, v) else 0.0)
            d.add_edge(u, v, capacity=cap)
    d.add_edges_from(("S", s) for s in sources)
    d.add_edges_from((t, "T") for t in sinks)
    if "S" not in d or "T" not in d or not nx.has_path(d, "S", "T"):
        return 0.0
    return float(nx.maximum_flow_value(d, "S", "T"))


def ring_blocks(g: nx.Graph, groups: Sequence[Sequence[int]]):
    """The rings of ``groups`` (each group's distinct GPUs, more than one), each GPU's ring, and
    the blocks graph.ring_bandwidth_bytes_per_s cuts at: each GPU alone, and the GPUs of the
    rings under each of its domain labels (PCIe switch, node, NVLink domain, leaf)."""
    rings = [sorted(set(grp)) for grp in groups if len(set(grp)) > 1]
    ring_of = {v: i for i, r in enumerate(rings) for v in r}
    blocks: dict[object, set[int]] = defaultdict(set)
    for v in ring_of:
        blocks[v].add(v)
        for label in g.nodes[v]["domains"]:
            blocks[label].add(v)
    return rings, ring_of, blocks
