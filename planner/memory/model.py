"""Per-rank memory from first principles: model states, activations, logits, buffers.

The model is written once, over a batch of layouts (planner.memory.peak.memory_batch; its
terms in states.py, activations.py, loss.py, buffers.py, params.py, shapes.py); here are the
per-layout views of one row of it: MemoryBreakdown and RankMemory, and per_rank_memory(),
the model on a batch of one.

Everything is bytes on one GPU (int). The most loaded rank is found by evaluating every
pipeline stage. Categories line up with PyTorch's memory trackers: everything a tensor
tracker can see is outside ``overhead``; ``overhead`` holds only what no tracker sees
(CUDA context, library workspaces, NCCL buffers, allocator fragmentation).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout
from planner.memory.activations import (  # noqa: F401  (re-exported: the per-shape figures)
    ActivationTerm,
    layer_activation_bytes,
    layer_activation_terms,
    lora_cast_bytes,
    norm_saved_bytes,
)
from planner.memory.floors import (  # noqa: F401  (re-exported: the search's floors)
    StateFloor,
    activation_floor_bytes,
    held_activation_floor_bytes,
    memory_floor_bytes,
    min_model_state_bytes_per_param,
    model_state_floor,
    model_state_floors,
    overhead_floor_bytes,
)
from planner.memory.loss import logits_bytes  # noqa: F401
from planner.memory.params import (  # noqa: F401
    RankParams,
    adafactor_bytes_per_param,
    rank_params,
    stage_layers,
    stages_to_check,
)
from planner.memory.peak import (
    ABSENT,
    MOMENT_PARTS,
    MOMENTS,
    MemoryBatch,
    StageMemory,
    memory_batch,
    pick_terms,
)
from planner.memory.peak import fsdp_blocks_done as batched_blocks_done
from planner.memory.shapes import in_flight_microbatches as batched_in_flight
from planner.memory.states import model_state_bytes as batched_states
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.finetune import RankSplit
from planner.training.kernels import KERNELS
from planner.training.setup import Precision, TrainingSetup

CATEGORIES = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes on one rank at its peak, by category (see module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    buffers: int
    overhead: int

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.logits + self.buffers + self.overhead)

    @property
    def tracked(self) -> int:
        """What a tensor tracker can see: the total less ``overhead``."""
        return self.total - self.overhead

    def as_dict(self) -> dict[str, int]:
        return {c: getattr(self, c) for c in CATEGORIES} | {"total": self.total}


@dataclass(frozen=True, kw_only=True, slots=True)
class RankMemory:
    """The memory of the most loaded rank, and where the figure comes from."""

    breakdown: MemoryBreakdown
    stage: int                  # which pipeline stage is the most loaded
    phase: str                  # when the peak happens: backward-start | backward-end
    n_layers_on_stage: int
    in_flight: float            # micro-batches whose activations the stage holds
    kernels: str
    # offload (ZeRO-Offload, ZeRO-Infinity, FSDP CPU offload): what this rank keeps in CPU
    # memory and on NVMe, and how many ranks share a node's CPU memory and drives
    host_bytes: int = 0
    nvme_bytes: int = 0
    ranks_per_node: int = 1
    # every term the total is summed from (this layout's row of the batched model, which
    # planner.report.explain_memory prints); not part of the answer's identity
    terms: MemoryTerms | None = field(default=None, compare=False, repr=False)

    @property
    def total(self) -> int:
        return self.breakdown.total

    @property
    def host_bytes_per_node(self) -> int:
        return self.host_bytes * self.ranks_per_node

    @property
    def nvme_bytes_per_node(self) -> int:
        return self.nvme_bytes * self.ranks_per_node



@dataclass(frozen=True, slots=True)
class MemoryTerms:
    """One layout's row of a MemoryBatch: every term of its most loaded stage
    (``batch.at.<term>[row]``), as planner.report.explain_memory prints them."""

    batch: MemoryBatch
    row: int

    def get(self, name: str) -> object:
        """The term ``name`` of the row (dotted for nested terms: "states.weights"); ints and
        floats, tuples of them."""
        x: object = self.batch.slots
        for part in name.split("."):
            x = x[part] if isinstance(x, dict) else getattr(x, part)
        rows = np.array([self.row])
        return _scalar(pick_terms(x, self.batch.pick(rows), rows, self.batch.state_inv[rows]), 0)

    def of_batch(self, name: str) -> object:
        """A per-layout fact of the batch (kernels, hybrid, persistent_grads ...) at the row."""
        return _scalar(getattr(self.batch, name), self.row)

    @property
    def phase(self) -> str:
        return MOMENTS[int(self.batch.pick_phase(np.array([self.row]))[0])]

    def moment(self, name: str) -> tuple[int, ...]:
        """The parts of moment ``name`` (peak.MOMENT_PARTS), or () where the layout has none."""
        rows = np.array([self.row])
        parts = tuple(int(self.batch.term(f"moments.{name}.{f}", rows)[0]) for f in MOMENT_PARTS)
        return () if parts[1] <= ABSENT // 2 else parts

    def moments(self) -> dict[str, tuple[int, ...]]:
        """The moments the layout has, in peak.MOMENTS order (the order the peak is chosen in)."""
        out = {k: self.moment(k) for k in MOMENTS}
        return {k: v for k, v in out.items() if v}

    def view(self, setup: TrainingSetup) -> RankTerms:
        """The row's terms as one typed object of plain numbers (planner.report.explain_memory
        prints them); ``setup``: the set-up the batch was sized for."""
        b, g = self.batch, self.get
        end: Any = g("end_grad_params")
        dense, expert = end
        return RankTerms(
            stage=int(g("stage")), phase=self.phase, phases=self.moments(),  # type: ignore[call-overload]
            rank_params=RankParams(**_fields(g("rank_params"))),
            split=RankSplit(**_fields(g("split"))),
            states=ScalarStates(**_fields(g("states"))), offload=ScalarOffload(**_fields(g("offload"))),
            **{k: g(k) for k in _STAGE_TERMS},  # type: ignore[arg-type]
            end_grad_params=None if dense < 0 else (dense, expert),
            kernels=KERNELS[int(self.of_batch("kernels"))],  # type: ignore[call-overload]
            act_setup=replace(setup, precision="fp32") if self.of_batch("act_fp32") else setup,
            state_precision=b.state_precision, optimizer_bytes_per_param=b.optimizer_bytes_per_param,
            amp_states=bool(self.of_batch("amp_states")), hybrid=int(self.of_batch("hybrid")) or None,  # type: ignore[call-overload]
            persistent_grads=bool(self.of_batch("persistent_grads")),
            distributed=bool(self.of_batch("distributed")),
            fixed_overhead=int(self.of_batch("fixed_overhead")),  # type: ignore[call-overload]
            tracked=int(self.of_batch("tracked")), fragmentation=int(self.of_batch("fragmentation")))  # type: ignore[call-overload]


def _fields(x: Any) -> dict[str, Any]:
    return {f.name: getattr(x, f.name) for f in fields(x)}


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalarStates:
    """states.ModelStates of one layout (bytes)."""

    weights: int
    gradients: int
    optimizer: int
    unsharded_weights: int
    accumulated_gradients: int      # states.no_sync_gradient_bytes (not in total: reduced before the step)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.unsharded_weights


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalarOffload:
    """states.OffloadSplit of one layout (bytes)."""

    weights: int
    gradients: int
    optimizer: int
    host_bytes: int
    nvme_bytes: int
    step_on_host: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class RankTerms:
    """Every term of one layout's most loaded stage, as the batched model summed them
    (planner.memory.peak.StageMemory at one row, and the batch's per-layout facts): what
    ``plan explain`` prints. ``phases``: each moment's (extra weights, gradients,
    activations, logits, buffers, step temporaries), peak.MOMENT_PARTS."""

    stage: int
    phase: str
    phases: dict[str, tuple[int, ...]]
    rank_params: RankParams
    split: RankSplit
    states: ScalarStates
    offload: ScalarOffload
    n_act_layers: int
    held: float
    layer_act: int
    full_layer: int
    block_acts: int
    embed_acts: int
    image_acts: int             # a trained image side's saved tensors in flight, first stage (training.images)
    dropout_embed: int
    amp_copies: int
    working: int
    score_grad: int
    last_block: int
    fsdp_end: tuple[int, int, int]
    fsdp_forward: tuple[int, int]
    fsdp_block: tuple[int, int]     # FSDP2 in the last block's backward: (gathered weights, its 16-bit gradients)
    step_transient: int
    grad_unit: int
    head_grad: int
    step_freed: int
    fsdp_done: int
    root_gathered: int
    fp8_weights: int
    logits: int
    buffers: int
    tracked: int
    fragmentation: int
    expert_padding: float
    end_grad_params: tuple[int, int] | None
    kernels: str
    act_setup: TrainingSetup
    state_precision: Precision
    optimizer_bytes_per_param: float
    amp_states: bool
    hybrid: int | None
    persistent_grads: bool
    distributed: bool
    fixed_overhead: int


# RankTerms' fields that are the stage's terms (StageMemory) as they are, at the row: every field of
# both but those view() converts and the batch's per-layout facts (MemoryBatch, read by of_batch).
# The names are StageMemory's: a new stage term is a field there and here, and nothing else.
_CONVERTED = ("stage", "rank_params", "split", "states", "offload", "end_grad_params")
_STAGE_TERMS = tuple(f.name for f in fields(RankTerms)
                     if f.name in {g.name for g in fields(StageMemory)} - {g.name for g in fields(MemoryBatch)}
                     and f.name not in _CONVERTED)


def _scalar(x: object, row: int) -> object:
    if isinstance(x, np.ndarray):
        v = x[row] if x.ndim else x[()]
        return v.item() if isinstance(v, np.generic) else v
    if isinstance(x, tuple):
        return tuple(_scalar(y, row) for y in x)
    if is_dataclass(x) and not isinstance(x, type):
        return type(x)(**{f.name: _scalar(getattr(x, f.name), row) for f in fields(x)})
    return x


def rank_memories(batch: MemoryBatch, rows: list[int] | None = None, keep_terms: bool = True) -> list[RankMemory]:
    """The per-layout view (RankMemory) of ``rows`` of ``batch`` (default: every row), each
    with its terms (``keep_terms``)."""
    idx = np.arange(len(batch)) if rows is None else np.asarray(rows, dtype=np.int64)
    if not len(idx):
        return []
    phase = batch.pick_phase(idx)
    cat = {f: np.zeros(len(idx), dtype=np.int64) for f in MOMENT_PARTS}
    for k, name in enumerate(MOMENTS):
        on = phase == k
        if on.any():
            for f in MOMENT_PARTS:
                cat[f] = np.where(on, batch.term(f"moments.{name}.{f}", idx), cat[f])
    term = batch.term
    weights = (term("weights", idx) + cat["extra_weights"]).tolist()
    grads = cat["gradients"].tolist()
    opt = (term("offload.optimizer", idx) + cat["step_temporaries"]).tolist()
    acts, logits, bufs = cat["activations"].tolist(), cat["logits"].tolist(), cat["buffers"].tolist()
    overhead = (batch.fixed_overhead[idx] + batch.fragmentation[idx]).tolist()
    stage, n_layers, held = term("stage", idx).tolist(), term("n_layers", idx).tolist(), term("held", idx).tolist()
    kernels = batch.kernels[idx].tolist()
    host = (term("offload.host_bytes", idx) + term("checkpoint_host", idx)).tolist()   # + DeepSpeed cpu_checkpointing
    nvme = term("offload.nvme_bytes", idx).tolist()
    rpn = batch.ranks_per_node[idx].tolist()
    phases = phase.tolist()
    out = []
    for j, i in enumerate(idx.tolist()):
        bd = MemoryBreakdown(weights=weights[j], gradients=grads[j], optimizer=opt[j], activations=acts[j],
                             logits=logits[j], buffers=bufs[j], overhead=overhead[j])
        out.append(RankMemory(breakdown=bd, stage=stage[j], phase=MOMENTS[phases[j]], n_layers_on_stage=n_layers[j],
                              in_flight=held[j], kernels=KERNELS[kernels[j]], host_bytes=host[j], nvme_bytes=nvme[j],
                              ranks_per_node=rpn[j], terms=MemoryTerms(batch, i) if keep_terms else None))
    return out


def per_rank_memory(m: ModelSpec, setup: TrainingSetup, lay: Layout,
                    pc: ParamCount | None = None, gpus_per_node: int = 8) -> RankMemory:
    """The peak memory of the most loaded rank of ``lay``, by category: memory_batch() on a
    batch of one (see planner.memory.peak for the moments it compares). ``terms`` holds
    every term the total is summed from."""
    batch = memory_batch(m, setup, LayoutArrays.from_layouts([lay]), pc or count_params(m), gpus_per_node,
                         seq_len=lay.seq_len)
    return rank_memories(batch)[0]


# ------------------------------------------------------- per-layout views of batched terms

def model_state_bytes(n_dense: int, n_expert: int, precision: Precision, optimizer_bytes_per_param: float,
                      lay: Layout, shard_degree_dense: int | None = None, amp: bool = False,
                      expert_padding: float = 1.0) -> ScalarStates:
    """states.model_state_bytes for one layout (a batch of one; ``shard_degree_dense``: FSDP
    hybrid's shard group, None otherwise)."""
    a = LayoutArrays.from_layouts([lay])
    ms = batched_states(np.array([n_dense], dtype=np.int64), np.array([n_expert], dtype=np.int64), precision,
                        optimizer_bytes_per_param, a, np.array([shard_degree_dense or 0], dtype=np.int64),
                        amp=np.array([amp]), expert_padding=np.array([expert_padding]))
    return ScalarStates(**{k: int(v[0]) for k, v in _fields(ms).items()})


def in_flight_microbatches(lay: Layout, stage: int) -> float:
    """shapes.in_flight_microbatches for one layout."""
    return float(batched_in_flight(lay, stage))  # type: ignore[arg-type]


def fsdp_blocks_done(lay: Layout, n_blocks: int) -> int:
    """peak.fsdp_blocks_done for one layout."""
    return int(batched_blocks_done(lay, n_blocks))  # type: ignore[arg-type]
