"""click's options of the step time and the cost objective: the cluster's topology, the tokens
to train on, a calibration file, the deadline, budget, objective, prices and ILP solver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from planner.cli.complete import complete_topologies
from planner.cli.options import apply_options, default_of
from planner.cli.types import Dollars, TokenCount


def time_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the step-time model: the cluster's wiring and the tokens to train on."""
    return apply_options([
        click.option("--topology", metavar="NAME|PATH", default=None, shell_complete=complete_topologies,
                     help="Cluster topology: a shipped one (`plan topologies`) or a TOML file  "
                          "[default: the GPU's own, e.g. dgx-h100 for h100]."),
        click.option("--tokens", type=TokenCount(), default=None,
                     help="Tokens to train on (2e12, 300B): the plan then minimises the cost (or time) of "
                          "training on them, over GPU counts (and the GPU types --gpus lists), by an ILP."),
        calibration_option,
    ], f)


def calibration_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--calibration FILE: the efficiency and overhead `plan calibrate` fitted to the user's logs."""
    return click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="FILE", help="Apply a `plan calibrate` file: its matmul fraction and "
                                             "allocator overhead, fitted to your own logs (same GPU type).")(f)


def prices_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--prices", "prices_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="PATH", help="A TOML file overriding entries of the price catalog (`plan gpus`).")(f)


# cost.solve.SOLVERS, spelt here so that the CLI's import loads no pulp (tests/test_cli_help.py checks they agree)
SOLVERS = ("auto", "highs", "cbc")


def solver_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--solver", type=click.Choice(SOLVERS), default=default_of("solver"), show_default=True,
                        help="The ILP solver: HiGHS when highspy is installed (auto), else PuLP's bundled CBC.")(f)


def cost_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the cost objective (`plan --tokens`): constraints, prices, the solver."""
    return apply_options([
        click.option("--deadline", metavar="DURATION|DATE", default=None,
                     help="With --tokens: finish within this long (30d, 12h, 2w) or by this date (2026-03-01)."),
        click.option("--budget", type=Dollars(), default=None,
                     help="With --tokens: spend at most this many US dollars (250k, 1.5M)."),
        click.option("--objective", type=click.Choice(["cost", "time"]), default=None,
                     help="With --tokens: what to minimise  [default: cost]."),
        prices_option,
        solver_option,
    ], f)

