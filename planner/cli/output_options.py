"""click's options of what `plan` writes and prints: configs (--out), plots, DeepSpeed's
cross-check, offload and the stack the configs are for, the scheduler, --quiet."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from planner.cli.options import apply_options, default_of
from planner.cli.training_options import offload_option, stack_option
from planner.cli.types import OutputPath
from planner.emit import SCHEDULERS


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the main `plan` command: configs to write, and DeepSpeed's cross-check."""
    return apply_options([
        click.option("--out", type=OutputPath(file_okay=False, path_type=Path), default=None, metavar="DIR",
                     help="Write the plan's configs here, only those its stack reads: ds_config.json and hostfile, "
                          "accelerate_config.yaml, train.py (DeepSpeed, hf), torchtitan_job.py, megatron_args.txt; "
                          "launch.sh, slurm.sbatch, pytorchjob.yaml, plan.json."),
        click.option("--force", is_flag=True, help="With --out or --plot, overwrite existing files."),
        click.option("--plot", type=OutputPath(dir_okay=False, path_type=Path), default=None, metavar="FILE",
                     help="Draw the plan into FILE (.png or .svg): memory per rank by category against the "
                          "GPU's capacity, and time (with --tokens, cost) against GPU count."),
        click.option("--crosscheck", is_flag=True,
                     help="Compare model states with DeepSpeed's own estimators (imports deepspeed, ~2 s)."),
        offload_option("offload_optimizer",
                 "ZeRO-Offload: optimizer states (and fp32 gradients) in CPU memory or on NVMe; "
                 "the GPU memory left and the CPU memory per node are planned (ZeRO-1 or higher)."),
        offload_option("offload_params",
                 "ZeRO-Infinity / FSDP CPU offload: parameters in CPU memory or on NVMe "
                 "(ZeRO-3 or FSDP full sharding; FSDP also moves gradients and optimizer states)."),
        # emit (issue 19): which stack --out writes for, and which scheduler files
        stack_option("The training stack: its memory profile (recompute policies, loss, kernels) and the "
               "configs --out writes  [default: what fits the layout: megatron for tp/pp/cp (fused "
               "kernels), hf for FSDP without them, torchtitan for FSDP with pp under --kernels "
               "eager, deepspeed for ZeRO]."),
        click.option("--scheduler", type=click.Choice(SCHEDULERS), default=default_of("scheduler"),
                     show_default=True, help="Scheduler files --out writes: slurm.sbatch, pytorchjob.yaml (Kubeflow)."),
    ], f)



def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--quiet: the answer on one line, for scripts."""
    return click.option("--quiet", "-q", "quiet", is_flag=True,
                        help="Print only the answer, on one line (not with --json).")(f)
