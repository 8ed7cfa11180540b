"""`plan --model M --gpus G`: a training plan (the fewest GPUs that fit), `--tokens N`: the
plan of least cost or time over GPU types and counts, `--task load`: inference memory.
Both training plans end in one output tail (finish): --out, --plot, the report."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from planner.cli.common import check_quiet, per_count, progress, say_written, show, written_text
from planner.cli.options import Options
from planner.cli.request import (
    build_request,
    check_names,
    efficiency_of,
    emit_options,
    finetune_spec,
    timing,
    unread_option,
    within_topology,
)
from planner.errors import UserError

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.emit import EmitOptions
    from planner.layouts.layout import SearchSpace
    from planner.measure.crosscheck import Crosscheck

Renders = Callable[["Crosscheck | None"], Any]


@dataclass(frozen=True)
class Answer:
    """What a training plan prints and writes: its PlanResult and how each output shows it.

    json_of, quiet_of and view_of take the cross-check (None without --crosscheck);
    figure_of draws the --plot figure. ``failed`` exits with status 2 after printing
    (nothing fits or satisfies the constraints); ``out_refusal`` is the error --out gives
    when there is nothing to write, raised before printing when ``refuse_first``."""

    result: PlanResult
    json_of: Renders
    quiet_of: Renders
    view_of: Renders
    figure_of: Callable[[], Any]
    failed: bool
    out_refusal: str | None
    refuse_first: bool
    crosscheck_always: bool


def plan(o: Options) -> None:
    """The `plan` command without a subcommand."""
    check_quiet(o)
    from planner.cli.posttrain import posttrain, stray_option  # issue 34: post-training

    if o.teacher is not None or o.task in ("grpo", "ppo", "dpo"):
        posttrain(o)
        return
    stray = stray_option(o)
    if stray:
        raise UserError(stray)
    if o.plot is not None:      # a bad name or an existing file: refused before the search
        from planner.report.plot import plot_format
        if o.task == "load":
            raise UserError("--plot draws a training plan; --task load has no plot")
        plot_format(o.plot, o.force)
    if o.task == "load":
        load(o)
        return
    if o.mla_cache is not None:
        raise UserError(f"--mla-cache {o.mla_cache} sizes an inference KV cache: use it with --task load")
    if o.tokens is not None:
        plan_cost(o)
        return
    for name in ("deadline", "budget", "objective"):
        if getattr(o, name) is not None:
            raise UserError(f"--{name} needs --tokens N: the time and cost of a plan depend on the tokens to train on")
    finish(o, plan_fewest(o))


def plan_fewest(o: Options) -> Answer:
    """The plan on the fewest GPUs (or --n-gpus) that fit, searched or for a fixed layout."""
    from planner import api
    from planner.report import text as report

    m, gpu, setup, space, n_gpus = build_request(o)
    lay = api.fixed_layout(space, setup, n_gpus)
    o = within_topology(o, gpu, lay.n_gpus if lay is not None else n_gpus)
    if o.method == "auto":
        tried = api.auto_methods(setup)
        specs = tuple(finetune_spec(o, name) for name in tried)
        if lay is not None:
            results = [api.evaluate_layout(m, gpu, replace(setup, finetune=ft), lay, **timing(o, gpu))
                       for ft in specs]
            result = next((r for r in results if r.fits), results[-1])
            result = replace(result, methods_tried=tried)
        else:
            with progress(o.aside, f"searching layouts on {gpu.name}") as bar:
                result = api.plan_methods(m, gpu, setup, specs, space, n_gpus=n_gpus, max_gpus=o.max_gpus,
                                          progress=per_count(bar, gpu.name), **timing(o, gpu))
    elif lay is not None:
        result = api.evaluate_layout(m, gpu, setup, lay, **timing(o, gpu))
    else:
        with progress(o.aside, f"searching layouts on {gpu.name}") as bar:
            result = api.plan(m, gpu, setup, space, n_gpus=n_gpus, max_gpus=o.max_gpus,
                              progress=per_count(bar, gpu.name), **timing(o, gpu))

    if result.best is None:
        from planner.report.advice import no_valid_layout
        why = no_valid_layout(m, setup, space, [lay.n_gpus if lay is not None else (n_gpus or gpu.gpus_per_node)],
                              gpu.gpus_per_node)
        if why is not None:
            raise UserError(why)
    if result.best is None and result.result.smallest is None:
        result = with_least_memory(result, space)
    if o.calibration is not None:
        result = replace(result, calibration=str(o.calibration))

    def as_json(crosscheck: Crosscheck | None) -> Any:
        d = report.plan_json(result, crosscheck)
        if result.best is not None and result.best.fits:
            from planner.emit import stack_json
            d["stack"] = stack_json(result, emit_options(o))     # the stack --out writes for (issue 19)
        if result.best is None:
            from planner.report.advice import fit_advice
            d["advice"] = fit_advice(result)
        return d

    def view(crosscheck: Crosscheck | None) -> Any:
        from planner.report.terminal import plan_view
        return plan_view(result, crosscheck)

    def figure() -> Any:
        from planner.report import plot
        return plot.plan_figure(result, api.scaling(result, space, o.max_gpus))

    fits = result.best is not None and result.best.fits
    return Answer(result=result, json_of=as_json, quiet_of=lambda _: report.quiet_line(result), view_of=view,
                  figure_of=figure, failed=result.best is None,
                  out_refusal=None if fits else f"no plan fits, so nothing was written to --out {o.out}",
                  refuse_first=False, crosscheck_always=True)


def with_least_memory(result: PlanResult, space: SearchSpace) -> PlanResult:
    """When nothing fits and the search sized no layout (its floor, weights, gradients and
    optimizer states alone, ruled out every count tried), the layout needing the least memory
    on the largest count tried, so that the report and --json's ``least_memory`` can show it
    (README: "least_memory then holds the layout that needs the least")."""
    from planner.hardware.placement import scale_up_domain_gpus
    from planner.search.search import size_count

    counts = result.result.counts_tried
    if not counts:
        return result
    gpu = result.gpu
    if space.max_tp is None and result.cluster is not None:     # as api.plan widens it
        space = replace(space, max_tp=max(gpu.gpus_per_node, scale_up_domain_gpus(result.cluster)))
    _, least = size_count(result.model, result.setup, max(counts), gpu.gpus_per_node, space,
                          result.capacity_bytes, result.params, result.host_capacity_bytes,
                          result.nvme_capacity_bytes)
    if least is None:
        return result
    return replace(result, result=replace(result.result, smallest=least))


def plan_cost(o: Options) -> None:
    """`plan --tokens N`: the plan that minimises the cost (or time) of training on N tokens,
    chosen by an ILP over GPU types, counts and layouts (planner.cost.plan)."""
    finish(o, cheapest(o))


def cheapest(o: Options) -> Answer:
    from datetime import UTC, datetime

    from planner import api
    from planner.cost.jobs import parse_when_s
    from planner.cost.plan import plan_cost as solve_cost
    from planner.cost.prices import load_prices
    from planner.cost.solve import Limits
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import reject_reason
    from planner.limits import check_gpu_type_count
    from planner.report import costs
    from planner.report import text as report

    if not o.model_name:
        raise UserError("missing --model; pass a preset name (`plan models`) or a config.json path")
    check_names(o)
    names = [g.strip() for g in (o.gpu_name or "").split(",") if g.strip()]
    if not names:
        raise UserError("missing --gpus; pass one GPU type or several (--gpus h100,a100), see `plan gpus`")
    check_gpu_type_count(names, "--gpus")
    gpus = [get_gpu(n) for n in names]
    if len({g.name for g in gpus}) != len(gpus):
        raise UserError(f"--gpus {o.gpu_name} names a GPU type twice")
    if o.method == "auto":
        raise UserError("--method auto picks the method on the fewest GPUs; with --tokens give one method "
                        "(full, lora, qlora, freeze) and compare them by running the plan per method")
    # the first GPU as the user named it: a GPU file by its path, not by the name inside it,
    # which the catalog does not hold or holds as another GPU (issue 32, U1)
    m, _, setup, space, n_gpus = build_request(replace(o, gpu_name=names[0]))
    batch_basis = ""
    if o.global_batch is None and o.global_batch_tokens is None and o.grad_accum is None:
        # issue 33: the fixed 1,024 sequences were kept at 16,384 GPUs and for fine-tunes
        from planner.models.spec import count_params
        from planner.training.batch import basis, default_global_batch

        assert o.tokens is not None
        method = setup.finetune.method
        setup = replace(setup, global_batch=default_global_batch(count_params(m).total, o.tokens, setup.seq_len,
                                                                 method))
        batch_basis = basis(setup.global_batch, setup.seq_len, method)
    deadline_s = None
    if o.deadline is not None:
        deadline_s, _ = parse_when_s(o.deadline, "--deadline", datetime.now(UTC))
        if deadline_s <= 0:
            raise UserError(f"--deadline {o.deadline} is in the past; give a later date or a duration (30d)")
    lay = api.fixed_layout(space, setup, n_gpus)
    for g in gpus:      # a count beyond a topology is refused; the sweep's answer is checked below
        within_topology(o, g, lay.n_gpus if lay is not None else n_gpus)
    if lay is not None:
        for gpu in gpus:
            reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
            if reason:
                raise UserError(f"layout {lay.describe()} cannot run: {reason}")
            fixed = api.evaluate_layout(m, gpu, setup, lay, **timing(o, gpu))
            if not fixed.fits:
                raise UserError(f"layout {lay.describe()} does not fit on {gpu.name}; run the plan without "
                                f"--tokens to see its memory by category")
        n_gpus = lay.n_gpus
    assert o.tokens is not None
    with progress(o.aside, f"sweeping GPU counts of {', '.join(g.name for g in gpus)} and solving the ILP"):
        r = solve_cost(m, gpus, setup, o.tokens, load_prices(o.prices_path), space,
                       objective=o.objective or "cost",
                       limits=Limits(deadline_s=deadline_s, budget_usd=o.budget, max_gpus=o.max_gpus),
                       n_gpus=n_gpus, topology=o.topology, efficiency=efficiency_of(o, [g.name for g in gpus]),
                       solver=o.solver)
    if o.calibration is not None:
        r = replace(r, result=replace(r.result, calibration=str(o.calibration)))
    r = replace(r, global_batch_basis=batch_basis)

    def view(crosscheck: Crosscheck | None) -> Any:
        from planner.report.terminal import cost_view
        return cost_view(r, crosscheck)

    def figure() -> Any:
        from planner.report import plot
        return plot.cost_figure(r)

    result = r.result
    if result.best is not None and result.cluster is not None and result.cluster.topology is not None:
        from planner.hardware.topology import check_covers
        check_covers(result.cluster.topology, result.best.n_gpus, flag="--max-gpus")
    refusal = (f"no plan satisfies the constraints, so nothing was written to --out {o.out}"
               if result.best is None else None)
    return Answer(result=result, json_of=lambda cc: costs.cost_json(r, cc),
                  quiet_of=lambda _: report.cost_quiet_line(r), view_of=view, figure_of=figure,
                  failed=r.chosen is None, out_refusal=refusal, refuse_first=True, crosscheck_always=False)


def finish(o: Options, a: Answer) -> None:
    """The output tail of both training plans: offload checks, --crosscheck, --out (written
    before printing, so that its errors come alone), --plot, the report, the exit status."""
    result = a.result
    opts = emit_options(o)
    if opts.offloads and result.best is not None:
        from planner.emit import check_options
        check_options(result, opts)
    crosscheck = None
    if o.crosscheck and (a.crosscheck_always or result.best is not None):
        import os

        from planner.measure.crosscheck import crosscheck as run_crosscheck
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # estimators need no accelerator; skip its probe
        crosscheck = run_crosscheck(result, opts.offload_optimizer, opts.offload_params)
    written: list[Path] = []
    not_written = None
    stack_used = None
    if o.out is not None:
        if a.out_refusal is None:
            from planner.emit import stack_for
            if o.plot is not None:      # not one output written and the next refused (issue 32, B6)
                from planner.emit.write import writable_target
                writable_target(o.plot, "--plot")
            written = write_out(result, o, opts, crosscheck)
            stack_used = stack_for(result, opts)
        elif a.refuse_first:
            raise UserError(a.out_refusal)
        else:
            not_written = UserError(a.out_refusal)
    plotted = None
    if o.plot is not None:
        from planner.report import plot
        try:
            plotted = plot.save(a.figure_of(), o.plot, force=o.force)
        except UserError as e:
            if not written:
                raise
            raise UserError(f"{e}; {written_text(o.out, written, stack_used)}") from None
    if o.as_json:
        click.echo(json.dumps(a.json_of(crosscheck), indent=2))
    elif o.quiet:
        click.echo(a.quiet_of(crosscheck))
    else:
        show(a.view_of(crosscheck))
    say_written(o, written, plotted, stack_used)
    if not_written is not None:
        raise not_written
    if a.failed:
        sys.exit(2)                     # nothing fits: a user error, with --json too


def write_out(result: PlanResult, o: Options, opts: EmitOptions, crosscheck: Crosscheck | None) -> list[Path]:
    """Write the chosen plan's configs to --out (atomically; existing files need --force)."""
    from planner.emit import PLAN_FILE_NAMES, plan_files
    from planner.emit.write import write_files
    from planner.report import text as report

    assert o.out is not None
    files = plan_files(result, opts, report.plan_json(result, crosscheck))
    return write_files(o.out, files, force=o.force, owned=PLAN_FILE_NAMES)


def load(o: Options) -> None:
    """`plan --task load`: weights, KV cache and working memory on the fewest GPUs."""
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import AXIS_NAMES
    from planner.memory.inference import LoadSetup, plan_load
    from planner.models.spec import load_model
    from planner.report import text as report
    from planner.training.checks import default_seq_len, positions_refusal
    from planner.training.setup import Overheads

    if not o.model_name or not o.gpu_name:
        raise UserError("--task load needs --model and --gpus")
    check_names(o)
    if o.method not in (None, "full"):
        raise UserError("--task load sizes a model for inference; drop --method (use --quant for quantized weights)")
    for name in (*(a for a in AXIS_NAMES if a not in ("tp", "pp")), "etp", "zero", "fsdp", "recompute",
                 "grad_accum", "global_batch", "global_batch_tokens"):
        if getattr(o, name) is not None:
            raise UserError(f"--{name.replace('_', '-')} is a training option; --task load takes --tp, --pp, "
                            f"--micro-batch (sequences held at once) and --seq-len (their context)")
    unread = unread_option(o, "load")
    if unread is not None:
        raise UserError(f"{unread} is not read by --task load, which sizes inference memory from --model, --gpus, "
                        f"--tp, --pp, --n-gpus, --max-gpus, --micro-batch, --seq-len, --precision, --quant, "
                        f"--mla-cache, --usable-memory and --fragmentation: drop {unread}")
    if o.precision == "fp8":
        raise UserError("--task load holds 16-bit or 32-bit weights (--precision bf16, fp16 or fp32); for 8-bit "
                        "weights give --quant int8")
    m, gpu = load_model(o.model_name), get_gpu(o.gpu_name)
    if o.mla_cache is not None and not m.is_mla:
        raise UserError(f"--mla-cache is for multi-head latent attention (DeepSeek-V3, Kimi K2); {m.name} "
                        f"caches K and V per head already: drop --mla-cache")
    why = positions_refusal(m, o.seq_len or default_seq_len(m))
    if why is not None:
        raise UserError(why)
    wb = 4 if o.precision == "fp32" else 2
    setup = LoadSetup(weight_bytes=wb, quant=o.quant or "none", batch=o.micro_batch or 1,
                      context=o.seq_len or default_seq_len(m), kv_bytes=wb, mla_cache=o.mla_cache or "latent",
                      usable_memory_fraction=o.usable_memory)
    if o.fragmentation is not None:
        setup = replace(setup, overheads=Overheads(fragmentation=o.fragmentation))
    tp, pp = o.tp, o.pp
    if o.n_gpus is not None and tp is None and pp is None:
        tp, pp = (o.n_gpus, 1) if o.n_gpus <= gpu.gpus_per_node else (gpu.gpus_per_node,
                                                                       o.n_gpus // gpu.gpus_per_node)
    from planner.layouts.rules import split_refusal
    why = split_refusal(m, tp or 1, pp or 1)
    if why is not None:
        raise UserError(f"--tp {tp or 1} --pp {pp or 1}: {why} of {m.name}")
    result = plan_load(m, gpu, setup, tp=tp, pp=pp, max_gpus=o.max_gpus)
    if o.as_json:
        click.echo(report.load_json(result))
    elif o.quiet:
        click.echo(report.load_quiet_line(result))
    else:
        from planner.report.terminal import load_view
        show(load_view(result))
    if not result.fits:
        sys.exit(2)
