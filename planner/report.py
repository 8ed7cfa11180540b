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
    for shaped_like_plan in ([out["plan"]] if out["plan"] is not None else []) + out["alternatives"]:
        shaped_like_plan["method"] = method_json(r)
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
    ] + ([f"  offload: optimizer states -> {s.offload_optimizer}, parameters -> {s.offload_params}; "
          f"CPU memory per node: {gib(r.host_capacity_bytes) if r.host_capacity_bytes else 'not given by the topology'}"]
         if s.offload_optimizer != "none" or s.offload_params != "none" else [])


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


# --------------------------------------------------------------------- --task load

LOAD_LABELS = {"weights": "weights", "kv_cache": "KV cache", "activations": "prefill working set",
               "overhead": "overhead (CUDA, NCCL, fragmentation)"}


def load_json(r: Any) -> str:
    """`plan --task load --json`: the split, the memory of the most loaded GPU, the settings."""
    s = r.setup
    return json.dumps({
        "task": "load",
        "model": {"name": r.model.name, "n_params": r.params.total},
        "gpu": {"name": r.gpu.name, "memory_bytes": r.gpu.memory_bytes},
        "load": {"n_gpus": r.n_gpus, "tp": r.tp, "pp": r.pp, "fits": r.fits, "capacity_bytes": r.capacity_bytes,
                 "memory_bytes": r.memory.as_dict()},
        "assumptions": {"weight_bytes": s.weight_bytes, "quant": s.quant, "batch": s.batch, "context": s.context,
                        "kv_bytes": s.kv_bytes, "usable_memory_fraction": s.usable_memory_fraction,
                        "overheads": asdict(s.overheads)},
    }, indent=2)


def load_text(r: Any) -> str:
    s, m = r.setup, r.model
    fmt = {"none": f"{8 * s.weight_bytes}-bit", "int8": "int8 (LLM.int8)", "int4": "int4 (group 128)",
           "nf4": "NF4 (4-bit, double-quantized constants)"}[s.quant]
    out = [f"{m.name}: {r.params.total:,} parameters, held for inference on {r.gpu.name}",
           f"  weights {fmt}" + (", embeddings and LM head in 16 bits" if s.quant != "none" else "")
           + f"; KV cache for {s.batch} sequence(s) of {s.context:,} tokens, {8 * s.kv_bytes}-bit", ""]
    head = "The split you gave" if r.fixed else ("Fewest GPUs that hold it" if r.fits else "Nothing fits; the least memory tried")
    out.append(f"{head}: {r.n_gpus} x {r.gpu.name} (tp={r.tp}, pp={r.pp})")
    cap = r.capacity_bytes
    for key, label in LOAD_LABELS.items():
        out.append(f"  {label:<38} {gib(getattr(r.memory, key)):>12}")
    verdict = "fits" if r.fits else "DOES NOT FIT"
    out.append(f"  {'total per GPU':<38} {gib(r.memory.total):>12}   {100 * r.memory.total / cap:.0f}% of "
               f"{gib(cap)}: {verdict}")
    return "\n".join(out)


# ------------------------------------------------------------------- measurement

def comparison_json(m: Any, gpu: Any, cmp: Any) -> dict[str, Any]:
    """``plan measure --json``: prediction, measurement and error per category."""
    meas = cmp.measured
    return {
        "model": {"name": m.name},
        "gpu": {"name": gpu.name, "memory_bytes": gpu.memory_bytes},
        "layout": layout_json(cmp.layout),
        "method": cmp.setup.finetune.as_dict(m),
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
    ft = cmp.setup.finetune
    method = "" if ft.is_full else f"\n{ft.describe(m)}"
    out = [f"{m.name}: {cmp.layout.describe()}, sequence {cmp.layout.seq_len}, {cmp.setup.precision}, "
           f"{cmp.setup.optimizer}{method}",
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


# ------------------------------------------------------------- cost (plan --tokens)

def _cost_fields(p: Any) -> dict[str, Any]:
    """cost_usd, train_time_s and gpu_hours of a priced plan (planner.costplan.PricedPlan)."""
    return {"cost_usd": p.cost_usd, "train_time_s": p.train_time_s, "gpu_hours": p.gpu_hours}


def _limits_json(r: Any) -> dict[str, Any]:
    lim = r.limits
    return {"deadline_s": lim.deadline_s, "budget_usd": lim.budget_usd, "max_gpus": lim.max_gpus}


def _meets(r: Any, p: Any) -> list[str]:
    """The constraints a priced plan breaks (deadline, budget)."""
    lim, out = r.limits, []
    if lim.deadline_s is not None and p.train_time_s > lim.deadline_s:
        out.append("deadline")
    if lim.budget_usd is not None and (p.cost_usd or 0.0) > lim.budget_usd:
        out.append("budget")
    return out


def prices_json(prices: Any, gpu_names: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in gpu_names:
        p = prices.for_gpu(name)
        out[name] = {"rent_usd_per_gpu_hour": p.rent_usd_per_gpu_hour, "rent_source": p.rent_source,
                     "rent_date": p.rent_date, "node_purchase_usd": p.node_purchase_usd,
                     "purchase_source": p.purchase_source, "purchase_date": p.purchase_date,
                     "node_power_kw": p.node_power_kw, "power_source": p.power_source}
    return out


def cost_json(r: Any, crosscheck: Crosscheck | None = None) -> dict[str, Any]:
    """`plan --tokens --json`: the plain plan's object, each plan with cost_usd, train_time_s
    and gpu_hours, the table by GPU count, the constraints and the solver."""
    out = plan_json(r.result, crosscheck)
    if r.chosen is not None:
        from .costplan import price_plan
        out["plan"].update({"gpu": r.chosen.gpu.name, **_cost_fields(r.chosen)})
        for alt, c in zip(out["alternatives"], r.result.alternatives):
            alt.update({"gpu": r.chosen.gpu.name, **_cost_fields(price_plan(r.chosen.gpu, c, r.tokens, r.prices))})
    out["objective"] = r.objective
    out["tokens"] = r.tokens
    out["constraints"] = _limits_json(r)
    out["gpus_considered"] = [g.name for g in r.gpus]
    out["by_gpu_count"] = [{"gpu": p.gpu.name, "n_gpus": p.n_gpus, **_cost_fields(p),
                            "step_time_s": p.candidate.time.step_time_s, "mfu": p.candidate.time.mfu,
                            "layout": layout_json(p.candidate.layout), "breaks": _meets(r, p),
                            "chosen": r.chosen is not None and p.candidate is r.chosen.candidate}
                           for p in r.by_count]
    out["solver"] = {**r.solver.as_dict(), "n_candidates": r.n_options}
    out["prices"] = prices_json(r.prices, [g.name for g in r.gpus])
    out["prices"]["electricity"] = {"usd_per_kwh": r.prices.electricity_usd_per_kwh, "pue": r.prices.pue}
    out["prices_overrides"] = r.prices.overrides
    d = r.diagnosis
    out["infeasible"] = None if d is None else {
        "binding": list(d.binding), "fits_from_gpus": d.fits_from_gpus,
        "deadline_needs_gpus": d.deadline_needs_gpus, "budget_allows_gpus": d.budget_allows_gpus,
        "message": " ".join(d.lines)}
    out["search_s"] = r.search_s
    return out


def _rent_text(r: Any) -> list[str]:
    out = []
    for g in r.gpus:
        p = r.prices.for_gpu(g.name)
        if p.rent_usd_per_gpu_hour is None:
            out.append(f"  {g.name}: no rental price")
        else:
            date = f", {p.rent_date}" if p.rent_date else ""
            out.append(f"  {g.name}: ${p.rent_usd_per_gpu_hour:,.2f} per GPU-hour ({p.rent_source}{date})")
    return out


def cost_table(r: Any) -> list[str]:
    """The fastest (so cheapest) plan at each GPU type and count."""
    from .costplan import usd
    lines = [f"  {'':1} {'gpu':<9} {'GPUs':>6} {'cost':>10} {'time':>12} {'GPU-hours':>12} {'MFU':>6}  layout"]
    for p in r.by_count:
        mark = "*" if r.chosen is not None and p.candidate is r.chosen.candidate else " "
        broken = _meets(r, p)
        cost = usd(p.cost_usd) if p.cost_usd is not None else "-"
        note = f"  (over {' and '.join(broken)})" if broken else ""
        lines.append(f"  {mark} {p.gpu.name:<9} {p.n_gpus:>6} {cost:>10} {duration(p.train_time_s):>12} "
                     f"{p.gpu_hours:>12,.0f} {p.candidate.time.mfu:>6.1%}  {p.candidate.layout.describe()}{note}")
    return lines


def cost_text(r: Any, crosscheck: Crosscheck | None = None) -> str:
    """`plan --tokens`: the chosen plan, its cost and time, the table by GPU count, the solver."""
    from .costplan import usd
    res = r.result
    m, pc = res.model, res.params
    lim = r.limits
    goal = "the cost" if r.objective == "cost" else "the time"
    out = [f"{m.name}: {pc.total:,} parameters; {params_text(int(r.tokens))} tokens; minimising {goal}"]
    cons = [f"deadline {duration(lim.deadline_s)}" if lim.deadline_s is not None else "no deadline",
            f"budget {usd(lim.budget_usd)}" if lim.budget_usd is not None else "no budget",
            f"at most {lim.max_gpus:,} GPUs"]
    out.append(f"  GPU types {', '.join(g.name for g in r.gpus)}; {'; '.join(cons)}")
    ft = res.setup.finetune
    if not ft.is_full:
        out.append(f"  method: {ft.describe(m)}")
    out += ["", "Prices (override with --prices FILE):"] + _rent_text(r)
    out += ["", "Assumptions:"] + assumptions_text(res) + [""]
    if r.chosen is None:
        out.append("No plan satisfies the constraints.")
        out += [f"  {line}" for line in (r.diagnosis.lines if r.diagnosis else ())]
    else:
        c = r.chosen
        what = "Cheapest plan" if r.objective == "cost" else "Fastest plan"
        cost = usd(c.cost_usd) if c.cost_usd is not None else "no price"
        out.append(f"{what}: {c.n_gpus} x {c.gpu.name}, {cost}, {duration(c.train_time_s)} "
                   f"({c.gpu_hours:,.0f} GPU-hours)")
        out.append(f"  {c.candidate.layout.describe()}")
        out += time_text(c.candidate.time, r.tokens)
        out.append("")
        out += memory_table(c.candidate)
    if r.by_count:
        out += ["", "The fastest layout at each GPU count, its cost and time (* chosen):"] + cost_table(r)
    s = r.solver
    proved = "optimality proved" if s.optimal else "optimality NOT proved"
    out += ["", f"Solver: {s.name} on an ILP of {r.n_options} candidates (binary choice, named constraints), "
                f"status {s.status}, {proved} (gap {s.gap_rel:g}, limit {s.time_limit_s:g} s), "
                f"{s.solve_s:.3f} s; search {r.search_s:.1f} s"]
    if crosscheck is not None:
        out += [""] + crosscheck_text(crosscheck)
    return "\n".join(out)


# ---------------------------------------------------------------------- plan buy

def buy_json(r: Any) -> dict[str, Any]:
    pools = {p.gpu: p for p in r.pools}
    return {
        "jobs_file": r.path, "start_date": r.start_date, "horizon_s": r.horizon_s, "budget_usd": r.budget_usd,
        "feasible": r.feasible,
        "nodes": {g: {"nodes": n, "gpus": n * pools[g].gpus_per_node, "capex_usd": n * pools[g].capex_usd,
                      "opex_usd": n * pools[g].opex_usd} for g, n in r.nodes.items()},
        "capex_usd": r.capex_usd, "opex_usd": r.opex_usd, "tco_usd": r.tco_usd,
        "jobs": [{"name": j.name, "model": j.model.name, "gpu": j.gpu.name, "n_gpus": j.n_gpus,
                  "layout": layout_json(j.candidate.layout), "start_s": j.start_s, "finish_s": j.finish_s,
                  "deadline_s": j.deadline_s, "train_time_s": j.finish_s - j.start_s, "tokens": j.tokens,
                  "gpu_hours": j.n_gpus * (j.finish_s - j.start_s) / 3600,
                  "step_time_s": j.candidate.time.step_time_s, "mfu": j.candidate.time.mfu} for j in r.plans],
        "solver": {**r.solver.as_dict(), "n_candidates": r.n_options},
        "prices": prices_json(r.prices, [p.gpu for p in r.pools])
        | {"electricity": {"usd_per_kwh": r.prices.electricity_usd_per_kwh, "pue": r.prices.pue,
                           "source": r.prices.electricity_source, "pue_source": r.prices.pue_source}},
        "infeasible": None if r.feasible else " ".join(r.lines),
        "search_s": r.search_s,
    }


def buy_text(r: Any) -> str:
    from datetime import date, timedelta

    from .costplan import usd
    day0 = date.fromisoformat(r.start_date)

    def when(seconds: float) -> str:
        return f"day {seconds / 86400:,.1f} ({(day0 + timedelta(seconds=seconds)).isoformat()})"

    p = r.prices
    out = [f"Cluster purchase for {len(r.plans) or 'the'} jobs of {r.path}: horizon {duration(r.horizon_s)} "
           f"from {r.start_date}" + (f", budget {usd(r.budget_usd)}" if r.budget_usd is not None else ""),
           f"  power: {p.electricity_usd_per_kwh:g} $/kWh ({p.electricity_source}), PUE {p.pue:g} ({p.pue_source})"]
    for pool in r.pools:
        g = p.for_gpu(pool.gpu)
        out.append(f"  {pool.gpu} node ({pool.gpus_per_node} GPUs): {usd(pool.capex_usd)} ({g.purchase_source}, "
                   f"{g.purchase_date}) + {usd(pool.opex_usd)} power over the horizon ({g.node_power_kw:g} kW: "
                   f"{g.power_source})")
    out.append("")
    if not r.feasible:
        out.append("No purchase satisfies the constraints.")
        out += [f"  {line}" for line in r.lines]
    else:
        bought = ", ".join(f"{n} x {g} node{'s' if n != 1 else ''}" for g, n in r.nodes.items() if n)
        out.append(f"Buy: {bought}; capex {usd(r.capex_usd)}, opex {usd(r.opex_usd)}, total {usd(r.tco_usd)}")
        for pool in r.pools:
            n = r.nodes[pool.gpu]
            out.append(f"  {pool.gpu:<9} {n:>4} nodes = {n * pool.gpus_per_node:>6} GPUs")
        out += ["", "Jobs:"]
        for j in r.plans:
            out.append(f"  {j.name}: {j.model.name}, {params_text(int(j.tokens))} tokens on {j.n_gpus} x {j.gpu.name}, "
                       f"{when(j.start_s)} to {when(j.finish_s)} ({duration(j.finish_s - j.start_s)}; deadline "
                       f"{when(j.deadline_s)})")
            out.append(f"    {j.candidate.layout.describe()}; step {duration(j.candidate.time.step_time_s)}, "
                       f"MFU {j.candidate.time.mfu:.1%}")
    s = r.solver
    proved = "optimality proved" if s.optimal else "optimality NOT proved"
    out += ["", f"Solver: {s.name} on an ILP of {s.n_variables} variables ({r.n_options} job options, integer "
                f"nodes per type) and {s.n_constraints} named constraints, status {s.status}, {proved} "
                f"(gap {s.gap_rel:g}, limit {s.time_limit_s:g} s), {s.solve_s:.3f} s; search {r.search_s:.1f} s"]
    return "\n".join(out)


def gpu_price_cells(p: Any) -> str:
    """`plan gpus` columns: rent per GPU-hour, node purchase price, node power."""
    from .costplan import usd
    rent = f"{p.rent_usd_per_gpu_hour:.2f}" if p.rent_usd_per_gpu_hour is not None else "-"
    node = usd(p.node_purchase_usd) if p.node_purchase_usd is not None else "-"
    kw = f"{p.node_power_kw:g}" if p.node_power_kw is not None else "-"
    return f"{rent:>8} {node:>9} {kw:>8}"


def price_sources_text(prices: Any, gpu_names: Any) -> str:
    """Where every price comes from (and the --prices file, when one overrides them)."""
    out = ["Price sources" + (f" (with {prices.overrides} on top)" if prices.overrides else
                              " (override any entry with --prices FILE; see planner/presets/prices.toml)") + ":"]
    for name in gpu_names:
        p = prices.for_gpu(name)
        if p.rent_usd_per_gpu_hour is None and p.node_purchase_usd is None:
            continue
        out.append(f"  {name}: rent: {p.rent_source or '-'}" + (f" ({p.rent_date})" if p.rent_date else ""))
        out.append(f"  {' ' * len(name)}  node: {p.purchase_source or '-'}"
                   + (f" ({p.purchase_date})" if p.purchase_date else "") + f"; power: {p.power_source or '-'}")
    out.append(f"  electricity: {prices.electricity_usd_per_kwh:g} $/kWh, {prices.electricity_source}"
               + (f" ({prices.electricity_date})" if prices.electricity_date else ""))
    out.append(f"  PUE {prices.pue:g}: {prices.pue_source}")
    return "\n".join(out)
