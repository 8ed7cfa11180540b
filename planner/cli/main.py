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

from planner.cli.sizes import SeqLength, SequenceCount, TokenBatch, global_batch_from
from planner.report.advice import contradicting_options, degree_conflict
from planner.errors import UserError
from planner.training.finetune import METHODS, QUANTS
from planner.training.setup import (ATTENTION, KERNELS, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_MICRO_BATCH,
                       MAX_SEQ_LEN, OPTIMIZERS, PRECISIONS, RECOMPUTE)

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.measure.crosscheck import Crosscheck
    from planner.emit import EmitOptions

ISSUES_HINT = "this is a bug in planner; please report it with the command you ran"


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan (which passes every range comparison)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        out = super().convert(value, param, ctx)
        if out != out:
            self.fail(f"{value!r} is not a number", param, ctx)
        return out


def _complete_names(load: Callable[[], list[str]], incomplete: str, paths: bool = False,
                    lists: bool = False) -> list[Any]:
    """Shell completion: the catalog names ``load`` gives that start with what was typed (with
    ``lists``, the last item of a comma-separated list); with ``paths``, a path completes as a
    file. A catalog that fails to load completes nothing rather than print into the shell."""
    from click.shell_completion import CompletionItem

    if paths and (incomplete.startswith((".", "/", "~")) or "/" in incomplete):
        return [CompletionItem(incomplete, type="file")]
    head, _, last = incomplete.rpartition(",") if lists else ("", "", incomplete)
    prefix = head + "," if head else ""
    try:
        names = sorted(set(load()))
    except Exception:   # completion must never print a traceback into the shell
        return []
    return [CompletionItem(prefix + n) for n in names if n.startswith(last.lower())]


def _model_names() -> list[str]:
    from planner.models.spec import load_presets

    return [n for p in load_presets().values() for n in (p.name, *p.aliases)]


def _gpu_names() -> list[str]:
    from planner.hardware.gpus import list_gpus

    return [n for g in list_gpus() for n in (g.name, *g.aliases)]


def _topology_names() -> list[str]:
    import importlib.resources    # the file names, without topology.py's networkx

    files = importlib.resources.files("planner") / "presets" / "topologies"
    return [f.name[:-5] for f in files.iterdir() if f.name.endswith(".toml")]


def _complete_models(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    return _complete_names(_model_names, incomplete, paths=True)


def _complete_gpus(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    return _complete_names(_gpu_names, incomplete, lists=True)


def _complete_topologies(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    return _complete_names(_topology_names, incomplete, paths=True)


def _degree(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(f"--{name}", type=click.IntRange(1, MAX_GPUS), default=None,
                        help=f"Fix the {name.upper()} degree (default: searched).")


def layout_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `plan` and the commands that take a layout."""
    opts = [
        click.option("--model", "model_name", metavar="NAME|PATH", shell_complete=_complete_models,
                     help="A preset (`plan models`) or a Hugging Face config.json."),
        click.option("--gpus", "gpu_name", metavar="NAME", shell_complete=_complete_gpus, help="GPU type (`plan gpus`), e.g. h100; with --tokens "
                                                                "a list to choose from, e.g. h100,a100."),
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
        click.option("--seq-len", type=SeqLength(MAX_SEQ_LEN), default=4096, show_default=True,
                     help="Sequence length in tokens: 4096, 8k, 128k (k = 1,024)."),
        click.option("--global-batch", type=SequenceCount(MAX_GLOBAL_BATCH), default=None,
                     help="Sequences per optimizer step  [default: 1024]."),
        click.option("--global-batch-tokens", type=TokenBatch(), default=None,
                     help="Tokens per optimizer step instead: 4M, 512k (binary: 4M = 4,194,304), "
                          "divided by --seq-len to the nearest whole sequence."),
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
        click.option("--fragmentation", type=FiniteFloatRange(0, 1), default=None,
                     help="Allocator fragmentation as a fraction of tensor memory  [default: 0.10]."),
        click.option("--usable-memory", type=FiniteFloatRange(0.05, 1), default=1.0, show_default=True,
                     help="Fraction of the GPU's memory a plan may use."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema in the README)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def method_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The fine-tuning method (planner.training.finetune), for `plan` and `plan measure`."""
    opts = [
        click.option("--method", type=click.Choice([*METHODS, "auto"]), default="full", show_default=True,
                     help="What trains: full; lora (16-bit frozen base, adapters); qlora (4-bit NF4 base, "
                          "16-bit adapters, paged 8-bit AdamW); freeze (only the last blocks); auto: full, "
                          "lora or qlora, whichever fits on the fewest GPUs (full first on a tie)."),
        click.option("--lora-rank", type=click.IntRange(1, 65536), default=None,
                     help="LoRA rank r  [default: 8; qlora: 64]."),
        click.option("--lora-alpha", type=click.IntRange(1, 1 << 20), default=None,
                     help="LoRA alpha (scales the update, costs no memory)  [default: 8; qlora: 16]."),
        click.option("--lora-targets", metavar="LIST", default=None,
                     help="Comma-separated layers to adapt: attention, mlp, all-linear, or module names "
                          "(q_proj,v_proj)  [default: PEFT's for the architecture; qlora: all-linear]."),
        click.option("--lora-dropout", type=FiniteFloatRange(0, 1, max_open=True), default=None,
                     help="LoRA dropout; > 0 keeps a mask and a copy of each adapted input  [default: 0]."),
        click.option("--quant", type=click.Choice(QUANTS), default=None,
                     help="Store the frozen base's linear weights as int8, int4 or nf4 (--method lora, "
                          "or --task load)  [default: none; qlora: nf4]."),
        click.option("--trainable-layers", type=click.IntRange(1, 1 << 20), default=None,
                     help="With --method freeze: how many of the last blocks train  [default: 2]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def task_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`plan --task load`: inference memory instead of a training plan."""
    return click.option(
        "--task", type=click.Choice(["train", "load"]), default="train", show_default=True,
        help="train: a training plan; load: the memory to hold the model for inference (weights at "
             "--precision or --quant, KV cache for --micro-batch sequences of --seq-len tokens).")(f)


def finetune_spec(kw: dict[str, Any], method: str | None = None):  # noqa: ANN201 - FinetuneSpec
    """--method and its options -> FinetuneSpec (``method`` overrides --method, for auto)."""
    from planner.training.finetune import FinetuneSpec

    name = method or kw.get("method") or "full"
    targets = None
    if kw.get("lora_targets"):
        targets = tuple(t.strip() for t in kw["lora_targets"].split(",") if t.strip())
        if not targets:
            raise UserError("--lora-targets is empty; give module names or attention, mlp, all-linear")
    lora_opts = [o for o in ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout") if kw.get(o) is not None]
    if name in ("full", "freeze") and lora_opts and method is None:
        raise UserError(f"--{lora_opts[0].replace('_', '-')} needs --method lora or qlora")
    if kw.get("trainable_layers") is not None and name != "freeze" and method is None:
        raise UserError("--trainable-layers needs --method freeze")
    quant = kw.get("quant")
    if quant is not None and name not in ("lora", "qlora") and method is None:
        raise UserError(f"--quant {quant} stores a frozen base: use it with --method lora (or qlora), "
                        f"or with --task load")
    if name == "qlora" and quant not in (None, "nf4"):
        raise UserError(f"--method qlora stores the base as nf4; for an {quant} base use --method lora --quant {quant}")
    return FinetuneSpec.named(name, rank=kw.get("lora_rank"), alpha=kw.get("lora_alpha"), targets=targets,
                              dropout=kw.get("lora_dropout"),
                              quant=quant if name in ("lora", "qlora") else None,
                              trainable_layers=kw.get("trainable_layers"))


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the main `plan` command: configs to write, and DeepSpeed's cross-check."""
    offload = click.Choice(["none", "cpu", "nvme"])
    opts = [
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
                     help="Write the plan's configs here: ds_config.json, accelerate_config.yaml, "
                          "megatron_args.txt, hostfile, launch.sh, plan.json."),
        click.option("--force", is_flag=True, help="With --out or --plot, overwrite existing files."),
        click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
                     help="Draw the plan into FILE (.png or .svg): memory per rank by category against the "
                          "GPU's capacity, and time (with --tokens, cost) against GPU count."),
        click.option("--crosscheck", is_flag=True,
                     help="Compare model states with DeepSpeed's own estimators (imports deepspeed, ~2 s)."),
        click.option("--offload-optimizer", type=offload, default="none", show_default=True,
                     help="ZeRO-Offload: optimizer states (and fp32 gradients) in CPU memory or on NVMe; "
                          "the GPU memory left and the CPU memory per node are planned (ZeRO-1 or higher)."),
        click.option("--offload-params", type=offload, default="none", show_default=True,
                     help="ZeRO-Infinity / FSDP CPU offload: parameters in CPU memory or on NVMe "
                          "(ZeRO-3 or FSDP full sharding; FSDP also moves gradients and optimizer states)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


class ScaledNumber(click.ParamType):
    """A positive number with an optional suffix (SUFFIXES), between 0 and UPPER
    (exclusive); subclasses name it and say what a good value looks like."""

    SUFFIXES: dict[str, float] = {}
    UPPER = 1e18
    EXAMPLES = ""
    STRIP = ""

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        text = str(value).strip().lstrip(self.STRIP).replace("_", "").replace(",", "")
        scale = self.SUFFIXES.get(text[-1:].lower(), 1.0)
        try:
            n = float(text[:-1] if scale != 1.0 else text) * scale
        except ValueError:
            self.fail(f"{value!r} is not {self.what} (e.g. {self.EXAMPLES})", param, ctx)
        if not 0 < n < self.UPPER:
            self.fail(f"{value!r} must be {self.bounds}", param, ctx)
        return n


class TokenCount(ScaledNumber):
    """A token count: 2e12, 2000000000000, or with a suffix: 300B, 2T, 15.6T."""

    name = "N"
    SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    what, EXAMPLES, bounds = "a token count", "2e12, 300B, 15T", "between 1 and 1e18 tokens"


def time_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the step-time model: the cluster's wiring and the tokens to train on."""
    opts = [
        click.option("--topology", metavar="NAME|PATH", default=None, shell_complete=_complete_topologies,
                     help="Cluster topology: a shipped one (`plan topologies`) or a TOML file  "
                          "[default: the GPU's own, e.g. dgx-h100 for h100]."),
        click.option("--tokens", type=TokenCount(), default=None,
                     help="Tokens to train on (2e12, 300B): the plan then minimises the cost (or time) of "
                          "training on them, over GPU counts (and the GPU types --gpus lists), by an ILP."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


class Dollars(ScaledNumber):
    """An amount in US dollars: 250000, 250k, 1.5M, $2M."""

    name = "USD"
    SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9}
    UPPER, STRIP = 1e15, "$"
    what, EXAMPLES, bounds = "an amount in dollars", "250000, 250k, 1.5M", "a positive amount in dollars"


def cost_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options of the cost objective (`plan --tokens`): constraints, prices, the solver."""
    opts = [
        click.option("--deadline", metavar="DURATION|DATE", default=None,
                     help="With --tokens: finish within this long (30d, 12h, 2w) or by this date (2026-03-01)."),
        click.option("--budget", type=Dollars(), default=None,
                     help="With --tokens: spend at most this many US dollars (250k, 1.5M)."),
        click.option("--objective", type=click.Choice(["cost", "time"]), default=None,
                     help="With --tokens: what to minimise  [default: cost]."),
        click.option("--prices", "prices_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     metavar="PATH", help="A TOML file overriding entries of the price catalog (`plan gpus`)."),
        click.option("--solver", type=click.Choice(["auto", "highs", "cbc"]), default="auto", show_default=True,
                     help="The ILP solver: HiGHS when highspy is installed (auto), else PuLP's bundled CBC."),
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
    except BrokenPipeError:
        _reader_left()
    except Exception as e:  # noqa: BLE001 - the last line of defence
        import os

        if os.environ.get("PLANNER_TRACEBACK"):     # for a bug report: where it happened
            raise
        click.echo(f"internal error: {type(e).__name__}: {e} ({ISSUES_HINT})", err=True)
        sys.exit(1)


def quiet_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """--quiet: the answer on one line, for scripts."""
    return click.option("--quiet", "-q", "quiet", is_flag=True,
                        help="Print only the answer, on one line (not with --json).")(f)


def _check_quiet(quiet: bool | None, as_json: bool) -> None:
    if quiet and as_json:
        raise UserError("--quiet and --json cannot be used together; give one of them")


def _say_written(kw: dict[str, Any], written: list[Path], plotted: Path | None) -> None:
    """Name the files --out and --plot wrote (on stderr when stdout is --json or --quiet)."""
    if written:
        click.echo(f"wrote {', '.join(p.name for p in written)} to {kw['out']}", err=_aside(kw))
    if plotted is not None:
        click.echo(f"wrote the plot to {plotted}", err=_aside(kw))


def _aside(kw: dict[str, Any]) -> bool:
    """Notes (files written) go to stderr when stdout holds JSON or the one-line answer."""
    return bool(kw.get("as_json") or kw.get("quiet"))


def _show(parts: list[Any]) -> None:
    """Print a human report (planner.report.terminal) on stdout: colour only on a terminal."""
    from planner.report import terminal as term

    screen = term.screen_for(sys.stdout)
    click.echo(term.render(parts, screen), color=screen.colour)


def _progress(kw: dict[str, Any], description: str) -> Any:
    """A progress bar on stderr for work that may run past a second; none with --json or --quiet."""
    from planner.report import terminal as term

    return term.progress(description, enabled=not _aside(kw))


def _per_count(update: Any, gpu_name: str) -> Callable[[int, int, int], None]:
    """api.plan's progress(n_gpus, i, n_counts) -> the bar."""
    return lambda n, i, total: update(i, total, f"searching layouts on {n:,} x {gpu_name}")


def build_request(kw: dict[str, Any]):
    """Options -> (model, gpu, setup, space, n_gpus); raises UserError on bad input."""
    from dataclasses import replace

    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import SearchSpace
    from planner.models.spec import load_model
    from planner.training.setup import Overheads, TrainingSetup

    if not kw["model_name"]:
        raise UserError("missing --model; pass a preset name (`plan models`) or a config.json path")
    if not kw["gpu_name"]:
        raise UserError("missing --gpus; pass a GPU type (`plan gpus`), e.g. --gpus h100")
    if "," in kw["gpu_name"]:
        raise UserError("--gpus takes one GPU type without --tokens; give --tokens N to let the planner "
                        "choose among several (--gpus h100,a100) by cost")
    clash = contradicting_options(kw)
    if clash:
        raise UserError(clash)
    m = load_model(kw["model_name"])
    gpu = get_gpu(kw["gpu_name"])
    if kw["precision"].startswith("bf16") and gpu.bf16_flops_per_s is None:
        raise UserError(f"{gpu.full_name} has no bf16 support; use --precision fp16-mixed or fp32")
    if kw["ep"] and kw["ep"] > 1 and not m.is_moe:
        raise UserError(f"--ep {kw['ep']} needs a mixture-of-experts model; {m.name} is dense")
    if kw["zero"] is not None and kw["fsdp"] is not None:
        from planner.layouts.layout import FSDP_STAGE
        if FSDP_STAGE[f"fsdp-{kw['fsdp']}"] != kw["zero"]:
            raise UserError(f"--zero {kw['zero']} and --fsdp {kw['fsdp']} contradict each other; give one of them")
    global_batch = global_batch_from(kw, MAX_GLOBAL_BATCH)
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
                          usable_memory_fraction=kw["usable_memory"],
                          finetune=finetune_spec(kw, "full" if kw.get("method") == "auto" else None),
                          offload_optimizer=kw.get("offload_optimizer") or "none",
                          offload_params=kw.get("offload_params") or "none")
    if kw["fragmentation"] is not None:
        setup = replace(setup, overheads=Overheads(fragmentation=kw["fragmentation"]))
    clash = degree_conflict(m, setup, kw)
    if clash:
        raise UserError(clash)
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
@method_options
@task_options
@time_options
@cost_options
@output_options
@quiet_option
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
    from planner import api
    from planner.report import text as report

    _check_quiet(kw.get("quiet"), kw["as_json"])
    if kw.get("plot") is not None:      # a bad name or an existing file: refused before the search
        from planner.report.plot import plot_format
        if kw.get("task") == "load":
            raise UserError("--plot draws a training plan; --task load has no plot")
        plot_format(kw["plot"], kw["force"])
    if kw.get("task") == "load":
        _load(kw)
        return
    if kw.get("tokens") is not None:
        _plan_cost(kw)
        return
    for name in ("deadline", "budget", "objective"):
        if kw.get(name) is not None:
            raise UserError(f"--{name} needs --tokens N: the time and cost of a plan depend on the tokens to train on")
    m, gpu, setup, space, n_gpus = build_request(kw)
    lay = api.fixed_layout(space, setup, n_gpus)
    if kw.get("method") == "auto":
        specs = tuple(finetune_spec(kw, name) for name in api.AUTO_METHODS)
        if lay is not None:
            from dataclasses import replace
            results = [api.evaluate_layout(m, gpu, replace(setup, finetune=ft), lay, **_timing(kw, gpu))
                       for ft in specs]
            result = next((r for r in results if r.fits), results[-1])
            result = replace(result, methods_tried=api.AUTO_METHODS)
        else:
            with _progress(kw, f"searching layouts on {gpu.name}") as bar:
                result = api.plan_methods(m, gpu, setup, specs, space, n_gpus=n_gpus, max_gpus=kw["max_gpus"],
                                          progress=_per_count(bar, gpu.name), **_timing(kw, gpu))
    elif lay is not None:
        result = api.evaluate_layout(m, gpu, setup, lay, **_timing(kw, gpu))
    else:
        with _progress(kw, f"searching layouts on {gpu.name}") as bar:
            result = api.plan(m, gpu, setup, space, n_gpus=n_gpus, max_gpus=kw["max_gpus"],
                              progress=_per_count(bar, gpu.name), **_timing(kw, gpu))
    opts = _emit_options(kw)
    if opts.offloads and result.best is not None:
        from planner.emit import check_options
        check_options(result, opts)
    crosscheck = None
    if kw["crosscheck"]:
        import os

        from planner.measure.crosscheck import crosscheck as run_crosscheck
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # estimators need no accelerator; skip its probe
        crosscheck = run_crosscheck(result, opts.offload_optimizer, opts.offload_params)
    written, not_written = [], None
    if kw["out"] is not None:
        if result.best is not None and result.best.fits:
            written = _write_out(result, kw, opts, crosscheck)   # before printing: errors come alone
        else:
            not_written = UserError(f"no plan fits, so nothing was written to --out {kw['out']}")
    plotted = None
    if kw.get("plot") is not None:
        from planner.report import plot
        fig = plot.plan_figure(result, api.scaling(result, space, kw["max_gpus"]))
        plotted = plot.save(fig, kw["plot"], force=kw["force"])
    if kw["as_json"]:
        d = report.plan_json(result, crosscheck)
        if result.best is None:
            from planner.report.advice import fit_advice
            d["advice"] = fit_advice(result)
        click.echo(json.dumps(d, indent=2))
    elif kw.get("quiet"):
        click.echo(report.quiet_line(result))
    else:
        from planner.report.terminal import plan_view
        _show(plan_view(result, crosscheck))
    _say_written(kw, written, plotted)
    if not_written is not None:
        raise not_written
    if result.best is None:
        sys.exit(2)                     # nothing fits: a user error, with --json too


def _plan_cost(kw: dict[str, Any]) -> None:
    """`plan --tokens N`: the plan that minimises the cost (or time) of training on N tokens,
    chosen by an ILP over GPU types, counts and layouts (planner.cost.plan)."""
    from datetime import datetime, timezone

    from planner import api
    from planner.report import text as report
    from planner.cost.prices import load_prices
    from planner.cost.plan import plan_cost
    from planner.hardware.gpus import get_gpu
    from planner.cost.jobs import parse_when_s
    from planner.layouts.layout import reject_reason
    from planner.cost.solve import Limits

    if not kw["model_name"]:
        raise UserError("missing --model; pass a preset name (`plan models`) or a config.json path")
    names = [g.strip() for g in (kw["gpu_name"] or "").split(",") if g.strip()]
    if not names:
        raise UserError("missing --gpus; pass one GPU type or several (--gpus h100,a100), see `plan gpus`")
    gpus = [get_gpu(n) for n in names]
    if len({g.name for g in gpus}) != len(gpus):
        raise UserError(f"--gpus {kw['gpu_name']} names a GPU type twice")
    if kw.get("method") == "auto":
        raise UserError("--method auto picks the method on the fewest GPUs; with --tokens give one method "
                        "(full, lora, qlora, freeze) and compare them by running the plan per method")
    m, _, setup, space, n_gpus = build_request({**kw, "gpu_name": gpus[0].name})
    deadline_s = None
    if kw["deadline"] is not None:
        deadline_s, _ = parse_when_s(kw["deadline"], "--deadline", datetime.now(timezone.utc))
        if deadline_s <= 0:
            raise UserError(f"--deadline {kw['deadline']} is in the past; give a later date or a duration (30d)")
    lay = api.fixed_layout(space, setup, n_gpus)
    if lay is not None:
        for gpu in gpus:
            reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
            if reason:
                raise UserError(f"layout {lay.describe()} cannot run: {reason}")
            fixed = api.evaluate_layout(m, gpu, setup, lay, **_timing(kw, gpu))
            if not fixed.fits:
                raise UserError(f"layout {lay.describe()} does not fit on {gpu.name}; run the plan without "
                                f"--tokens to see its memory by category")
        n_gpus = lay.n_gpus
    with _progress(kw, f"sweeping GPU counts of {', '.join(g.name for g in gpus)} and solving the ILP"):
        r = plan_cost(m, gpus, setup, kw["tokens"], load_prices(kw["prices_path"]), space,
                      objective=kw["objective"] or "cost",
                      limits=Limits(deadline_s=deadline_s, budget_usd=kw["budget"], max_gpus=kw["max_gpus"]),
                      n_gpus=n_gpus, topology=kw["topology"], solver=kw["solver"])
    result = r.result
    opts = _emit_options(kw)
    if opts.offloads and result.best is not None:
        from planner.emit import check_options
        check_options(result, opts)
    crosscheck = None
    if kw["crosscheck"] and result.best is not None:
        import os

        from planner.measure.crosscheck import crosscheck as run_crosscheck
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        crosscheck = run_crosscheck(result, opts.offload_optimizer, opts.offload_params)
    written = []
    if kw["out"] is not None:
        if result.best is None:
            raise UserError(f"no plan satisfies the constraints, so nothing was written to --out {kw['out']}")
        written = _write_out(result, kw, opts, crosscheck)
    plotted = None
    if kw.get("plot") is not None:
        from planner.report import plot
        plotted = plot.save(plot.cost_figure(r), kw["plot"], force=kw["force"])
    if kw["as_json"]:
        click.echo(json.dumps(report.cost_json(r, crosscheck), indent=2))
    elif kw.get("quiet"):
        click.echo(report.cost_quiet_line(r))
    else:
        from planner.report.terminal import cost_view
        _show(cost_view(r, crosscheck))
    _say_written(kw, written, plotted)
    if r.chosen is None:
        sys.exit(2)


def _load(kw: dict[str, Any]) -> None:
    """`plan --task load`: weights, KV cache and working memory on the fewest GPUs."""
    from dataclasses import replace

    from planner.report import text as report
    from planner.hardware.gpus import get_gpu
    from planner.memory.inference import LoadSetup, plan_load
    from planner.models.spec import load_model
    from planner.training.setup import Overheads

    if not kw["model_name"] or not kw["gpu_name"]:
        raise UserError("--task load needs --model and --gpus")
    if kw.get("method") not in (None, "full"):
        raise UserError("--task load sizes a model for inference; drop --method (use --quant for quantized weights)")
    for name in ("dp", "cp", "ep", "zero", "fsdp", "recompute", "grad_accum", "global_batch", "global_batch_tokens"):
        if kw.get(name) is not None:
            raise UserError(f"--{name.replace('_', '-')} is a training option; --task load takes --tp, --pp, "
                            f"--micro-batch (sequences held at once) and --seq-len (their context)")
    m, gpu = load_model(kw["model_name"]), get_gpu(kw["gpu_name"])
    wb = 4 if kw["precision"] == "fp32" else 2
    setup = LoadSetup(weight_bytes=wb, quant=kw.get("quant") or "none", batch=kw["micro_batch"] or 1,
                      context=kw["seq_len"], kv_bytes=wb, usable_memory_fraction=kw["usable_memory"])
    if kw["fragmentation"] is not None:
        setup = replace(setup, overheads=Overheads(fragmentation=kw["fragmentation"]))
    tp, pp = kw["tp"], kw["pp"]
    if kw["n_gpus"] is not None and tp is None and pp is None:
        tp, pp = (kw["n_gpus"], 1) if kw["n_gpus"] <= gpu.gpus_per_node else (gpu.gpus_per_node,
                                                                              kw["n_gpus"] // gpu.gpus_per_node)
    if tp is not None and (m.n_heads % tp or (m.n_kv_heads % tp and tp % m.n_kv_heads)):
        raise UserError(f"--tp {tp} does not split the {m.n_heads} heads ({m.n_kv_heads} KV heads) evenly")
    if pp is not None and pp > m.n_layers:
        raise UserError(f"--pp {pp} exceeds the {m.n_layers} layers")
    result = plan_load(m, gpu, setup, tp=tp, pp=pp, max_gpus=kw["max_gpus"])
    if kw["as_json"]:
        click.echo(report.load_json(result))
    elif kw.get("quiet"):
        click.echo(report.load_quiet_line(result))
    else:
        from planner.report.terminal import load_view
        _show(load_view(result))
    if not result.fits:
        sys.exit(2)


def _timing(kw: dict[str, Any], gpu: Any) -> dict[str, Any]:
    """The cluster (--topology, else the GPU's default) and --tokens for the step times."""
    from planner.timing.model import cluster_for

    return {"cluster": cluster_for(gpu, kw["topology"]), "tokens": kw["tokens"]}


def _emit_options(kw: dict[str, Any]) -> EmitOptions:
    from planner.emit import EmitOptions

    if kw["force"] and kw["out"] is None and kw.get("plot") is None:
        raise UserError("--force needs --out DIR or --plot FILE")
    return EmitOptions(offload_optimizer=kw["offload_optimizer"], offload_params=kw["offload_params"])


def _write_out(result: PlanResult, kw: dict[str, Any], opts: EmitOptions,
               crosscheck: Crosscheck | None) -> list[Path]:
    """Write the chosen plan's configs to --out (atomically; existing files need --force)."""
    from planner.report import text as report
    from planner.emit import plan_files
    from planner.emit.write import write_files

    files = plan_files(result, opts, report.plan_json(result, crosscheck))
    return write_files(kw["out"], files, force=kw["force"])


@cli.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def models_cmd(as_json: bool) -> None:
    """List the model presets with their parameter counts."""
    def go() -> None:
        from planner.models.spec import count_params, load_preset, load_presets
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
@click.option("--prices", "prices_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="PATH", help="A TOML file overriding entries of the price catalog.")
def gpus_cmd(as_json: bool, prices_path: Path | None) -> None:
    """List the GPU catalog with its prices: rental per GPU-hour, a node's purchase price
    and power (presets/prices.toml, each with its source and date)."""
    def go() -> None:
        from planner.report import text as report
        from planner.cost.prices import load_prices
        from planner.hardware.gpus import list_gpus
        from planner.units import GiB
        gpus = list_gpus()
        prices = load_prices(prices_path)
        priced = report.prices_json(prices, [g.name for g in gpus])
        if as_json:
            click.echo(json.dumps([{
                "name": g.name, "full_name": g.full_name, "memory_bytes": g.memory_bytes,
                "bf16_flops_per_s": g.bf16_flops_per_s, "hbm_bytes_per_s": g.hbm_bytes_per_s,
                "gpus_per_node": g.gpus_per_node, "intra_node_link": g.intra_node_link,
                "source": g.source, "prices": priced[g.name]} for g in gpus], indent=2))
            return
        click.echo(f"{'name':<10} {'memory':>10} {'bf16 TFLOP/s':>13} {'HBM TB/s':>9} {'per node':>9} "
                   f"{'$/GPU-h':>8} {'node $':>9} {'node kW':>8}  link / full name")
        for g in gpus:
            bf16 = f"{g.bf16_flops_per_s / 1e12:.1f}" if g.bf16_flops_per_s else "-"
            click.echo(f"{g.name:<10} {g.memory_bytes / GiB:>6.1f} GiB {bf16:>13} "
                       f"{g.hbm_bytes_per_s / 1e12:>9.2f} {g.gpus_per_node:>9} "
                       f"{report.gpu_price_cells(prices.for_gpu(g.name))}  {g.intra_node_link}; {g.full_name}")
        click.echo("")
        click.echo(report.price_sources_text(prices, [g.name for g in gpus]))
    run_safely(go)


@cli.command("buy")
@click.argument("jobs_path", metavar="JOBS.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--gpus", "gpu_names", metavar="LIST", default=None, shell_complete=_complete_gpus,
              help="GPU types to choose from, e.g. h100,h200,b200  [default: the file's gpus, else h100,h200,b200].")
@click.option("--budget", type=Dollars(), default=None, help="Spend at most this much over the horizon (purchase + power).")
@click.option("--horizon", metavar="DURATION", default=None,
              help="How long the cluster is owned and powered (365d, 52w)  [default: the file's horizon, else 365d].")
@click.option("--max-gpus", type=click.IntRange(1, MAX_GPUS), default=4096, show_default=True,
              help="The most GPUs one job may use.")
@click.option("--prices", "prices_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="PATH", help="A TOML file overriding entries of the price catalog (`plan gpus`).")
@click.option("--solver", type=click.Choice(["auto", "highs", "cbc"]), default="auto", show_default=True,
              help="The ILP solver: HiGHS when highspy is installed (auto), else PuLP's bundled CBC.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Draw the purchase into FILE (.png or .svg): GPUs and dollars per GPU type, each job's run.")
@click.option("--force", is_flag=True, help="With --plot, overwrite an existing file.")
@quiet_option
def buy_cmd(jobs_path: Path, gpu_names: str | None, budget: float | None, horizon: str | None, max_gpus: int,
            prices_path: Path | None, solver: str, as_json: bool, plot: Path | None, force: bool,
            quiet: bool = False) -> None:
    """Size a cluster purchase: how many nodes of each GPU type to buy so that every job of
    JOBS.yaml meets its deadline, at the least cost of ownership (purchase plus power over
    the horizon), by an ILP. Jobs that overlap in time share the cluster's GPUs.

    \b
      plan buy examples/jobs.yaml
      plan buy jobs.yaml --gpus h100,b200 --budget 20M --horizon 2y
    """
    run_safely(lambda: _buy(jobs_path, gpu_names, budget, horizon, max_gpus, prices_path, solver, as_json,
                            plot, force, quiet))


def _buy(jobs_path: Path, gpu_names: str | None, budget: float | None, horizon: str | None, max_gpus: int,
         prices_path: Path | None, solver: str, as_json: bool, plot: Path | None = None, force: bool = False,
         quiet: bool = False) -> None:
    from planner.report import text as report
    from planner.cost.prices import DAY_S, load_prices
    from planner.cost.plan import plan_purchase
    from planner.cost.jobs import load_jobs, parse_duration_s

    _check_quiet(quiet, as_json)

    if plot is not None:                # a bad name or an existing file: refused before the search
        from planner.report.plot import plot_format
        plot_format(plot, force)
    elif force:
        raise UserError("--force needs --plot FILE")
    jobs = load_jobs(jobs_path)
    names = [g.strip() for g in gpu_names.split(",") if g.strip()] if gpu_names else list(jobs.gpus)
    names = names or ["h100", "h200", "b200"]
    horizon_s = (parse_duration_s(horizon, "--horizon") if horizon is not None
                 else jobs.horizon_s if jobs.horizon_s is not None else 365 * DAY_S)
    with _progress({"as_json": as_json, "quiet": quiet}, f"sweeping GPU counts of {', '.join(names)} per job "
                   f"and solving the ILP"):
        r = plan_purchase(jobs, names, load_prices(prices_path), horizon_s, budget, max_gpus, solver=solver)
    plotted = None
    if plot is not None:
        from planner.report import plot as plots
        plotted = plots.save(plots.buy_figure(r), plot, force=force)
    if as_json:
        click.echo(json.dumps(report.buy_json(r), indent=2))
    elif quiet:
        click.echo(report.buy_quiet_line(r))
    else:
        from planner.report.terminal import buy_view
        _show(buy_view(r))
    if plotted is not None:
        click.echo(f"wrote the plot to {plotted}", err=as_json or quiet)
    if not r.feasible:
        sys.exit(2)


@cli.command("topologies")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def topologies_cmd(as_json: bool) -> None:
    """List the shipped cluster topologies (pass one with --topology NAME, or your own file
    with --topology PATH; see topologies/README.md)."""
    def go() -> None:
        from planner.report import text as report
        rows = report.topologies_json()
        click.echo(json.dumps(rows, indent=2) if as_json else report.topologies_text(rows))
    run_safely(go)


@cli.command("measure")
@layout_options
@method_options
@click.option("--real", is_flag=True,
              help="Run on this machine's CUDA GPUs for real (torchrun, one process per GPU) "
                   "instead of fake tensors on the CPU.")
@quiet_option
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
    from planner.measure import accuracy
    from planner.report import text as report
    from planner.models.spec import load_hf_config

    _check_quiet(kw.get("quiet"), kw["as_json"])
    for axis in ("dp", "tp", "pp", "cp", "ep"):
        kw[axis] = kw[axis] or 1
    if kw["zero"] is None and kw["fsdp"] is None:
        kw["zero"] = 0
    kw["micro_batch"] = kw["micro_batch"] or 1
    kw["recompute"] = kw["recompute"] or "none"
    if not kw["gpu_name"]:
        kw["gpu_name"] = "h100"
    if kw.get("method") == "auto":
        raise UserError("plan measure runs one method: give --method full, lora or freeze")
    m, gpu, setup, space, n_gpus = build_request(kw)
    from dataclasses import replace
    from planner.api import fixed_layout
    from planner.layouts.layout import reject_reason

    setup = replace(setup, global_batch=kw["micro_batch"] * kw["dp"] * kw["ep"])
    lay = fixed_layout(space, setup, n_gpus)
    assert lay is not None
    reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
    if reason:
        raise UserError(f"layout {lay.describe()} cannot run: {reason}")
    how = "on this machine's GPUs" if real else "under fake tensors"
    with _progress(kw, f"measuring a training step of {m.name} {how}"):
        cmp = accuracy.compare(m, load_hf_config(kw["model_name"]), setup, lay, fake=not real)
    if kw["as_json"]:
        click.echo(json.dumps(report.comparison_json(m, gpu, cmp), indent=2))
    elif kw.get("quiet"):
        click.echo(report.comparison_quiet_line(m, cmp))
    else:
        from planner.report.terminal import comparison_view
        _show(comparison_view(m, gpu, cmp))


@cli.command("explain")
@layout_options
@method_options
@time_options
@click.option("--offload-optimizer", type=click.Choice(["none", "cpu", "nvme"]), default="none",
              show_default=True, help="As for `plan`: optimizer states in CPU memory or on NVMe.")
@click.option("--offload-params", type=click.Choice(["none", "cpu", "nvme"]), default="none",
              show_default=True, help="As for `plan`: parameters in CPU memory or on NVMe.")
def explain_cmd(**kw: Any) -> None:
    """Every term of the memory and step-time models for one layout: its formula, its
    inputs, its value and its source (paper, data sheet), to check the arithmetic by hand.

    \b
    The layout is the one `plan` picks for the same options (fix it with --dp, --tp, --pp,
    --zero or --fsdp, --micro-batch, --recompute); the terms add up to what `plan` reports.
    When nothing fits, the layout that needs the least memory is explained.

    \b
      plan explain --model 8b --gpus h100 --dp 8 --zero 3
      plan explain --model 70b --gpus h100 --dp 2 --tp 8 --pp 4 --zero 1 --recompute full --json
    """
    run_safely(lambda: _explain(kw))


def _explain(kw: dict[str, Any]) -> None:
    from planner import api
    from planner.report.explain import explain, to_json, to_text

    if kw.get("method") == "auto":
        raise UserError("plan explain explains one method: give --method full, lora, qlora or freeze")
    m, gpu, setup, space, n_gpus = build_request(kw)
    lay = api.fixed_layout(space, setup, n_gpus)
    if lay is not None:
        result = api.evaluate_layout(m, gpu, setup, lay, **_timing(kw, gpu))
    else:
        result = api.plan(m, gpu, setup, space, n_gpus=n_gpus, max_gpus=kw["max_gpus"], **_timing(kw, gpu))
    cand = result.best or result.result.smallest
    if cand is None:
        raise UserError(f"no layout of {m.name} fits on up to {kw['max_gpus']} x {gpu.name}, and none was sized; "
                        f"fix one with --dp, --tp, --pp, --zero (or --fsdp), --micro-batch and --recompute to "
                        f"explain it anyway, or raise --max-gpus")
    if setup.offload_optimizer != "none" or setup.offload_params != "none":
        from planner.emit import EmitOptions, check_options
        check_options(result, EmitOptions(offload_optimizer=setup.offload_optimizer,
                                          offload_params=setup.offload_params))
    ex = explain(m, gpu, setup, cand.layout, result.cluster, result.efficiency, result.capacity_bytes,
                 kw["tokens"])
    if kw["as_json"]:
        click.echo(json.dumps(to_json(ex), indent=2))
        return
    if result.best is None:
        click.echo(f"No layout fits; this is the one that needs the least memory on {cand.n_gpus} GPUs.\n")
    click.echo(to_text(ex))


SHELLS = ("bash", "zsh", "fish")


@cli.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion_cmd(shell: str) -> None:
    """Print the shell completion script for SHELL (model, GPU and topology names complete).

    \b
      eval "$(plan completion bash)"            # in ~/.bashrc
      eval "$(plan completion zsh)"             # in ~/.zshrc
      plan completion fish > ~/.config/fish/completions/plan.fish
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "plan", "_PLAN_COMPLETE").source())


def _reader_left() -> None:
    """The reader of stdout went away (`plan ... | head`): stop quietly, status 0. Python
    would flush stdout again at exit and print a BrokenPipeError; point it at devnull."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(0)


def main() -> None:
    try:
        cli(prog_name="plan")
    except BrokenPipeError:
        _reader_left()
    except SystemExit as e:
        # click meets a closed stdout itself while printing help or usage: it wraps stdout
        # in its PacifyFlushWrapper and exits 1; that is no error of ours either
        if e.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
            _reader_left()
        raise


if __name__ == "__main__":
    main()
