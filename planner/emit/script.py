"""train.py for the DeepSpeed and Hugging Face stacks: the script their launch.sh runs.

The text is planner/emit/train_template.py (a standalone script: it imports nothing from
the planner) with its ``PLAN = {}`` line replaced by the plan's numbers: the model's name,
the layout, the training length and learning-rate schedule (planner.emit.schedule), the
micro-batch and accumulation, the optimizer's hyper-parameters (EmitOptions) and whether
activations are recomputed. Under DeepSpeed the optimizer and schedule come from
ds_config.json, which carries the same numbers.
"""

from __future__ import annotations

import pprint
from importlib import resources
from typing import TYPE_CHECKING, Any

from planner.emit import EmitOptions, chosen
from planner.emit.schedule import training_schedule

if TYPE_CHECKING:
    from planner.api import PlanResult

TEMPLATE = "train_template.py"
PLACEHOLDER = "PLAN: dict[str, Any] = {}   # filled by plan --out\n"


def train_settings(r: PlanResult, opts: EmitOptions) -> dict[str, Any]:
    """What train.py reads from PLAN."""
    lay = chosen(r).layout
    sch = training_schedule(r, opts)
    return {"model": r.model.name, "layout": lay.describe(), "stack": opts.stack,
            "steps": sch.steps, "seq_len": lay.seq_len, "micro_batch": lay.micro_batch,
            "grad_accum": lay.grad_accum, "lr": sch.peak_lr, "min_lr_ratio": float(f"{sch.min_lr / sch.peak_lr:.6g}"),
            "warmup_steps": sch.warmup_steps, "betas": list(opts.betas), "eps": opts.eps,
            "weight_decay": opts.weight_decay, "grad_clip": opts.grad_clip, "recompute": lay.recompute,
            "schedule": sch.describe()}


def to_train_script(r: PlanResult, opts: EmitOptions, stack: str, config_beside: bool = True) -> str:
    """The text of train.py for ``stack`` (deepspeed or hf). Without a config.json beside it
    (``config_beside`` False) the script's default --model is where the model came from."""
    text = resources.files("planner.emit").joinpath(TEMPLATE).read_text(encoding="utf-8")
    if PLACEHOLDER not in text:
        raise AssertionError(f"{TEMPLATE} lost its PLAN placeholder")
    settings = {**train_settings(r, opts), "stack": stack,
                "model_source": None if config_beside else (r.model.source or r.model.name)}
    plan = "PLAN: dict[str, Any] = " + pprint.pformat(settings, sort_dicts=False, width=110) + "\n"
    # names are data (issue 32): the model's name only inside PLAN, as a Python literal
    head = f"# Written by planner for the plan in PLAN below ({settings['layout']}), stack {stack}.\n"
    return head + text.replace(PLACEHOLDER, plan)
