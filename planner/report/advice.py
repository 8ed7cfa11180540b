"""Advice on a request that cannot run: options that contradict each other, degrees the
model cannot be split by, and what would make an impossible plan fit. The CLI raises the
first two as UserError; the report prints the third when nothing fits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planner.errors import UserError
from planner.layouts.layout import AXIS_NAMES

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.layouts.layout import SearchSpace
    from planner.models.spec import ModelSpec
    from planner.training.setup import TrainingSetup


def contradicting_options(kw: Mapping[str, Any]) -> str | None:
    """The first pair of options of a plan that contradict each other, as a message naming
    both and the way out, or None."""
    def given(name: str) -> Any:
        return kw.get(name)

    tp, pp, cp, zero, fsdp = given("tp"), given("pp"), given("cp"), given("zero"), given("fsdp")
    vp, sp = given("vp"), given("sp")
    off_opt, off_par = given("offload_optimizer") or "none", given("offload_params") or "none"
    if vp is not None and vp > 1 and pp == 1:
        return (f"--vp {vp} interleaves the layers of each pipeline rank, but --pp 1 has no pipeline; "
                f"give --pp 2 or more, or drop --vp")
    if sp and tp == 1:
        return ("--sp splits the sequence over the tensor-parallel ranks, but --tp is 1; give --tp 2 or more, "
                "or drop --sp")
    if off_par != "none":
        if fsdp in ("grad-op",) or (fsdp is None and zero is not None and zero < 3):
            what = f"--fsdp {fsdp}" if fsdp else f"--zero {zero}"
            return (f"--offload-params {off_par} needs sharded parameters: {what} keeps them whole on each "
                    f"rank; use --zero 3 or --fsdp full (ZeRO-Infinity, FSDP CPU offload)")
        if fsdp is not None and off_par == "nvme":
            return (f"--offload-params nvme with --fsdp {fsdp}: FSDP offloads to CPU memory only; "
                    f"use --offload-params cpu, or --zero 3 for NVMe (ZeRO-Infinity)")
        for axis, d in (("tp", tp), ("pp", pp), ("cp", cp)):
            if d is not None and d > 1:
                return (f"--offload-params {off_par} with --{axis} {d}: Megatron-LM does not offload "
                        f"parameters; offload under pure data parallelism (--{axis} 1)")
    if off_opt != "none":
        if fsdp is not None:
            return (f"--offload-optimizer {off_opt} with --fsdp {fsdp}: FSDP offloads parameters, gradients and "
                    f"the optimizer step together; use --offload-params cpu instead")
        if zero == 0:
            return (f"--offload-optimizer {off_opt} needs ZeRO-1 or higher (ZeRO-Offload moves the optimizer's "
                    f"partition), but --zero is 0; give --zero 1, 2 or 3")
        if off_opt == "nvme" and zero is not None and zero < 3:
            return f"--offload-optimizer nvme (ZeRO-Infinity) needs --zero 3, not --zero {zero}"
    if zero is not None and zero >= 2 and fsdp is None and pp is not None and pp > 1:
        return (f"--zero {zero} with --pp {pp}: DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only; "
                f"give --zero 1, or --fsdp")
    quant = given("quant")
    if quant is not None or given("method") == "qlora":
        for axis, d in (("tp", tp), ("pp", pp), ("cp", cp)):
            if d is not None and d > 1:
                what = f"--quant {quant}" if quant else "--method qlora"
                return (f"{what} with --{axis} {d}: quantized base weights (bitsandbytes) run under data "
                        f"parallelism only; drop --{axis} or the quantization")
    n_gpus = given("n_gpus")
    max_gpus = given("max_gpus")
    if n_gpus is not None and max_gpus is not None and n_gpus > max_gpus:
        return (f"--n-gpus {n_gpus} is more than --max-gpus {max_gpus}; raise --max-gpus or lower --n-gpus "
                f"(or drop one of them)")
    too_many = degrees_past_limit(kw)
    if too_many:
        return too_many
    if zero is not None and fsdp is not None:
        return (f"--zero {zero} and --fsdp {fsdp} contradict each other: both choose how the states are sharded "
                f"(ZeRO for DeepSpeed and Megatron, FSDP for PyTorch); give one of them")
    if n_gpus is not None:
        fixed = {a: given(a) for a in AXIS_NAMES if given(a) is not None}
        prod = 1
        for d in fixed.values():
            prod *= d
        if fixed and n_gpus % prod and not folds_on(kw, n_gpus):
            names = " x ".join(f"--{a} {d}" for a, d in fixed.items())
            hint = ""
            if "dp" in fixed and fixed.get("ep", 1) > 1 and n_gpus * fixed["ep"] == prod:
                # --dp given as Megatron's data-parallel size, which the planner counts beside ep
                hint = (f" (the planner's --dp counts data-parallel ranks beside ep; drop --dp {fixed['dp']} "
                        f"to fold ep over tp x cp x dp, as Megatron-Core does)")
            elif kw.get("etp") is None and folds_on({**kw, "etp": 1}, n_gpus):
                # megatron-core sets etp to tp unless given: the fold tiles only with etp 1
                hint = f" (ep folds over tp x cp x dp with --etp 1, not the default etp = tp = {kw.get('tp') or 1})"
            return f"--n-gpus {n_gpus} is not a multiple of {names} = {prod}; change --n-gpus or the degrees{hint}"
    return None


def folds_on(kw: Mapping[str, Any], n_gpus: int) -> bool:
    """Whether the options' --ep folds over tp x cp x dp on ``n_gpus`` (no --dp given;
    layouts.layout.ep_folds, the rule api.fixed_layout builds the layout with) into a grid
    the search walks (layouts.layout.fold_searched, the rule folded_shapes searches by; a tp, pp
    or cp left open counts as 1, the largest stage, which any other choice's stage divides), so
    that `--ep 8 --n-gpus 12` is not explained as a memory limit."""
    from planner.layouts.layout import ep_folds, fold_searched

    if kw.get("dp") is not None or kw.get("ep") is None:
        return False
    tp, pp, cp = (kw.get(a) or 1 for a in ("tp", "pp", "cp"))
    given = kw.get("tp") is not None and kw.get("pp") is not None
    return bool(ep_folds(n_gpus, tp, pp, cp, kw["ep"])) and fold_searched(
        tp, cp, n_gpus // (tp * cp * pp), kw.get("etp"), kw["ep"], given)


def degrees_past_limit(kw: Mapping[str, Any]) -> str | None:
    """Whether the degrees the options fix (--dp, --tp, --pp, --cp, --ep) need more GPUs
    than --max-gpus allows, as --n-gpus beyond it is refused (issue 32, W2: --tp 8 --pp 8
    --cp 8 --dp 64 planned 32,768 GPUs; U3: --dp 32768 was explained as a memory limit).
    Every GPU holds one rank of each group, so the product is the least count they need,
    except where ep folds over tp x cp x dp on --n-gpus (folds_on), whose count is --n-gpus."""
    fixed = {a: kw[a] for a in AXIS_NAMES if kw.get(a) is not None}
    max_gpus = kw.get("max_gpus")
    if kw.get("n_gpus") is not None and folds_on(kw, kw["n_gpus"]):
        return None
    prod = 1
    for d in fixed.values():
        prod *= d
    if max_gpus is None or prod <= max_gpus:
        return None
    names = " x ".join(f"--{a} {d}" for a, d in fixed.items())
    lead = f"{names} = {prod:,} GPUs" if len(fixed) > 1 else f"{names} needs {prod:,} GPUs, which"
    return (f"{lead} is more than --max-gpus {max_gpus}; lower the degrees, or raise --max-gpus "
            f"(the search limit, at most the topology's GPUs)")


def fit_advice(r: Any) -> list[str]:
    """When nothing fits (``r``: an api.PlanResult without a plan): the least memory any
    layout needs, and what would make it fit that the request does not use yet (more GPUs,
    a GPU with more memory, QLoRA or LoRA, offload, recomputation, a shorter sequence), one
    sentence each. Every way out is re-planned first (the same memory search, on the GPU
    counts tried) and offered only where it fits, with the count it fits on (issue 20:
    "a GPU with more memory: mi300x" for 405B on one GPU, offload and LoRA for a model
    whose weights alone overflow, misled)."""
    from planner.fmt import gib
    from planner.hardware.gpus import list_gpus
    from planner.memory.model import min_model_state_bytes_per_param

    gpu, setup, n = r.gpu, r.setup, r.params.total
    sm = r.result.smallest
    out = []
    ft = setup.finetune
    none_valid = sm is None and bool(r.result.rejected) and not r.fits_from_gpus
    if sm is not None:
        out.append(f"The least memory any layout needs is {gib(sm.memory.total)} per GPU, on {sm.n_gpus} x "
                   f"{gpu.name} ({sm.layout.describe()}), against {gib(r.capacity_bytes)} usable.")
    elif none_valid:
        why = Counter(x.reason for x in r.result.rejected).most_common(3)
        out.append("No layout with these options can run: " + "; ".join(reason for reason, _ in why) + ".")
    # the model states alone need more GPUs than were tried (or than the least layout has)
    if (sm is None and not none_valid) or (sm is not None and r.min_gpus_for_states > sm.n_gpus):
        per_param = min_model_state_bytes_per_param(setup)
        out.append(f"Weights, gradients and optimizer states alone take {gib(per_param * n)} "
                   f"({per_param:g} B per parameter x {n:,} parameters): at least {r.min_gpus_for_states} x "
                   f"{gpu.name} of {gib(r.capacity_bytes)}, even fully sharded.")
    if r.fits_from_gpus:
        out.append(fits_from_line(r))
    if sm is None:
        return out
    # a GPU with more memory, smallest first, where the least layout's GPU count holds it
    on = sm.n_gpus
    # (a GPU whose usable memory is below the least layout's need is not re-planned: the
    # same layout takes about as much on it)
    usable = r.capacity_bytes / gpu.memory_bytes if gpu.memory_bytes else 1.0
    bigger = [g for g in sorted(list_gpus(), key=lambda g: g.memory_bytes)
              if g.memory_bytes > gpu.memory_bytes and g.memory_bytes * usable >= 0.9 * sm.memory.total]
    holding = [g for g in bigger if refit(r, gpu=g, counts=(on,)) is not None][:3]
    if holding:
        out.append(f"A GPU with enough memory for that layout on {on} GPU{'s' if on > 1 else ''}: "
                   f"{', '.join(f'{g.name} ({gib(g.memory_bytes)})' for g in holding)}.")
    ways = []
    for way, spec in (("--method qlora", "qlora"), ("--method lora", "lora")):
        if ft.method not in (spec, "qlora") and (ft.is_full or spec == "qlora"):
            fits = refit(r, setup=_with_method(setup, spec))
            if fits is not None:
                ways.append(f"{way} fits on {fits} x {gpu.name}")
    if ft.is_full and setup.offload_optimizer == "none" and setup.offload_params == "none":
        for way, change in (("--offload-optimizer cpu", {"offload_optimizer": "cpu"}),
                            ("--offload-params cpu --offload-optimizer cpu --zero 3",
                             {"offload_optimizer": "cpu", "offload_params": "cpu"})):
            fits = refit(r, setup=_replace(setup, **change))
            if fits is not None:
                ways.append(f"{way} fits on {fits} x {gpu.name} (states in CPU memory)")
                break
    space = r.space
    if space is not None and "full" not in space.recomputes:
        fits = refit(r, space=_replace(space, recomputes=("full",)))
        if fits is not None:
            ways.append(f"--recompute full fits on {fits} x {gpu.name}")
    if space is not None and 1 not in space.micro_batches:
        fits = refit(r, space=_replace(space, micro_batches=(1,)))
        if fits is not None:
            ways.append(f"--micro-batch 1 fits on {fits} x {gpu.name}")
    group = smaller_microbatch_group(r, sm.layout)
    if group is not None:
        ways.append(group)
    for seq in (setup.seq_len // 2, setup.seq_len // 4, setup.seq_len // 8):   # a few re-plans, not a sweep
        if seq < 256:
            break
        fits = refit(r, setup=_replace(setup, seq_len=seq))
        if fits is not None:
            ways.append(f"--seq-len {seq} fits on {fits} x {gpu.name}")
            break
    if ways:
        out.append("Re-planned with one change each: " + "; ".join(ways) + ".")
    return out


def smaller_microbatch_group(r: Any, lay: Any) -> str | None:
    """For an interleaved layout at megatron-core's default micro-batch group (N = pp): the largest
    N below pp that fits, as a way out. Stage r's warm-up holds (pp - r - 1) x 2 + (vp - 1) x N
    chunks (TrainingSetup.pp_microbatch_group), so a smaller N holds fewer activations; N below pp
    is the Llama 3 schedule (arXiv:2407.21783, Sec. 3.3.2), which megatron-core 0.16.1 refuses
    (schedules.py), so the line says so."""
    setup = r.setup
    if lay.vp <= 1 or lay.pp <= 1 or setup.pp_microbatch_group:
        return None
    for n in range(lay.pp - 1, 0, -1):
        fits = refit(r, setup=_replace(setup, pp_microbatch_group=n), counts=(lay.n_gpus,))
        if fits is not None:
            return (f"--pp-microbatch-group {n} fits on {fits} x {r.gpu.name} (Llama 3's schedule, fewer "
                    f"micro-batches per model chunk than pp, which megatron-core 0.16.1 refuses)")
    return None


def refit(r: Any, *, setup: Any = None, gpu: Any = None, counts: Sequence[int] | None = None,
          space: Any = None) -> int | None:
    """The smallest GPU count of ``counts`` (default: the counts the plan tried) on which a
    layout fits with one change to the request (its setup, GPU or search space): the
    memory search of planner.search.search, without step times. None when none fits, or
    when the command line would refuse the changed request (training.checks: a set-up rule,
    or a GPU without the precision's tensor cores; another GPU's default topology holding
    fewer GPUs than a count: hardware.topology.check_covers), so that no way out is one it
    refuses."""
    from planner.api import capacity_bytes, host_capacities
    from planner.hardware.topology import max_covered_gpus
    from planner.layouts.layout import SearchSpace
    from planner.search.search import search
    from planner.timing.model import cluster_for
    from planner.training.checks import precision_refusal, setup_refusal

    setup = setup if setup is not None else r.setup
    space = space if space is not None else (r.space or SearchSpace())
    counts = counts if counts is not None else r.result.counts_tried
    if gpu is None:
        gpu, host, nvme = r.gpu, r.host_capacity_bytes, r.nvme_capacity_bytes
    else:
        cluster = cluster_for(gpu)
        host, nvme = host_capacities(cluster)
        space = _replace(space, max_tp=None) if space.max_tp is not None and space.max_tp < gpu.gpus_per_node else space
        if cluster.topology is not None:
            counts = tuple(c for c in counts if c <= max_covered_gpus(cluster.topology))
    if not counts or setup_refusal(r.model, setup) is not None or precision_refusal(gpu, setup.precision) is not None:
        return None
    try:
        res = search(r.model, setup, capacity_bytes(gpu, setup), gpu.gpus_per_node, counts, space,
                     host_capacity_bytes=host, nvme_capacity_bytes=nvme)
    except (ValueError, UserError):     # a change the setup refuses (e.g. --method lora on a
        return None                     # model_type PEFT has no default targets for): not a way out
    return res.n_gpus if res.fitting else None


def _replace(obj: Any, **changes: Any) -> Any:
    from dataclasses import replace
    return replace(obj, **changes)


def _with_method(setup: Any, method: str) -> Any:
    from planner.training.finetune import FinetuneSpec
    return _replace(setup, finetune=FinetuneSpec.named(method))


def degree_conflict(m: Any, setup: Any, kw: Mapping[str, Any]) -> str | None:
    """Whether the degrees the options fix (--tp, --pp, --cp, --ep, --vp, --sp) cannot split
    model ``m`` (heads, layers, experts, the sequence): layouts.reject_reason's rules on a
    layout with only those degrees, as a message naming the options, or None."""
    from dataclasses import replace

    from planner.layouts.layout import Layout, reject_reason
    from planner.training.finetune import FinetuneSpec
    from planner.training.pp_layout import is_layout

    fixed = {a: kw[a] for a in AXIS_NAMES if a != "dp" and kw.get(a) is not None}
    if kw.get("vp") is not None and "pp" in fixed:     # vp and sp are read with the degree they split
        fixed["vp"] = kw["vp"]
    if not fixed:
        return None
    tp, pp, ep = fixed.get("tp", 1), fixed.get("pp", 1), fixed.get("ep", 1)
    sp = kw["sp"] if kw.get("sp") is not None and "tp" in fixed else tp > 1
    probe = Layout(tp=tp, pp=pp, cp=fixed.get("cp", 1), ep=ep, vp=fixed.get("vp", 1), sp=sp,
                   micro_batch=1, grad_accum=pp, seq_len=setup.seq_len)
    # degrees only: the stack is checked per layout, but for the MTP modules the split counts
    # (--pp-balance embedding-loss-mtp, or a --pp-layout, megatron-core's layout: layouts.stages.stage_layers)
    mtp_split = setup.pp_balance == "embedding-loss-mtp" or is_layout(setup.pp_balance)
    plain = replace(setup, global_batch=probe.global_batch, offload_optimizer="none", offload_params="none",
                    finetune=FinetuneSpec(), stack="megatron" if mtp_split else "auto",
                    offload_activations=0, mtp_layers=setup.mtp_layers if mtp_split else 0, pp_microbatch_group=0,
                    cross_entropy="native")
    reason = reject_reason(m, plain, probe, 1 << 20)
    if reason is None:
        return None
    given = " ".join(f"--{a} {d}" for a, d in fixed.items())
    return f"{given} cannot split {m.name}: {reason}"


def no_valid_layout(m: ModelSpec, setup: TrainingSetup, space: SearchSpace, counts: Sequence[int],
                    gpus_per_node: int, batch_hint: bool = True) -> str | None:
    """When no candidate layout on ``counts`` GPUs can run at all (an arithmetic rule, not
    memory, rejects every one), one line naming the most common reject reason and the nearest
    values that work; None when some layout is valid (issue 20: "no layout fits (memory)" was
    reported for batches that do not divide). A global batch that does not divide is checked
    first (layouts.rules), so where the batches it advises run nothing either, the reason they
    meet is given instead (issue 32: `--ep 8 --tp 1 --pp 1 --n-gpus 12` advised --global-batch 1020,
    which megatron-core's fold rule refuses too). ``batch_hint`` False: that check's own call."""
    from itertools import chain

    from planner.layouts.layout import enumerate_folded, enumerate_layouts

    reasons: Counter[str] = Counter()
    steps: set[int] = set()
    steps_dp: set[int] = set()
    for n in counts:
        for lay, reason in chain(enumerate_layouts(m, setup, n, gpus_per_node, space),
                                 enumerate_folded(m, setup, n, gpus_per_node, space)):
            if reason is None:
                return None
            reasons[reason] += 1
            if reason.startswith("global batch"):
                steps.add(lay.micro_batch * lay.data_parallel)
                steps_dp.add(lay.data_parallel)
    if not reasons:
        return None
    reason, _ = reasons.most_common(1)[0]
    on = ", ".join(str(n) for n in counts)
    line = f"no layout can run on {on} GPUs (not a memory limit): {reason}"
    if reason.startswith("global batch") and steps:
        step = min(steps)
        gb = setup.global_batch
        near = sorted({max(step, gb - gb % step), gb - gb % step + step})
        if batch_hint:
            why = no_valid_layout(m, _replace(setup, global_batch=near[0]), space, counts, gpus_per_node, False)
            if why is not None and "(not a memory limit): global batch" not in why:
                return why
        line += f"; global batches that divide: {' or '.join(str(b) for b in near)} (--global-batch)"
        dpep = min(steps_dp)
        if gb % dpep == 0:
            mbs = [b for b in range(1, gb // dpep + 1) if (gb // dpep) % b == 0][:4]
            line += f", or micro-batches {', '.join(str(b) for b in mbs)} (--micro-batch)"
    elif "hybrid" in reason:
        line += f"; hybrid sharding needs more than {gpus_per_node} GPUs (--n-gpus {2 * gpus_per_node})"
    return line


def topology_cap(r: PlanResult) -> tuple[str, int] | None:
    """(topology name, the most GPUs it describes) of the plan's cluster, or None without one."""
    from planner.hardware.topology import max_covered_gpus

    top = r.cluster.topology if r.cluster is not None else None
    return (top.name, max_covered_gpus(top)) if top is not None else None


def fits_from_line(r: PlanResult) -> str:
    """Where a larger count fits: raise --max-gpus, unless the cluster's topology describes
    fewer GPUs than that, when --max-gpus cannot change the answer (issue 33: the 4090's
    one-node workstation) and a topology file is the way out."""
    n, gpu = r.fits_from_gpus, r.gpu.name
    cap = topology_cap(r)
    if cap is not None and n is not None and n > cap[1]:
        return (f"It fits from {n} x {gpu}, more than topology {cap[0]} describes ({cap[1]:,} GPUs), so "
                f"--max-gpus cannot reach it: describe a larger {gpu} cluster in a topology file "
                f"(topologies/README.md) and pass --topology PATH.")
    return f"It fits from {n} x {gpu}: raise --max-gpus (or drop --n-gpus)."
