"""Post-training plans as text and JSON: distillation (the student's memory with the
teacher's terms named, the teacher's forward in the step) and RL (memory and time by phase)."""

from __future__ import annotations

from typing import Any

from planner.fmt import duration, gib, gib_of
from planner.hardware.gpus import GpuSpec
from planner.search.posttrain import DistillChoice, PosttrainPlan, RLChoice
from planner.timing.rollout import generation_and_rest_s

DISTILL_TERMS = (
    ("teacher_weights", "teacher weights"),
    ("teacher_gathered", "teacher blocks gathered (FSDP)"),
    ("teacher_forward", "teacher forward, no grad (one block)"),
    ("teacher_logits", "teacher logits"),
    ("student_logits", "student logits kept for the KD loss"),
    ("kd_loss", "KD loss working set"),
    ("hidden", "hidden-state losses: teacher states"),
    ("hidden_mse", "hidden-state losses: MSE inputs"),
    ("projection_states", "hidden-state projections (trained)"),
    ("offline_topk", "stored top-k teacher logits"),
    ("student_loss_grads", "student loss gradients not made yet"),
)


def _rows(pairs: list[tuple[str, str]], width: int = 44) -> list[str]:
    return [f"  {name:<{width}} {value:>12}" for name, value in pairs]


def distill_lines(p: PosttrainPlan) -> list[str]:
    """The distillation plan as plain-text lines."""
    d, ds, t = p.distill, p.distill_setup, p.teacher
    assert ds is not None and t is not None
    head = f"{p.model.name} distilled from {t.name} on {p.gpu.name}"
    if d is None:
        return [head, f"nothing fits on up to {max(p.counts_tried)} x {p.gpu.name} "
                      f"(--teacher-quant, --teacher-sharding fsdp, --kd-offline-topk or more GPUs)"]
    lay = d.candidate.layout
    bd = d.candidate.memory.breakdown
    tm = d.teacher
    how = {"replicated": "whole on every GPU", "fsdp": f"FSDP-sharded over dp={lay.dp}",
           "tp": f"split over tp={lay.tp} x pp={lay.pp} like the student",
           "offline": "offline: stored top-k logits, no teacher on the GPUs"}[tm.sharding]
    tw = "fp32" if ds.teacher_weight_bytes == 4 else "bf16"
    quant = f", {ds.teacher_quant} linear weights" if ds.teacher_quant != "none" else ""
    lines = [head, "",
             f"Smallest GPU count that fits: {lay.n_gpus} x {p.gpu.name}",
             f"  layout  {lay.describe()}",
             f"  teacher {how} ({tw}{quant}), KD loss {ds.kd_loss}"
             + (f", {ds.kd_hidden_layers} hidden-state losses" if ds.kd_hidden_layers else ""),
             f"  memory  {gib_of(d.total_bytes, p.capacity_bytes)} per GPU; peak at the {tm.peak_moment}",
             f"  step    {duration(d.step_time_s)} (student {duration(d.student_time.step_time_s)}, teacher forward "
             f"{duration(d.teacher_forward_s)}" + (f", teacher gathers {duration(d.teacher_gather_s)}"
                                                    if d.teacher_gather_s else "") + ")",
             "", f"Memory per GPU at the peak ({tm.peak_moment})"]
    student = [("student: weights", bd.weights), ("student: gradients", bd.gradients),
               ("student: optimizer states", bd.optimizer), ("student: activations", bd.activations),
               ("student: logits and loss", bd.logits), ("student: communication buffers", bd.buffers)]
    terms = tm.peak_terms()
    extra = [(label, terms[key]) for key, label in DISTILL_TERMS if terms.get(key)]
    frag = d.total_bytes - d.candidate.memory.total - tm.extra
    rows = [(n, gib(v)) for n, v in student + extra]
    rows.append(("overhead (CUDA, NCCL, fragmentation)", gib(bd.overhead + frag)))
    rows.append(("total", gib(d.total_bytes)))
    lines += _rows(rows)
    lines += ["", f"  the teacher's terms at its forward: {gib(tm.forward_moment)}, at the KD loss: "
                  f"{gib(tm.loss_moment)}; the larger is added to the student's peak",
              f"  teacher forward FLOPs per step {d.teacher_flops:.3e} (2 x its parameters per token and the "
              f"attention scores), at the student's training rate"]
    return lines


def rl_lines(p: PosttrainPlan) -> list[str]:
    """The RL plan as plain-text lines: memory by phase, the peak phase, time by phase."""
    r, rl = p.rl, p.rl_setup
    assert rl is not None
    head = (f"{p.model.name} {rl.task.upper()} on {p.gpu.name}: {rl.prompts_per_step} prompts x "
            f"{rl.group_size if rl.task != 'dpo' else 2} sequences of {rl.prompt_len} + {rl.response_len} "
            f"tokens per step")
    if r is None:
        return [head, f"nothing fits on up to {max(p.counts_tried)} x {p.gpu.name}: lower "
                      f"--rollout-memory-fraction, --offload-train-states, or more GPUs"]
    lay = r.candidate.layout
    totals = r.phases.totals()
    lines = [head, "",
             f"Smallest GPU count that fits: {lay.n_gpus} x {p.gpu.name} ({rl.placement} rollout"
             + (f", {rl.engine_gpus(lay.n_gpus)} more GPUs for the engines" if rl.engine_gpus(lay.n_gpus) else "")
             + ")",
             f"  training layout  {lay.describe()}",
             f"  peak phase       {r.phases.peak_phase}: {gib_of(r.phases.peak, p.capacity_bytes)} per GPU",
             f"  step             {duration(r.step_time_s)}"]
    largest = r.phases.largest_engine_fraction(p.capacity_bytes, p.gpu)
    if largest is not None:
        lines.append(f"  engine fraction  {rl.engine_memory_fraction} of each GPU; at most {largest:.2f} fits beside "
                     f"what stays on the GPU during generation (--rollout-memory-fraction)")
    lines.append("")
    for phase, terms in (("generation", r.phases.generation), ("scoring", r.phases.scoring),
                         ("training", r.phases.training)):
        if not terms:
            continue
        lines.append(f"Memory per GPU, {phase}: {gib(totals[phase])}")
        lines += _rows([(k, gib(v)) for k, v in terms.items() if v])
    if r.engine is not None and r.generation is not None:
        e, g = r.engine, r.generation
        lines += ["", f"Rollout engine (vLLM, tp={rl.engine_tp}, gpu_memory_utilization {rl.engine_memory_fraction}): "
                      f"weights {gib(e.weights_bytes)}, profile and sampling {gib(e.profile_bytes)}, KV cache "
                      f"{gib(e.kv_bytes)} = {e.n_blocks:,} blocks of 16 tokens; a sequence holds "
                      f"{e.blocks_per_sequence} blocks, so {e.max_sequences} at once",
                  f"  {g.n_engines} engines x {g.sequences_per_engine} sequences, {g.concurrent} decoded at once "
                  f"in {g.waves} wave(s), {g.decode_steps:,} decode steps (of which tp all-reduces "
                  f"{duration(g.collective_s)}, fitted per-step time {duration(g.overhead_s)})"]
    lines += ["", f"Step time: {duration(r.step_time_s)}"]
    if r.overlapped:
        gen, rest = generation_and_rest_s(r.times_s)
        lines.append(f"  asynchronous, {rl.off_policy_steps} step(s) off-policy: generation ({duration(gen)}, the "
                     f"engines' {rl.engine_gpus(lay.n_gpus)} GPUs) overlaps the rest ({duration(rest)}, "
                     f"the training GPUs); the slower side sets the step")
    lines += _rows([(k, duration(v)) for k, v in r.times_s.items()])
    return lines


def run_lines(p: PosttrainPlan) -> list[str]:
    """The whole run's time, with --tokens (distillation) or --rl-steps (RL)."""
    if p.run_time_s is None or p.gpu_hours is None or p.chosen is None:
        return []
    return ["", f"Run: {p.steps:,} steps, {duration(p.run_time_s)} on {p.n_gpus} x {p.gpu.name} "
                f"({p.gpu_hours:,.0f} GPU-hours)"]


def posttrain_text(p: PosttrainPlan) -> str:
    return "\n".join((distill_lines(p) if p.distill_setup is not None else rl_lines(p)) + run_lines(p))


def _distill_json(d: DistillChoice) -> dict[str, Any]:
    return {"layout": d.candidate.layout.describe(), "n_gpus": d.candidate.layout.n_gpus,
            "total_bytes": d.total_bytes, "student": d.candidate.memory.breakdown.as_dict(),
            "teacher": d.teacher.as_dict(), "step_time_s": d.step_time_s,
            "student_step_time_s": d.student_time.step_time_s, "teacher_forward_s": d.teacher_forward_s,
            "teacher_gather_s": d.teacher_gather_s, "teacher_flops": d.teacher_flops}


def _rl_json(r: RLChoice, plan_capacity: int, plan_gpu: GpuSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"layout": r.candidate.layout.describe(), "n_gpus": r.candidate.layout.n_gpus,
                           "memory_by_phase": {"generation": r.phases.generation, "scoring": r.phases.scoring,
                                               "training": r.phases.training},
                           "phase_totals_bytes": r.phases.totals(), "peak_phase": r.phases.peak_phase,
                           "step_time_s": r.step_time_s, "time_by_phase_s": r.times_s,
                           "largest_engine_fraction": r.phases.largest_engine_fraction(plan_capacity, plan_gpu)}
    if r.overlapped:
        out["overlapped"] = True     # asynchronous RL: step = max(generation, the rest) (timing.rollout.rl_step_s)
    if r.engine is not None:
        e = r.engine
        out["engine"] = {"reserved_bytes": e.reserved_bytes, "weights_bytes": e.weights_bytes,
                         "profile_bytes": e.profile_bytes, "kv_bytes": e.kv_bytes, "n_blocks": e.n_blocks,
                         "blocks_per_sequence": e.blocks_per_sequence, "max_sequences": e.max_sequences}
    if r.generation is not None:
        g = r.generation
        out["generation"] = {"n_engines": g.n_engines, "sequences_per_engine": g.sequences_per_engine,
                             "concurrent": g.concurrent, "waves": g.waves, "decode_steps": g.decode_steps,
                             "decode_collective_s": g.collective_s, "decode_overhead_s": g.overhead_s}
    return out


def posttrain_json(p: PosttrainPlan) -> dict[str, Any]:
    """One JSON object: the chosen layout (None when nothing fits) and its terms, bytes and seconds."""
    out: dict[str, Any] = {"model": p.model.name, "gpu": p.gpu.name, "capacity_bytes": p.capacity_bytes,
                           "fits": p.fits, "counts_tried": list(p.counts_tried)}
    if p.steps is not None:
        out |= {"steps": p.steps, "run_time_s": p.run_time_s, "gpu_hours": p.gpu_hours}
    if p.distill_setup is not None:
        assert p.teacher is not None
        out["teacher"] = p.teacher.name
        out["plan"] = _distill_json(p.distill) if p.distill is not None else None
    else:
        assert p.rl_setup is not None
        out["task"] = p.rl_setup.task
        out["plan"] = _rl_json(p.rl, p.capacity_bytes, p.gpu) if p.rl is not None else None
    return out


def posttrain_quiet(p: PosttrainPlan) -> str:
    if p.distill is not None:
        d = p.distill
        lay = d.candidate.layout
        return f"{lay.n_gpus} x {p.gpu.name}: {lay.describe()}, {duration(d.step_time_s)}/step"
    if p.rl is not None:
        r = p.rl
        return (f"{r.candidate.layout.n_gpus} x {p.gpu.name}: {r.candidate.layout.describe()}, "
                f"{duration(r.step_time_s)}/step, peak {r.phases.peak_phase}")
    return f"nothing fits on up to {max(p.counts_tried)} x {p.gpu.name}"
