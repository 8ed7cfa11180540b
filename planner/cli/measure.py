"""`plan measure`: a real training step under PyTorch's memory trackers beside the prediction."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from planner.cli.common import check_quiet, note, progress, run_safely, show
from planner.cli.layout_options import layout_options
from planner.cli.options import Options
from planner.cli.output_options import quiet_option
from planner.cli.request import build_request
from planner.cli.task_options import distill_options, method_options
from planner.cli.types import OutputPath
from planner.errors import UserError


@click.command("measure")
@layout_options
@method_options
@distill_options
@click.option("--real", is_flag=True,
              help="Run on this machine's CUDA GPUs for real (torchrun, one process per GPU) "
                   "instead of fake tensors on the CPU.")
@click.option("--stack", type=click.Choice(["hf", "torchtitan"]), default="hf", show_default=True,
              help="What runs the step: Hugging Face transformers' model, or torchtitan's own Llama 3 "
                   "parallelised by torchtitan (FSDP2 and tensor parallel; deep models scaled from 2 and 4 blocks).")
@click.option("--calibration-out", type=OutputPath(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="With --real: write the calibration file `plan calibrate` writes, fitted on the measured "
                   "step (use it with --calibration FILE).")
@click.option("--force", is_flag=True, help="With --calibration-out, overwrite an existing file.")
@click.option("--blocks", type=int, default=None, metavar="N",
              help="Measure and predict the model's first N blocks at its real width (large models: "
                   "a block keeps the same tensors at any depth); the report names the cut model.")
@quiet_option
def measure_cmd(real: bool, stack: str, calibration_out: Path | None = None, blocks: int | None = None,
                **kw: Any) -> None:
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
      plan measure --stack torchtitan --model llama3.1-8b --gpus h100 --dp 2 --tp 2 --seq-len 2048 --recompute selective
      plan measure --model qwen3-30b-a3b --gpus h100 --dp 8 --zero 3 --seq-len 1024 --blocks 2
    """
    run_safely(lambda: measure(Options.from_click(kw), real, stack, calibration_out, blocks))


def measure(o: Options, real: bool, stack: str = "hf", calibration_out: Path | None = None,
            blocks: int | None = None) -> None:
    from planner.api import fixed_layout
    from planner.layouts.layout import data_parallel_size, reject_reason
    from planner.measure import accuracy
    from planner.models.spec import load_hf_config
    from planner.report import text as report
    from planner.timing.model import cluster_for

    check_quiet(o)
    from planner.cli.posttrain import stray_option

    stray = stray_option(o)
    if stray:
        raise UserError(stray)
    if calibration_out is not None:
        from planner.cli.calibrate import check_out

        if not real:
            raise UserError("--calibration-out needs --real: steps under fake tensors take no GPU time")
        check_out(calibration_out, o.force)
    elif o.force:
        raise UserError("--force needs --calibration-out FILE")
    if o.etp is not None:
        raise UserError("plan measure runs transformers or torchtitan 0.3.0, neither of which splits experts "
                        "over tensor-parallel ranks: drop --etp")
    if o.method == "auto":
        raise UserError("plan measure runs one method: give --method full, lora or freeze")
    if o.compile:
        from planner.measure.torchtitan import compile_refusal
        raise UserError(compile_refusal(real))
    if o.zero is None and o.fsdp is None:
        # torchtitan always applies FSDP2 (parallelize_llama); Hugging Face models run replicated
        o = replace(o, fsdp="full") if stack == "torchtitan" else replace(o, zero=0)
    o = replace(o.unsplit_where_not_given(), micro_batch=o.micro_batch or 1,
                recompute=o.recompute or "none", gpu_name=o.gpu_name or "h100")
    m, gpu, setup, space, n_gpus = build_request(o)
    assert o.model_name is not None and o.micro_batch is not None and o.dp is not None and o.ep is not None
    hf_config = load_hf_config(o.model_name)
    if blocks is not None:
        from planner.measure.blocks import depth, first_blocks_config
        from planner.models.families import spec_from_hf_config

        if stack != "hf":
            raise UserError("--blocks cuts Hugging Face models; torchtitan measurements scale from 2 and 4 "
                            "blocks by themselves (drop --blocks)")
        total = depth(hf_config)
        hf_config = first_blocks_config(hf_config, blocks)
        m = spec_from_hf_config(hf_config, f"{m.name} (first {blocks} of {total} blocks)", o.model_name,
                                m.source)
    setup = replace(setup, global_batch=o.micro_batch * data_parallel_size(o.dp, o.ep, False))
    lay = fixed_layout(space, setup, n_gpus)
    assert lay is not None
    reason = reject_reason(m, setup, lay, gpu.gpus_per_node)
    if reason:
        raise UserError(f"layout {lay.describe()} cannot run: {reason}")
    if o.teacher is not None:       # issue 34: a distillation step
        from planner.cli.posttrain import measure_teacher
        if real or stack != "hf" or blocks is not None:
            raise UserError("plan measure --teacher runs one process on the CPU with transformers' models: "
                            "drop --real, --stack and --blocks")
        measure_teacher(o, m, hf_config, setup, lay)
        return
    vlm = m.vision is not None
    if vlm and (stack != "hf" or blocks is not None):
        raise UserError("a vision-language model is measured with transformers' whole model: drop --stack and --blocks")
    how = "on this machine's GPUs" if real else ("with real tensors on the CPU" if vlm else "under fake tensors")
    label = f" ({stack})" if stack != "hf" else ""
    with progress(o.aside, f"measuring a training step of {m.name}{label} {how}"):
        if stack == "torchtitan":
            from planner.measure import torchtitan
            cmp = torchtitan.compare(m, hf_config, setup, lay, fake=not real)
        else:
            cmp = accuracy.compare(m, hf_config, setup, lay, fake=not real and not vlm)
    if calibration_out is not None:
        write_measured_calibration(m, cmp.setup, cmp.layout, cluster_for(gpu, o.topology), cmp.measured,
                                   f"plan measure --real ({stack})", stack, calibration_out, o.aside, o.force)
    if o.as_json:
        click.echo(json.dumps(report.comparison_json(m, gpu, cmp), indent=2))
    elif o.quiet:
        click.echo(report.comparison_quiet_line(m, cmp))
    else:
        from planner.report.terminal import comparison_view
        show(comparison_view(m, gpu, cmp))


def write_measured_calibration(m: Any, setup: Any, lay: Any, cluster: Any, measured: Any, name: str, stack: str,
                               out_file: Path, aside: bool = False, force: bool = False) -> None:
    """Fit the calibration on one measured step and write it as plan calibrate does."""
    from datetime import UTC, datetime

    from planner import __version__
    from planner.cli.calibrate import write_atomically
    from planner.measure.calibration import measured_calibration, measured_observation
    from planner.timing.calibrate import to_toml

    obs = measured_observation(m, setup, lay, cluster, measured, name, stack)
    c = measured_calibration(obs, __version__, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    write_atomically(out_file, to_toml(c), force)
    note(f"wrote {out_file}: matmul fraction {c.matmul_fraction_before:.3f} (shipped) -> "
         f"{c.matmul_fraction:.3f} (fitted on a {obs.step_time_s:.3f} s step)", aside)

