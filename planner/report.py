"""Reports: the text a person reads and the JSON a script reads. The only module that
formats units (GiB = 2**30 bytes)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from .api import PlanResult
from .crosscheck import Crosscheck, crosscheck_json
from .layouts import Layout
from .memory import CATEGORIES
from .search import Candidate
from .timing import StepTime
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


def time_json(t: StepTime | None, tokens: float | None = None) -> dict[str, Any]:
    """Step-time fields of a candidate (None when it was not timed: it does not fit)."""
    if t is None:
        out: dict[str, Any] = {"step_time_s": None, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None}
    else:
        out = {"step_time_s": t.step_time_s, "tokens_per_s": t.tokens_per_s,
               "tflops_per_gpu": t.model_flops_per_s_per_gpu / 1e12, "mfu": t.mfu,
               "time": {"compute_s": t.compute_s, "comm_s": dict(t.comm_s), "bubble_s": t.bubble_s,
                        "optimizer_s": t.optimizer_s, "hardware_tflops_per_gpu": t.hardware_flops_per_s_per_gpu / 1e12,
                        "placement": list(t.placement)}}
    if tokens is not None:
        out["train_time_s"] = t.train_time_s(tokens) if t is not None else None
    return out


def candidate_json(c: Candidate, tokens: float | None = None) -> dict[str, Any]:
    mem = c.memory
    return {
        "n_gpus": c.n_gpus,
        "layout": layout_json(c.layout),
        "memory_bytes": mem.breakdown.as_dict(),
        "fits": c.fits,
        "capacity_bytes": c.capacity_bytes,
        "peak": {"stage": mem.stage, "phase": mem.phase, "layers_on_stage": mem.n_layers_on_stage,
                 "in_flight_micro_batches": mem.in_flight, "kernels": mem.kernels},
        "offload": offload_json(c),
        **time_json(c.time, tokens),
    }


def offload_json(c: Candidate) -> dict[str, Any]:
    """What offload keeps off the GPU: CPU memory and NVMe per rank and per node, and the
    node's capacities when the topology gives them (None: not checked)."""
    mem = c.memory
    return {"host_bytes_per_rank": mem.host_bytes, "nvme_bytes_per_rank": mem.nvme_bytes,
            "host_bytes_per_node": mem.host_bytes_per_node, "nvme_bytes_per_node": mem.nvme_bytes_per_node,
            "host_capacity_bytes": c.host_capacity_bytes, "nvme_capacity_bytes": c.nvme_capacity_bytes,
            "host_fits": c.host_fits}


def method_json(r: PlanResult) -> dict[str, Any]:
    """The fine-tuning method and its settings (planner.finetune)."""
    from .finetune import n_trainable_params

    ft = r.setup.finetune
    out = ft.as_dict(r.model) | {"n_trainable_params": n_trainable_params(r.model, ft, r.params),
                                 "optimizer": "adam8bit (paged)" if ft.paged_8bit_optimizer else r.setup.optimizer,
                                 "offload_optimizer": r.setup.offload_optimizer,
                                 "offload_params": r.setup.offload_params}
    if r.methods_tried:
        out["methods_tried"] = list(r.methods_tried)
    return out


def topology_name(r: PlanResult) -> str | None:
    top = r.cluster.topology if r.cluster is not None else None
    return top.name if top is not None else None


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
        "method": r.setup.finetune.method,
        "offload_optimizer": s.offload_optimizer,
        "offload_params": s.offload_params,
        "topology": topology_name(r),
        "step_time_model": asdict(r.efficiency),
        "tokens": r.tokens,
    }


def plan_json(r: PlanResult, crosscheck: Crosscheck | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": {"name": r.model.name, "n_params": r.params.total, "n_active_params": r.params.active,
                  "n_trainable_params": method_json(r)["n_trainable_params"]},
        "gpu": {"name": r.gpu.name, "memory_bytes": r.gpu.memory_bytes},
        "plan": candidate_json(r.best, r.tokens) if r.best else None,
        "alternatives": [candidate_json(c, r.tokens) for c in r.alternatives],
        "assumptions": assumptions(r),
    }
    if out["plan"] is not None:
        out["plan"]["method"] = method_json(r)
    if r.best is None:
        if r.result.smallest is not None:
            out["least_memory"] = candidate_json(r.result.smallest)
        out["fits_from_gpus"] = r.fits_from_gpus
        out["min_gpus_for_model_states"] = r.min_gpus_for_states
    out["crosscheck"] = crosscheck_json(crosscheck)
    return out


def to_json(r: PlanResult, crosscheck: Crosscheck | None = None) -> str:
    return json.dumps(plan_json(r, crosscheck), indent=2)


def topologies_json() -> list[dict[str, Any]]:
    """`plan topologies --json`: the shipped cluster topologies."""
    from .hardware import get_gpu
    from .timing import Cluster, scale_up_domain_gpus
    from .topology import list_topologies

    rows = []
    for t in list_topologies():
        gpu = get_gpu(t.gpu)
        rows.append({
            "name": t.name, "gpu": t.gpu, "gpus_per_node": t.gpus_per_node, "max_nodes": t.max_nodes,
            "nvlink_domain_gpus": scale_up_domain_gpus(Cluster(gpu=gpu, topology=t)),
            "intra_node_fabric": t.intra_node.fabric,
            "nic_bytes_per_s_per_node": t.network.nics_per_node * t.network.nic_bytes_per_s,
            "default_for": [gpu.name] if gpu.default_topology == t.name else [],
            "description": t.description, "source": t.source})
    return rows


# ------------------------------------------------------------------------------ text

def topologies_text(rows: list[dict[str, Any]]) -> str:
    out = [f"{'name':<24} {'gpu':<10} {'per node':>8} {'nodes':>6} {'NVLink':>7} {'NICs GB/s':>10}  fabric"]
    for r in rows:
        default = f"  (default for {r['gpu']})" if r["default_for"] else ""
        out.append(f"{r['name']:<24} {r['gpu']:<10} {r['gpus_per_node']:>8} {r['max_nodes']:>6} "
                   f"{r['nvlink_domain_gpus']:>7} {r['nic_bytes_per_s_per_node'] / 1e9:>10,.0f}  "
                   f"{r['intra_node_fabric']}{default}")
    out.append("NVLink: GPUs per NVLink domain, read from the graph; NICs: scale-out bandwidth per node, "
               "per direction. Pass one with --topology NAME, or your own file with --topology PATH.")
    return "\n".join(out)


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
    if m.host_bytes or m.nvme_bytes:
        cap_text = f" of {gib(c.host_capacity_bytes)}" if c.host_capacity_bytes else " (no topology figure to check)"
        line = f"  offloaded: {gib(m.host_bytes_per_node)} of CPU memory per node{cap_text}"
        if m.nvme_bytes:
            line += f", {gib(m.nvme_bytes_per_node)} on NVMe per node"
        lines.append(line + ("" if c.host_fits else ": MORE THAN THE NODE HAS"))
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
        f"  cluster: {topology_name(r) or 'no topology file (bandwidths from the GPU catalog)'}; "
        f"step times: {r.efficiency.name} overlap settings",
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


def duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.3g} s"


def time_text(t: StepTime | None, tokens: float | None) -> list[str]:
    """The predicted step time, throughput and utilisation, and where the time goes."""
    if t is None:
        return []
    out = [f"  step {duration(t.step_time_s)}, {t.tokens_per_s:,.0f} tokens/s, "
           f"{t.model_flops_per_s_per_gpu / 1e12:,.0f} TFLOP/s per GPU, MFU {t.mfu:.1%}"]
    comm = ", ".join(f"{ax} {duration(v)}" for ax, v in t.comm_s.items() if v > 0) or "none"
    out.append(f"  per step: compute {duration(t.compute_s)}, exposed communication {comm}, "
               f"pipeline bubble {duration(t.bubble_s)}, optimizer {duration(t.optimizer_s)}; "
               f"groups placed {'-'.join(t.placement)} (innermost first)")
    if tokens is not None:
        out.append(f"  {params_text(int(tokens))} tokens in {duration(t.train_time_s(tokens))} "
                   f"on {t.n_gpus} GPUs")
    return out


def crosscheck_text(c: Crosscheck) -> list[str]:
    """DeepSpeed's estimate beside the planner's figures, and why they differ."""
    d = c.deepspeed
    if d is None:
        return [f"Cross-check with DeepSpeed skipped: {c.reason}"]
    i = d.inputs
    off = "optimizer" if i.cpu_offload else ""
    off += (" and parameters" if off else "parameters") if i.cpu_offload_params else ""
    agree = "agrees to the byte" if d.planner_as_deepspeed == d.deepspeed else "differs"
    return [
        f"Cross-check with DeepSpeed's {d.estimator} ({i.num_nodes} node(s) x {i.num_gpus_per_node} GPUs, "
        f"offload: {off or 'none'}):",
        f"  {'DeepSpeed, model states per GPU':<44} {gib(d.deepspeed.gpu_bytes):>12}",
        f"  {'DeepSpeed, CPU memory per node':<44} {gib(d.deepspeed.cpu_bytes):>12}",
        f"  {'planner, weights + gradients + optimizer':<44} {gib(d.planner_model_state_bytes):>12}",
        f"  {'planner, communication buffers':<44} {gib(d.planner_buffer_bytes):>12}",
        f"  {'planner, total per rank':<44} {gib(d.planner_total_bytes):>12}",
        f"  the planner's formulas under DeepSpeed's assumptions: {gib(d.planner_as_deepspeed.gpu_bytes)} per GPU, "
        f"{gib(d.planner_as_deepspeed.cpu_bytes)} CPU per node ({agree})",
        "  why they differ:",
    ] + [f"    - {n}" for n in d.notes]


def to_text(r: PlanResult, crosscheck: Crosscheck | None = None) -> str:
    m, pc = r.model, r.params
    active = f" ({params_text(pc.active)} active per token)" if m.is_moe else ""
    out = [f"{m.name}: {pc.total:,} parameters{active} on {r.gpu.name}"]
    ft = r.setup.finetune
    if not ft.is_full or r.methods_tried:
        from .finetune import n_trainable_params
        n_train = n_trainable_params(m, ft, pc)
        tried = f" (--method auto chose it among {', '.join(r.methods_tried)})" if r.methods_tried else ""
        out.append(f"method: {ft.describe(m)}{tried}")
        out.append(f"  {n_train:,} trainable parameters ({100 * n_train / pc.total:.3g}% of the model)")
    out += ["", "Assumptions:"]
    out += assumptions_text(r)
    out.append("")
    if r.best is None:
        out += no_fit_text(r)
        return "\n".join(out)
    b = r.best
    title = "The layout you gave" if r.fixed else f"Smallest GPU count that fits: {b.n_gpus} x {r.gpu.name}"
    out.append(f"{title}")
    out.append(f"  {b.layout.describe()}")
    out += time_text(b.time, r.tokens)
    out.append("")
    out += memory_table(b)
    if r.alternatives:
        out += ["", f"Alternatives on {b.n_gpus} GPUs:"]
        for c in r.alternatives:
            step = f"{duration(c.time.step_time_s):>10}/step" if c.time else ""
            out.append(f"  {gib(c.memory.total):>12} {step}  {c.layout.describe()}")
    if crosscheck is not None:
        out += [""] + crosscheck_text(crosscheck)
    return "\n".join(out)


# ------------------------------------------------------------------- measurement

def comparison_json(m: Any, gpu: Any, cmp: Any) -> dict[str, Any]:
    """``plan measure --json``: prediction, measurement and error per category."""
    meas = cmp.measured
    return {
        "model": {"name": m.name},
        "gpu": {"name": gpu.name, "memory_bytes": gpu.memory_bytes},
        "layout": layout_json(cmp.layout),
        "rows": [{"category": r.category, "predicted_bytes": r.predicted_bytes,
                  "measured_bytes": r.measured_bytes, "error": r.error} for r in cmp.rows],
        "predicted": {"memory_bytes": cmp.predicted.as_dict(), "phase": cmp.predicted_phase},
        "measured": {k: meas[k] for k in ("peak_bytes", "peak_phase", "peak_step", "peak_module",
                                          "tracker", "device", "fake", "wall_s", "raw",
                                          "max_allocated_bytes", "max_reserved_bytes") if k in meas},
        "note": "total is the planner's total less overhead (what no tensor tracker sees) against the tracker's peak",
    }


def comparison_text(m: Any, gpu: Any, cmp: Any) -> str:
    meas = cmp.measured
    how = "fake tensors on the CPU, fake process group" if meas.get("fake") else f"real run on {meas.get('device')}"
    out = [f"{m.name}: {cmp.layout.describe()}, sequence {cmp.layout.seq_len}, {cmp.setup.precision}, "
           f"{cmp.setup.optimizer}",
           f"measured with {meas.get('tracker')} ({how}) in {meas.get('wall_s', 0):.1f} s", "",
           f"  {'category (at the peak)':<26} {'predicted':>12} {'measured':>12} {'error':>8}"]
    for r in cmp.rows:
        err = "-" if r.error is None else f"{100 * r.error:+.1f}%"
        label = "total (less overhead)" if r.category == "total" else LABELS.get(r.category, r.category)
        if r.category == "activations":
            label = "activations and loss"
        out.append(f"  {label:<26} {gib(r.predicted_bytes):>12} {gib(r.measured_bytes):>12} {err:>8}")
    out.append("")
    out.append(f"  peak: predicted at {cmp.predicted_phase.replace('-', ' ')}; measured in "
               f"{meas.get('peak_phase')} of step {meas.get('peak_step')} ({meas.get('peak_module') or 'outside modules'})")
    out.append(f"  overhead not seen by the tracker (CUDA context, NCCL, fragmentation): "
               f"{gib(cmp.predicted.overhead)}; planner total {gib(cmp.predicted.total)} of {gib(gpu.memory_bytes)}")
    if meas.get("max_allocated_bytes"):
        out.append(f"  CUDA max allocated {gib(meas['max_allocated_bytes'])}, max reserved {gib(meas['max_reserved_bytes'])}")
    return "\n".join(out)
