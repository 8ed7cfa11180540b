"""`plan explain`, time: the parts of the step-time model, named, with formulas and sources."""

from __future__ import annotations

from typing import Any

from planner.hardware.axes import AXES as PLACEMENT_AXES
from planner.hardware.gpus import sustained_rate
from planner.hardware.placement import Cluster
from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout
from planner.memory.params import optimizer_state_bytes
from planner.models.spec import ModelSpec, ParamCount
from planner.report.terms import (
    BUBBLE,
    FLASH,
    FLOPS,
    HBM,
    KAPLAN,
    LAYER_TIME,
    MATMUL,
    OPT_TIME,
    OVERLAP,
    RING,
    TP_COMM,
    ZERO,
    Term,
)
from planner.report.terms import label as _label
from planner.timing.degrees import layout_links
from planner.timing.efficiency import sustained_clock_share
from planner.timing.flops import with_mtp
from planner.timing.kernels import fp8_fraction_of
from planner.timing.model import (
    FLASH_FRACTION,
    FLASH_FRACTION_DEFAULT,
    MATMUL_FRACTION,
    MATMUL_FRACTION_DEFAULT,
    Efficiency,
    StepTime,
    ceiling_floor_s,
    head_backward_gemms,
    layer_key,
    layer_time,
    mfu_ceiling,
    optimizer_update_bytes_per_param,
    rates,
    step_arrays,
    trained_split,
)
from planner.training.kernels import layout_kernels
from planner.training.layer_precision import bf16_layer_setup, stage_bf16_layers
from planner.training.moe_runtime import dedup_routing
from planner.training.setup import TrainingSetup

_NOT_DP = tuple(a for a in PLACEMENT_AXES if a != "dp")    # the axes timed here beside dp's reduce, in order

# ----------------------------------------------------------------------------- time

def _time(category: str, name: str, formula: str, value: float, source: str, unit: str = "s",
          summed: bool = True, **inputs: Any) -> Term:
    return Term(section="time", category=category, name=name, formula=formula,
                inputs={_label(k): v for k, v in inputs.items()}, value=float(value), unit=unit,
                source=source, summed=summed)


DP_NAMES = {
    "zero3-hybrid": ("gradient all-reduce across the replica groups (HSDP)",
                     "parameter all-gather in forward (per micro-batch)",
                     "parameter all-gather + gradient reduce-scatter in backward (per micro-batch)"),
    "zero3": ("parameter all-gather in forward (per micro-batch)",
              "parameter all-gather + gradient reduce-scatter in backward (per micro-batch)"),
    "fsdp-grad-op": ("parameter all-gather in forward (per micro-batch)",
                     "gradient reduce-scatter in backward (per micro-batch)"),
    "zero12": ("gradient reduce-scatter (once per step)", "parameter all-gather after the step"),
    "zero0": ("gradient all-reduce (once per step)",),
}


def _dp_kind(lay: Layout) -> str:
    if lay.zero_stage == 3:
        return "zero3-hybrid" if lay.sharding == "fsdp-hybrid" else "zero3"
    if lay.zero_stage == 2 and lay.is_fsdp:
        return "fsdp-grad-op"
    return "zero12" if lay.zero_stage in (1, 2) else "zero0"


def _link(links: dict[str, Any], axis: str) -> dict[str, Any]:
    ln = links[axis]
    return {f"{axis} bus bandwidth B (bytes/s)": ln.bus_bytes_per_s, f"{axis} hop latency alpha (s)": ln.latency_s}


def time_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster, eff: Efficiency,
               pc: ParamCount, st: StepTime) -> list[Term]:
    """The parts of timing.step_time() for ``lay`` on the placement it chose, read off the
    batched model's named parts (timing.parts.StepArrays) for that one layout."""
    gpu = cluster.gpu
    prec = setup.precision_spec
    fp8_share = prec.fp8.matmul_fraction(gpu.name, fp8_fraction_of(gpu, eff, prec.fp8)) if prec.fp8 is not None else 0.0
    parts = step_arrays(m, setup, LayoutArrays.from_layouts([lay]), cluster, eff, pc, [st.placement])
    lt = layer_time(m, setup, layer_key(lay), layout_kernels(setup, lay), gpu, eff)
    # the ep line times all-to-alls: their link (placement.all_to_all_link), not the ep ring's;
    # a folded ep on megatron-core's expert grid (timing.degrees.layout_links)
    rings, a2a = layout_links(cluster, lay.axis_sizes, st.placement, lay.etp,
                              int(lay.ep_fold), dedup_routing(m, setup.moe_dispatcher))
    links = {**rings, "ep": a2a}
    fwd_mb, bwd_mb, t_mb = float(parts.fwd_mb_s[0]), float(parts.bwd_mb_s[0]), float(parts.micro_batch_s[0])
    n_slow, n_slow_bwd, slow_stage = int(parts.n_slow[0]), int(parts.n_slow_bwd[0]), int(parts.slow_stage[0])
    n_comm = int(parts.n_comm[0])        # its blocks' communication, its MTP modules' layers' too
    in_mtp: dict[str, Any] = {"mtp_layers": n_comm - n_slow} if n_comm != n_slow else {}
    with_mtp_comm = " (+ the MTP modules' layers, each the mean block's)" if in_mtp else ""
    comm_s = {ax: float(parts.comm(ax)[0]) for ax in _NOT_DP}
    n_mb = lay.grad_accum
    r = rates(gpu, prec.compute_dtype, eff)
    top = cluster.topology
    link_src = (f"topology {top.name}: {top.intra_node.source}; {top.network.source}" if top is not None
                else f"GPU catalog (no topology): {gpu.source}")
    out: list[Term] = []

    # figures the summed terms use
    dtype = prec.compute_dtype
    peak = gpu.peak_flops_per_s(dtype)
    n_active = pc.active
    out += [
        _time("flops", "model FLOPs per token (no recomputation)", "3 x (L x mean block forward + LM head + MTP), "
              "2 FLOPs per multiply-add", st.model_flops / st.tokens_per_step, FLOPS, unit="FLOPs", summed=False,
              n_layers_L=m.n_layers, d_model_h=m.d_model, seq_len_s=lay.seq_len, vocab_V=m.vocab_size),
        _time("flops", "model FLOPs per step (no recomputation)", "model FLOPs per token x tokens",
              st.model_flops, FLOPS, unit="FLOPs", summed=False, tokens_per_step=st.tokens_per_step),
        _time("flops", f"hardware FLOPs per step (recompute {lay.recompute})", "model FLOPs + recomputed forward",
              st.hardware_flops, FLOPS, unit="FLOPs", summed=False),
        _time("flops", "Kaplan's 6N estimate, for comparison", "6 x active params x tokens",
              6 * n_active * st.tokens_per_step, KAPLAN, unit="FLOPs", summed=False,
              active_params_N=n_active, tokens_per_step=st.tokens_per_step),
        _time("rates", f"peak {dtype} FLOP/s of the GPU (dense)", "data sheet", peak, f"{gpu.full_name}: {gpu.source}",
              unit="FLOP/s", summed=False),
        _time("rates", "matmul rate", "peak x sustained clock share x matmul fraction", r.matmul_flops_per_s, MATMUL,
              unit="FLOP/s", summed=False, peak=peak, sustained_clock_share=sustained_clock_share(gpu),
              matmul_fraction=eff.matmul_fraction if eff.matmul_fraction is not None
              else MATMUL_FRACTION.get(gpu.name, MATMUL_FRACTION_DEFAULT)),
        _time("rates", "flash-attention rate", "peak x sustained clock share x flash fraction", r.flash_flops_per_s,
              FLASH, unit="FLOP/s", summed=False, peak=peak, sustained_clock_share=sustained_clock_share(gpu),
              flash_fraction=eff.flash_fraction if eff.flash_fraction is not None
              else FLASH_FRACTION.get(gpu.name, FLASH_FRACTION_DEFAULT)),
        *([] if prec.fp8 is None or gpu.fp8_flops_per_s is None else [
            _time("rates", f"FP8 matmul rate of the blocks' linear layers ({prec.fp8.name})",
                  "FP8 dense peak x sustained clock share x FP8 matmul fraction (ASSUMED; router, attention and "
                  "LM head stay bf16)",
                  gpu.fp8_flops_per_s * sustained_clock_share(gpu) * fp8_share, "planner.training.fp8 "
                  "(FP8_MATMUL_FRACTION, ASSUMED); FP8 peak: " + gpu.source, unit="FLOP/s", summed=False,
                  fp8_peak=gpu.fp8_flops_per_s, sustained_clock_share=sustained_clock_share(gpu),
                  fp8_matmul_fraction=fp8_share)]),
        _time("rates", "HBM rate of element-wise kernels", "HBM bandwidth x hbm fraction", r.hbm_bytes_per_s,
              f"{HBM}; HBM bandwidth: {gpu.source}", unit="bytes/s", summed=False,
              hbm_bytes_per_s=gpu.hbm_bytes_per_s, hbm_fraction=eff.hbm_fraction),
        _time("compute", "one block, forward, one micro-batch", "GEMMs + attention + element-wise", lt.fwd_s,
              LAYER_TIME, summed=False, micro_batch_b=lay.micro_batch, seq_len_s=lay.seq_len, tp_t=lay.tp,
              cp=lay.cp),
        _time("compute", f"one block, backward (recompute {lay.recompute}), one micro-batch",
              "2 x forward GEMMs (1 x frozen GEMMs + 2 x adapter GEMMs under LoRA) + 2.5 x flash attention "
              "+ element-wise (+ dequantization) (+ recomputed forward)", lt.bwd_s,
              LAYER_TIME, summed=False),
    ]
    for axis in PLACEMENT_AXES:
        size = getattr(lay, axis)
        if size > 1:
            ln = links[axis]
            out.append(_time("links", f"{axis} groups of {size}: bus bandwidth per GPU"
                             + (" (all-to-all)" if axis == "ep" else ""),
                             "ring bandwidth of the topology graph, every group of the axis at once"
                             if axis != "ep" else
                             "all-to-all: (n-1)/n / max((g-1)/n / B_NVLink, (n-g)/n / B_NIC), g of the n ranks "
                             "in one NVLink domain (hardware.placement.all_to_all_link); the ring's where g = n",
                             ln.bus_bytes_per_s, link_src, unit="bytes/s", summed=False, latency_s=ln.latency_s,
                             placement="-".join(st.placement)))

    # the step: m (t_mb) + bubble + dp + optimizer
    # layers kept in BF16 on the slowest stage (training.layer_precision), each adding the BF16
    # block's time over the low-precision block's
    n_bf16 = int(stage_bf16_layers(slow_stage, lay.pp, n_slow, setup.bf16_layers))
    bf16: dict[str, Any] = {}
    if n_bf16:
        lt16 = layer_time(m, bf16_layer_setup(setup), layer_key(lay), layout_kernels(setup, lay), gpu, eff)
        bf16 = {"bf16_blocks_on_slowest_stage": n_bf16, "bf16_block_extra_forward_s": lt16.fwd_s - lt.fwd_s,
                "bf16_block_extra_backward_s": lt16.bwd_s - lt.bwd_s}
    extra_f, extra_b = n_bf16 * bf16.get("bf16_block_extra_forward_s", 0.0), \
        n_bf16 * bf16.get("bf16_block_extra_backward_s", 0.0)
    head = fwd_mb - n_slow * lt.fwd_s - extra_f
    with_bf16 = " + BF16 layers x their extra" if n_bf16 else ""
    # the MTP modules, timed on the last stage (timing.layer.block_table), where it is the slowest
    n_mtp = with_mtp(m, setup.mtp_layers).n_mtp_modules if slow_stage == lay.pp - 1 else 0
    if n_mtp:
        with_bf16 += " + MTP modules (eh_proj, their layers, the head and loss)"
        bf16 = {**bf16, "mtp_modules": n_mtp}
    out.append(_time("compute", "forward compute",
                     f"m x (L_stage x block forward{with_bf16} + LM head and loss on the last stage)",
                     n_mb * fwd_mb, LAYER_TIME, micro_batches_m=n_mb, blocks_on_slowest_stage=n_slow,
                     block_forward_s=lt.fwd_s, **{("head_loss_and_mtp_forward_s" if n_mtp else
                                                       "head_and_loss_forward_s"): head}, slowest_stage=slow_stage,
                     **{k: v for k, v in bf16.items() if "backward" not in k}))
    out.append(_time("compute", f"backward compute (recompute {lay.recompute})",
                     f"m x (L_backward x block backward{with_bf16} + LM head and loss backward)", n_mb * bwd_mb,
                     LAYER_TIME, micro_batches_m=n_mb, blocks_with_backward=n_slow_bwd, block_backward_s=lt.bwd_s,
                     head_backward_gemms=head_backward_gemms(setup.finetune),
                     **{("head_loss_and_mtp_backward_s" if n_mtp else "head_and_loss_backward_s"):
                        bwd_mb - n_slow_bwd * lt.bwd_s - extra_b},
                     **{k: v for k, v in bf16.items() if "forward" not in k}))
    ar = "AR(S, n) = 2(n-1) alpha + 2(n-1)/n x S / (B x bus fraction)"
    if lay.tp > 1:
        out.append(_time("communication", "tensor-parallel all-reduces, exposed",
                         f"m x (L_stage x k + edges) x AR(S, tp) x (1 - tp overlap){with_mtp_comm}; {ar}",
                         comm_s["tp"], f"{TP_COMM}; {RING}; {link_src}", micro_batches_m=n_mb, blocks=n_comm, **in_mtp,
                         collectives_per_block_k=lt.tp_collectives, bytes_per_collective_S=lt.tp_bytes, tp=lay.tp,
                         bus_fraction=eff.bus_fraction, tp_overlap=eff.tp_overlap, **_link(links, "tp")))
    if lay.cp > 1:
        out.append(_time("communication", "context-parallel K/V ring sends, exposed",
                         "m x L_stage x max(0, passes x (cp-1) x send(S) - cp overlap x attention time)"
                         f"{with_mtp_comm}; send(S) = alpha + S / (B x bus fraction)", comm_s["cp"],
                         f"Liu et al. 2023, Ring Attention, arXiv:2310.01889; {link_src}", micro_batches_m=n_mb,
                         blocks=n_comm, **in_mtp, bytes_per_send_S=lt.cp_bytes, passes=lt.cp_passes, cp=lay.cp,
                         cp_overlap=eff.cp_overlap, **_link(links, "cp")))
    if lt.ep_bytes:
        out.append(_time("communication", "expert-parallel all-to-alls, exposed",
                         f"m x L_stage x k x AG(S, ep) x (1 - ep overlap){with_mtp_comm}; "
                         "AG(S, n) = (n-1) alpha + (n-1)/n S/(B f)",
                         comm_s["ep"], f"{RING}; {link_src}", micro_batches_m=n_mb, blocks=n_comm, **in_mtp,
                         all_to_alls_per_block_k=lt.ep_all_to_alls, bytes_S=lt.ep_bytes, ep=lay.ep,
                         ep_overlap=lt.ep_hidden_share, **_link(links, "ep")))
    if lay.pp > 1:
        out.append(_time("communication", "pipeline sends, exposed",
                         "m x 2 v x send(b s h a / t) x (1 - pp overlap); send(S) = alpha + S / (B x bus fraction)",
                         comm_s["pp"], f"{BUBBLE}; {link_src}", micro_batches_m=n_mb, vp=lay.vp,
                         pp_overlap=eff.pp_overlap, **_link(links, "pp")))
    exposed = sum(comm_s[ax] for ax in _NOT_DP)
    slow_pipe = n_mb * t_mb - n_mb * (fwd_mb + bwd_mb) - exposed
    if slow_pipe > 1e-12 * n_mb * t_mb:
        out.append(_time("communication", "slowdown of compute under hidden tp/cp/ep/pp communication",
                         "overlap slowdown x hidden seconds (= m x t_mb - compute - exposed)", slow_pipe, OVERLAP,
                         overlap_slowdown=eff.overlap_slowdown, micro_batch_time_t_mb_s=t_mb))
    if lay.pp > 1:
        out.append(_time("bubble", "pipeline bubble", "(p - 1) / v x t_mb", st.bubble_s, BUBBLE, pp_p=lay.pp,
                         vp_v=lay.vp, micro_batch_time_t_mb_s=t_mb))

    rp = trained_split(m, pc, setup, lay, slow_stage, n_slow)
    dp = parts.dp_collectives(0)
    names = DP_NAMES[_dp_kind(lay)]
    g_b = eff.grad_reduce_bytes or prec.grad_bytes
    axis = "dp" if lay.dp > 1 else ("cp" if lay.cp > 1 else "ep")
    hidden_total = 0.0
    for i, c in enumerate(dp):
        exposed_s, hidden_s, per_mb = c.exposed_s, c.hidden_s, c.per_micro_batch
        raw_s, window, overlap = c.seconds, c.window, c.overlap
        if raw_s == 0:
            continue
        times = c.times
        hidden_total += hidden_s * times
        name = names[i] if len(names) == len(dp) else f"data-parallel collective {i + 1}"
        out.append(_time("communication", f"{name}, exposed",
                         f"{'m x ' if per_mb else ''}max(0, C - overlap x {window} time of a micro-batch); "
                         "C = ring collective of Psi x bytes over N_d ranks: (n-1) alpha + (n-1)/n S/(B f) "
                         "(all-reduce: twice)", exposed_s * times, f"{ZERO}; {RING}; {link_src}",
                         collective_C_s=raw_s, overlap=overlap,
                         window_s={"fwd": fwd_mb, "bwd": bwd_mb}.get(window, fwd_mb + bwd_mb),
                         times=times, trainable_dense_params=rp.trainable_dense,
                         trainable_expert_params=rp.trainable_expert, frozen_weight_bytes=rp.frozen_bytes,
                         bytes_per_weight=prec.weight_bytes, bytes_per_gradient=g_b,
                         N_d=lay.dense_shard_degree, N_e=lay.expert_shard_degree,
                         bus_fraction=eff.bus_fraction, **(_link(links, axis) if lay.n_gpus > 1 else {})))
    if hidden_total:
        out.append(_time("communication", "slowdown of compute under hidden data-parallel communication",
                         "overlap slowdown x hidden seconds", float(parts.dp_slowdown_s[0]), OVERLAP,
                         overlap_slowdown=eff.overlap_slowdown, hidden_s=hidden_total))
    opt_s = st.optimizer_s
    sharded = lay.zero_stage >= 1
    out.append(_time("optimizer", "optimizer update",
                     "(Psi / N_d + Psi_e / N_e) x (2 x (master + optimizer state bytes) + gradient + weight bytes) "
                     "/ HBM rate; Psi: trainable parameters", opt_s, OPT_TIME, Psi=rp.trainable_dense,
                     Psi_e=rp.trainable_expert, bytes_per_param=optimizer_update_bytes_per_param(m, setup),
                     N_d=lay.dense_shard_degree if sharded else 1, N_e=lay.expert_shard_degree if sharded else 1,
                     master_bytes=prec.master_bytes,
                     optimizer_state_bytes=optimizer_state_bytes(m, setup),
                     gradient_bytes=prec.grad_bytes, weight_bytes=prec.weight_bytes,
                     hbm_rate_bytes_per_s=r.hbm_bytes_per_s))
    modelled = sum(t.value for t in out if t.summed)
    rate = sustained_rate(gpu)
    ceiling = mfu_ceiling(eff, gpu, setup.precision_spec.fp8 is not None)
    floor_s = ceiling_floor_s(st.model_flops, st.n_gpus, peak, ceiling)
    if floor_s > modelled:
        out.append(_time("compute", "sustained training rate: no step faster than its model FLOPs at the GPU's "
                         "sustained MFU ceiling", "model FLOPs / (GPUs x peak x ceiling) - the terms above",
                         floor_s - modelled,
                         (f"{gpu.name} sustained rate ({'measured' if rate.measured else 'ASSUMED'}): {rate.source}"
                          if eff.mfu_ceiling is None else "the step-time model's mfu_ceiling"),
                         mfu_ceiling=ceiling, model_flops=st.model_flops, n_gpus=st.n_gpus, peak=peak))
    if eff.step_time_factor != 1.0:
        out.append(_time("interval", "planned at the upper end of the step-time interval (--time-confidence)",
                         "(factor - 1) x the step above", max(modelled, floor_s) * (eff.step_time_factor - 1),
                         "planner/timing/step_intervals.json (bench/out_of_sample.py)",
                         step_time_factor=eff.step_time_factor))
    rest = st.step_time_s - sum(t.value for t in out if t.summed)
    if abs(rest) > 1e-9 * st.step_time_s:
        out.append(_time("unexplained", "not itemised (planner.report.explain is behind planner.timing.model; "
                         "please report it)",
                         "step time - the terms above", rest, "planner.timing.model"))
    out.append(_time("utilisation", "MFU", "model FLOPs / step time / GPUs / peak", st.mfu,
                     "Chowdhery et al. 2022, PaLM, App. B", unit="fraction", summed=False,
                     model_flops=st.model_flops, step_time_s=st.step_time_s, n_gpus=st.n_gpus, peak=peak))
    if st.mfu_fp8 is not None:
        out.append(_time("utilisation", "MFU against the low-precision peak (FP8; FP4 under NVFP4)",
                         "model FLOPs / step time / GPUs / low-precision peak",
                         st.mfu_fp8, "Chowdhery et al. 2022, PaLM, App. B; gpus.toml FP8 dense peak", unit="fraction",
                         summed=False, model_flops=st.model_flops, step_time_s=st.step_time_s, n_gpus=st.n_gpus,
                         peak=st.fp8_peak_flops_per_s))
    return out


