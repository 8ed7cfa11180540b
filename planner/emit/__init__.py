"""Configs and launch files for a chosen plan: one module per target, each returning plain data.

    deepspeed.py  ds_config.json (to_deepspeed_config)
    fsdp.py       accelerate's config YAML with its fsdp_config, and the torchrun command for FSDP2
    megatron.py   Megatron-LM's command-line arguments
    launch.py     a hostfile and the multi-node launch script
    write.py      atomic writes to a directory (the only module here that touches files)

Which engine runs a plan follows its layout: FSDP sharding without pipeline parallelism
runs under PyTorch FSDP2 (accelerate, whose parallelism config also takes tp and cp, or
torchrun); tensor, pipeline or context parallelism otherwise runs under Megatron-LM (its
distributed optimizer, Megatron FSDP for ZeRO-2/3, or --use-torch-fsdp2); pure data
parallelism with ZeRO runs under DeepSpeed. ``plan_files`` returns every file for a plan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.layouts.layout import Layout

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.search.search import Candidate

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ENGINES = ("deepspeed", "megatron", "fsdp")


@dataclass(frozen=True, kw_only=True, slots=True)
class EmitOptions:
    """What a config needs beyond the plan: offload, optimizer hyper-parameters, launch details.

    The optimizer defaults are Llama 2's pretraining recipe (Touvron et al. 2023,
    arXiv:2307.09288, Sec. 2.2: AdamW with beta1 0.9, beta2 0.95, eps 1e-5, weight decay
    0.1, gradient clipping 1.0, peak learning rate 3e-4). Offload moves optimizer states
    (and, for parameters, the weights) to CPU memory or NVMe; the planner's own memory
    figures do not subtract offloaded states yet.
    """

    offload_optimizer: str = "none"      # none | cpu | nvme
    offload_params: str = "none"         # none | cpu | nvme (ZeRO-3 or FSDP only)
    nvme_path: str = "/local_nvme"
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    sgd_momentum: float = 0.9
    script: str = "train.py"             # the user's training script (FSDP, DeepSpeed)
    master_addr: str = "node-0"          # default rendezvous host; the launch script reads $MASTER_ADDR
    master_port: int = 29500

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer != "none" or self.offload_params != "none"


def engine(lay: Layout) -> str:
    """The program that runs ``lay``: fsdp, megatron or deepspeed (see module docstring)."""
    if lay.is_fsdp and lay.pp == 1:
        return "fsdp"
    if lay.tp > 1 or lay.pp > 1 or lay.cp > 1:
        return "megatron"
    return "deepspeed"


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
    eng = engine(lay)
    for name, device in (("--offload-optimizer", opts.offload_optimizer), ("--offload-params", opts.offload_params)):
        if device not in OFFLOAD_DEVICES:
            raise UserError(f"{name} {device!r}: choose one of {', '.join(OFFLOAD_DEVICES)}")
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
    if eng == "megatron" and r.setup.precision == "bf16":
        raise UserError("Megatron-LM keeps fp32 main weights under --bf16; plan with --precision bf16-mixed")
    if eng != "fsdp" and r.setup.precision == "bf16" and lay.zero_stage == 0:
        raise UserError("DeepSpeed keeps an fp32 master copy under bf16 unless ZeRO shards it "
                        "(bf16_master_weights_and_grads needs ZeRO-1 or higher); add --zero 1 "
                        "or use --precision bf16-mixed")


def plan_files(r: PlanResult, opts: EmitOptions = EmitOptions(),
               plan_json: dict[str, Any] | None = None) -> dict[str, str]:
    """Every file to write for the chosen plan, name -> text.

    ds_config.json for ZeRO plans (DeepSpeed, or Megatron-DeepSpeed under tp/pp/cp),
    accelerate_config.yaml for FSDP plans, megatron_args.txt for plans Megatron-LM runs,
    hostfile and launch.sh for every plan, plan.json when ``plan_json`` is given.
    """
    from planner.emit.deepspeed import to_deepspeed_config
    from planner.emit.fsdp import to_accelerate_config, to_yaml
    from planner.emit.launch import to_hostfile, to_launch_script
    from planner.emit.megatron import to_megatron_args

    cand = chosen(r)
    check_options(r, opts)
    lay = cand.layout
    eng = engine(lay)
    files: dict[str, str] = {}
    if not lay.is_fsdp:
        files["ds_config.json"] = json.dumps(to_deepspeed_config(r, opts), indent=2) + "\n"
    if eng == "fsdp":
        files["accelerate_config.yaml"] = to_yaml(to_accelerate_config(r, opts))
    if eng == "megatron":
        files["megatron_args.txt"] = "\n".join(to_megatron_args(r, opts)) + "\n"
    files["hostfile"] = to_hostfile(r)
    files["launch.sh"] = to_launch_script(r, opts)
    if plan_json is not None:
        files["plan.json"] = json.dumps(plan_json, indent=2) + "\n"
    return files
