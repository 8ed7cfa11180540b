"""Prediction against measurement: the planner's per-rank memory beside PyTorch's trackers.

A real training step of the transformers model (planner/measure.py) is the referee. Only
layouts that PyTorch can run on one process with a fake process group are measurable:
data parallelism, replicated (ZeRO-0), FSDP2 shard-grad-op (ZeRO-2-like) or full shard
(ZeRO-3). Tensor, pipeline, context and expert parallelism need the model's code split
across ranks (Megatron-style), which transformers' models do not do, so they are refused
with that reason.

Categories compared, at the moment of the peak (as the trackers snapshot it):
weights, gradients, optimizer states, activations (the planner's activations plus logits
and loss, against the tracker's activations, temporaries and inputs), buffers, and the
total. The planner's ``overhead`` (CUDA context, NCCL, fragmentation) is what no tensor
tracker sees, so ``total - overhead`` is the figure held against the tracker's peak.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import Any

from planner.errors import UserError
from planner.layouts.layout import AXIS_NAMES, Layout
from planner.memory.model import MemoryBreakdown, per_rank_memory
from planner.models.spec import ModelSpec, count_params
from planner.training.setup import TrainingSetup

MEASURABLE_TYPES = ("llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2", "gpt2", "bert", "gpt_neox",
                    "qwen3", "qwen3_moe", "deepseek_v3", "llama4_text", "gemma3_text", "gpt_oss", "phi3", "olmo2",
                    "nemotron_h", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "glm4_moe", "minimax_m2",
                    "deepseek_v32", "kimi_linear")
# A vision-language model's step runs real tensors (planner.measure.images): tiny configs only
MAX_MEASURED_VLM_PARAMS = 200_000_000
ROWS = ("weights", "gradients", "optimizer", "activations", "buffers", "total")


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    category: str
    predicted_bytes: int
    measured_bytes: int

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when nothing was measured."""
        if self.measured_bytes == 0:
            return None
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    layout: Layout
    setup: TrainingSetup
    predicted: MemoryBreakdown
    predicted_phase: str
    rows: tuple[Row, ...]
    measured: dict[str, Any]         # MeasuredMemory as a dict
    # the moment the category rows are read at (planner.memory.peak.MOMENTS; "" at each side's peak,
    # as for Hugging Face models), every moment's totals (titan_moments.MomentTotals) and notes on
    # categories still apart at that moment (planner.measure.titan_moments)
    moment: str = ""
    moment_totals: tuple[Any, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def total_error(self) -> float:
        err = self.rows[-1].error
        assert err is not None
        return err


def measurable(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> str:
    """The measurement's sharding name, or a UserError saying why it cannot be measured."""
    if m.vision is not None and count_params(m).total > MAX_MEASURED_VLM_PARAMS:
        raise UserError(f"a vision-language step is measured with real tensors on the CPU: {m.name} has "
                        f"{count_params(m).total:,} parameters, above {MAX_MEASURED_VLM_PARAMS:,}; measure a tiny "
                        f"config of the same wrapper")
    if m.model_type not in MEASURABLE_TYPES and not m.is_generic:    # a generic model is transformers' own
        raise UserError(f"model_type {m.model_type!r} cannot be measured here; "
                        f"measurable: {', '.join(MEASURABLE_TYPES)}")
    for axis in (a for a in AXIS_NAMES if a != "dp"):
        if getattr(lay, axis) > 1:
            raise UserError(
                f"--{axis} {getattr(lay, axis)} cannot be measured: transformers' models are not split "
                f"across ranks by {axis}; measure dp layouts (ZeRO-0, ZeRO-2/FSDP grad-op, ZeRO-3/FSDP full)")
    if lay.sharding == "fsdp-hybrid":
        raise UserError("--fsdp hybrid cannot be measured on one process; measure --fsdp full")
    if lay.zero_stage == 1:
        raise UserError("ZeRO-1 has no FSDP2 equivalent to measure; measure --zero 2 (grad-op) or --zero 3 (full)")
    if lay.recompute == "selective":
        raise UserError("--recompute selective cannot be measured (transformers checkpoints whole blocks); use none "
                        "or full")
    if setup.precision == "fp16-mixed":
        raise UserError("--precision fp16-mixed cannot be measured; use bf16-mixed, bf16 or fp32")
    if setup.finetune.method == "qlora" or setup.finetune.quant != "none":
        raise UserError("quantized bases (--method qlora, --quant) need bitsandbytes' GPU kernels and cannot "
                        "be measured here; measure --method lora (the same adapters over a 16-bit base)")
    if m.is_moe and setup.precision == "fp32":
        raise UserError("an MoE model in fp32 cannot be measured: transformers' grouped expert matmul "
                        "(torch._grouped_mm) takes bf16 only; measure --precision bf16-mixed")
    if setup.optimizer == "adam8bit":
        raise UserError("--optimizer adam8bit cannot be measured (it needs bitsandbytes and a GPU); use adamw, sgd "
                        "or adafactor")
    if lay.micro_batch * lay.seq_len > 1 << 22:
        raise UserError("micro-batch x sequence above 4M tokens is too large to measure here")
    return {0: "none", 2: "grad-op", 3: "full"}[lay.zero_stage]


def measured_layout(lay: Layout) -> Layout:
    """What the measurement runs: FSDP2 for ZeRO-2/3, one micro-batch per step."""
    sharding = {0: "zero", 2: "fsdp-grad-op", 3: "fsdp-full"}[lay.zero_stage]
    return replace(lay, sharding=sharding, grad_accum=1)


def measured_setup(setup: TrainingSetup, lay: Layout) -> TrainingSetup:
    """The measurement runs Hugging Face's eager ops with single-tensor optimizers
    (foreach=False: multi-tensor optimizers are mis-counted under fake tensors).

    Attention is the plan's own: "flash" runs PyTorch's scaled_dot_product_attention,
    "eager" Hugging Face's eager attention. Models with dropout (GPT-2) used to be
    predicted with eager attention here, because on the CPU scaled_dot_product_attention
    has no fused kernel with dropout and falls back to the math kernel (s x s
    probabilities); and CPU dropout keeps a noise tensor of the input's dtype, not a bool
    mask. Both are CPU-only: the measurement runs dropout as CUDA does
    (planner.measure.trackers._gpu_dropout_kernels), so the prediction needs no switch."""
    return replace(setup, kernels="eager", optimizer_foreach=False,
                   global_batch=lay.micro_batch * lay.data_parallel)


def measure_payload(hf_config: dict[str, Any], lay: Layout, setup: TrainingSetup, sharding: str,
                    fake: bool = True, lora_targets: list[str] | str | None = None) -> dict[str, Any]:
    """The MeasureSetup fields (planner.measure.trackers) for one layout and set-up."""
    payload = {
        "hf_config": hf_config, "dp": lay.dp, "sharding": sharding, "micro_batch": lay.micro_batch,
        "seq_len": lay.seq_len, "precision": setup.precision, "optimizer": setup.optimizer,
        "recompute": lay.recompute, "attention": "sdpa" if setup.attention == "flash" else "eager",
        "fake": fake,
    }
    payload |= finetune_payload(setup)
    if setup.images_per_sample or not setup.finetune.freeze_vision:
        payload |= {"images_per_sample": setup.images_per_sample, "freeze_vision": setup.finetune.freeze_vision}
    if lora_targets is not None and payload.get("method") == "lora":
        payload["lora_targets"] = lora_targets
    return payload


def run_measurement(hf_config: dict[str, Any], lay: Layout, setup: TrainingSetup, sharding: str,
                    fake: bool = True, timeout_s: float = 900,
                    lora_targets: list[str] | str | None = None) -> dict[str, Any]:
    """Run planner.measure.trackers in a fresh Python process (so peaks start from zero)."""
    payload = measure_payload(hf_config, lay, setup, sharding, fake, lora_targets)
    cmd = [sys.executable, "-m", "planner.measure.trackers", json.dumps(payload)]
    if not fake and sharding != "none" and lay.dp > 1:
        cmd.insert(3, f"--nproc={lay.dp}")   # one process per GPU, NCCL (torchrun)
    try:
        out = subprocess.run(cmd,
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"the measurement ran past {timeout_s:.0f} s; "
                        "try a shorter --seq-len or a smaller model") from None
    if out.returncode == 2:
        raise UserError(out.stderr.strip().splitlines()[-1].removeprefix("error: "))
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named 'peft'" in out.stderr:
            raise UserError("plan measure --method lora needs peft: pip install -c constraints.txt -e '.[measure]'")
        if "No module named 'torch'" in out.stderr or "No module named 'transformers'" in out.stderr:
            raise UserError("plan measure needs torch and transformers: pip install -c constraints.txt -e '.[measure]'")
        raise RuntimeError(f"the measurement failed: {tail}")
    return json.loads(out.stdout)


def finetune_payload(setup: TrainingSetup) -> dict[str, Any]:
    """MeasureSetup's method fields for the planner's FinetuneSpec (LoRA targets as given;
    compare() passes them as PEFT names)."""
    ft = setup.finetune
    if ft.method == "full":
        return {}
    if ft.method == "freeze":
        return {"method": "freeze", "trainable_layers": ft.trainable_layers}
    out: dict[str, Any] = {"method": "lora", "lora_rank": ft.lora_rank, "lora_alpha": ft.lora_alpha,
                           "lora_dropout": ft.lora_dropout}
    if ft.lora_targets:
        out["lora_targets"] = list(ft.lora_targets)
    return out


def peft_targets(m: ModelSpec, setup: TrainingSetup) -> list[str] | str | None:
    """The planner's LoRA targets as PEFT target_modules: None (PEFT's default for the
    architecture), "all-linear", or the resolved module names (expert projections by
    their transformers 4 names w1, w2, w3, which PEFT maps onto the fused experts)."""
    from planner.training.finetune import resolve_targets

    ft = setup.finetune
    if not ft.lora_targets:
        return None
    if ft.lora_targets == ("all-linear",):
        return "all-linear"
    names: list[str] = []
    for lin in resolve_targets(m, ft):
        names += list(lin.aliases) if lin.expert else [lin.name]
    return names


def predicted_rows(bd: MemoryBreakdown) -> dict[str, int]:
    """The planner's figures in ROWS' categories (the logits count as activations, the total
    leaves out the overhead no tracker sees), bytes."""
    return {"weights": bd.weights, "gradients": bd.gradients, "optimizer": bd.optimizer,
            "activations": bd.activations + bd.logits, "buffers": bd.buffers, "total": bd.tracked}


def predict(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> tuple[dict[str, int], str]:
    """What compare() predicts for ``lay``, without measuring: (ROWS in bytes, peak phase).
    bench/accuracy.py --repredict uses it to redo the table from stored measurements."""
    lay = measured_layout(lay)
    pred = per_rank_memory(m, measured_setup(setup, lay), lay)
    return predicted_rows(pred.breakdown), pred.phase


def compare(m: ModelSpec, hf_config: dict[str, Any], setup: TrainingSetup, lay: Layout,
            fake: bool = True, in_process: bool = False) -> Comparison:
    """Predict and measure the same step; rows per category and the total. ``in_process``
    measures in this process (the tracker's peaks are fresh per call; only CUDA's own
    maxima need a fresh process), saving the start-up of a new one."""
    sharding = measurable(m, setup, lay)
    lay = measured_layout(lay)
    if in_process:
        import dataclasses

        from planner.measure.trackers import MeasureSetup, measure
        payload = measure_payload(hf_config, lay, setup, sharding, fake, peft_targets(m, setup))
        got = dataclasses.asdict(measure(MeasureSetup(**payload)))
    else:
        got = run_measurement(hf_config, lay, setup, sharding, fake=fake, lora_targets=peft_targets(m, setup))
    setup = measured_setup(setup, lay)
    pred = per_rank_memory(m, setup, lay)
    bd = pred.breakdown
    predicted = predicted_rows(bd)
    measured = {
        "weights": got["weights_bytes"],
        "gradients": got["gradients_bytes"],
        "optimizer": got["optimizer_bytes"],
        "activations": got["activations_bytes"] + got["temporaries_bytes"] + got["inputs_bytes"],
        "buffers": got["buffers_bytes"],
        "total": got["peak_bytes"],
    }
    rows = tuple(Row(category=c, predicted_bytes=predicted[c], measured_bytes=measured[c]) for c in ROWS)
    return Comparison(layout=lay, setup=setup, predicted=bd, predicted_phase=pred.phase, rows=rows,
                      measured=got)
