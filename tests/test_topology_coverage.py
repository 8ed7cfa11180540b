"""A plan never runs past what its topology describes (issue 19).

dgx-h100 describes 64 scalable units of 32 nodes under a non-blocking leaf-spine-core fabric
(NVIDIA DGX SuperPOD reference architecture with DGX H100, RA-11333-001: up to 64 SUs,
2,048 nodes, 16,384 GPUs); rtx4090-4x-workstation is one node of 4 GPUs.
"""

from __future__ import annotations

import importlib.resources

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.errors import UserError
from planner.hardware.topology import check_covers, load_topology, max_covered_gpus


def _shipped(name: str) -> str:
    return importlib.resources.files("planner").joinpath(f"presets/topologies/{name}.toml").read_text()


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


def test_shipped_coverage():
    assert max_covered_gpus(load_topology("dgx-h100")) == 64 * 32 * 8 == 16_384
    assert max_covered_gpus(load_topology("rtx4090-4x-workstation")) == 4
    assert max_covered_gpus(load_topology("gb200-nvl72")) == 8_192       # 128 racks of 72 (GB200 RA), 64 per job


@pytest.mark.slow
def test_16384_gpu_dgx_h100_plan_is_covered():
    r = run("--model", "405b", "--gpus", "h100", "--n-gpus", "16384", "--quiet")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("llama3.1-405b: 16384 x h100")


@pytest.mark.parametrize("args, largest", [
    (("--model", "8b", "--gpus", "4090", "--n-gpus", "8"), "4"),
    (("--model", "405b", "--gpus", "h100", "--n-gpus", "32768", "--max-gpus", "32768"), "16384"),
])
def test_a_plan_larger_than_its_topology_is_refused_in_one_line(args, largest):
    r = run(*args)
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert f"--n-gpus {largest} or fewer" in lines[0] and "--topology PATH" in lines[0]


def test_the_search_stops_at_the_topology():
    r = run("--model", "8b", "--gpus", "4090", "--quiet")
    assert r.exit_code == 2 and "1 to 4 x 4090" in r.output


def test_a_bigger_cluster_is_described_by_its_own_file(tmp_path):
    text = _shipped("rtx4090-4x-workstation")
    path = tmp_path / "two-workstations.toml"
    path.write_text(text.replace("max_nodes = 1", "max_nodes = 2")
                    .replace('name = "rtx4090-4x-workstation"', 'name = "two-workstations"'))
    r = run("--model", "8b", "--gpus", "4090", "--n-gpus", "8", "--topology", str(path), "--quiet")
    assert r.exit_code == 0, r.output
    assert "8 x 4090" in r.output


def test_units_table_is_checked(tmp_path):
    from planner.hardware.topology import parse_topology

    base = _shipped("dgx-h100")
    with pytest.raises(UserError, match="non-blocking"):
        parse_topology(base.replace("non_blocking = true", "non_blocking = false"))
    with pytest.raises(UserError, match="max_units"):
        parse_topology(base.replace("max_units = 64", "max_units = 0"))
    top = parse_topology(base.replace("max_units = 64", "max_units = 2"))
    check_covers(top, 512)
    with pytest.raises(UserError, match="2 scalable units of 32 nodes"):
        check_covers(top, 520)
