"""Write planner/presets/links.json: the graph links (placement.graph_link) that the mission
commands and the examples ask for on the shipped topologies, so that a plan reads them instead
of solving their max-flow problems again (planner.hardware.placement.shipped_links), with each
topology's NVLink domain (placement.shipped_domain_gpus): a plan on them builds no graph.

Run it after changing a shipped topology or the bandwidth model: an entry answers only for the
topology whose fingerprint it carries, and tests/test_link_table.py recomputes the entries.

    PYTHONPATH=. python bench/link_table.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware import placement
from planner.hardware.graph import nvlink_domain_size
from planner.hardware.topology import ClusterTopology

CATALOG = ("h100,h100-pcie,h100-nvl,h200,h20,gh200,b200,gb200,b300,gb300,a100,a100-40gb,l40s,l4,a10g,a6000,"
           "rtx6000-ada,rtx-pro-6000,4090,5090,mi300x,mi325x,mi355x")       # bench/resources.py's
COMMANDS = [
    ["--model", "405b", "--gpus", "h100,h200,b200,a100,mi300x", "--tokens", "15T", "--deadline", "90d"],
    ["buy", "examples/jobs.yaml"],
    ["--model", "70b", "--gpus", "h100"],
    ["--model", "8b", "--gpus", "a100"],
    # the MoE plans over the GPU catalog of bench/resources.py (issue 32's H4): their PCIe and
    # mesh topologies' links were solved on every run
    ["--model", "deepseek-v3", "--gpus", CATALOG, "--tokens", "15T", "--deadline", "90d"],
    ["--model", "kimi-k2", "--gpus", CATALOG, "--tokens", "15T", "--deadline", "90d"],
]


def main() -> None:
    seen: dict[tuple, placement.AxisLink] = {}
    live = placement.graph_link

    def recording(top: ClusterTopology, stride: int, size: int, n_gpus: int, min_nodes: int) -> placement.AxisLink:
        link = live(top, stride, size, n_gpus, min_nodes)
        seen[top, stride, size, n_gpus, min_nodes] = link
        return link

    placement.shipped_links.cache_clear()
    placement._graph_link.cache_clear()
    placement._topology_axis_link.cache_clear()
    placement.axis_links.cache_clear()
    placement.graph_link = recording                           # every link solved afresh and kept
    placement.shipped_links = lambda top: {}                   # type: ignore[assignment]
    runner = CliRunner()
    for args in COMMANDS:
        result = runner.invoke(cli, args)
        if result.exit_code != 0:
            sys.exit(f"plan {' '.join(args)} failed: {result.output[-500:]}")
    table: dict[str, dict] = {}
    for (top, stride, size, n, mn), link in sorted(seen.items(), key=lambda kv: (kv[0][0].name, kv[0][1:])):
        entry = table.setdefault(top.name, {"fingerprint": placement.topology_fingerprint(top),
                                            "domain_gpus": nvlink_domain_size(top), "links": []})
        entry["links"].append([stride, size, n, mn, link.bus_bytes_per_s, link.latency_s])
    out = Path(__file__).resolve().parent.parent / "planner" / "presets" / placement.LINK_TABLE
    lines = ["{"]
    for i, (name, entry) in enumerate(table.items()):
        rows = ",\n".join("   " + json.dumps(row) for row in entry["links"])
        comma = "," if i < len(table) - 1 else ""
        lines.append(f' {json.dumps(name)}: {{"fingerprint": {json.dumps(entry["fingerprint"])}, '
                     f'"domain_gpus": {entry["domain_gpus"]}, "links": [\n{rows}\n ]}}{comma}')
    lines.append("}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{out}: {sum(len(e['links']) for e in table.values())} links on {len(table)} topologies")


if __name__ == "__main__":
    main()
