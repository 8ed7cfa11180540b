"""The command line. Only this module knows click; it parses, calls the API, prints.

User errors end with one line on stderr and exit status 2; internal errors with a
short message, a hint to report them, and exit status 1. No traceback reaches a user.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .errors import UserError
from .training import (ATTENTION, KERNELS, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_MICRO_BATCH,
                       MAX_SEQ_LEN, OPTIMIZERS, PRECISIONS, RECOMPUTE)

if TYPE_CHECKING:
    from .api import PlanResult
    from .crosscheck import Crosscheck
    from .emit import EmitOptions

ISSUES_HINT = "this is a bug in planner; please report it with the command you ran"


def _degree(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(f"--{name}", type=click.IntRange(1, MAX_GPUS), default=None,
                        help=f"Fix the {name.upper()} degree (default: searched).")


def layout_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `plan` and the commands that take a layout."""
    opts = [
        click.option("--model", "model_name", metavar="NAME|PATH",
                     help="A preset (`plan models`) or a Hugging Face config.json."),
        click.option("--gpus", "gpu_name", metavar="NAME", help="GPU type (`plan gpus`), e.g. h100."),
        click.option("--n-gpus", type=click.IntRange(1, MAX_GPUS), default=None,
                     help="Fix the GPU count (default: the smallest that fits)."),
        click.option("--max-gpus", type=click.IntRange(1, MAX_GPUS), default=16_384, show_default=True,
                     help="The largest GPU count the search tries."),
        _degree("dp"), _degree("tp"), _degree("pp"), _degree("cp"), _degree("ep"),
        click.option("--zero", type=click.IntRange(0, 3), default=None, help="Fix the ZeRO stage (0-3)."),
        click.option("--fsdp", type=click.Choice(["full", "grad-op", "hybrid"]), default=None,
                     help="Shard with PyTorch FSDP instead of ZeRO."),
        click.option("--vp", type=click.IntRange(1, 64), default=None,
                     help="Virtual stages per pipeline rank (interleaved 1F1B)."),
        click.option("--sp/--no-sp", default=None, help="Sequence parallelism with tp (default: on when tp > 1)."),
        click.option("--micro-batch", type=click.IntRange(1, MAX_MICRO_BATCH), default=None,
                     help="Fix the micro-batch (default: searched over 1, 2, 4, 8)."),
        click.option("--seq-len", type=click.IntRange(1, MAX_SEQ_LEN), default=4096, show_default=True,
                     help="Sequence length in tokens."),
        click.option("--global-batch", type=click.IntRange(1, MAX_GLOBAL_BATCH), default=None,
                     help="Sequences per optimizer step  [default: 1024]."),
        click.option("--grad-accum", type=click.IntRange(1, MAX_GLOBAL_BATCH), default=None,
                     help="Gradient-accumulation steps (sets the global batch; needs --micro-batch and --dp)."),
        click.option("--recompute", type=click.Choice(RECOMPUTE), default=None,
                     help="Activation recomputation (default: searched)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default="bf16-mixed", show_default=True),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True),
        click.option("--attention", type=click.Choice(ATTENTION), default="flash", show_default=True,
                     help="flash/SDPA, or eager that materialises the s x s scores."),
        click.option("--kernels", type=click.Choice(KERNELS), default="auto", show_default=True,
                     help="eager PyTorch ops (Hugging Face models) or fused Megatron kernels; auto: fused with tp/pp/cp."),
        click.option("--fragmentation", type=click.FloatRange(0, 1), default=None,
                     help="Allocator fragmentation as a fraction of tensor memory  [default: 0.10]."),
        click.option("--usable-memory", type=click.FloatRange(0.05, 1), default=1.0, show_default=True,
                     help="Fraction of the GPU's memory a plan may use."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema in the README)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the main `plan` command: configs to write, and DeepSpeed's cross-check."""
    offload = click.Choice(["none", "cpu", "nvme"])
    opts = [
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
                     help="Write the plan's configs here: ds_config.json, accelerate_config.yaml, "
                          "megatron_args.txt, hostfile, launch.sh, plan.json."),
        click.option("--force", is_flag=True, help="With --out, overwrite existing files."),
        click.option("--crosscheck", is_flag=True,
                     help="Compare model states with DeepSpeed's own estimators (imports deepspeed, ~2 s)."),
        click.option("--offload-optimizer", type=offload, default="none", show_default=True,
                     help="Offload optimizer states in the written configs and the cross-check "
                          "(memory figures do not subtract them yet)."),
        click.option("--offload-params", type=offload, default="none", show_default=True,
                     help="Offload parameters (ZeRO-3 or FSDP) in the written configs and the cross-check."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


class TokenCount(click.ParamType):
    """A token count: 2e12, 2000000000000, or with a suffix: 300B, 2T, 15.6T."""

    name = "N"
    SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        text = str(value).strip().replace("_", "").replace(",", "")
        scale = self.SUFFIXES.get(text[-1:].lower(), 1.0)
        try:
            n = float(text[:-1] if scale != 1.0 else text) * scale
        except ValueError:
            self.fail(f"{value!r} is not a token count (e.g. 2e12, 300B, 15T)", param, ctx)
        if not 0 < n < 1e18:
            self.fail(f"{value!r} must be between 1 and 1e18 tokens", param, ctx)
        return n


def time_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the step-time model: the cluster's wiring and the tokens to train on."""
    opts = [
        click.option("--topology", metavar="NAME|PATH", default=None,
                     help="Cluster topology: a shipped one (`plan topologies`) or a TOML file  "
                          "[default: the GPU's own, e.g. dgx-h100 for h100]."),
        click.option("--tokens", type=TokenCount(), default=None,
                     help="Tokens to train on (2e12, 300B): adds the time to train."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def run_safely(fn: Callable[[], None]) -> None:
    """Turn user errors into exit 2 and anything unexpected into exit 1, never a traceback."""
    try:
        fn()
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Exit:
        raise
    except click.ClickException:
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last line of defence
        click.echo(f"internal error: {type(e).__name__}: {e} ({ISSUES_HINT})", err=True)
        sys.exit(1)


def build_request(kw: dict[str, Any]):
    """Options -> (model, gpu, setup, space, n_gpus); raises UserError on bad input."""
    from dataclasses import replace

    from .hardware import get_gpu
    from .layouts import SearchSpace
    from .model import load_model
    from .training import Overheads, TrainingSetup

    if not kw["model_name"]:
        raise UserError("missing --model; pass a preset name (`plan models`) or a config.json path")
    if not kw["gpu_name"]:
        raise UserError("missing --gpus; pass a GPU type (`plan gpus`), e.g. --gpus h100")
    if "," in kw["gpu_name"]:
        raise UserError("--gpus takes one GPU type here; run one plan per type to compare them")
    m = load_model(kw["model_name"])
    gpu = get_gpu(kw["gpu_name"])
    if kw["precision"].startswith("bf16") and gpu.bf16_flops_per_s is None:
        raise UserError(f"{gpu.full_name} has no bf16 support; use --precision fp16-mixed or fp32")
    if kw["ep"] and kw["ep"] > 1 and not m.is_moe:
        raise UserError(f"--ep {kw['ep']} needs a mixture-of-experts model; {m.name} is dense")
    if kw["zero"] is not None and kw["fsdp"] is not None:
        from .layouts import FSDP_STAGE
        if FSDP_STAGE[f"fsdp-{kw['fsdp']}"] != kw["zero"]:
            raise UserError(f"--zero {kw['zero']} and --fsdp {kw['fsdp']} contradict each other; give one of them")
    global_batch = kw["global_batch"]
    if kw["grad_accum"] is not None:
        if kw["micro_batch"] is None or kw["dp"] is None:
            raise UserError("--grad-accum needs --micro-batch and --dp (or give --global-batch instead)")
        implied = kw["grad_accum"] * kw["micro_batch"] * kw["dp"] * (kw["ep"] or 1)
        if global_batch is not None and global_batch != implied:
            raise UserError(f"--global-batch {global_batch} contradicts --grad-accum x --micro-batch x --dp "
                            f"= {implied}; give one of them")
        global_batch = implied
    setup = TrainingSetup(seq_len=kw["seq_len"], global_batch=global_batch or 1024,
                          precision=kw["precision"], optimizer=kw["optimizer"],
                          attention=kw["attention"], kernels=kw["kernels"],
                          usable_memory_fraction=kw["usable_memory"])
    if kw["fragmentation"] is not None:
        setup = replace(setup, overheads=Overheads(fragmentation=kw["fragmentation"]))
    space = SearchSpace(
        dp=kw["dp"], tp=kw["tp"], pp=kw["pp"], cp=kw["cp"], ep=kw["ep"], zero_stage=kw["zero"],
        fsdp=kw["fsdp"], vp=kw["vp"], sp=kw["sp"],
        micro_batches=(kw["micro_batch"],) if kw["micro_batch"] else SearchSpace().micro_batches,
        recomputes=(kw["recompute"],) if kw["recompute"] else SearchSpace().recomputes,
    )
    if not m.is_moe and space.ep is None:
        space = replace(space, ep=1)
    return m, gpu, setup, space, kw["n_gpus"]


class PlanGroup(click.Group):
    """`plan [OPTIONS]` plans; `plan COMMAND` runs a subcommand."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage("plan", "--model NAME|PATH --gpus NAME [OPTIONS]\n       plan COMMAND [ARGS]")


@click.group(cls=PlanGroup, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@layout_options
@time_options
@output_options
@click.version_option(package_name="planner", prog_name="planner")
@click.pass_context
def cli(ctx: click.Context, **kw: Any) -> None:
    """Plan a distributed training run: how many GPUs, which layout, and the memory
    per rank by category.

    \b
      plan --model 70b --gpus h100
      plan --model llama3.1-8b --gpus a100 --dp 8 --zero 3 --micro-batch 2 --recompute none
      plan --model ./config.json --gpus h100 --json
    """
    if ctx.invoked_subcommand is not None:
        return
    if not kw["model_name"] and not kw["gpu_name"]:
        click.echo(ctx.get_help())
        return
    run_safely(lambda: _plan(kw))


def _plan(kw: dict[str, Any]) -> None:
    from . import api, report

    m, gpu, setup, space, n_gpus = build_request(kw)
    lay = api.fixed_layout(space, setup, n_gpus)
    if lay is not None:
        result = api.evaluate_layout(m, gpu, setup, lay, **_timing(kw, gpu))
    else:
        result = api.plan(m, gpu, setup, space, n_gpus=n_gpus, max_gpus=kw["max_gpus"], **_timing(kw, gpu))
    opts = _emit_options(kw)
    if opts.offloads and result.best is not None:
        from .emit import check_options
        check_options(result, opts)
    crosscheck = None
    if kw["crosscheck"]:
        import os

        from .crosscheck import crosscheck as run_crosscheck
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # estimators need no accelerator; skip its probe
        crosscheck = run_crosscheck(result, opts.offload_optimizer, opts.offload_params)
    written, not_written = [], None
    if kw["out"] is not None:
        if result.best is not None and result.best.fits:
            written = _write_out(result, kw, opts, crosscheck)   # before printing: errors come alone
        else:
            not_written = UserError(f"no plan fits, so nothing was written to --out {kw['out']}")
    if kw["as_json"]:
        click.echo(report.to_json(result, crosscheck))
    else:
        click.echo(report.to_text(result, crosscheck))
    if written:
        click.echo(f"wrote {', '.join(p.name for p in written)} to {kw['out']}", err=kw["as_json"])
    if not_written is not None:
        raise not_written
    if result.best is None and not kw["as_json"]:
        sys.exit(2)


def _timing(kw: dict[str, Any], gpu: Any) -> dict[str, Any]:
    """The cluster (--topology, else the GPU's default) and --tokens for the step times."""
    from .timing import cluster_for

    return {"cluster": cluster_for(gpu, kw["topology"]), "tokens": kw["tokens"]}


def _emit_options(kw: dict[str, Any]) -> EmitOptions:
    from .emit import EmitOptions

    if kw["force"] and kw["out"] is None:
        raise UserError("--force needs --out DIR")
    return EmitOptions(offload_optimizer=kw["offload_optimizer"], offload_params=kw["offload_params"])


def _write_out(result: PlanResult, kw: dict[str, Any], opts: EmitOptions,
               crosscheck: Crosscheck | None) -> list[Path]:
    """Write the chosen plan's configs to --out (atomically; existing files need --force)."""
    from . import report
    from .emit import plan_files
    from .emit.write import write_files

    files = plan_files(result, opts, report.plan_json(result, crosscheck))
    return write_files(kw["out"], files, force=kw["force"])


@cli.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models_cmd(as_json: bool) -> None:
    """List the model presets with their parameter counts."""
    def go() -> None:
        from .model import count_params, load_preset, load_presets
        rows = []
        for name, p in load_presets().items():
            pc = count_params(load_preset(name))
            rows.append({"name": name, "n_params": pc.total, "n_active_params": pc.active,
                         "aliases": list(p.aliases), "description": p.description, "source": p.source})
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        click.echo(f"{'name':<16} {'parameters':>17} {'active':>17}  aliases")
        for r in rows:
            active = f"{r['n_active_params']:,}" if r["n_active_params"] != r["n_params"] else ""
            click.echo(f"{r['name']:<16} {r['n_params']:>17,} {active:>17}  {', '.join(r['aliases'])}")
    run_safely(go)


@cli.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def gpus_cmd(as_json: bool) -> None:
    """List the GPU catalog."""
    def go() -> None:
        from .hardware import list_gpus
        from .units import GiB
        gpus = list_gpus()
        if as_json:
            click.echo(json.dumps([{
                "name": g.name, "full_name": g.full_name, "memory_bytes": g.memory_bytes,
                "bf16_flops_per_s": g.bf16_flops_per_s, "hbm_bytes_per_s": g.hbm_bytes_per_s,
                "gpus_per_node": g.gpus_per_node, "intra_node_link": g.intra_node_link,
                "source": g.source} for g in gpus], indent=2))
            return
        click.echo(f"{'name':<10} {'memory':>10} {'bf16 TFLOP/s':>13} {'HBM TB/s':>9} {'per node':>9}  link / full name")
        for g in gpus:
            bf16 = f"{g.bf16_flops_per_s / 1e12:.1f}" if g.bf16_flops_per_s else "-"
            click.echo(f"{g.name:<10} {g.memory_bytes / GiB:>6.1f} GiB {bf16:>13} "
                       f"{g.hbm_bytes_per_s / 1e12:>9.2f} {g.gpus_per_node:>9}  {g.intra_node_link}; {g.full_name}")
    run_safely(go)


@cli.command("topologies")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def topologies_cmd(as_json: bool) -> None:
    """List the shipped cluster topologies (pass one with --topology NAME, or your own file
    with --topology PATH; see topologies/README.md)."""
    def go() -> None:
        from . import report
        rows = report.topologies_json()
        click.echo(json.dumps(rows, indent=2) if as_json else report.topologies_text(rows))
    run_safely(go)


@cli.command("measure")
@layout_options
@click.option("--real", is_flag=True,
              help="Run on this machine's CUDA GPUs for real (torchrun, one process per GPU) "
                   "instead of fake tensors on the CPU.")
def measure_cmd(real: bool, **kw: Any) -> None:
    """Run real training steps of the model under PyTorch's memory trackers and print the
    planner's prediction beside the measurement, per category.

    \b
    Without GPUs the step runs under fake tensors with a fake process group of the
    planned data-parallel size, so a 70B model costs no real memory. Measurable: data
    parallelism with --zero 0 (replicated), --zero 2 / --fsdp grad-op, --zero 3 /
    --fsdp full; tensor, pipeline, context and expert parallelism are not (transformers'
    models are not split across ranks).

    \b
      plan measure --model llama3.1-8b --gpus h100 --dp 8 --zero 3 --seq-len 2048 --micro-batch 1
    """
    run_safely(lambda: _measure(kw, real))


def _measure(kw: dict[str, Any], real: bool) -> None:
    from . import accuracy, report
    from .model import load_hf_config

    for axis in ("dp", "tp", "pp", "cp", "ep"):
        kw[axis] = kw[axis] or 1
    if kw["zero"] is None and kw["fsdp"] is None:
        kw["zero"] = 0
    kw["micro_batch"] = kw["micro_batch"] or 1
    kw["recompute"] = kw["recompute"] or "none"
    if not kw["gpu_name"]:
        kw["gpu_name"] = "h100"
    m, gpu, setup, space, n_gpus = build_request(kw)
    from dataclasses import replace
    from .api import fixed_layout
    from .layouts import reject_reason

    setup = replace(setup, global_batch=kw["micro_batch"] * kw["dp"] * kw["ep"])
    lay = fixed_layout(space, setup, n_gpus)
    assert lay is not None
    reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
    if reason:
        raise UserError(f"layout {lay.describe()} cannot run: {reason}")
    cmp = accuracy.compare(m, load_hf_config(kw["model_name"]), setup, lay, fake=not real)
    if kw["as_json"]:
        click.echo(json.dumps(report.comparison_json(m, gpu, cmp), indent=2))
    else:
        click.echo(report.comparison_text(m, gpu, cmp))


def main() -> None:
    cli(prog_name="plan")


if __name__ == "__main__":
    main()
