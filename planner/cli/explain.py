"""`plan explain`: every term of the memory and step-time models for one layout."""

from __future__ import annotations

import json
from typing import Any

import click

from planner.cli.common import run_safely
from planner.cli.cost_options import time_options
from planner.cli.layout_options import layout_options
from planner.cli.options import Options
from planner.cli.request import build_request, timing, within_topology
from planner.cli.task_options import method_options
from planner.cli.training_options import offload_options, stack_options
from planner.errors import UserError


@click.command("explain")
@layout_options
@method_options
@time_options
@offload_options
@stack_options
def explain_cmd(**kw: Any) -> None:
    """Every term of the memory and step-time models for one layout: its formula, its
    inputs, its value and its source (paper, data sheet), to check the arithmetic by hand.

    \b
    The layout is the one `plan` picks for the same options (fix it with --dp, --tp, --pp,
    --zero or --fsdp, --micro-batch, --recompute); the terms add up to what `plan` reports.
    When nothing fits, the layout that needs the least memory is explained. --tokens adds
    the time to train on them but runs no cost search: the layout stays the smallest GPU
    count that fits, not the plan `plan --tokens` picks (fix that plan's layout to explain it).

    \b
      plan explain --model 8b --gpus h100 --dp 8 --zero 3
      plan explain --model 70b --gpus h100 --dp 2 --tp 8 --pp 4 --zero 1 --recompute full --json
    """
    run_safely(lambda: explain(Options.from_click(kw)))


def explain(o: Options) -> None:
    from planner import api
    from planner.report.explain import explain as explain_terms
    from planner.report.explain import to_json, to_text

    if o.method == "auto":
        raise UserError("plan explain explains one method: give --method full, lora, qlora or freeze")
    m, gpu, setup, space, n_gpus = build_request(o)
    lay = api.fixed_layout(space, setup, n_gpus)
    o = within_topology(o, gpu, lay.n_gpus if lay is not None else n_gpus)     # as `plan` does (issue 32, W3)
    if lay is not None:
        result = api.evaluate_layout(m, gpu, setup, lay, **timing(o, gpu))
    else:
        result = api.plan(m, gpu, setup, space, n_gpus=n_gpus, max_gpus=o.max_gpus, **timing(o, gpu))
    cand = result.best or result.result.smallest
    if cand is None:
        raise UserError(f"no layout of {m.name} fits on up to {o.max_gpus} x {gpu.name}, and none was sized; "
                        f"fix one with --dp, --tp, --pp, --zero (or --fsdp), --micro-batch and --recompute to "
                        f"explain it anyway, or raise --max-gpus")
    if setup.offload_optimizer != "none" or setup.offload_params != "none":
        from planner.emit import EmitOptions, check_options
        check_options(result, EmitOptions(offload_optimizer=setup.offload_optimizer,
                                          offload_params=setup.offload_params))
    ex = explain_terms(m, gpu, setup, cand.layout, result.cluster, result.efficiency, result.capacity_bytes,
                       o.tokens)
    if o.as_json:
        d = to_json(ex)
        if o.calibration is not None:       # only then: the JSON without it is as it was
            d["calibration"] = str(o.calibration)
        click.echo(json.dumps(d, indent=2))
        return
    if result.best is None:
        click.echo(f"No layout fits; this is the one that needs the least memory on {cand.n_gpus} GPUs.\n")
    elif o.tokens is not None and lay is None:
        click.echo("--tokens adds the time to train; the layout is the smallest GPU count that fits, not the "
                   "cost plan `plan --tokens` picks (fix that plan's layout to explain it).\n")
    click.echo(to_text(ex))
    if o.calibration is not None:
        click.echo(f"\ncalibration: {o.calibration} (its matmul fraction and fragmentation are the inputs above)")
