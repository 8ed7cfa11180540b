"""planner/presets/links.json holds graph links of the shipped topologies so that a plan need
not solve their max-flow problems again: every entry must be what placement.graph_link
computes on the topology today, to the bit, and an edited topology must not read the table."""

import dataclasses
import importlib.resources
import json

import pytest

from planner.hardware import placement
from planner.hardware.topology import load_topology


def _table() -> dict:
    path = importlib.resources.files("planner") / "presets" / placement.LINK_TABLE
    return json.loads(path.read_text(encoding="utf-8"))


TABLE = _table()


@pytest.mark.parametrize("name", sorted(TABLE))
def test_table_is_for_the_shipped_topology(name):
    # a stale table (a topology file edited since bench/link_table.py ran) is ignored by
    # shipped_links; this test says so, so that the table is written again
    top = load_topology(name)
    assert TABLE[name]["fingerprint"] == placement.topology_fingerprint(top), \
        "rerun PYTHONPATH=. python bench/link_table.py"
    assert len(placement.shipped_links(top)) == len(TABLE[name]["links"])


@pytest.mark.parametrize("name", sorted(TABLE))
def test_entries_are_the_graphs_links(name):
    top = load_topology(name)
    rows = TABLE[name]["links"]
    for stride, size, n, min_nodes, bw, lat in rows:      # all of them: about 2 s
        link = placement.graph_link(top, stride, size, n, min_nodes)
        assert (link.bus_bytes_per_s, link.latency_s) == (bw, lat)


def test_an_edited_topology_computes_its_links():
    top = load_topology("dgx-h100")
    edited = dataclasses.replace(top, network=dataclasses.replace(top.network, nic_bytes_per_s=25e9))
    assert placement.shipped_links(edited) == {}
    assert placement.shipped_links(top)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_domain_is_the_graphs(name):
    from planner.hardware.graph import nvlink_domain_size

    top = load_topology(name)
    assert TABLE[name]["domain_gpus"] == nvlink_domain_size(top) == placement.shipped_domain_gpus(top)


def test_an_edited_topology_reads_no_domain_from_the_table():
    top = load_topology("dgx-h100")
    edited = dataclasses.replace(top, max_nodes=top.max_nodes - 1)
    assert placement.shipped_domain_gpus(edited) is None
