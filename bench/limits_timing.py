#!/usr/bin/env python3
"""Wall-clock time of `plan` on inputs at the README's input limits (docs/options.md, "Input
limits"; issue 20: every command within the limits answers within seconds).

Each case runs the CLI in a fresh process (`python -m planner ...`), as a user would, and is
timed from start to exit (wall), with the CPU time of the process (user + system, which a
loaded machine stretches far less than the wall time); the exit status is printed beside it. The topology and jobs files
are written to a temporary folder:

- oversubscribed: 256 GPUs a node, 64 NICs, rail-optimized leaves of 64 nodes with
  oversubscription 4 (topologies/README.md's limits: gpus_per_node 256, domain_gpus 1,024,
  switches 64, nics_per_node 64; max_nodes 256 so that the largest count, 16,384 GPUs, fits);
- pcie: a PCIe-only node at the limits (256 GPUs, 64 switches, 16 sockets, 64 NICs);
- buy-256: a jobs file at MAX_JOBS (256 jobs, 3 GPU types).

    python bench/limits_timing.py            # every case
    python bench/limits_timing.py pcie buy   # the cases whose name contains "pcie" or "buy"
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a topology at the limits of planner/limits.py TOPOLOGY_KEY_RULES (shared with tests/test_ring_closed_form.py)
OVERSUBSCRIBED = (REPO / "tests" / "data" / "oversubscribed-limits.toml").read_text()

PCIE = """\
name = "pcie-limits"
description = "A PCIe-only node at the limits: 256 GPUs under 64 switches on 16 sockets, 64 NICs"
gpu = "l40s"
gpus_per_node = 256
max_nodes = 64
source = "ASSUMPTION: a bench topology at the limits of planner/limits.py TOPOLOGY_KEY_RULES"

[intra_node]
fabric = "pcie"
source = "ASSUMPTION"

[pcie]
switches = 64
link_gb_per_s = 32
uplink_gb_per_s = 64
sockets = 16
socket_link_gb_per_s = 64
latency_us = 1.0
source = "ASSUMPTION"

[network]
nics_per_node = 64
nic_gbit_per_s = 100
rail_optimized = false
nodes_per_leaf = 16
oversubscription = 1.0
latency_us = 2.7
switch_latency_us = 0.5
source = "ASSUMPTION"
"""


def jobs_file(n_jobs: int) -> str:
    """n_jobs jobs, the three of examples/jobs.yaml in turn, each start a day later."""
    kinds = [("llama3.1-8b", "1T", "30d"), ("llama3.1-70b", "60B", "40d"), ("llama3.1-8b", "200B", "21d")]
    lines = ["start: 2026-01-05", "horizon: 730d", "gpus: [h100, h200, b200]", "jobs:"]
    for i in range(n_jobs):
        model, tokens, deadline = kinds[i % 3]
        lines += [f"  - name: job-{i}", f"    model: {model}", f"    tokens: {tokens}",
                  f"    deadline: {deadline}", f"    start: {i}d"]
    return "\n".join(lines) + "\n"


def cases(d: Path) -> dict[str, list[str]]:
    (d / "oversubscribed.toml").write_text(OVERSUBSCRIBED)
    (d / "pcie.toml").write_text(PCIE)
    (d / "jobs.yaml").write_text(jobs_file(256))
    return {
        "oversubscribed --tokens": ["--model", "70b", "--gpus", "h100", "--topology", str(d / "oversubscribed.toml"),
                                    "--tokens", "15T", "--max-gpus", "16384"],
        "oversubscribed plan": ["--model", "405b", "--gpus", "h100", "--topology", str(d / "oversubscribed.toml"),
                                "--max-gpus", "16384"],
        "pcie --tokens": ["--model", "8b", "--gpus", "l40s", "--topology", str(d / "pcie.toml"),
                          "--tokens", "1T", "--max-gpus", "16384"],
        "buy-256": ["buy", str(d / "jobs.yaml")],
    }


def main(argv: list[str]) -> int:
    env = dict(os.environ, PYTHONPATH=str(REPO), PLANNER_TODAY="2026-12-01")
    with tempfile.TemporaryDirectory() as tmp:
        chosen = {k: v for k, v in cases(Path(tmp)).items() if not argv or any(a in k for a in argv)}
        print(f"{'case':<26} {'wall s':>7} {'cpu s':>6}  exit")
        for name, args in chosen.items():
            t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            r = subprocess.run([sys.executable, "-m", "planner", *args, "--quiet"], env=env, cwd=REPO,
                               capture_output=True, text=True)
            wall_s, ru1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
            print(f"{name:<26} {wall_s:7.1f} {cpu_s:6.1f}  {r.returncode}  {(r.stdout or r.stderr).strip()[:100]}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
