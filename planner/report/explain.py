"""`plan explain`: every term of the memory and step-time models for one layout, with
its inputs, its value and its source, so a user can check the arithmetic by hand.

The values are never worked out here: the memory terms are the parts
the memory model itself adds up (its terms, RankMemory.terms), the time terms those of
timing.step_time() (its pipeline, data-parallel and optimizer parts, from the same
functions). This module only names them, writes their formulas in words and symbols and
cites where each comes from; tests/test_explain.py checks that the terms add up to what
`plan` reports. A term marked ``summed=False`` is a figure the summed terms use (the
FLOPs, a rate, a link's bandwidth), shown for the hand check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.hardware.gpus import GpuSpec
from planner.hardware.placement import Cluster, cluster_for
from planner.layouts.layout import Layout
from planner.memory.model import CATEGORIES, RankMemory, per_rank_memory
from planner.models.spec import ModelSpec, count_params
from planner.report.explain_memory import memory_terms
from planner.report.explain_time import time_terms
from planner.report.terms import Term
from planner.timing.model import Efficiency, StepTime, step_time
from planner.training.setup import TrainingSetup


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    model: ModelSpec
    gpu: GpuSpec
    layout: Layout
    memory: RankMemory
    capacity_bytes: int
    time: StepTime
    terms: tuple[Term, ...]
    tokens: float | None = None

    def summed(self, section: str) -> float:
        return sum(t.value for t in self.terms if t.section == section and t.summed)


def explain(m: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, lay: Layout, cluster: Cluster | None = None,
            eff: Efficiency | None = None, capacity_bytes: int | None = None,
            tokens: float | None = None) -> Explanation:
    """The memory and time terms of ``lay`` (as `plan` evaluates it on ``gpu``)."""
    eff = eff or Efficiency()
    pc = count_params(m)
    cluster = cluster or cluster_for(gpu)
    mem = per_rank_memory(m, setup, lay, pc, gpu.gpus_per_node)
    st = step_time(m, setup, lay, cluster, eff, pc)
    terms = memory_terms(m, setup, lay, pc, mem) + time_terms(m, setup, lay, cluster, eff, pc, st)
    if tokens is not None:
        terms.append(Term(section="time", category="training", name="time to train on the tokens",
                          formula="tokens / (tokens per step / step time)",
                          inputs={"tokens": tokens, "tokens per step": st.tokens_per_step,
                                  "step time s": st.step_time_s},
                          value=st.train_time_s(tokens), unit="s", source="Narayanan et al. 2021, Eq. 4",
                          summed=False))
    cap = capacity_bytes if capacity_bytes is not None else gpu.memory_bytes
    return Explanation(model=m, gpu=gpu, layout=lay, memory=mem, capacity_bytes=cap, time=st,
                       terms=tuple(terms), tokens=tokens)



# --------------------------------------------------------------------------- output

def _fmt(v: Any) -> str:
    if isinstance(v, (bool, str)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.6g}"
    return str(v)


def _value_text(v: float, unit: str) -> str:
    from planner.report.text import gib

    if unit == "bytes":
        return f"{int(v):,} B = {gib(v)}"
    if unit == "s":
        return f"{v:.6g} s"
    if unit == "FLOPs":
        return f"{v:.6g} FLOPs"
    if unit == "FLOP/s":
        return f"{v / 1e12:,.1f} TFLOP/s"
    if unit == "bytes/s":
        return f"{v / 1e9:,.1f} GB/s"
    if unit == "fraction":
        return f"{v:.1%}"
    return f"{v:.6g} {unit}"


def _term_text(t: Term) -> list[str]:
    mark = "" if t.summed else "  (used above, not added)"
    out = [f"  {t.name}: {_value_text(t.value, t.unit)}{mark}"]
    if t.name.startswith("  per block"):
        return [f"    {t.name.strip()}: {_value_text(t.value, t.unit)}"]
    out.append(f"      = {t.formula}")
    if t.inputs:
        out.append("      inputs: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in t.inputs.items()))
    out.append(f"      source: {t.source}")
    return out


def expert_sharding_lines(ex: Explanation) -> list[str]:
    """How the experts are split, where --etp sets the expert tensor-parallel size apart from
    tp (megatron-core 0.16.1: experts.py's expert tensor-parallel group, parallel_state's
    expert data-parallel group; layouts.layout's notes)."""
    lay, m = ex.layout, ex.model
    if not m.is_moe or lay.expert_tp == lay.tp:
        return []
    return [f"experts: {m.n_experts} per layer, {m.n_experts // lay.ep} on each rank (ep={lay.ep}), each "
            f"matrix split over etp={lay.expert_tp} ranks (dense matrices over tp={lay.tp}): expert params per "
            f"rank = experts' params / (ep x etp); expert data parallel N_e = "
            + (f"DP x cp x tp / (etp x ep) = {lay.dp} x {lay.cp} x {lay.tp} / ({lay.expert_tp} x {lay.ep}) "
               if lay.ep_fold else f"dp x cp x tp / etp = {lay.dp} x {lay.cp} x {lay.tp} / {lay.expert_tp} ")
            + f"= {lay.expert_shard_degree} ranks share (and, "
            f"sharded, split) each expert's gradients and optimizer states; the MLP's tp collectives run on "
            f"the etp group"]


def to_text(ex: Explanation) -> str:
    from planner.report.text import gib

    lay, mem = ex.layout, ex.memory
    where = f"pipeline stage {mem.stage} ({mem.n_layers_on_stage} layers)" if lay.pp > 1 else "every rank"
    out = [f"{ex.model.name} on {lay.n_gpus} x {ex.gpu.name}: {lay.describe()}", *expert_sharding_lines(ex), "",
           (f"MEMORY per rank at its peak ({mem.phase.replace('-', ' ')}, {where}): "
            f"{gib(mem.total)} of {gib(ex.capacity_bytes)} usable")]
    mem_terms = [t for t in ex.terms if t.section == "memory"]
    for cat in CATEGORIES:
        terms = [t for t in mem_terms if t.category == cat]
        out.append(f" {cat}: {gib(getattr(mem.breakdown, cat))}")
        for t in terms:
            out += _term_text(t)
    out.append(f" total (sum of the terms): {ex.summed('memory'):,.0f} B = {gib(ex.summed('memory'))}")
    out.append(" the peak, of the moments a step goes through:")
    for t in [t for t in mem_terms if t.category == "peak"]:
        out.append(f"  {t.name}: {_value_text(t.value, t.unit)}")
    st = ex.time
    out += ["", (f"TIME of one optimizer step: {st.step_time_s:.6g} s "
                 f"({st.tokens_per_step:,} tokens, MFU {st.mfu:.1%})")]
    time_terms = [t for t in ex.terms if t.section == "time"]
    for t in [t for t in time_terms if not t.summed and t.category != "utilisation"]:
        out += _term_text(t)
    out.append(" the step, term by term:")
    for t in [t for t in time_terms if t.summed]:
        out += _term_text(t)
    out.append(f" step time (sum of the terms): {ex.summed('time'):.6g} s")
    for t in [t for t in time_terms if t.category == "utilisation"]:
        out += _term_text(t)
    return "\n".join(out)


def to_json(ex: Explanation) -> dict[str, Any]:
    from planner.report.text import layout_json

    return {"model": ex.model.name, "gpu": ex.gpu.name, "n_gpus": ex.layout.n_gpus,
            "layout": layout_json(ex.layout),
            "memory": {"total_bytes": ex.memory.total, "capacity_bytes": ex.capacity_bytes,
                       "phase": ex.memory.phase, "stage": ex.memory.stage,
                       "fits": ex.memory.total <= ex.capacity_bytes},
            "time": {"step_time_s": ex.time.step_time_s, "mfu": ex.time.mfu,
                     "placement": list(ex.time.placement)},
            "terms": [t.as_dict() for t in ex.terms]}
