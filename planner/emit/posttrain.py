"""`--out` for post-training plans: TRL's own configs (trl 1.16), each a JSON object of the
config class's keyword arguments, which tests load with the class itself.

- RL: ``trl.GRPOConfig`` with vLLM colocated (use_vllm, vllm_mode "colocate",
  vllm_gpu_memory_utilization, vllm_tensor_parallel_size, vllm_enable_sleep_mode) and the plan's
  batch: per_device_train_batch_size x processes x steps_per_generation = the sequences
  generated per step (GRPOConfig's generation_batch_size), num_generations = --group-size.
  PPO and DPO write the plan only (TRL's PPO and DPO trainers take no colocated engine).
- Distillation: ``trl.DistillationConfig`` (TRL's knowledge-distillation trainer, a
  generalised JSD between student and teacher; beta 0.0 is the forward KL torchtune's
  ForwardKLLoss computes) with the teacher by name.

TRL trains data-parallel only (accelerate's FSDP or DeepSpeed ZeRO), so a plan whose layout
has tp, pp or cp above 1 is refused with the way out (fix --tp 1 --pp 1 --cp 1).
"""

from __future__ import annotations

import json
from typing import Any

from planner.errors import UserError
from planner.layouts.layout import Layout
from planner.search.posttrain import PosttrainPlan


def _data_parallel_only(lay: Layout, what: str) -> None:
    if lay.model_parallel > 1:
        raise UserError(f"{what} trains data-parallel only (accelerate FSDP or DeepSpeed) and the plan chose "
                        f"{lay.describe()}; run it with --tp 1 --pp 1 --cp 1 to write its config")


def _batch(plan: PosttrainPlan, lay: Layout, what: str) -> dict[str, Any]:
    """The batch and precision keys TRL's configs share (TrainingArguments'). They write bf16
    mixed precision only: a plan timed and sized at another precision (--precision fp8 with
    --bf16-layers, fp32) was written as "bf16": true; it is refused."""
    _data_parallel_only(lay, what)
    precision = plan.setup.precision
    if precision != "bf16-mixed":
        raise UserError(f"--precision {precision}: the config --out writes for {what} runs bf16 mixed precision "
                        "(TrainingArguments bf16), not this plan's; plan with --precision bf16-mixed to write it, "
                        "or drop --out")
    return {"per_device_train_batch_size": lay.micro_batch, "gradient_accumulation_steps": lay.grad_accum,
            "bf16": True, "gradient_checkpointing": lay.recompute != "none"}


def to_trl_grpo(plan: PosttrainPlan) -> dict[str, Any]:
    """GRPOConfig keyword arguments of an RL plan (GRPO, colocated vLLM)."""
    r, rl = plan.rl, plan.rl_setup
    assert r is not None and rl is not None
    lay = r.candidate.layout
    batch = _batch(plan, lay, "TRL's GRPOTrainer")
    if rl.overlapped:   # GRPOConfig (trl 1.16) has no asynchronous mode: its steps would take turns
        raise UserError(f"--rl-async {rl.off_policy_steps}: TRL's GRPOTrainer trains on-policy (GRPOConfig has no "
                        "asynchronous mode), so its config would not run this plan; drop --rl-async to write it, "
                        "or drop --out")
    return batch | {
        "num_generations": rl.group_size,
        "steps_per_generation": lay.grad_accum,
        "max_completion_length": rl.response_len,
        "use_vllm": True,
        "vllm_mode": "colocate" if rl.placement == "colocated" else "server",
        "vllm_gpu_memory_utilization": rl.engine_memory_fraction,
        "vllm_tensor_parallel_size": rl.engine_tp,
        "vllm_enable_sleep_mode": rl.engine_sleeps,
        "beta": 0.04 if rl.reference_model else 0.0,
    }


def to_trl_distillation(plan: PosttrainPlan) -> dict[str, Any]:
    """DistillationConfig keyword arguments of a distillation plan."""
    d, t = plan.distill, plan.teacher
    assert d is not None and t is not None
    return _batch(plan, d.candidate.layout, "TRL's DistillationTrainer") | {
        "teacher_model_name_or_path": t.source or t.name, "beta": 0.0, "temperature": 1.0}


# every file a post-training --out may write (emit.write.write_files' ``owned``)
POSTTRAIN_FILE_NAMES = ("posttrain_plan.json", "trl_grpo_config.json", "trl_distillation_config.json")


def posttrain_files(plan: PosttrainPlan, plan_json: dict[str, Any]) -> dict[str, str]:
    """File name -> text for --out: the plan (``plan_json``, report.posttrain's), and the
    stack's config where TRL runs it."""
    files = {"posttrain_plan.json": json.dumps(plan_json, indent=2) + "\n"}
    if plan.distill is not None:
        files["trl_distillation_config.json"] = json.dumps(to_trl_distillation(plan), indent=2) + "\n"
    elif plan.rl is not None and plan.rl_setup is not None and plan.rl_setup.task == "grpo":
        files["trl_grpo_config.json"] = json.dumps(to_trl_grpo(plan), indent=2) + "\n"
    return files
