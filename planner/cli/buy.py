"""`plan buy JOBS.yaml`: size a cluster purchase for a list of jobs (planner.cost.buy)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from planner.cli.common import note, progress, run_safely, show
from planner.cli.complete import complete_gpus
from planner.cli.cost_options import calibration_option, prices_option, solver_option
from planner.cli.output_options import quiet_option
from planner.cli.training_options import confidence_option
from planner.cli.types import Dollars, OutputPath
from planner.errors import UserError
from planner.training.setup import MAX_GPUS


@click.command("buy")
@click.argument("jobs_path", metavar="JOBS.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--gpus", "gpu_names", metavar="LIST", default=None, shell_complete=complete_gpus,
              help="GPU types to choose from, e.g. h100,h200,b200  [default: the file's gpus, else h100,h200,b200].")
@click.option("--budget", type=Dollars(), default=None,
              help="Spend at most this much over the horizon (purchase + power).")
@click.option("--horizon", metavar="DURATION", default=None,
              help="How long the cluster is owned and powered (365d, 52w)  [default: the file's horizon, else 365d].")
@click.option("--max-gpus", type=click.IntRange(1, MAX_GPUS), default=4096, show_default=True,
              help="The most GPUs one job may use.")
@prices_option
@solver_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=OutputPath(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Draw the purchase into FILE (.png or .svg): GPUs and dollars per GPU type, each job's run.")
@click.option("--force", is_flag=True, help="With --plot, overwrite an existing file.")
@quiet_option
@calibration_option
@confidence_option("--time-confidence", "Size the cluster with step times not exceeded with this confidence "
                                        "(out-of-sample errors on published runs), so every deadline is met with it.")
def buy_cmd(jobs_path: Path, gpu_names: str | None, budget: float | None, horizon: str | None, max_gpus: int,
            prices_path: Path | None, solver: str, as_json: bool, plot: Path | None, force: bool,
            quiet: bool = False, calibration: Path | None = None, time_confidence: float | None = None) -> None:
    """Size a cluster purchase: how many nodes of each GPU type to buy so that every job of
    JOBS.yaml meets its deadline, at the least cost of ownership (purchase plus power over
    the horizon), by an ILP. Jobs that overlap in time share the cluster's GPUs.

    \b
      plan buy examples/jobs.yaml
      plan buy jobs.yaml --gpus h100,b200 --budget 20M --horizon 2y
    """
    run_safely(lambda: buy(jobs_path, gpu_names, budget, horizon, max_gpus, prices_path, solver, as_json,
                           plot, force, quiet, calibration, time_confidence))


def buy(jobs_path: Path, gpu_names: str | None, budget: float | None, horizon: str | None, max_gpus: int,
        prices_path: Path | None, solver: str, as_json: bool, plot: Path | None = None, force: bool = False,
        quiet: bool = False, calibration: Path | None = None, time_confidence: float | None = None) -> None:
    from planner.cost.buy import plan_purchase
    from planner.cost.jobs import load_jobs, parse_duration_s
    from planner.cost.prices import DAY_S, load_prices
    from planner.limits import check_gpu_type_count
    from planner.report import costs
    from planner.report import text as report

    if quiet and as_json:
        raise UserError("--quiet and --json cannot be used together; give one of them")
    if plot is not None:                # a bad name or an existing file: refused before the search
        from planner.report.plot import plot_format
        plot_format(plot, force)
    elif force:
        raise UserError("--force needs --plot FILE")
    jobs = load_jobs(jobs_path)
    names = [g.strip() for g in gpu_names.split(",") if g.strip()] if gpu_names else list(jobs.gpus)
    names = names or ["h100", "h200", "b200"]
    check_gpu_type_count(names, "--gpus")
    horizon_s = (parse_duration_s(horizon, "--horizon") if horizon is not None
                 else jobs.horizon_s if jobs.horizon_s is not None else 365 * DAY_S)
    extra: dict[str, Any] = {}
    if calibration is not None:     # its matmul fraction and fragmentation, on its GPU type only
        from planner.timing.calibrate import check_gpu, load_calibration
        from planner.timing.model import Efficiency
        from planner.training.setup import TrainingSetup

        c = load_calibration(str(calibration))
        check_gpu(c, names)
        extra = {"efficiency": c.efficiency(Efficiency()), "base_setup": c.setup(TrainingSetup())}
    if time_confidence is not None:     # plan at the step time's upper end (issue 18)
        from dataclasses import replace

        from planner.timing.intervals import upper_factor
        from planner.timing.model import Efficiency

        extra["efficiency"] = replace(extra.get("efficiency", Efficiency()),
                                      step_time_factor=upper_factor(time_confidence))
    with progress(as_json or quiet, f"sweeping GPU counts of {', '.join(names)} per job "
                  f"and solving the ILP"):
        r = plan_purchase(jobs, names, load_prices(prices_path), horizon_s, budget, max_gpus, solver=solver,
                          **extra)
    plotted = None
    if plot is not None:
        from planner.report import plot as plots
        plotted = plots.save(plots.buy_figure(r), plot, force=force)
    if as_json:
        click.echo(json.dumps(costs.buy_json(r), indent=2))
    elif quiet:
        click.echo(report.buy_quiet_line(r))
    else:
        from planner.report.terminal import buy_view
        show(buy_view(r))
    if calibration is not None:
        note(f"calibration: {calibration} applied to every {names[0]} job", as_json or quiet)
    if plotted is not None:
        note(f"wrote the plot to {plotted}", as_json or quiet)
    if not r.feasible:
        sys.exit(2)
