"""A Slurm batch script for a plan: one task per node, each running torchrun.

#SBATCH options (Slurm's sbatch manual, slurm.schedmd.com/sbatch.html): --nodes,
--ntasks-per-node=1 (torchrun starts the GPU processes), --gpus-per-node, --exclusive.
srun starts one torchrun per node; torchrun's c10d rendezvous (torch.distributed.run:
--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id) joins them at the first node of
the allocation (``scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1``). Submit it
from the directory --out wrote: ``cd DIR && sbatch slurm.sbatch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.emit import EmitOptions, chosen, label, node_shape
from planner.emit.launch import env_lines, shell_command, stack_env, worker_command

if TYPE_CHECKING:
    from planner.api import PlanResult


def job_name(r: PlanResult) -> str:
    """A job name Slurm and Kubernetes both accept (DNS-1123: lower-case letters, digits, '-')."""
    raw = f"planner-{r.model.name}-{chosen(r).layout.n_gpus}x{r.gpu.name}".lower()
    name = "".join(c if c.isascii() and c.isalnum() else "-" for c in raw).strip("-")
    while "--" in name:
        name = name.replace("--", "-")
    return name[:63].rstrip("-")


def torchrun_under_scheduler(r: PlanResult, opts: EmitOptions, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun's flags for a scheduler-started node: c10d rendezvous at ``endpoint``."""
    lay = chosen(r).layout
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    return ["torchrun", "--nnodes", str(n_nodes), "--nproc-per-node", str(per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id]


def to_slurm_script(r: PlanResult, opts: EmitOptions = EmitOptions(), stack: str | None = None) -> str:
    """The text of slurm.sbatch for the chosen plan."""
    from planner.emit import stack_for

    lay = chosen(r).layout
    stack = stack or stack_for(r, opts)
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    prog, extra = worker_command(r, opts, stack)
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name(r)}",
        f"#SBATCH --nodes={n_nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}",
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
        f"# Written by planner: {label(r.model.name)} on {lay.n_gpus} x {label(r.gpu.name)}, stack {stack}; "
        f"layout {lay.describe()}",
        "# Submit from the directory that holds this plan: cd DIR && sbatch slurm.sbatch",
        "set -euo pipefail",
        'HERE="${PLAN_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"',
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"MASTER_PORT={opts.master_port}",
    ]
    lines += env_lines(stack_env(r, stack))
    from planner.stacks import reads_megatron_args
    if reads_megatron_args(stack, lay):
        lines += ['MEGATRON="${MEGATRON:-$HERE/Megatron-LM}"   # your Megatron-LM (or Megatron-DeepSpeed) checkout',
                  'mapfile -t MEGATRON_ARGS < <(grep -v "^#" "$HERE/megatron_args.txt")']
    if stack == "torchtitan":
        lines += ['export PYTHONPATH="${HERE}${PYTHONPATH:+:${PYTHONPATH}}"   # torchtitan_job.py']
    cmd = ["srun", "--kill-on-bad-exit=1"] + torchrun_under_scheduler(
        r, opts, "${MASTER_ADDR}:${MASTER_PORT}", "${SLURM_JOB_ID}") + prog
    lines.append(shell_command(cmd, extra=" ".join(extra + ['"$@"'])))
    return "\n".join(lines) + "\n"
