"""Configs and launch files for a chosen plan: one module per target, each returning plain data.

    deepspeed.py   ds_config.json (to_deepspeed_config)
    fsdp.py        accelerate's config YAML with its fsdp_config, and the torchrun command for FSDP2
    megatron.py    Megatron-LM's command-line arguments
    torchtitan.py  a torchtitan 0.3.0 job (a config_registry module its ConfigManager loads)
    launch.py      a hostfile and the multi-node launch script
    slurm.py       a Slurm batch script (srun + torchrun's c10d rendezvous)
    kubernetes.py  a Kubeflow training-operator PyTorchJob (schemas/ holds its JSON schema)
    write.py       atomic writes to a directory (the only module here that touches files)

Which stack runs a plan is --stack, or by default what fits the layout
(planner.stacks.default_stack), following the kernels the memory model used (plan_kernels:
fused kernels, which --kernels auto picks for tp, pp or cp, are Megatron-LM's, so the memory
on screen and the files written describe one stack): FSDP without pipeline parallelism runs under Hugging Face
+ accelerate (FSDP2; its parallelism config also takes tp and cp, or torchrun); FSDP with
pipeline parallelism under torchtitan; tensor, pipeline or context parallelism otherwise
under Megatron-LM (its distributed optimizer, Megatron FSDP for ZeRO-2/3, or
--use-torch-fsdp2); pure data parallelism with ZeRO under DeepSpeed. Each stack gets only
the files it reads (planner/stacks/catalog.toml). ``plan_files`` returns every file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.stacks import STACKS, check_stack, default_stack
from planner.training.setup import DEFAULT_SETUP, OFFLOAD, SGD_MOMENTUM

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.layouts.layout import Layout
    from planner.search.search import Candidate

SCHEDULERS = ("both", "slurm", "kubernetes", "none")
# Every file plan_files writes for some plan: --out --force over a plan of another stack
# removes those the new plan does not write (planner.emit.write.write_files, issue 32 B4).
PLAN_FILE_NAMES = ("ds_config.json", "hostfile", "config.json", "accelerate_config.yaml", "megatron_args.txt",
                   "torchtitan_job.py", "train.py", "launch.sh", "slurm.sbatch", "pytorchjob.yaml", "plan.json")
HOST_NAME = re.compile(r"[A-Za-z0-9._:\[\]-]+")    # a DNS name, IPv4 or IPv6 address (RFC 1123, RFC 4291)


@dataclass(frozen=True, kw_only=True, slots=True)
class EmitOptions:
    """What a config needs beyond the plan: offload, optimizer hyper-parameters, launch details.

    The optimizer defaults are Llama 2's pretraining recipe (Touvron et al. 2023,
    arXiv:2307.09288, Sec. 2.2: AdamW with beta1 0.9, beta2 0.95, eps 1e-5, weight decay
    0.1, gradient clipping 1.0, peak learning rate 3e-4). Offload moves optimizer states
    (and, for parameters, the weights) to CPU memory or NVMe; the planner's own memory
    figures do not subtract offloaded states yet.
    """

    offload_optimizer: str = DEFAULT_SETUP.offload_optimizer      # none | cpu | nvme
    offload_params: str = DEFAULT_SETUP.offload_params            # none | cpu | nvme (ZeRO-3 or FSDP only)
    nvme_path: str = "/local_nvme"
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    sgd_momentum: float = SGD_MOMENTUM
    script: str = "train.py"             # the user's training script (FSDP, DeepSpeed)
    master_addr: str = "node-0"          # default rendezvous host; the launch script reads $MASTER_ADDR
    master_port: int = 29500
    stack: str | None = None             # hf | torchtitan | megatron | deepspeed; None: default_stack
    scheduler: str = "both"              # slurm | kubernetes | both | none
    image: str = "REPLACE-WITH-YOUR-TRAINING-IMAGE"   # the container image of the Kubernetes job

    def __post_init__(self) -> None:
        """The free-text fields go into launch files: none may hold a control character, and
        the rendezvous host, written inside a double-quoted shell word, is a host name."""
        from planner.limits import check_label

        for what, text in (("script", self.script), ("image", self.image), ("nvme_path", self.nvme_path)):
            check_label(text, what)
        if not HOST_NAME.fullmatch(self.master_addr):
            raise UserError(f"master_addr {self.master_addr!r} is not a host name or address "
                            f"(letters, digits, '.', '-', ':', '_')")

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_params != "none"


def label(name: str) -> str:
    """A name (a model's, a GPU's) as every written file carries it in a comment or a
    docstring: data, never code. Unchanged when each character is printable and none is a
    quote or a backslash; else a JSON string (ASCII, every control character, quote and
    backslash escaped), which stays on one line, ends no bash or YAML comment and no Python
    docstring (``\\"`` is an escaped quote there), and reads the same in each. The loaders
    refuse names with control characters (planner.limits.check_label); this holds for a
    name given through the Python API too."""
    if name.isprintable() and not any(c in name for c in "\"\\"):
        return name
    return json.dumps(name)


def stack_for(r: PlanResult, opts: EmitOptions) -> str:
    """The stack that runs the chosen plan: --stack, checked against the layout, or the default."""
    lay = chosen(r).layout
    if opts.stack is None:
        return default_stack(r.model, lay, plan_kernels(r, lay))
    if opts.stack not in STACKS:
        raise UserError(f"--stack {opts.stack!r}: choose one of {', '.join(STACKS)}")
    check_stack(opts.stack, r.model, lay)
    return opts.stack


def plan_kernels(r: PlanResult, lay: Layout) -> str | None:
    """The kernels the memory model used for ``lay`` when the plan named no stack (the
    default stack follows them), else None."""
    if r.setup.stack != "auto":
        return None
    from planner.training.kernels import layout_kernels

    return layout_kernels(r.setup, lay)


def node_shape(n_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node) for a job of ``n_gpus``: full nodes where the count
    allows, else the largest per-node count that divides the job (launchers need the same
    number of processes on every node)."""
    per_node = min(n_gpus, gpus_per_node)
    while n_gpus % per_node:
        per_node -= 1
    return n_gpus // per_node, per_node


def chosen(r: PlanResult) -> Candidate:
    """The candidate to write configs for; a UserError when there is none or it does not fit."""
    if r.best is None:
        raise UserError("no layout fits, so there is no plan to write configs for")
    if not r.best.fits:
        raise UserError(f"the layout {r.best.layout.describe()} does not fit in memory; "
                        f"no configs written (give a layout that fits)")
    return r.best


def check_options(r: PlanResult, opts: EmitOptions) -> None:
    """Reject offload and optimizer choices the plan's engine cannot run, one rule per ``if``."""
    if r.best is None:
        return
    lay = r.best.layout
    eng = stack_for(r, opts) if r.best.fits else default_stack(r.model, lay, plan_kernels(r, lay))
    for name, device in (("--offload-optimizer", opts.offload_optimizer), ("--offload-params", opts.offload_params)):
        if device not in OFFLOAD:
            raise UserError(f"{name} {device!r}: choose one of {', '.join(OFFLOAD)}")
    if opts.offload_params != "none" and not lay.is_fsdp and lay.zero_stage != 3:
        raise UserError(f"--offload-params needs ZeRO-3 or FSDP; the plan uses ZeRO-{lay.zero_stage} "
                        f"(add --zero 3, or drop --offload-params)")
    if opts.offload_optimizer != "none" and not lay.is_fsdp and lay.zero_stage == 0:
        raise UserError("--offload-optimizer needs ZeRO-1 or higher (DeepSpeed offloads the optimizer's "
                        "partition); add --zero 1, 2 or 3")
    if eng == "megatron" and opts.offload_params != "none":
        raise UserError("Megatron-LM does not offload parameters; drop --offload-params or plan without tp/pp/cp")
    if eng == "megatron" and lay.is_fsdp and opts.offload_optimizer != "none":
        raise UserError("Megatron-LM does not offload under FSDP; drop --offload-optimizer or plan without pp")
    if eng == "megatron" and opts.offload_optimizer == "nvme":
        raise UserError("Megatron-LM offloads the optimizer to CPU only; use --offload-optimizer cpu")
    if eng == "torchtitan" and (opts.offload_optimizer != "none" or opts.offload_params == "nvme"):
        raise UserError("torchtitan offloads parameters, gradients and optimizer states to CPU together "
                        "(training.enable_cpu_offload): use --offload-params cpu only")
    if lay.is_fsdp and opts.offload_optimizer != "none":
        raise UserError("FSDP2 offloads parameters, gradients and the optimizer step together: "
                        "use --offload-params cpu instead of --offload-optimizer")
    if lay.is_fsdp and opts.offload_params == "nvme":
        raise UserError("FSDP2 offloads to CPU memory only; use --offload-params cpu")
    opt = r.setup.optimizer
    if opts.offload_optimizer != "none" and opt != "adamw":
        raise UserError(f"optimizer offload runs DeepSpeed's CPU Adam; --optimizer {opt} cannot be offloaded")
    if eng == "megatron" and opt in ("adafactor", "adam8bit"):
        raise UserError(f"Megatron-LM has no {opt} optimizer; use --optimizer adamw or sgd, "
                        f"or plan without tp/pp/cp")
    if opt == "adamw-bf16-states":
        check_bf16_states(eng, r.setup.precision, lay)
    if r.setup.precision in ("fp8", "nvfp4"):
        fp8 = r.setup.precision_spec.fp8
        check_fp8(eng, fp8.name if fp8 is not None else "")
        if eng != "megatron" and r.setup.bf16_layers != (0, 0):
            raise UserError("--bf16-layers is written as Megatron-Core's first_last_layers_bf16 only (the torchtitan "
                            "float8 config written here keeps every block's linears in FP8); add --stack megatron "
                            "or drop --bf16-layers")
    if eng == "megatron" and r.setup.precision == "bf16":
        raise UserError("Megatron-LM keeps fp32 main weights under --bf16; plan with --precision bf16-mixed")
    if eng == "torchtitan" and r.setup.precision not in ("bf16-mixed", "fp32", "fp8"):
        raise UserError(f"torchtitan trains with fp32 parameters and bf16 (or fp32) compute; "
                        f"--precision {r.setup.precision} is not one of its choices: use bf16-mixed or fp32")
    if eng not in ("hf", "torchtitan") and r.setup.precision == "bf16" and lay.zero_stage == 0:
        raise UserError("DeepSpeed keeps an fp32 master copy under bf16 unless ZeRO shards it "
                        "(bf16_master_weights_and_grads needs ZeRO-1 or higher); add --zero 1 "
                        "or use --precision bf16-mixed")


# FP8 recipes each stack's own configuration can name (planner.training.fp8 holds the recipes):
# torchtitan 0.3.0 components/quantization/float8.py, Float8LinearConverter.Config.recipe_name:
# Literal["rowwise", "rowwise_with_gw_hp"] (no tensorwise scaling, no FSDP float8 all-gather option);
# megatron-core 0.16.1 TransformerConfig.fp8_recipe: Literal['tensorwise', 'delayed', 'mxfp8',
# 'blockwise', 'custom'] (Transformer Engine's recipes: no rowwise scaling).
FP8_RECIPES_BY_STACK = {"torchtitan": ("rowwise",),
                        "megatron": ("tensorwise", "delayed", "blockwise", "mxfp8", "nvfp4")}


def check_fp8(eng: str, recipe_name: str) -> None:
    """Refuse an FP8 recipe the plan's stack cannot be told to run, one line with the way out."""
    if eng in ("deepspeed", "hf"):
        raise UserError(f"--out writes FP8 settings for torchtitan (float8 converter) and Megatron-LM (--fp8-format) "
                        f"only: {'DeepSpeed' if eng == 'deepspeed' else 'accelerate'} runs FP8 through Transformer "
                        f"Engine modules in the model code, which these files cannot set; add --stack torchtitan "
                        f"or --stack megatron")
    allowed = FP8_RECIPES_BY_STACK[eng]
    if recipe_name not in allowed:
        where = ("torchtitan 0.3.0 Float8LinearConverter recipe_name" if eng == "torchtitan"
                 else "megatron-core 0.16.1 --fp8-recipe")
        raise UserError(f"--fp8-recipe {recipe_name}: {eng} runs {', '.join(allowed)} ({where}); "
                        f"plan with --fp8-recipe {allowed[0]} or another --stack")


def check_bf16_states(eng: str, precision: str, lay: Layout) -> None:
    """Refuse 16-bit Adam moments where the stack has no such setting (see each line)."""
    if eng == "hf":
        raise UserError("--optimizer adamw-bf16-states: accelerate's torch AdamW keeps its moments in the "
                        "parameters' dtype (fp32 here); add --stack torchtitan or --stack megatron")
    if eng == "deepspeed" and (precision != "bf16" or lay.zero_stage == 0):
        raise UserError("--optimizer adamw-bf16-states: DeepSpeed keeps bf16 moments only with bf16 master weights "
                        "under ZeRO-1..3 (bf16.bf16_optimizer_states needs bf16_master_weights_and_grads, "
                        "deepspeed runtime/config.py); plan with --precision bf16 --zero 1 or higher, "
                        "or another --stack")
    if eng == "megatron" and lay.zero_stage == 0:
        raise UserError("--optimizer adamw-bf16-states: Megatron-LM's precision-aware optimizer "
                        "(--exp-avg-dtype bf16) needs its distributed optimizer (megatron-core 0.16.1 "
                        "OptimizerConfig: 'only supported with distributed optimizer'); plan with --zero 1")


def plan_files(r: PlanResult, opts: EmitOptions = EmitOptions(),
               plan_json: dict[str, Any] | None = None) -> dict[str, str]:
    """Every file to write for the chosen plan, name -> text: only what its stack reads.

    deepspeed: ds_config.json, hostfile, config.json (the model's Hugging Face config), train.py;
    hf: accelerate_config.yaml, config.json, train.py (planner.emit.script); megatron:
    megatron_args.txt; torchtitan: torchtitan_job.py; every stack: launch.sh, and the
    scheduler files (slurm.sbatch, pytorchjob.yaml) that ``opts.scheduler`` asks for;
    plan.json (with the stack named) when ``plan_json`` is given.
    """
    from planner.emit.deepspeed import to_deepspeed_config
    from planner.emit.fsdp import to_accelerate_config, to_yaml
    from planner.emit.launch import to_hostfile, to_launch_script
    from planner.emit.megatron import to_megatron_args
    from planner.emit.script import to_train_script

    chosen(r)
    check_options(r, opts)
    if opts.scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler {opts.scheduler!r}: choose one of {', '.join(SCHEDULERS)}")
    stack = stack_for(r, opts)
    files: dict[str, str] = {}
    if stack == "deepspeed":
        files["ds_config.json"] = json.dumps(to_deepspeed_config(r, opts), indent=2) + "\n"
        files["hostfile"] = to_hostfile(r)
        from planner.stacks import runs_megatron_deepspeed
        if runs_megatron_deepspeed(stack, chosen(r).layout):
            from planner.emit.megatron_deepspeed import to_megatron_deepspeed_args
            files["megatron_args.txt"] = "\n".join(to_megatron_deepspeed_args(r, opts)) + "\n"
        else:
            files.update(hf_model_config(r))
            files["train.py"] = to_train_script(r, opts, stack, config_beside="config.json" in files)
    elif stack == "hf":
        files["accelerate_config.yaml"] = to_yaml(to_accelerate_config(r, opts))
        files.update(hf_model_config(r))
        files["train.py"] = to_train_script(r, opts, stack, config_beside="config.json" in files)
    elif stack == "megatron":
        files["megatron_args.txt"] = "\n".join(to_megatron_args(r, opts)) + "\n"
    else:
        from planner.emit.torchtitan import to_torchtitan_job
        files["torchtitan_job.py"] = to_torchtitan_job(r, opts)
    files["launch.sh"] = to_launch_script(r, opts, stack)
    if opts.scheduler in ("both", "slurm"):
        from planner.emit.slurm import to_slurm_script
        files["slurm.sbatch"] = to_slurm_script(r, opts, stack)
    if opts.scheduler in ("both", "kubernetes"):
        from planner.emit.kubernetes import to_manifest_yaml
        files["pytorchjob.yaml"] = to_manifest_yaml(r, opts, stack)
    if plan_json is not None:
        files["plan.json"] = json.dumps({**plan_json, "stack": stack_json(r, opts)}, indent=2) + "\n"
    return files


def hf_model_config(r: PlanResult) -> dict[str, str]:
    """config.json: the model's Hugging Face config, which a transformers script under
    DeepSpeed or accelerate builds the model from (``AutoConfig.from_pretrained(DIR)``); the
    preset's shipped file or the user's own. Empty when the model came from neither."""
    from planner.models.spec import load_hf_config, load_presets

    m = r.model
    key = m.name if m.name in load_presets() else m.source
    if not key:
        return {}
    return {"config.json": json.dumps(load_hf_config(key), indent=2) + "\n"}


def stack_json(r: PlanResult, opts: EmitOptions) -> dict[str, Any]:
    """The stack that runs the plan, as plan.json and --json give it."""
    from planner.stacks import stack_summary

    if opts.stack is not None:
        how = "--stack"
    else:
        from planner.stacks import default_stack_reason

        lay = chosen(r).layout
        how = (f"{default_stack_reason(r.model, lay, plan_kernels(r, lay) or 'auto')} "
               f"(planner.stacks.default_stack)")
    return stack_summary(stack_for(r, opts), how)
