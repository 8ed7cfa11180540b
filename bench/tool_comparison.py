"""What other estimators say about the configurations PyTorch's trackers measured.

docs/accuracy.md holds per-rank peaks measured with PyTorch's MemTracker / FSDPMemTracker on
the real transformers models (fake tensors, a fake process group). This script puts beside
each measurement what a user gets from the tools they would otherwise reach for:

- accelerate's `accelerate estimate-memory`: its own functions (`calculate_maximum_sizes`,
  `estimate_training_usage`) on the model it builds (transformers' `AutoModel` in fp32 on
  the meta device), without the Hub download. One device, no activations, no sharding.
- DeepSpeed's `estimate_zero2_model_states_mem_needs` / `estimate_zero3_...`: model states
  per GPU for ZeRO-2/3 (called through planner.measure.crosscheck, with DeepSpeed's default buffer
  factor). No activations.
- llm-analysis 0.2.2 (its own virtual environment, made by bench/speed.py's helper): its
  `train()` per-GPU total (weights, optimizer, gradients, activations) for the models it
  ships a config for and the precisions it has (16-bit only).
- the planner: the prediction of `plan measure` for the same step (total less overhead,
  the figure held against the tracker).

    python bench/tool_comparison.py          # print and rewrite docs/tool-comparison.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import llm_analysis_python  # noqa: E402  (the same llm-analysis environment)

from planner.layouts.layout import Layout  # noqa: E402
from planner.measure.crosscheck import EstimatorInputs, deepspeed_figures  # noqa: E402
from planner.memory.model import rank_params  # noqa: E402
from planner.models.spec import count_params, load_hf_config, load_model  # noqa: E402
from planner.units import GiB  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ACCURACY = ROOT / "docs" / "accuracy.json"
DOC = ROOT / "docs" / "tool-comparison.md"
CACHE = Path(os.environ.get("PLANNER_BENCH_CACHE", Path.home() / ".cache" / "planner-bench"))

# llm-analysis ships configs for these of the measured models (its model_configs/*.json)
LLM_ANALYSIS_MODELS = {"gpt2-large": "gpt2-large"}
LLM_ANALYSIS_DRIVER = r'''
import json, sys
from llm_analysis.analysis import train
out = []
for row in json.load(sys.stdin):
    try:
        s = train(model_name=row["model"], gpu_name="a100-sxm-80gb", dtype_name="w16a16e16", log_level="ERROR",
                  batch_size_per_gpu=row["mb"], gradient_accumulation_steps=1, seq_len=row["seq"],
                  activation_recomputation=row["rc"], ds_zero=row["zero"], dp_size=row["dp"], tp_size=1, pp_size=1,
                  flash_attn=True, num_gpus_per_node=min(8, row["dp"]))
        out.append(s["(weight+op_state+grad+act)_memory_per_gpu"])
    except BaseException as e:
        out.append(str(e).splitlines()[0][:120] if str(e) else type(e).__name__)
print(json.dumps(out))
'''


def accelerate_estimate_bytes(model_name: str, precision: str) -> int:
    """`accelerate estimate-memory`'s "Training using Adam" column for one dtype: the largest
    of its model, gradient, optimizer and step figures (accelerate/commands/estimate.py),
    computed by accelerate's own functions on the model it would build."""
    import torch
    import transformers
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    cfg = load_hf_config(model_name)
    config = transformers.AutoConfig.for_model(**cfg)
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config, torch_dtype=torch.float32)
    total_size, _largest = calculate_maximum_sizes(model)
    dtype = "float32" if precision == "fp32" else "bfloat16"
    return int(max(estimate_training_usage(total_size, dtype).values()))


def deepspeed_estimate_bytes(model_name: str, dp: int, zero: int) -> int | None:
    """DeepSpeed's per-GPU model states for ZeRO-2/3 at the row's data-parallel size."""
    if zero not in (2, 3):
        return None
    m = load_model(model_name)
    pc = count_params(m)
    per_node = min(8, dp)
    largest = rank_params(m, pc, Layout(), 0, m.n_layers).largest_module
    inp = EstimatorInputs(stage=zero, total_params=pc.total, largest_layer_params=largest,
                          num_gpus_per_node=per_node, num_nodes=max(1, dp // per_node),
                          cpu_offload=False, cpu_offload_params=False)
    return deepspeed_figures(inp).gpu_bytes


def llm_analysis_estimates(rows: list[dict]) -> list[float | str | None]:
    """llm-analysis's per-GPU total for the rows it can express; None for the others."""
    asks = [i for i, r in enumerate(rows) if r["model"] in LLM_ANALYSIS_MODELS and r["precision"] != "fp32"]
    out: list[float | str | None] = [None] * len(rows)
    py = llm_analysis_python(CACHE)
    if py is None or not asks:
        return out
    payload = json.dumps([{"model": LLM_ANALYSIS_MODELS[rows[i]["model"]], "mb": rows[i]["micro_batch"],
                           "seq": rows[i]["seq_len"], "dp": rows[i]["dp"], "zero": rows[i]["zero"],
                           "rc": {"none": 0, "selective": 1, "full": 2}[rows[i]["recompute"]]} for i in asks])
    p = subprocess.run([str(py), "-c", LLM_ANALYSIS_DRIVER], input=payload, capture_output=True, text=True,
                       timeout=600, check=False)
    if p.returncode != 0:
        print(f"llm-analysis failed: {p.stderr[-300:]}", file=sys.stderr)
        return out
    for i, v in zip(asks, json.loads(p.stdout.strip().splitlines()[-1]), strict=True):
        out[i] = v
    return out


def fmt(est: float | str | None, measured: float) -> str:
    if est is None:
        return "-"
    if isinstance(est, str):
        return "refused"
    return f"{est / GiB:.2f} ({(est - measured) / measured:+.0%})"


def main() -> None:
    rows = json.loads(ACCURACY.read_text())
    llm = llm_analysis_estimates(rows)
    cache: dict[tuple[str, str], int] = {}
    lines = []
    errs: dict[str, list[float]] = {"accelerate": [], "deepspeed": [], "llm-analysis": [], "planner": []}
    for r, la in zip(rows, llm, strict=True):
        meas = r["rows"]["total"]["measured"]
        pred = r["rows"]["total"]["predicted"]
        key = (r["model"], r["precision"])
        if key not in cache:
            cache[key] = accelerate_estimate_bytes(*key)
        acc = cache[key]
        ds = deepspeed_estimate_bytes(r["model"], r["dp"], r["zero"])
        errs["accelerate"].append(abs(acc - meas) / meas)
        errs["planner"].append(abs(pred - meas) / meas)
        if ds is not None:
            errs["deepspeed"].append(abs(ds - meas) / meas)
        if isinstance(la, float | int):
            errs["llm-analysis"].append(abs(la - meas) / meas)
        lines.append(f"| {r['model']} | {r['dp']} | {r['zero']} | {r['precision']} | {r['seq_len']} | "
                     f"{r['micro_batch']} | {r['recompute']} | **{meas / GiB:.2f}** | {fmt(pred, meas)} | "
                     f"{fmt(acc, meas)} | {fmt(ds, meas)} | {fmt(la, meas)} |")

    def med(xs: list[float]) -> str:
        if not xs:
            return "-"
        s = sorted(xs)
        mid = (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2
        return f"{mid:.1%} median, {max(s):.0%} worst ({len(s)} rows)"

    doc = """# The planner beside other estimators

Generated by `python bench/tool_comparison.py` (do not edit by hand) from the measurements
in [accuracy.md](accuracy.md): each row is the per-rank peak PyTorch's memory trackers
measured on the real transformers model (GiB), and each estimator's figure for the same
training step with its error against that measurement.

- **planner**: `plan measure`'s prediction (total less the overhead no tracker sees).
- **accelerate**: `accelerate estimate-memory`'s "Training using Adam" column, computed by
  accelerate's own `calculate_maximum_sizes` and `estimate_training_usage` on the model it
  builds (transformers' `AutoModel`, fp32, meta device). It describes one device at batch 1:
  no activations, no sharding, the same figure whatever the data-parallel size. In bf16 it
  reports the optimizer's 8 B per parameter as the peak, not the 16 B mixed precision holds.
- **DeepSpeed**: `estimate_zero2_model_states_mem_needs` / `estimate_zero3_...` per GPU at
  the row's data-parallel size; model states only, ZeRO-2/3 only.
- **llm-analysis** 0.2.2: `train()`'s per-GPU weights + optimizer + gradients + activations,
  for the models it ships a config for (GPT-2 large of these) in 16-bit precision
  (`w16a16e16`, fp32 master weights), flash attention. "refused": it raised an error.

| model | dp | ZeRO | precision | seq | mb | recompute | measured | planner | accelerate | DeepSpeed | llm-analysis |
|---|---|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(lines) + f"""

Absolute error against the measurement:

- planner: {med(errs["planner"])}
- accelerate estimate-memory: {med(errs["accelerate"])}
- DeepSpeed's estimators: {med(errs["deepspeed"])}
- llm-analysis: {med(errs["llm-analysis"])}

Why they differ: accelerate and DeepSpeed size model states only, so every row whose peak
holds activations (long sequences, no recomputation) is under-estimated, and accelerate's
figure does not shrink with sharding. DeepSpeed's estimators are exact for the model
states they describe ([deepspeed-comparison.md](deepspeed-comparison.md)); the rest of
the peak is what they leave out. llm-analysis adds Korthikanti et al.'s per-layer
activations and the logits once at 16 bits (its `get_activation_memory_output_embedding`),
but not the loss's fp32 copies of the logits and their gradients, nor FSDP's gathered
units.
"""
    DOC.write_text(doc)
    print(doc)


if __name__ == "__main__":
    main()
