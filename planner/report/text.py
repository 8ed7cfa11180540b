"""Reports: the text a person reads and the JSON a script reads. Units are formatted by
planner.fmt (GiB = 2**30 bytes), as in every report."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from planner.api import PlanResult
from planner.fmt import (
    duration,
    gib,
    gib_number,
    gib_of,
    params,
    plural,
    usd,
)
from planner.hardware.gpus import sustained_rate
from planner.layouts.layout import Layout
from planner.layouts.rules import GENERIC_LAYOUTS
from planner.measure.crosscheck import Crosscheck, crosscheck_json
from planner.report.intervals import memory_interval_json, time_interval_json
from planner.search.search import Candidate
from planner.timing.model import StepTime
from planner.training.pp_layout import is_layout
from planner.training.setup import TrainingSetup

LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "logits": "logits and loss",
    "buffers": "communication buffers",
    "overhead": "overhead (CUDA, NCCL, fragmentation)",
}


params_text = params     # the names the report modules have used; planner.fmt formats


# ------------------------------------------------------------------------------ JSON


def fp8_label(s: TrainingSetup) -> str:
    """The precision as the assumptions print it: under fp8 with its recipe and its stack."""
    p = s.precision_spec
    if p.fp8 is None:
        return s.precision
    start, end = s.bf16_layers
    kept = f"; the first {start} and the last {end} layers in BF16" if start or end else ""
    return f"fp8 recipe {p.fp8.name} ({p.fp8.stack}; {p.fp8.scaling}{kept})"

def layout_json(lay: Layout) -> dict[str, Any]:
    out: dict[str, Any] = {
        **lay.degrees(), "zero_stage": lay.zero_stage, "sharding": lay.sharding, "sp": lay.sp, "vp": lay.vp,
        "micro_batch": lay.micro_batch, "grad_accum": lay.grad_accum, "seq_len": lay.seq_len,
        "recompute": lay.recompute,
    }
    if lay.expert_tp != lay.tp:     # only when --etp sets it apart from tp
        out["etp"] = lay.expert_tp
    if lay.ep_fold:                 # only where ep is folded over tp x cp x dp
        out["ep_fold"] = True
    if lay.optimizer_instances > 1:     # only over several distributed-optimizer instances
        out["optimizer_instances"] = lay.optimizer_instances
    return out


def time_json(t: StepTime | None, tokens: float | None = None) -> dict[str, Any]:
    """Step-time fields of a candidate (None when it was not timed: it does not fit)."""
    if t is None:
        out: dict[str, Any] = {"step_time_s": None, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None,
                               "at_mfu_ceiling": None}
    else:
        out = {"step_time_s": t.step_time_s, "tokens_per_s": t.tokens_per_s,
               "tflops_per_gpu": t.model_flops_per_s_per_gpu / 1e12, "mfu": t.mfu,
               **({} if t.mfu_fp8 is None else {"mfu_fp8_peak": t.mfu_fp8}),
               "at_mfu_ceiling": t.at_mfu_ceiling,
               "time": {"compute_s": t.compute_s, "comm_s": dict(t.comm_s), "bubble_s": t.bubble_s,
                        "optimizer_s": t.optimizer_s, "hardware_tflops_per_gpu": t.hardware_flops_per_s_per_gpu / 1e12,
                        "placement": list(t.placement)}}
    if tokens is not None:
        out["train_time_s"] = t.train_time_s(tokens) if t is not None else None
    out["interval"] = time_interval_json(t, tokens)      # issue 18: error bars (report.intervals)
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
        "memory_interval": memory_interval_json(mem.total, c.capacity_bytes),
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
    """The fine-tuning method and its settings (planner.training.finetune)."""
    from planner.training.finetune import n_trainable_params

    ft = r.setup.finetune
    out = ft.as_dict(r.model) | {"n_trainable_params": n_trainable_params(r.model, ft, r.params),
                                 "optimizer": optimizer_name(r),
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
        **({"fp8_recipe": s.fp8_recipe} if s.precision == "fp8" else {}),
        "optimizer": s.optimizer,
        "attention": s.attention,
        "kernels": s.kernels,
        "fsdp_pipeline_grad_sync": s.fsdp_pipeline_grad_sync,
        **({"pp_layout" if is_layout(s.pp_balance) else "pp_balance": s.pp_balance} if s.pp_balance != "none" else {}),
        **({"pp_microbatch_group": s.pp_microbatch_group} if s.pp_microbatch_group else {}),
        **({"cross_entropy": s.cross_entropy} if s.cross_entropy != "native" else {}),
        **({"moe_a2a_overlap": s.moe_a2a_overlap} if s.moe_a2a_overlap != "auto" else {}),
        **({"cuda_graphs": s.cuda_graphs} if s.cuda_graphs != "none" else {}),
        **({"fp8_attention": True} if s.fp8_attention else {}),
        **({"bf16_layers": {"start": s.bf16_layers[0], "end": s.bf16_layers[1]}} if s.bf16_layers != (0, 0) else {}),
        **({"moe_dispatcher": s.moe_dispatcher} if s.moe_dispatcher != "alltoall" else {}),
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
        "sustained_rate": sustained_rate_json(r),
    } | ({"calibration": r.calibration} if r.calibration is not None else {})


def sustained_rate_json(r: PlanResult) -> dict[str, Any] | None:
    """The MFU ceiling the step times obey (hardware.gpus.sustained_rate): its value, whether it
    is measured or ASSUMED, and its source; None when none applies (a calibration's or fp8's)."""
    if r.efficiency.mfu_ceiling is not None or r.setup.precision_spec.fp8 is not None:
        return None
    rate = sustained_rate(r.gpu)
    return {"mfu_ceiling": rate.mfu, "basis": "measured" if rate.measured else "assumed",
            "from_gpu": rate.from_gpu, "source": rate.source}


def sustained_rate_lines(r: PlanResult) -> list[str]:
    """One line naming an ASSUMED sustained rate (nothing when it is measured or none applies)."""
    rate = sustained_rate_json(r)
    if rate is None or rate["basis"] == "measured":
        return []
    how = (f"inherited from {rate['from_gpu']}" if rate["from_gpu"] != r.gpu.name and
           rate["source"].startswith("inherited") else
           f"best run on any GPU, {rate['from_gpu']}" if rate["from_gpu"] != r.gpu.name
           else "no published run on it")
    return [f"  sustained rate: at most {rate['mfu_ceiling']:.1%} MFU, ASSUMED ({how}; docs/models.md)"]


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
        # README: least_memory holds the layout that needs the least (null: no layout is valid)
        out["least_memory"] = candidate_json(r.result.smallest) if r.result.smallest is not None else None
        out["fits_from_gpus"] = r.fits_from_gpus
        out["min_gpus_for_model_states"] = r.min_gpus_for_states
    out["crosscheck"] = crosscheck_json(crosscheck)
    return out


def to_json(r: PlanResult, crosscheck: Crosscheck | None = None) -> str:
    return json.dumps(plan_json(r, crosscheck), indent=2)


def topologies_json() -> list[dict[str, Any]]:
    """`plan topologies --json`: the shipped cluster topologies."""
    from planner.hardware.gpus import get_gpu
    from planner.hardware.topology import list_topologies
    from planner.timing.model import Cluster, scale_up_domain_gpus

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


# A plan this full of the usable memory has no headroom but the fragmentation allowance.
FULL_FRACTION = 0.95


def optimizer_name(r: PlanResult) -> str:
    """The optimizer that runs: QLoRA's paged 8-bit AdamW (bitsandbytes) replaces --optimizer."""
    return "adam8bit (paged)" if r.setup.finetune.paged_8bit_optimizer else r.setup.optimizer


def assumptions_text(r: PlanResult) -> list[str]:
    s = r.setup
    o = s.overheads
    shown = r.best or r.result.smallest
    # training/setup.py Overheads.fixed_bytes: NCCL's buffers only when the plan spans GPUs
    nccl = (f"NCCL {gib(o.nccl_bytes)}" if shown is None or shown.n_gpus > 1
            else "no NCCL buffers (one GPU)")
    headroom = []
    if r.best is not None and r.best.fits and r.best.memory.total >= FULL_FRACTION * r.best.capacity_bytes:
        headroom = [f"  headroom: the plan fills {r.best.memory.total / r.best.capacity_bytes:.0%} of the usable "
                    f"memory; its only margin is the fragmentation allowance, none for an error of the estimate"]
    return [
        f"  sequence {s.seq_len}, global batch {s.global_batch} sequences, {fp8_label(s)}, {optimizer_name(r)}, "
        f"{s.attention} attention, {s.kernels} kernels",
        f"  overheads: CUDA context {gib(o.cuda_context_bytes)}, workspaces {gib(o.library_workspace_bytes)}, "
        f"{nccl}, fragmentation {o.fragmentation:.0%} of tensor memory",
        *headroom,
        *stack_lines(r),
        *allocator_lines(r),
        f"  GPU: {r.gpu.full_name}, {gib(r.gpu.memory_bytes)}, {r.gpu.gpus_per_node} per node",
        f"  cluster: {topology_name(r) or 'no topology file (bandwidths from the GPU catalog)'}; "
        f"step times: {r.efficiency.name} overlap settings",
        *sustained_rate_lines(r),
        *generic_lines(r),
    ] + ([f"  offload: optimizer states -> {s.offload_optimizer}, parameters -> {s.offload_params}; "
          "CPU memory per node: "
          f"{gib(r.host_capacity_bytes) if r.host_capacity_bytes else 'not given by the topology'}"]
         if s.offload_optimizer != "none" or s.offload_params != "none" else []) + (
        [(f"  calibration: {r.calibration} (matmul fraction {r.efficiency.matmul_fraction}, "
          f"fragmentation {o.fragmentation:.0%})")] if r.calibration is not None else [])


def generic_lines(r: PlanResult) -> list[str]:
    """For a model on the generic path: what was measured, on what, and the layouts it allows."""
    p = r.model.profile
    if p is None:
        return []
    kinds = ", ".join(f"{b.n_layers} x {b.name.split(' (layers')[0]}" for b in p.blocks)
    return [f"  model: generic path, {r.model.model_type} measured on transformers {p.transformers_version}'s "
            f"own model (parameters exact; saved tensors and FLOPs per token of each block kind under fake "
            f"tensors, its eager reference kernels); blocks: {kinds}",
            f"  layouts: {GENERIC_LAYOUTS}"]


def stack_lines(r: PlanResult) -> list[str]:
    """The stack whose memory profile the plan follows (issue 16); without --stack, the one
    the layout defaults to and why (planner.stacks.default_stack, which --out writes for)."""
    s = r.setup
    shown = r.best or r.result.smallest
    if s.stack == "auto":
        if shown is None:
            return []
        from planner.stacks import default_stack_reason
        from planner.training.kernels import layout_kernels
        return [f"  stack: {default_stack_reason(r.model, shown.layout, layout_kernels(s, shown.layout))}"
                "; --stack to change"]
    if s.stack not in ("torchtitan", "megatron"):     # hf and deepspeed keep the kernels' profile
        return []
    from planner.stacks import memory_profile_line
    recompute = shown.layout.recompute if shown is not None else "none"
    return ["  " + memory_profile_line(s.stack, recompute, s.compile, s.recompute_every, s.recompute_method,
                                       s.recompute_num_layers, s.recompute_modules)]


def allocator_lines(r: PlanResult) -> list[str]:
    """How the caching allocator runs under the plan's stack (--stack, or the one the shown layout
    defaults to): with expandable segments where the stack's own launchers set them and --out
    writes them (planner.stacks.runs_expandable_segments), else PyTorch's default. The
    fragmentation allowance is the same assumed fraction under both: no measured figure gives a
    smaller one for expandable segments (torchtitan's published reserved peaks, run with them,
    exceed the planner's tracked tensors plus 10% in 9 of 11 runs: docs/published-memory.md)."""
    s = r.setup
    shown = r.best or r.result.smallest
    if s.stack == "auto" and shown is None:
        return []
    from planner.stacks import default_stack, runs_expandable_segments

    if s.stack == "auto":
        from planner.training.kernels import layout_kernels

        stack = default_stack(r.model, shown.layout, layout_kernels(s, shown.layout))  # type: ignore[union-attr]
    else:
        stack = s.stack
    how = ("expandable segments (--out sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as "
           f"{stack}'s own launchers do)" if runs_expandable_segments(stack)
           else f"PyTorch's default caching allocator ({stack}'s launchers set no PYTORCH_CUDA_ALLOC_CONF)")
    return [f"  allocator: {how}; its {s.overheads.fragmentation:.0%} fragmentation allowance is assumed"]


# ------------------------------------------------------------------- --quiet

def layout_notes(lay: Layout, n_gpus: int, global_batch: int | None) -> list[str]:
    """What a reader of the layout line may misread (issue 20): how Megatron-LM counts an
    expert-parallel layout, and why a GPU count that does not divide the global batch got
    a layout other than plain data parallelism."""
    out = []
    if lay.ep > 1:
        # megatron-core 0.16.1 parallel_state.initialize_model_parallel: data_parallel_size =
        # world_size // (tp * pp * cp); expert_data_parallel_size = world_size // (etp * ep * pp),
        # etp = tp by default: expert parallel is carved out of data parallel
        etp = f", expert tensor parallel {lay.expert_tp}" if lay.expert_tp != lay.tp else ""
        if lay.ep_fold:
            out.append(f"Megatron-LM runs this as data parallel {lay.data_parallel} for the dense layers "
                       f"(GPUs / (tp x pp x cp)) and, over the same GPUs of a stage, expert parallel {lay.ep}"
                       f"{etp} and expert data parallel {lay.expert_shard_degree} for the experts "
                       f"(MoE parallel folding: ep spans tp x cp x dp); dp={lay.dp} is that data parallel")
        else:
            out.append(f"Megatron-LM counts this as data parallel {lay.data_parallel} for the dense layers "
                       f"(GPUs / (tp x pp x cp)), with expert parallel {lay.ep} carved out of it{etp} and expert "
                       f"data parallel {lay.expert_shard_degree} for the experts; here dp={lay.dp} counts the "
                       f"replicas beyond ep")
    if global_batch is not None and n_gpus > 1 and global_batch % n_gpus != 0:
        degrees = " x ".join(f"{ax} {d}" for ax, d in lay.degrees().items()
                             if ax == "dp" or (d > 1 and not (ax == "ep" and lay.ep_fold)))
        if n_gpus > global_batch:
            # issue 33: not a choice anybody made, the batch's limit on data-parallel ranks
            out.append(f"the global batch of {global_batch:,} sequences gives at most {global_batch:,} "
                       f"data-parallel ranks (a whole sequence each), so {n_gpus:,} GPUs run {degrees}")
        else:
            below = max((d for d in range(1, n_gpus) if global_batch % d == 0), default=None)
            above = next((d for d in range(n_gpus + 1, 2 * n_gpus + 1) if global_batch % d == 0), None)
            near = " or ".join(f"{d:,}" for d in (below, above) if d is not None)
            out.append(f"{n_gpus:,} GPUs do not divide the global batch of {global_batch:,} sequences, so they "
                       f"cannot all be data-parallel ranks: {degrees}" + (f"; {near} GPUs divide it" if near else ""))
    return out


def layout_compact(lay: Layout) -> str:
    """The layout as space-separated key=value words, e.g. dp=16 tp=4+sp pp=1 zero=2 mb=1
    ga=64 recompute=none (vp, cp, ep only when above 1; fsdp=full etc. for FSDP)."""
    parts = lay.degree_words(marks=("+sp", ""))
    if lay.ep_fold:
        parts.append("ep-fold")
    parts.append(f"zero={lay.zero_stage}" if lay.sharding == "zero" else f"fsdp={lay.sharding[5:]}")
    parts += [f"mb={lay.micro_batch}", f"ga={lay.grad_accum}", f"recompute={lay.recompute}"]
    return " ".join(parts)


def _answer_line(name: str, gpu_name: str, c: Candidate) -> str:
    """MODEL: N x GPU, LAYOUT, USED/CAPACITY GiB[ DOES NOT FIT][ + H GiB CPU memory per node][ + N GiB
    NVMe per node], S s/step, MFU P%."""
    mem = gib_of(c.memory.total, c.capacity_bytes) + ("" if c.fits else " DOES NOT FIT")
    m = c.memory
    if m.host_bytes:        # issue 33: offload's host memory was in the long report only
        mem += f" + {gib_number(m.host_bytes_per_node)} GiB CPU memory per node"
        mem += "" if c.host_fits else " (MORE THAN THE NODE HAS)"
    if m.nvme_bytes:
        mem += f" + {gib_number(m.nvme_bytes_per_node)} GiB NVMe per node"
    out = f"{name}: {c.n_gpus} x {gpu_name}, {layout_compact(c.layout)}, {mem}"
    if c.time is not None:
        t = c.time.step_time_s
        out += f", {t:.3g} s/step" if t < 100 else f", {t:.0f} s/step"
        out += f", MFU {c.time.mfu:.1%}"
    return out


def _model_name(r: PlanResult) -> str:
    ft = r.setup.finetune
    return r.model.name if ft.is_full else f"{r.model.name} ({ft.method})"


def quiet_line(r: PlanResult) -> str:
    """`plan --quiet`: the answer on one line (a script's `cut -d' ' -f2` is the GPU count)."""
    if r.best is None:
        tried = r.result.counts_tried
        span = f"{tried[0]}" if len(tried) == 1 else f"{tried[0]} to {tried[-1]}"
        sm = r.result.smallest
        least = f"; least memory {gib_number(sm.memory.total)} GiB per rank on {plural(sm.n_gpus, 'GPU')}" if sm else ""
        return f"{_model_name(r)}: no layout fits on {span} x {r.gpu.name}{least}"
    out = _answer_line(_model_name(r), r.gpu.name, r.best)
    if r.tokens is not None and r.best.time is not None:
        out += f", {duration(r.best.time.train_time_s(r.tokens))} for {params_text(int(r.tokens))} tokens"
    return out


def cost_quiet_line(r: Any) -> str:
    """`plan --tokens --quiet`: the chosen plan, its cost and its training time."""

    if r.chosen is None:
        return f"{_model_name(r.result)}: no plan satisfies the constraints"
    c = r.chosen
    cost = usd(c.cost_usd) if c.cost_usd is not None else "no price"
    return (f"{_answer_line(_model_name(r.result), c.gpu.name, c.candidate)}, {cost}, "
            f"{duration(c.train_time_s)} for {params_text(int(r.tokens))} tokens")


def load_quiet_line(r: Any) -> str:
    fits = "" if r.fits else " DOES NOT FIT"
    return (f"{r.model.name}: {r.n_gpus} x {r.gpu.name}, tp={r.tp} pp={r.pp}, "
            f"{gib_of(r.memory.total, r.capacity_bytes)}{fits}")


def buy_quiet_line(r: Any) -> str:
    """`plan buy --quiet`: the nodes to buy and the total cost of ownership; where the solver
    stopped at its time limit without proving the optimum, that too, with how far below the
    answer its lower bound lies (SolverInfo.gap_found; issue 32, H5: 32 staggered jobs stop at
    20 s with the bound 4-5% below, which the one line did not say)."""

    if not r.feasible:
        return "no purchase satisfies the constraints" + (f": {r.lines[0]}" if r.lines else "")
    bought = ", ".join(f"{n} x {g}" for g, n in r.nodes.items() if n)
    line = f"buy {bought} nodes: total {usd(r.tco_usd)} (capex {usd(r.capex_usd)}, opex {usd(r.opex_usd)})"
    stopped = getattr(r.solver, "stopped_by", None)    # a time limit: cost.solve.TIME_LIMIT_S
    if stopped is not None:
        line += f"; the solver's {stopped} ended its search: another machine or load may answer otherwise"
    if r.solver.optimal:
        return line
    gap = getattr(r.solver, "gap_found", None)
    return line + ("; not proved optimal" if gap is None else
                   f"; not proved optimal: the optimum costs at least {1 - gap:.1%} of it")


def comparison_quiet_line(m: Any, cmp: Any) -> str:
    """`plan measure --quiet`: the total predicted and measured, and the error."""
    total = cmp.rows[-1]
    err = "-" if total.error is None else f"{100 * total.error:+.1f}%"
    return (f"{m.name}: {layout_compact(cmp.layout)}, predicted {gib_number(total.predicted_bytes)} GiB, "
            f"measured {gib_number(total.measured_bytes)} GiB, error {err}")


# ----------------------------------------------------------------------- text






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
                        "kv_bytes": s.kv_bytes, "mla_cache": s.mla_cache if r.model.is_mla else None,
                        "usable_memory_fraction": s.usable_memory_fraction,
                        "overheads": asdict(s.overheads)},
    }, indent=2)





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
    } | ({"moment": cmp.moment, "notes": list(cmp.notes),
          "moments": [{"moment": t.moment, "predicted_bytes": t.predicted_bytes, "measured_bytes": t.measured_bytes}
                      for t in cmp.moment_totals]} if getattr(cmp, "moment", "") else {})


def models_text(rows: list[dict[str, Any]]) -> str:
    """`plan models`: name, parameters, active parameters (when they differ) and aliases; the
    name column as wide as the longest name (at least 16)."""
    w = max([16, *(len(r["name"]) for r in rows)])
    lines = [f"{'name':<{w}} {'parameters':>17} {'active':>17}  aliases"]
    for r in rows:
        active = f"{r['n_active_params']:,}" if r["n_active_params"] != r["n_params"] else ""
        lines.append(f"{r['name']:<{w}} {r['n_params']:>17,} {active:>17}  {', '.join(r['aliases'])}")
    return "\n".join(lines)
