"""The catalog commands: `plan models`, `plan gpus`, `plan topologies`, and
`plan completion SHELL` (whose names come from the same catalogs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from planner.cli.common import run_safely

SHELLS = ("bash", "zsh", "fish")


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models_cmd(as_json: bool) -> None:
    """List the model presets with their parameter counts."""
    def go() -> None:
        from planner.models.spec import count_params, load_preset, load_presets
        rows: list[dict[str, Any]] = []
        for name, p in load_presets().items():
            pc = count_params(load_preset(name))
            rows.append({"name": name, "n_params": pc.total, "n_active_params": pc.active,
                         "aliases": list(p.aliases), "description": p.description, "source": p.source})
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        from planner.report.text import models_text
        click.echo(models_text(rows))
    run_safely(go)


@click.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--prices", "prices_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="PATH", help="A TOML file overriding entries of the price catalog.")
def gpus_cmd(as_json: bool, prices_path: Path | None) -> None:
    """List the GPU catalog with its prices: rental per GPU-hour, a node's purchase price
    and power (presets/prices.toml, each with its source and date)."""
    def go() -> None:
        from planner.cost.prices import load_prices
        from planner.hardware.gpus import list_gpus
        from planner.report import costs
        gpus = list_gpus()
        prices = load_prices(prices_path)
        priced = costs.prices_json(prices, [g.name for g in gpus])
        if as_json:
            click.echo(json.dumps([{
                "name": g.name, "full_name": g.full_name, "memory_bytes": g.memory_bytes,
                "bf16_flops_per_s": g.bf16_flops_per_s, "hbm_bytes_per_s": g.hbm_bytes_per_s,
                "gpus_per_node": g.gpus_per_node, "intra_node_link": g.intra_node_link,
                "source": g.source, "prices": priced[g.name]} for g in gpus], indent=2))
            return
        click.echo(costs.gpus_text(gpus, prices))
    run_safely(go)


@click.command("topologies")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def topologies_cmd(as_json: bool) -> None:
    """List the shipped cluster topologies (pass one with --topology NAME, or your own file
    with --topology PATH; see topologies/README.md)."""
    def go() -> None:
        from planner.report import text as report
        rows = report.topologies_json()
        click.echo(json.dumps(rows, indent=2) if as_json else report.topologies_text(rows))
    run_safely(go)


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion_cmd(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL (model, GPU and topology names complete).

    \b
      eval "$(plan completion bash)"            # in ~/.bashrc
      eval "$(plan completion zsh)"             # in ~/.zshrc
      plan completion fish > ~/.config/fish/completions/plan.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    root = ctx.find_root().command
    run_safely(lambda: click.echo(cls(root, {}, "plan", "_PLAN_COMPLETE").source()))
