"""Reports: the text a person reads and the JSON a script reads. The only module that
formats units (GiB = 2**30 bytes)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from .api import PlanResult
from .layouts import Layout
from .memory import CATEGORIES
from .search import Candidate
from .units import GiB

LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "logits": "logits and loss",
    "buffers": "communication buffers",
    "overhead": "overhead (CUDA, NCCL, fragmentation)",
}


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GiB:,.2f} GiB"


def params_text(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


# ------------------------------------------------------------------------------ JSON

def layout_json(lay: Layout) -> dict[str, Any]:
    return {
        "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep,
        "zero_stage": lay.zero_stage, "sharding": lay.sharding, "sp": lay.sp, "vp": lay.vp,
        "micro_batch": lay.micro_batch, "grad_accum": lay.grad_accum, "seq_len": lay.seq_len,
        "recompute": lay.recompute,
    }


def candidate_json(c: Candidate) -> dict[str, Any]:
    mem = c.memory
    return {
        "n_gpus": c.n_gpus,
        "layout": layout_json(c.layout),
        "memory_bytes": mem.breakdown.as_dict(),
        "fits": c.fits,
        "capacity_bytes": c.capacity_bytes,
        "peak": {"stage": mem.stage, "phase": mem.phase, "layers_on_stage": mem.n_layers_on_stage,
                 "in_flight_micro_batches": mem.in_flight, "kernels": mem.kernels},
    }


def assumptions(r: PlanResult) -> dict[str, Any]:
    s = r.setup
    return {
        "seq_len": s.seq_len,
        "global_batch": s.global_batch,
        "precision": s.precision,
        "optimizer": s.optimizer,
        "attention": s.attention,
        "kernels": s.kernels,
        "usable_memory_fraction": s.usable_memory_fraction,
        "overheads": asdict(s.overheads),
        "buffers": asdict(s.buffers),
        "gpu_counts_tried": list(r.result.counts_tried),
    }


def plan_json(r: PlanResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": {"name": r.model.name, "n_params": r.params.total, "n_active_params": r.params.active},
        "gpu": {"name": r.gpu.name, "memory_bytes": r.gpu.memory_bytes},
        "plan": candidate_json(r.best) if r.best else None,
        "alternatives": [candidate_json(c) for c in r.alternatives],
        "assumptions": assumptions(r),
    }
    if r.best is None:
        if r.result.smallest is not None:
            out["least_memory"] = candidate_json(r.result.smallest)
        out["fits_from_gpus"] = r.fits_from_gpus
        out["min_gpus_for_model_states"] = r.min_gpus_for_states
    return out


def to_json(r: PlanResult) -> str:
    return json.dumps(plan_json(r), indent=2)


# ------------------------------------------------------------------------------ text

def memory_table(c: Candidate) -> list[str]:
    bd = c.memory.breakdown
    cap = c.capacity_bytes
    width = 30
    lines = [f"  {'category':<38} {'per rank':>12}   share of {gib(cap)}"]
    for cat in CATEGORIES:
        v = getattr(bd, cat)
        bar = "#" * min(width, round(width * v / cap)) + (">" if v > cap else "")
        lines.append(f"  {LABELS[cat]:<38} {gib(v):>12}   {bar}")
    verdict = "fits" if c.fits else "DOES NOT FIT"
    lines.append(f"  {'total':<38} {gib(bd.total):>12}   {100 * bd.total / cap:.0f}% of the GPU: {verdict}")
    m = c.memory
    where = f"pipeline stage {m.stage} ({m.n_layers_on_stage} layers)" if c.layout.pp > 1 else "every rank"
    lines.append(f"  peak at {m.phase.replace('-', ' ')}, on {where}, "
                 f"{m.in_flight:g} micro-batch(es) of activations held, {m.kernels} kernels")
    return lines


def assumptions_text(r: PlanResult) -> list[str]:
    s = r.setup
    o = s.overheads
    return [
        f"  sequence {s.seq_len}, global batch {s.global_batch} sequences, {s.precision}, {s.optimizer}, "
        f"{s.attention} attention, {s.kernels} kernels",
        f"  overheads: CUDA context {gib(o.cuda_context_bytes)}, workspaces {gib(o.library_workspace_bytes)}, "
        f"NCCL {gib(o.nccl_bytes)}, fragmentation {o.fragmentation:.0%} of tensor memory",
        f"  GPU: {r.gpu.full_name}, {gib(r.gpu.memory_bytes)}, {r.gpu.gpus_per_node} per node",
    ]


def no_fit_text(r: PlanResult) -> list[str]:
    """Why nothing fits, the least memory any layout needs, and what would make it fit."""
    tried = r.result.counts_tried
    span = f"{tried[0]}" if len(tried) == 1 else f"{tried[0]} to {tried[-1]}"
    out = [f"No layout fits on {span} x {r.gpu.name} ({gib(r.capacity_bytes)} each)."]
    sm = r.result.smallest
    if sm is not None:
        out.append(f"The least memory any layout needs: {gib(sm.memory.total)} per rank on "
                   f"{sm.n_gpus} GPUs ({sm.layout.describe()}):")
        out += memory_table(sm)
    else:
        out.append(f"Weights, gradients and optimizer states alone need at least "
                   f"{r.min_gpus_for_states} x {r.gpu.name}, even fully sharded.")
    if r.fits_from_gpus:
        out.append(f"It fits from {r.fits_from_gpus} x {r.gpu.name}: raise --max-gpus (or drop --n-gpus), "
                   f"or use a GPU with more memory.")
    else:
        out.append("Try more GPUs, a GPU with more memory, full recomputation, or a shorter sequence.")
    return out


def to_text(r: PlanResult) -> str:
    m, pc = r.model, r.params
    active = f" ({params_text(pc.active)} active per token)" if m.is_moe else ""
    out = [f"{m.name}: {pc.total:,} parameters{active} on {r.gpu.name}", "", "Assumptions:"]
    out += assumptions_text(r)
    out.append("")
    if r.best is None:
        out += no_fit_text(r)
        return "\n".join(out)
    b = r.best
    title = "The layout you gave" if r.fixed else f"Smallest GPU count that fits: {b.n_gpus} x {r.gpu.name}"
    out.append(f"{title}")
    out.append(f"  {b.layout.describe()}")
    out.append("")
    out += memory_table(b)
    if r.alternatives:
        out += ["", f"Alternatives on {b.n_gpus} GPUs:"]
        for c in r.alternatives:
            out.append(f"  {gib(c.memory.total):>12}  {c.layout.describe()}")
    return "\n".join(out)
