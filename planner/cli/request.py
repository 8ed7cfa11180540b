"""Options -> the planner's inputs: the model, the GPU, the training set-up, the search
space, the cluster for step times, and what --out writes. Every check of an option
against another raises UserError naming both."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.cli.options import Options
from planner.cli.sizes import global_batch_from
from planner.errors import UserError
from planner.report.advice import contradicting_options, degree_conflict
from planner.training.setup import MAX_GLOBAL_BATCH

if TYPE_CHECKING:
    from planner.emit import EmitOptions
    from planner.hardware.gpus import GpuSpec
    from planner.layouts.layout import SearchSpace
    from planner.models.spec import ModelSpec
    from planner.timing.calibrate import Calibration
    from planner.timing.model import Efficiency
    from planner.training.finetune import FinetuneSpec
    from planner.training.setup import TrainingSetup


def finetune_spec(o: Options, method: str | None = None) -> FinetuneSpec:
    """--method and its options -> FinetuneSpec (``method`` overrides --method, for auto)."""
    from planner.training.finetune import FinetuneSpec

    name = method or o.method or "full"
    targets = None
    if o.lora_targets:
        targets = tuple(t.strip() for t in o.lora_targets.split(",") if t.strip())
        if not targets:
            raise UserError("--lora-targets is empty; give module names or attention, mlp, all-linear")
    lora_opts = [n for n in ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout") if getattr(o, n) is not None]
    if name in ("full", "freeze") and lora_opts and method is None:
        raise UserError(f"--{lora_opts[0].replace('_', '-')} needs --method lora or qlora")
    if o.trainable_layers is not None and name != "freeze" and method is None:
        raise UserError("--trainable-layers needs --method freeze")
    quant = o.quant
    if quant is not None and name not in ("lora", "qlora") and method is None:
        raise UserError(f"--quant {quant} stores a frozen base: use it with --method lora (or qlora), "
                        f"or with --task load")
    if name == "qlora" and quant not in (None, "nf4"):
        raise UserError(f"--method qlora stores the base as nf4; for an {quant} base use --method lora --quant {quant}")
    return FinetuneSpec.named(name, rank=o.lora_rank, alpha=o.lora_alpha, targets=targets,
                              dropout=o.lora_dropout,
                              quant=quant if name in ("lora", "qlora") else None,
                              trainable_layers=o.trainable_layers, freeze_vision=o.freeze_vision)


def check_names(o: Options) -> None:
    """Every name or path option within the file system's limits (planner.limits.check_name),
    and a config.json --model whose numbers Python can read, before any file is touched."""
    from planner.limits import check_name

    # --gpus is a list (--tokens): each GPU name or file is a name of its own (a list of GPU files
    # in the working directory was refused as one name of more than 255 bytes)
    gpus = o.gpu_name.split(",") if o.gpu_name is not None else []
    for what, value in (("--model", o.model_name), *(("--gpus", g) for g in gpus), ("--topology", o.topology),
                        ("--prices", o.prices_path), ("--out", o.out), ("--plot", o.plot),
                        ("--calibration", o.calibration)):
        if value is not None:
            check_name(str(value), what)
    for what, path in (("--out", o.out), ("--plot", o.plot)):
        if path is not None and os.fsencode(path) != str(path).encode("utf-8", "replace"):
            raise UserError(f"{what} {str(path)!r} is not a UTF-8 name; give a file name in UTF-8")
    if o.model_name:
        check_config_numbers(o.model_name)


def check_config_numbers(name: str) -> None:
    """A config.json path whose text holds an integer of more than 4,300 digits (Python's
    limit on int(str), which json.loads meets as a ValueError): UserError naming the file.
    Everything else about the file is left to planner.models.spec.load_config_file."""
    import json

    from planner.limits import MAX_CONFIG_BYTES, read_input_file

    path = Path(name)
    try:
        if path.is_dir():
            path = path / "config.json"
        if not (path.suffix == ".json" or "/" in name) or not path.is_file():
            return
    except OSError:
        return
    if os.stat(path).st_size > MAX_CONFIG_BYTES:
        return                       # refused by the loader, with its own message
    raw = read_input_file(path, f"model file {path}", MAX_CONFIG_BYTES)
    try:
        json.loads(raw.decode("utf-8", "replace"))
    except RecursionError:
        return
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError):
            return
        raise UserError(f"{path}: not valid JSON (a number of more than 4,300 digits); "
                        f"expected a Hugging Face config.json") from None


def build_request(o: Options) -> tuple[ModelSpec, GpuSpec, TrainingSetup, SearchSpace, int | None]:
    """Options -> (model, gpu, setup, space, n_gpus); raises UserError on bad input."""
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import AXES, SearchSpace, data_parallel_size
    from planner.models.spec import load_model
    from planner.training.checks import check_setup, default_seq_len, precision_refusal
    from planner.training.fp8 import resolve_recipe
    from planner.training.setup import DEFAULT_SETUP, Overheads, TrainingSetup

    if not o.model_name:
        raise UserError("missing --model; pass a preset name (`plan models`) or a config.json path")
    check_names(o)
    o = stated_layout(o)
    if not o.gpu_name:
        raise UserError("missing --gpus; pass a GPU type (`plan gpus`), e.g. --gpus h100")
    if "," in o.gpu_name:
        if o.tokens is not None:    # a distillation's length (--teacher): the one mode with --tokens here
            raise UserError("--gpus takes one GPU type with --teacher (--tokens sets the distillation's length, "
                            "not a choice of GPUs); plan each GPU type in its own run")
        raise UserError("--gpus takes one GPU type without --tokens; give --tokens N to let the planner "
                        "choose among several (--gpus h100,a100) by cost")
    clash = contradicting_options(o.as_mapping())
    if clash:
        raise UserError(clash)
    m = load_model(o.model_name)
    gpu = get_gpu(o.gpu_name)
    refusal = precision_refusal(gpu, o.precision)
    if refusal:
        raise UserError(refusal)
    if o.fp8_param_gather and (o.precision != "fp8" or o.stack != "megatron"):
        raise UserError("--fp8-param-gather is Megatron-LM's: it needs --precision fp8 and --stack megatron")
    if o.fp8_recipe != "auto" and o.precision != "fp8":
        raise UserError(f"--fp8-recipe {o.fp8_recipe} needs --precision fp8")
    from planner.layouts.rules import ETP_REFUSAL, mamba_stack_refusal, option_refusal

    refusal = option_refusal(m, o.tp, o.ep, o.etp)
    if refusal:
        raise UserError(refusal)
    if o.etp is not None and o.stack in ETP_REFUSAL:
        raise UserError(ETP_REFUSAL[o.stack])
    if o.optimizer_instances > 1 and o.stack != "megatron":
        raise UserError(f"--optimizer-instances {o.optimizer_instances} is megatron-core's "
                        "num_distributed_optimizer_instances: add --stack megatron")
    o = replace(o, seq_len=o.seq_len or default_seq_len(m))
    global_batch = global_batch_from(o.as_mapping(), MAX_GLOBAL_BATCH)
    if o.grad_accum is not None:
        if o.micro_batch is None or o.dp is None:
            raise UserError("--grad-accum needs --micro-batch and --dp (or give --global-batch instead)")
        implied = o.grad_accum * o.micro_batch * data_parallel_size(o.dp, o.ep or 1, False)
        if global_batch is not None and global_batch != implied:
            raise UserError(f"--global-batch {global_batch} contradicts --grad-accum x --micro-batch x --dp "
                            f"= {implied}; give one of them")
        global_batch = implied
    assert o.seq_len is not None
    setup = TrainingSetup(seq_len=o.seq_len, global_batch=global_batch or DEFAULT_SETUP.global_batch,
                          precision=o.precision, optimizer=o.optimizer,
                          fp8_recipe=resolve_recipe(o.fp8_recipe, o.stack), moe_imbalance=o.moe_imbalance,
                          fp8_param_gather=o.fp8_param_gather, bf16_layers=o.bf16_layers,
                          attention=o.attention, kernels=o.kernels, stack=o.stack or "auto",
                          fsdp_pipeline_grad_sync=o.fsdp_pipeline_grad_sync, pp_balance=o.pp_balance,
                          pp_microbatch_group=o.pp_microbatch_group, cross_entropy=o.cross_entropy,
                          moe_a2a_overlap=o.moe_a2a_overlap, cuda_graphs=o.cuda_graphs,
                          fp8_attention=o.fp8_attention, moe_dispatcher=o.moe_dispatcher,
                          usable_memory_fraction=usable_memory(o),
                          finetune=finetune_spec(o, "full" if o.method == "auto" else None),
                          offload_optimizer=o.offload_optimizer or "none",
                          offload_params=o.offload_params or "none",
                          recompute_every=o.recompute_every, compile=o.compile,
                          ds_checkpointing=o.ds_checkpointing, offload_activations=o.offload_activations,
                          mtp_layers=o.mtp, recompute_modules=recompute_modules(o),
                          recompute_method=o.recompute_method or DEFAULT_SETUP.recompute_method,
                          recompute_num_layers=o.recompute_num_layers or DEFAULT_SETUP.recompute_num_layers,
                          recompute_chunk_layers=recompute_chunk_layers(o, m),
                          images_per_sample=o.images_per_sample)
    check_setup(m, setup)       # the rules the Python API applies too (issue 32, W11)
    if "mla_up_proj" in setup.recompute_modules and not m.is_mla:
        raise UserError(f"--recompute-modules mla_up_proj needs multi-latent attention; {m.name} has none")
    if "moe_act" in setup.recompute_modules and not m.is_moe:
        raise UserError(f"--recompute-modules moe_act needs a mixture-of-experts model; {m.name} is dense")
    stack_refusal = stack_setup_refusal(o, m)
    if stack_refusal:
        raise UserError(stack_refusal)
    calibration = calibration_of(o, [gpu.name])
    if calibration is not None:     # before --fragmentation, which overrides the file's
        setup = calibration.setup(setup)
    if o.fragmentation is not None:
        setup = replace(setup, overheads=Overheads(fragmentation=o.fragmentation))
    clash = degree_conflict(m, setup, o.as_mapping())
    if clash:
        raise UserError(clash)
    if o.offload_activations and o.recompute not in (None, "none"):
        raise UserError(f"--offload-activations {o.offload_activations} does not work with --recompute {o.recompute} "
                        "(megatron-core: CPU offloading does not work when activation recomputation is enabled); "
                        "use --recompute none")
    degrees: dict[str, Any] = {a.name: getattr(o, a.name) for a in AXES}
    space = SearchSpace(
        **degrees, etp=o.etp, zero_stage=o.zero, optimizer_instances=o.optimizer_instances,
        fsdp=o.fsdp, vp=o.vp, sp=o.sp,
        micro_batches=(o.micro_batch,) if o.micro_batch else SearchSpace().micro_batches,
        recomputes=(o.recompute,) if o.recompute else ("none",) if o.offload_activations
        else SearchSpace().recomputes,
    )
    if not m.is_moe and space.ep is None:
        space = replace(space, ep=1)
    if o.stack == "megatron" and (why := mamba_stack_refusal(m, "full")) is not None:
        if o.recompute == "full":
            raise UserError(f"--recompute full: {why}")
        space = replace(space, recomputes=tuple(r for r in space.recomputes if mamba_stack_refusal(m, r) is None))
    if o.stack == "deepspeed":
        # tp and pp under --stack deepspeed are Megatron-DeepSpeed's, run when asked for (--tp/--pp);
        # its search stays on ZeRO data parallelism, as before
        space = replace(space, tp=1 if o.tp is None else o.tp, pp=1 if o.pp is None else o.pp)
    return m, gpu, setup, space, o.n_gpus or degrees_count(space)


def degrees_count(space: SearchSpace) -> int | None:
    """The GPU count the search space's fixed degrees pin down (dp x tp x pp x cp x ep), or
    None when one is open: such a count is checked against the topology as --n-gpus is
    (issue 32, W2)."""
    return space.fixed_world_size()


def stack_setup_refusal(o: Options, m: Any) -> str | None:
    """Why --stack, --compile or --recompute-every cannot shape this plan's memory (one line), or None."""
    from planner.stacks import torchtitan_builds
    if o.stack == "torchtitan":
        why = torchtitan_builds(m)
        if why is not None:
            return f"--stack torchtitan: {why}; plan with --stack hf or megatron"
        # options no torchtitan layout can take, said before a search on a count nobody gave (issue 32, U4)
        if o.zero is not None and o.zero > 0 and o.fsdp is None:
            return (f"--stack torchtitan shards with FSDP2, not ZeRO: for --zero {o.zero} give --fsdp "
                    f"{ {1: 'grad-op or full', 2: 'grad-op'}.get(o.zero, 'full')} (or --zero 0)")
        if o.offload_optimizer != "none":
            return ("--stack torchtitan offloads with FSDP2, which moves parameters, gradients and optimizer states "
                    "together: give --offload-params cpu with --fsdp full instead of --offload-optimizer")
    if o.compile and o.stack != "torchtitan":
        return ("--compile is modelled for --stack torchtitan only (its per-block torch.compile); "
                "drop --compile or add --stack torchtitan")
    if o.ds_checkpointing != "none" and (o.stack != "deepspeed" or o.recompute != "full"):
        return ("--ds-checkpointing is DeepSpeed's activation checkpointing: it needs --stack deepspeed and "
                "--recompute full")
    if o.recompute_every > 1 and o.recompute == "none":
        return "--recompute-every needs --recompute selective or full"
    if o.recompute_every > 1 and o.stack == "megatron":
        # megatron_args.txt could not say it: Megatron-LM counts checkpointed layers per stage
        return ("--recompute-every under --stack megatron: Megatron-LM checkpoints a number of layers per "
                "pipeline stage; give --recompute full --recompute-method block --recompute-num-layers N")
    return recompute_method_refusal(o, m)


def recompute_method_refusal(o: Options, m: Any) -> str | None:
    """Why --recompute-method / --recompute-num-layers cannot shape this plan (one line), or None.

    megatron-core 0.16.1 (transformer_config.py, TransformerConfig.__post_init__): a method and
    a layer count go with full granularity only ("recompute_num_layers must be None" under
    selective). transformer_block.py's uniform loop calls layers [k N, (k + 1) N) of each
    model chunk, so N must divide the chunk's layers (else _get_layer indexes past the last);
    block's N counts layers per (virtual) stage, so both need the pipeline fixed."""
    if o.recompute_method is None and o.recompute_num_layers is None:
        return None
    flag = "--recompute-method" if o.recompute_method is not None else "--recompute-num-layers"
    if o.stack != "megatron" or o.recompute != "full":
        return f"{flag} is Megatron-LM's full recomputation: it needs --stack megatron and --recompute full"
    method, n = o.recompute_method or "uniform", o.recompute_num_layers or 1
    if method == "uniform" and n == 1:
        return None
    if o.pp is None or (o.pp > 1 and o.vp is None):
        return (f"--recompute-method {method} --recompute-num-layers {n} counts layers per (virtual) pipeline "
                f"stage: fix --pp (and --vp when pp > 1)")
    chunk = m.n_layers // (o.pp * (o.vp or 1))
    if n > chunk:
        return (f"--recompute-num-layers {n} is more than the {chunk} layers of each (virtual) pipeline stage "
                f"({m.n_layers} layers / pp {o.pp} / vp {o.vp or 1}): give 1 to {chunk}")
    if method == "uniform" and chunk % n:
        return (f"--recompute-method uniform --recompute-num-layers {n}: megatron-core runs groups of {n} "
                f"layers and needs them to divide each stage's {chunk}: give a divisor of {chunk}")
    return None


def recompute_modules(o: Options) -> tuple[str, ...]:
    """--recompute-modules as a tuple, checked against Megatron-Core's names and what the
    memory model covers (planner.memory.recompute)."""
    if o.recompute_modules is None:
        return ()
    from planner.memory.recompute import MODULES, NOT_MODELLED

    mods = tuple(x.strip() for x in o.recompute_modules.split(",") if x.strip())
    if not mods:
        raise UserError("--recompute-modules is empty; give core_attn, layernorm, moe_act, mla_up_proj or mlp")
    if o.stack != "megatron" or o.recompute != "selective":
        raise UserError("--recompute-modules is Megatron-Core's selective recomputation: it needs --stack megatron "
                        "and --recompute selective")
    for x in mods:
        if x in NOT_MODELLED:
            raise UserError(f"--recompute-modules {x}: recomputing the whole {x.replace('_', ' ')} is not modelled; "
                            f"use {', '.join(MODULES)}")
        if x not in MODULES:
            raise UserError(f"--recompute-modules {x}: not one of Megatron-Core's modules ({', '.join(MODULES)})")
    # megatron-core 0.16.1 TransformerConfig.__post_init__: delayed scaling does not support moe_act and
    # layernorm recompute for fp8
    if o.precision == "fp8" and o.fp8_recipe in ("delayed", "auto") and {"moe_act", "layernorm"} & set(mods):
        raise UserError("--recompute-modules moe_act/layernorm: Megatron-Core refuses them under FP8 delayed "
                        "scaling; give --fp8-recipe tensorwise, mxfp8 or blockwise")
    return mods


def recompute_chunk_layers(o: Options, m: Any) -> int:
    """Layers per virtual pipeline stage Megatron's block method counts in (0 when not fixed)."""
    if o.recompute_method != "block" or o.pp is None:
        return 0
    return int(m.n_layers // (o.pp * (o.vp or 1)))


def timing(o: Options, gpu: Any) -> dict[str, Any]:
    """The cluster (--topology, else the GPU's default), --tokens and the step-time model's
    efficiency (--calibration's, else the defaults) for the step times."""
    from planner.timing.model import cluster_for

    return {"cluster": cluster_for(gpu, o.topology), "tokens": o.tokens,
            "efficiency": efficiency_of(o, [gpu.name])}


def calibration_of(o: Options, gpu_names: list[str]) -> Calibration | None:
    """--calibration's file, checked against the GPU types planned on (None without one)."""
    if o.calibration is None:
        return None
    from planner.timing.calibrate import check_gpu, load_calibration

    c = load_calibration(str(o.calibration))
    check_gpu(c, gpu_names)
    return c


def efficiency_of(o: Options, gpu_names: list[str]) -> Efficiency:
    """The step-time model's parameters: the --stack's (timing.efficiency.stack_efficiency), with
    --calibration's overrides."""
    from planner.timing.efficiency import stack_efficiency

    c = calibration_of(o, gpu_names)
    base = stack_efficiency(o.stack)
    from planner.layouts.layout import Layout
    from planner.stacks import runs_megatron_deepspeed

    # --stack deepspeed searches tp and pp only where given (build_request): the layout's are these
    if o.stack and runs_megatron_deepspeed(o.stack, Layout(tp=o.tp or 1, pp=o.pp or 1)) \
            and o.precision == "bf16-mixed":
        # Megatron-DeepSpeed on DeepSpeed's pipeline engine: the engine's own step terms, as the
        # published-runs study times BLOOM and MT-NLG
        from planner.timing.efficiency import DEEPSPEED_PIPE_BF16
        base = DEEPSPEED_PIPE_BF16
    eff = base if c is None else c.efficiency(base)
    if o.time_confidence is not None:       # plan at the step time's upper end (issue 18)
        from dataclasses import replace

        from planner.timing.intervals import upper_factor

        eff = replace(eff, step_time_factor=upper_factor(o.time_confidence))
    return eff


def emit_options(o: Options) -> EmitOptions:
    """What --out writes beyond the plan itself (offload settings), checked against --force."""
    from planner.emit import EmitOptions

    if o.force and o.out is None and o.plot is None:
        raise UserError("--force needs --out DIR or --plot FILE")
    return EmitOptions(offload_optimizer=o.offload_optimizer, offload_params=o.offload_params,
                       stack=o.stack, scheduler=o.scheduler)


def within_topology(o: Options, gpu: Any, n_gpus: int | None) -> Options:
    """A plan never runs past what its topology describes (issue 19): refuse a GPU count
    beyond it, and search no further than it (the options with --max-gpus lowered)."""
    from planner.api import MAX_SEARCH_GPUS
    from planner.hardware.topology import check_covers, max_covered_gpus
    from planner.timing.model import cluster_for

    top = cluster_for(gpu, o.topology).topology
    if top is None:
        return o
    if n_gpus is not None:
        check_covers(top, n_gpus, flag="--n-gpus" if o.n_gpus is not None else "dp x tp x pp x cp x ep =")
    largest = max_covered_gpus(top)
    if o.max_gpus > max(MAX_SEARCH_GPUS, largest):
        # past the default search limit, --max-gpus is the user's own: say it cannot be met
        raise UserError(f"--max-gpus {o.max_gpus:,} is more than topology {top.name} describes ({largest:,} GPUs): "
                        f"pass --max-gpus {max(MAX_SEARCH_GPUS, largest)} or fewer, or describe a bigger cluster in a "
                        f"topology file (max_nodes, [units] max_units; topologies/README.md) and pass --topology PATH")
    return replace(o, max_gpus=min(o.max_gpus, largest))


def usable_memory(o: Options) -> float:
    """--usable-memory, shrunk by the memory interval's upper end under --fit-confidence: a plan
    then fits when predicted peak x (upper end / predicted) <= usable memory (report.intervals)."""
    if o.fit_confidence is None:
        return o.usable_memory
    from planner.report.intervals import memory_band

    return o.usable_memory / memory_band(o.fit_confidence).high_factor


# What each mode of `plan` reads (issue 32, W5: --task load ignored about 25 options, --out
# among them, which then wrote nothing). An option given with another value than its default
# that the mode does not read is refused, naming it.
MODE_READS = {
    "load": frozenset({"model_name", "gpu_name", "n_gpus", "max_gpus", "tp", "pp", "micro_batch", "seq_len",
                       "precision", "method", "quant", "mla_cache", "fragmentation", "usable_memory", "as_json",
                       "quiet", "task"}),
}
FLAGS = {"model_name": "--model", "gpu_name": "--gpus", "prices_path": "--prices", "as_json": "--json",
         "quiet": "--quiet"}


def flag_of(field: str) -> str:
    """The command-line option of an Options field."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def unread_option(o: Options, mode: str) -> str | None:
    """The first option ``o`` gives that ``mode`` (a key of MODE_READS) does not read, as
    its flag, or None."""
    from dataclasses import fields

    reads = MODE_READS[mode]
    for f in fields(o):
        if f.name not in reads and getattr(o, f.name) != f.default:
            return flag_of(f.name)
    return None


def stated_layout(o: Options) -> Options:
    """--pp-layout into the set-up's split (TrainingSetup.pp_balance holds it) and vp, the
    layout's virtual stages / --pp (megatron-core infers vp so: PipelineParallelLayerLayout);
    one line where it contradicts --pp-balance or --vp, lacks --pp, or is no layout."""
    if o.pp_layout is None:
        return o
    from planner.training.pp_layout import LayoutError, is_layout, shown, stack_refusal, stage_refusal, stages
    from planner.training.setup import DEFAULT_SETUP

    text = o.pp_layout
    try:
        n = len(stages(text))
    except LayoutError as e:
        raise UserError(f"--pp-layout {shown(text)} {e}") from None
    if not is_layout(text):
        raise UserError(f"--pp-layout {shown(text)} has no embedding 'E'; a layout begins with it: 'Et*4|(t*4|)*14tmL'")
    if (why := stack_refusal(o.stack)) is not None:
        raise UserError(why)
    if o.pp_balance != DEFAULT_SETUP.pp_balance:
        raise UserError(f"--pp-layout states the split itself: drop --pp-balance {o.pp_balance}")
    if o.pp is None:
        raise UserError(f"--pp-layout needs --pp (its {n} virtual stages are pp ranks x vp stages each)")
    vp = o.vp if o.vp is not None else max(n // o.pp, 1)
    if (why := stage_refusal(text, o.pp, vp)) is not None:
        raise UserError(why)
    return replace(o, pp_balance=text, vp=vp)
