"""Topologies: the shipped files load, graphs are built, and bandwidths computed on the graph
match the vendors' figures."""

import math

import pytest
from graph_groups import (
    axis_bandwidths_bytes_per_s,
    group_bandwidth_bytes_per_s,
    pair_bandwidth_bytes_per_s,
    place_groups,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.errors import UserError
from planner.hardware.graph import _solve_max_flow, build_graph, nvlink_domain_size
from planner.hardware.topology import ClusterTopology, list_topologies, load_topology
from planner.units import GB

SHIPPED = ["dgx-a100", "dgx-h100", "hgx-h200", "hgx-b200", "gb200-nvl72", "l40s-8x-pcie-ethernet", "aws-p4d",
           "aws-p5", "aws-g5.48xlarge", "rtx4090-4x-workstation", "mi300x-8x", "jean-zay-a100", "hgx-b300",
           "gb300-nvl72", "mi325x-8x", "mi355x-8x", "h100-pcie-8x", "h100-nvl-8x", "rtx-pro-6000-8x",
           "aws-g6.48xlarge", "rtx5090-4x-workstation", "a6000-4x-workstation", "rtx6000-ada-4x-workstation",
           "hgx-h20", "gh200-quad", "dgx1-v100"]


def gbps(bytes_per_s: float) -> float:
    return bytes_per_s / GB


def test_every_shipped_topology_loads():
    assert sorted(t.name for t in list_topologies()) == sorted(SHIPPED)
    for name in SHIPPED:
        top = load_topology(name)
        assert isinstance(top, ClusterTopology) and top.name == name
        assert load_topology(name.upper()) is top
        for part in (top, top.intra_node, top.pcie, top.network):
            assert part.source


def test_unknown_topology_lists_close_names():
    with pytest.raises(UserError, match=r"unknown topology 'dgx-h10'.*dgx-h100.*`plan topologies`"):
        load_topology("dgx-h10")


def test_load_by_path_and_reject_unknown_keys(tmp_path):
    text = (load_topology_text("dgx-h100"))
    path = tmp_path / "mine.toml"
    path.write_text(text)
    assert load_topology(path).name == "dgx-h100"
    assert load_topology(str(path)).gpu == "h100"

    path.write_text(text.replace("oversubscription = 1.0", "oversubscription = 1.0\nbisection = 1"))
    with pytest.raises(UserError, match=r"\[network\].*unknown keys \['bisection'\]"):
        load_topology(path)
    path.write_text(text.replace('fabric = "nvswitch"', 'fabric = "pcie"'))
    with pytest.raises(UserError, match="unknown keys"):      # NVSwitch keys do not apply to PCIe
        load_topology(path)
    path.write_text(text.replace('gpu = "h100"', 'gpu = "h1000"'))
    with pytest.raises(UserError, match="unknown GPU"):
        load_topology(path)
    with pytest.raises(UserError, match="not found"):
        load_topology(tmp_path / "missing.toml")


def load_topology_text(name: str) -> str:
    import importlib.resources

    return (importlib.resources.files("planner") / "presets" / "topologies" / f"{name}.toml").read_text()


def test_graph_has_the_parts_of_a_dgx_h100_pair():
    g = build_graph(load_topology("dgx-h100"), 2)
    kinds = [k for _, k in g.nodes(data="kind")]
    # per node: 8 GPUs, 4 NVSwitches, 8 PCIe (GPU-NIC) switches, 8 NICs; 8 rail leaves; one spine vertex
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "gpu": 16, "nvswitch": 8, "pcie_switch": 16, "nic": 16, "leaf": 8, "spine": 1}
    for _, _, e in g.edges(data=True):
        assert e["bandwidth_bytes_per_s"] > 0 and e["latency_s"] >= 0
    assert g.nodes[9]["node"] == 1 and g.nodes[9]["local"] == 1
    with pytest.raises(UserError, match="1 to 32 nodes"):
        build_graph(load_topology("dgx-h100"), 33)


@pytest.mark.parametrize("name, size", [
    ("dgx-h100", 8), ("dgx-a100", 8), ("hgx-b200", 8), ("aws-p5", 8),
    ("gb200-nvl72", 64),                    # GB200 NVL72: a job's 64 GPUs of a 72-GPU rack (the topology file)
    ("mi300x-8x", 8),                       # Infinity Fabric full mesh
    ("l40s-8x-pcie-ethernet", 1), ("aws-g5.48xlarge", 1), ("rtx4090-4x-workstation", 1),   # no NVLink
])
def test_nvlink_domain_size_read_from_the_graph(name, size):
    assert nvlink_domain_size(load_topology(name)) == size


# Ring bus bandwidth per GPU (per direction) against vendor figures.
# Intra-node: the GPU's NVLink / Infinity Fabric / PCIe bandwidth, per direction.
# Across nodes: a node's NICs carry every ring that leaves it, so busbw <= NICs x rate per node.
@pytest.mark.parametrize("name, n_nodes, expected_gb_per_s", [
    ("dgx-a100", 1, 300),           # NVLink 3: 600 GB/s both directions
    ("dgx-a100", 2, 200),           # 8x 200 Gb/s HDR = 200 GB/s out of each node
    ("dgx-h100", 1, 450),           # NVLink 4: 900 GB/s both directions
    ("dgx-h100", 2, 400),           # 8x 400 Gb/s NDR = 400 GB/s out of each node (< 450 NVLink)
    ("hgx-h200", 1, 450),
    ("hgx-h200", 2, 400),
    ("hgx-b200", 1, 900),           # NVLink 5: 1.8 TB/s both directions
    ("hgx-b200", 2, 400),
    ("gb200-nvl72", 16, 900),       # a job's 64 GPUs of a rack over NVLink 5
    ("gb200-nvl72", 32, 900),       # 2 racks: 64 NICs x 400 Gb/s = 3.2 TB/s leave a rack, NVLink binds
    ("gb200-nvl72", 128, 900),      # the whole 8-rack scalable unit
    ("aws-p4d", 1, 300),            # NVSwitch 600 GB/s both directions
    ("aws-p4d", 2, 50),             # 400 Gbps EFA per instance
    ("aws-p5", 1, 450),
    ("aws-p5", 2, 400),             # 3200 Gbps EFAv2 per instance
    ("aws-g5.48xlarge", 1, 32),     # PCIe Gen4 x16, no NVLink
    ("aws-g5.48xlarge", 2, 12.5),   # 100 Gbps per instance
    ("l40s-8x-pcie-ethernet", 1, 32),   # L40S: no NVLink -> PCIe Gen4 x16 (64 GB/s both directions)
    ("l40s-8x-pcie-ethernet", 2, 32),   # 4x 100 GbE = 50 GB/s per node, PCIe still binds
    ("rtx4090-4x-workstation", 1, 32),
    ("mi300x-8x", 1, 448),          # 7 Infinity Fabric links x 64 GB/s per direction
    ("mi300x-8x", 2, 400),          # 8x 400 Gb/s per node
    ("dgx1-v100", 1, 150),          # DGX-1 white paper: 6 NVLink 2 links x 25 GB/s per direction per V100
    ("dgx1-v100", 2, 50),           # DGX-1 white paper: 4x 100 Gb/s EDR = 50 GB/s out of each node
])
def test_whole_nodes_ring_bandwidth(name, n_nodes, expected_gb_per_s):
    top = load_topology(name)
    g = build_graph(top, n_nodes)
    assert gbps(group_bandwidth_bytes_per_s(g, range(n_nodes * top.gpus_per_node))) == pytest.approx(expected_gb_per_s)


@pytest.mark.parametrize("name, a, b, expected_gb_per_s", [
    ("dgx-h100", 0, 1, 450),        # NVLink 4 between two GPUs of a node
    ("dgx-h100", 0, 8, 50),         # same rail, two nodes: one 400 Gb/s NIC
    ("dgx-h100", 0, 11, 50),        # different rails: through the spine, still one NIC each end
    ("dgx-a100", 0, 8, 25),         # one 200 Gb/s HDR NIC
    ("mi300x-8x", 0, 1, 64),        # one Infinity Fabric link; other GPUs do not relay
    ("l40s-8x-pcie-ethernet", 0, 1, 32),    # same PCIe switch
    ("l40s-8x-pcie-ethernet", 0, 7, 32),    # across sockets: the GPU's own link binds
    ("aws-p4d", 0, 8, 12.5),        # one 100 Gbps EFA NIC per GPU pair
    ("gb200-nvl72", 0, 63, 900),    # other end of the rack's 64, still NVLink
])
def test_pair_bandwidth(name, a, b, expected_gb_per_s):
    g = build_graph(load_topology(name), 16 if name == "gb200-nvl72" else 2)
    assert gbps(pair_bandwidth_bytes_per_s(g, a, b)) == pytest.approx(expected_gb_per_s)


def test_concurrent_groups_share_the_nics():
    # tp=8 inside each DGX H100, dp=2 across two nodes: the 8 dp pairs share the 8 NICs,
    # 8 x 400 Gb/s / 8 = 50 GB/s each -- the per-GPU NIC bandwidth.
    g = build_graph(load_topology("dgx-h100"), 2)
    bw = axis_bandwidths_bytes_per_s(g, place_groups(16, tp=8, dp=2))
    assert gbps(bw["tp"]) == pytest.approx(450)
    assert gbps(bw["dp"]) == pytest.approx(50)
    assert bw["pp"] == bw["cp"] == bw["ep"] == math.inf     # size-1 axes send nothing


def test_concurrent_groups_on_a_full_scalable_unit():
    g = build_graph(load_topology("dgx-h100"), 32)
    bw = axis_bandwidths_bytes_per_s(g, place_groups(256, tp=4, dp=16, pp=4))
    assert gbps(bw["tp"]) == pytest.approx(450)
    assert gbps(bw["dp"]) == pytest.approx(100)     # 4 dp groups leave each node: 400 GB/s / 4
    assert gbps(bw["pp"]) == pytest.approx(50)      # 8 pp groups leave each node


def test_shared_nics_on_p4d():
    # p4d: 2 GPUs share each 100 Gbps EFA NIC -> 6.25 GB/s per GPU when all 8 talk across nodes
    g = build_graph(load_topology("aws-p4d"), 2)
    assert gbps(axis_bandwidths_bytes_per_s(g, place_groups(16, tp=8, dp=2))["dp"]) == pytest.approx(6.25)


def test_oversubscribed_leaves_limit_cross_leaf_rings(tmp_path):
    text = load_topology_text("dgx-h100")
    text = (text.replace("rail_optimized = true", "rail_optimized = false")
                .replace("nodes_per_leaf = 32", "nodes_per_leaf = 2")
                .replace("oversubscription = 1.0", "oversubscription = 4.0"))
    path = tmp_path / "oversubscribed.toml"
    path.write_text(text)
    g = build_graph(load_topology(path), 4)
    # inside one leaf (2 nodes): node NICs bind, 400 GB/s
    assert gbps(group_bandwidth_bytes_per_s(g, range(16))) == pytest.approx(400)
    # across leaves: a leaf's 2 x 8 x 50 GB/s down-links / 4 = 200 GB/s up to the spine
    assert gbps(group_bandwidth_bytes_per_s(g, range(32))) == pytest.approx(200)
    # 8 dp groups leave each leaf at once: 200 / 8
    assert gbps(axis_bandwidths_bytes_per_s(g, place_groups(32, tp=8, dp=4))["dp"]) == pytest.approx(25)


def test_place_groups_puts_tp_innermost():
    groups = place_groups(16, tp=2, dp=4, pp=2)
    assert groups["tp"][:2] == [[0, 1], [2, 3]]
    assert groups["dp"][0] == [0, 2, 4, 6]
    assert groups["pp"][0] == [0, 8]
    assert groups["cp"] == [[i] for i in range(16)]
    for axis, size in (("tp", 2), ("dp", 4), ("pp", 2)):
        assert sorted(v for grp in groups[axis] for v in grp) == list(range(16))
        assert all(len(grp) == size for grp in groups[axis])
    assert place_groups(16, tp=2, dp=4, pp=2, order=("dp", "tp", "cp", "ep", "pp"))["dp"][0] == [0, 1, 2, 3]


def test_place_groups_rejects_bad_sizes():
    with pytest.raises(UserError, match="must equal n_gpus"):
        place_groups(16, tp=8, dp=3)
    with pytest.raises(UserError, match="order"):
        place_groups(8, tp=8, order=("tp", "dp"))


def test_a_gpu_in_two_groups_of_one_axis_is_an_error():
    g = build_graph(load_topology("dgx-h100"), 1)
    with pytest.raises(UserError, match="two groups"):
        axis_bandwidths_bytes_per_s(g, {"tp": [[0, 1], [1, 2]]})
    with pytest.raises(UserError, match="not in this graph"):
        group_bandwidth_bytes_per_s(g, [0, 99])


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["dgx-h100", "aws-p4d", "l40s-8x-pcie-ethernet", "mi300x-8x"]),
       picks=st.lists(st.integers(0, 23), min_size=2, max_size=10, unique=True), split=st.integers(1, 9))
def test_cached_flows_equal_fresh_ones(name, picks, split):
    # The max-flow cache keys on where GPUs sit; nodes are alike, so a fresh solve must agree.
    g = build_graph(load_topology(name), 3)
    sources, sinks = set(picks[:split]), set(picks[split:]) or {picks[-1]} - set(picks[:split])
    if not sinks:
        return
    from planner.hardware.graph import _max_flow_bytes_per_s

    one_island = len({g.nodes[v]["island"] for v in sources | sinks}) == 1
    assert _max_flow_bytes_per_s(g, sources, sinks) == pytest.approx(_solve_max_flow(g, sources, sinks, one_island))


def test_merging_a_domains_switch_chips_keeps_every_bandwidth():
    # The max flow over one merged vertex per NVLink domain equals networkx's max flow over
    # the switch chips as built (the graph's own edges, no merging), on every shipped topology.
    import networkx as nx
    from graph_groups import pair_bandwidth_bytes_per_s

    from planner.hardware.graph import build_graph
    from planner.hardware.topology import _shipped

    for top in _shipped().values():
        g = build_graph(top, min(top.max_nodes, 2))
        n = g.graph["n_gpus"]
        for a, b in ((0, 1), (0, n - 1)):
            if a == b:
                continue
            und = nx.Graph()
            und.add_edges_from((u, v, {"capacity": e["bandwidth_bytes_per_s"]}) for u, v, e in g.edges(data=True)
                               if not isinstance(u, int) or u in (a, b) if not isinstance(v, int) or v in (a, b))
            und.add_edge("_s", a)
            und.add_edge(b, "_t")
            same_island = g.nodes[a]["island"] == g.nodes[b]["island"]
            if same_island:      # NCCL keeps such traffic on intra-island links
                keep = g.graph["intra_kinds"]
                und.remove_edges_from([(u, v) for u, v, k in g.edges(data="kind") if k not in keep and und.has_edge(u,
                                                                                                                    v)])
            expected = nx.maximum_flow_value(und.to_directed(), "_s", "_t") if nx.has_path(und, "_s", "_t") else 0.0
            assert pair_bandwidth_bytes_per_s(g, a, b) == pytest.approx(expected, rel=1e-12), (top.name, a, b)


def test_the_gpus_bought_in_clusters_have_a_default_topology_of_a_cluster_size():
    """Issue 33: B300, GB300, MI325X and MI355X had no default topology, A100's was one 20-node
    unit and MI300X's one 32-node unit. Each default now names its source, and the A100 and
    MI300X defaults hold 1,024 GPUs (Meta's RSC: 6,080 A100s; OCI's MI300X runs)."""
    from planner.hardware.gpus import list_gpus
    from planner.hardware.topology import max_covered_gpus

    for g in list_gpus():
        assert g.default_topology is not None, g.name
        top = load_topology(g.default_topology)
        assert top.gpu == g.name and top.source
    assert max_covered_gpus(load_topology("dgx-a100")) == 6080
    assert max_covered_gpus(load_topology("mi300x-8x")) >= 1024


def test_v100_plans_on_its_dgx1_default():
    """V100 had no default topology (issue 33). DGX-1's hybrid cube mesh is drawn as a full mesh
    of 7 equal links carrying the white paper's 150 GB/s per GPU (the file's ASSUMPTION): a
    linked pair then gets 150/7 GB/s, less than one NVLink 2 link's 25 GB/s, and a cube face of
    4 GPUs 3 x 150/7, less than the 100 GB/s of its 4 links (NVIDIA DGX-1 System Architecture
    white paper, Sec. 3.1). V100 has no bf16 (datasheet), so the plan is fp16-mixed; 1,024 GPUs
    span several 18-node leaf groups."""
    from click.testing import CliRunner

    from planner.cli.main import cli

    g = build_graph(load_topology("dgx1-v100"), 1)
    assert gbps(pair_bandwidth_bytes_per_s(g, 0, 1)) < 25
    assert gbps(group_bandwidth_bytes_per_s(g, range(4))) < 100
    for n in ("8", "1024"):
        out = CliRunner().invoke(cli, ["--model", "8b", "--gpus", "v100", "--precision", "fp16-mixed", "--n-gpus", n])
        assert out.exit_code == 0, out.output
        assert "cluster: dgx1-v100" in out.output and "fits" in out.output
