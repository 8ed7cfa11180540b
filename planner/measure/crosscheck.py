"""Cross-check a plan's model states against DeepSpeed's own estimators.

DeepSpeed ships two closed-form estimators (deepspeed/runtime/zero/stage_1_and_2.py and
stage3.py): ``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs``. Their assumptions (docs/facts.md):

- ZeRO-2 on the GPU: 2 B x P of 16-bit weights plus 18 B x P / N, where 18 B are 16-bit
  and fp32 gradients (2 + 4), the fp32 master copy (4) and Adam's two moments (8);
- ZeRO-3 on the GPU: 18 B x P / N (16-bit weights, fp32 gradients, master, moments)
  plus 4 B x the largest layer (gathered 16-bit weights);
- N is every GPU in the job: no tensor, pipeline or expert parallelism, no activations,
  buffers or overheads; CPU figures are per node, times additional_buffer_factor (1.5).

``planner_as_deepspeed`` runs the planner's own formulas (memory.model_state_bytes and
memory.buffer_bytes) under exactly those assumptions; it agrees with DeepSpeed to the
byte (tests/test_crosscheck.py). ``crosscheck`` puts DeepSpeed's figures beside the
plan's and says, one line each, why they differ. deepspeed is imported only here and
in emit/deepspeed.py, inside functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.emit.deepspeed import import_deepspeed
from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout
from planner.memory.buffers import buffer_bytes
from planner.memory.model import per_rank_memory
from planner.memory.params import optimizer_state_bytes, rank_params
from planner.memory.shapes import ParamsArrays, SplitArrays
from planner.memory.states import model_state_bytes
from planner.models.spec import ModelSpec
from planner.training.setup import (
    Buffers,
    Precision,
    TrainingSetup,
    optimizer_state_bytes_per_param,
)

if TYPE_CHECKING:
    from planner.api import PlanResult

# DeepSpeed's default additional_buffer_factor for its CPU figures (the estimators' signature)
DEEPSPEED_BUFFER_FACTOR = 1.5
ADAM_BYTES_PER_PARAM = optimizer_state_bytes_per_param("adamw")   # m and v in fp32: 8 B
ESTIMATORS = {2: "estimate_zero2_model_states_mem_needs", 3: "estimate_zero3_model_states_mem_needs"}


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimatorInputs:
    """The arguments DeepSpeed's estimator is called with (parameter counts, not models)."""

    stage: int
    total_params: int
    largest_layer_params: int
    num_gpus_per_node: int
    num_nodes: int
    cpu_offload: bool
    cpu_offload_params: bool
    zero_init: bool = True
    additional_buffer_factor: float = DEEPSPEED_BUFFER_FACTOR

    @property
    def n_gpus(self) -> int:
        return self.num_gpus_per_node * self.num_nodes


@dataclass(frozen=True, kw_only=True, slots=True)
class Figures:
    """Bytes per GPU and bytes of host memory per node."""

    gpu_bytes: int
    cpu_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DeepSpeedCrosscheck:
    estimator: str
    inputs: EstimatorInputs
    deepspeed: Figures
    planner_as_deepspeed: Figures      # the planner's formulas under DeepSpeed's assumptions
    planner_model_state_bytes: int     # the plan's weights + gradients + optimizer states per rank
    planner_buffer_bytes: int          # the plan's communication buffers (ZeRO-3 gathered modules)
    planner_total_bytes: int
    notes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Crosscheck:
    """DeepSpeed's view of a plan, or the reason none was run."""

    deepspeed: DeepSpeedCrosscheck | None
    reason: str | None = None


# ----------------------------------------------------------------- DeepSpeed's side

def deepspeed_figures(inp: EstimatorInputs) -> Figures:
    """Call DeepSpeed's estimator with ``inp``; imports deepspeed (about 2 s)."""
    if inp.stage == 2:
        estimate_zero2_model_states_mem_needs = import_deepspeed(
            "deepspeed.runtime.zero.stage_1_and_2").estimate_zero2_model_states_mem_needs
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total_params=inp.total_params, num_gpus_per_node=inp.num_gpus_per_node,
            num_nodes=inp.num_nodes, cpu_offload=inp.cpu_offload,
            additional_buffer_factor=inp.additional_buffer_factor)
    elif inp.stage == 3:
        estimate_zero3_model_states_mem_needs = import_deepspeed(
            "deepspeed.runtime.zero.stage3").estimate_zero3_model_states_mem_needs
        cpu, gpu, _largest = estimate_zero3_model_states_mem_needs(
            total_params=inp.total_params, largest_layer_params=inp.largest_layer_params,
            num_gpus_per_node=inp.num_gpus_per_node, num_nodes=inp.num_nodes,
            cpu_offload=inp.cpu_offload, cpu_offload_params=inp.cpu_offload_params,
            zero_init=inp.zero_init, additional_buffer_factor=inp.additional_buffer_factor)
    else:
        raise ValueError(f"DeepSpeed's estimators describe ZeRO-2 and ZeRO-3, not ZeRO-{inp.stage}")
    return Figures(gpu_bytes=int(gpu), cpu_bytes=int(cpu))


# ------------------------------------------------------- the planner, DeepSpeed's way

def deepspeed_precision(stage: int) -> Precision:
    """DeepSpeed's bytes per parameter as a Precision: 16-bit weights, an fp32 master
    copy, and gradients of 2 + 4 B (16-bit and fp32) at ZeRO-2 or 4 B (fp32) at ZeRO-3,
    so that with Adam's 8 B the sharded states are the estimators' 18 B."""
    return Precision(name="deepspeed-estimator", weight_bytes=2, grad_bytes=6 if stage == 2 else 4,
                     master_bytes=4, activation_bytes=2, compute_dtype="bf16")


def planner_as_deepspeed(inp: EstimatorInputs, m: ModelSpec) -> Figures:
    """The planner's model-state formulas run under DeepSpeed's assumptions.

    Pure data parallelism over all N GPUs (Layout(dp=N)); memory.model_state_bytes with
    ``deepspeed_precision``; at ZeRO-3 memory.buffer_bytes's gathered current and
    prefetched module (2 x 2 B x the largest layer = DeepSpeed's 4 B x largest layer)
    with no reduce bucket, which DeepSpeed does not count. Offload moves the fp32
    gradients, master copy and moments (and, with parameter offload, the 16-bit weights)
    off the GPU; as in DeepSpeed's estimator, parameter offload counts only together
    with optimizer offload. Host memory per node: the offloaded states of the node's
    ranks; without offload, what each local rank builds in fp32 before partitioning (the
    whole model, or under ZeRO-3's zero.Init one layer at a time), times
    ``additional_buffer_factor``.
    """
    prec = deepspeed_precision(inp.stage)
    lay = Layout(dp=inp.n_gpus, zero_stage=inp.stage)
    a = LayoutArrays.from_layouts([lay])
    no_hybrid = np.zeros(1, dtype=np.int64)
    ms = model_state_bytes(np.array([inp.total_params]), np.zeros(1, dtype=np.int64), prec, ADAM_BYTES_PER_PARAM, a,
                           no_hybrid)
    states = {"weights": int(ms.weights[0]), "gradients": int(ms.gradients[0]), "optimizer": int(ms.optimizer[0])}
    offloaded: set[str] = set()
    if inp.cpu_offload:
        offloaded |= {"gradients", "optimizer"}
        if inp.cpu_offload_params and inp.stage == 3:
            offloaded.add("weights")
    gpu = sum(v for k, v in states.items() if k not in offloaded)
    if inp.stage == 3:
        no_bucket = TrainingSetup(buffers=Buffers(zero_bucket_numel=0))
        one = np.ones(1, dtype=np.int64)
        zero = np.zeros(1, dtype=np.int64)
        rp = ParamsArrays(dense=one * inp.total_params, expert=zero, block_unit=one * inp.largest_layer_params,
                          root_unit=zero, largest_module=one * inp.largest_layer_params)
        split = SplitArrays(trainable_dense=rp.dense, trainable_expert=zero, frozen_dense_bytes=zero,
                            frozen_expert_bytes=zero, block_trainable=rp.block_unit, block_frozen_bytes=zero,
                            largest_trainable=zero, dequant_bytes=zero)
        gpu += int(buffer_bytes(m, no_bucket, a, rp, prec, split)[0])
    if offloaded:
        cpu = inp.num_gpus_per_node * sum(states[k] for k in offloaded)
    elif inp.stage == 3 and inp.zero_init:
        cpu = inp.num_gpus_per_node * inp.largest_layer_params * prec.master_bytes
    else:
        cpu = inp.num_gpus_per_node * inp.total_params * prec.master_bytes
    return Figures(gpu_bytes=gpu, cpu_bytes=int(cpu * inp.additional_buffer_factor))


# ------------------------------------------------------------------- the comparison

def model_largest_layer(m: ModelSpec, r: PlanResult) -> int:
    """The largest unit ZeRO-3 gathers at once in the whole model (no tp split): a
    transformer block or the word embedding (memory.rank_params)."""
    return rank_params(m, r.params, Layout(), 0, m.n_layers).largest_module


def not_described(r: PlanResult) -> str | None:
    """Why DeepSpeed's estimators do not describe the plan, or None when they do."""
    if r.best is None:
        return "no layout fits, so there is no plan to compare"
    lay = r.best.layout
    if lay.is_fsdp:
        return (f"DeepSpeed's estimators describe its ZeRO engine; this plan shards with PyTorch FSDP "
                f"({lay.sharding})")
    if lay.zero_stage not in ESTIMATORS:
        return f"DeepSpeed's estimators describe ZeRO-2 and ZeRO-3; this plan uses ZeRO-{lay.zero_stage}"
    if not r.setup.finetune.is_full:
        return (f"DeepSpeed's estimators size full training (every parameter with its optimizer states); "
                f"this plan fine-tunes with {r.setup.finetune.method}")
    return None


def estimator_inputs(r: PlanResult, offload_optimizer: str = "none", offload_params: str = "none",
                     additional_buffer_factor: float = DEEPSPEED_BUFFER_FACTOR) -> EstimatorInputs:
    from planner.emit import node_shape

    lay = r.best.layout  # type: ignore[union-attr]
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    return EstimatorInputs(
        stage=lay.zero_stage, total_params=r.params.total, largest_layer_params=model_largest_layer(r.model, r),
        num_gpus_per_node=per_node, num_nodes=n_nodes,
        cpu_offload=offload_optimizer != "none", cpu_offload_params=offload_params != "none",
        additional_buffer_factor=additional_buffer_factor)


def _optimizer_bytes(r: PlanResult) -> float:
    """Master copy and optimizer state per parameter, as the memory model counts them
    (memory.params.optimizer_state_bytes)."""
    return r.setup.precision_spec.master_bytes + optimizer_state_bytes(r.model, r.setup)


def plan_model_states(r: PlanResult) -> tuple[int, int]:
    """(weights + gradients + optimizer states, communication buffers) of the plan's most
    loaded rank, as the memory model counts them (states.model_state_bytes and
    buffers.buffer_bytes, read from its terms): the states as they persist through the step,
    whichever moment the rank's peak falls on."""
    mem = r.best.memory  # type: ignore[union-attr]
    terms = mem.terms
    if terms is None:
        lay = r.best.layout  # type: ignore[union-attr]
        terms = per_rank_memory(r.model, r.setup, lay, r.params, r.gpu.gpus_per_node).terms
    assert terms is not None
    states, buffers = terms.get("states.total"), terms.get("buffers")
    assert isinstance(states, int | np.integer) and isinstance(buffers, int | np.integer)
    return int(states), int(buffers)


def difference_notes(r: PlanResult, inp: EstimatorInputs, offload_optimizer: str = "none",
                     offload_params: str = "none") -> tuple[str, ...]:
    """One line per assumption in which DeepSpeed's estimate and the plan differ."""
    lay = r.best.layout  # type: ignore[union-attr]
    mem = r.best.memory  # type: ignore[union-attr]
    p = r.setup.precision_spec
    ds_grad = deepspeed_precision(inp.stage).grad_bytes
    notes = []
    if p.grad_bytes != ds_grad:
        kind = "16-bit and fp32 copies" if inp.stage == 2 else "fp32"
        notes.append(f"gradients: DeepSpeed counts {ds_grad} B per parameter ({kind}); the planner counts "
                     f"{p.grad_bytes} B ({r.setup.precision}, as the ZeRO paper does)")
    opt = _optimizer_bytes(r)
    if abs(opt - 12) > 1e-9:
        notes.append(f"optimizer states: DeepSpeed assumes Adam with an fp32 master copy, 12 B per parameter; "
                     f"the planner counts {opt:.4g} B ({r.setup.optimizer}, {r.setup.precision})")
    if p.weight_bytes != 2:
        notes.append(f"weights: DeepSpeed counts 16-bit weights, 2 B per parameter; the planner counts "
                     f"{p.weight_bytes} B ({r.setup.precision})")
    if lay.dense_shard_degree != inp.n_gpus:
        notes.append(f"sharding: DeepSpeed divides by all {inp.n_gpus} GPUs; the planner shards over the "
                     f"{lay.dense_shard_degree} data-parallel ranks (dp x cp x ep = {lay.dp} x {lay.cp} x {lay.ep})")
    if lay.tp > 1 or lay.pp > 1 or lay.ep > 1:
        rp = rank_params(r.model, r.params, lay, mem.stage, mem.n_layers_on_stage)
        notes.append(f"model parallelism: DeepSpeed ignores tp, pp and ep and counts all {inp.total_params:,} "
                     f"parameters; the planner's most loaded rank holds {rp.total:,} "
                     f"(tp={lay.tp}, pp={lay.pp}, ep={lay.ep})")
    bucket = r.setup.buffers.zero_bucket_numel
    if inp.stage == 3:
        rp = rank_params(r.model, r.params, lay, mem.stage, mem.n_layers_on_stage)
        notes.append(f"gathered weights: DeepSpeed adds 4 B x the largest layer ({inp.largest_layer_params:,} "
                     f"parameters) to its GPU figure; the planner counts the gathered and the prefetched "
                     f"module (2 x {p.weight_bytes} B x {rp.largest_module:,}) and a {bucket:,}-element "
                     f"reduce bucket as communication buffers, beside the model states")
    else:
        notes.append(f"buffers: DeepSpeed counts no communication buffers; the planner counts a "
                     f"{bucket:,}-element gradient reduce bucket as communication buffers")
    if offload_optimizer != "none" or offload_params != "none":
        notes.append("offload: DeepSpeed's GPU figure leaves out the offloaded states; the planner's figures "
                     "do not subtract them yet (ZeRO-Offload sizing is a separate change)")
    if "nvme" in (offload_optimizer, offload_params):
        notes.append("NVMe: DeepSpeed's estimators know CPU offload only, so NVMe offload is estimated as CPU "
                     "offload; the CPU figure is then what NVMe holds")
    if offload_params != "none" and offload_optimizer == "none":
        notes.append("parameter offload alone: DeepSpeed's estimator counts parameter offload only together "
                     "with optimizer offload, so its figures are those without offload")
    if inp.stage == 2 and inp.cpu_offload:
        notes.append("host memory: DeepSpeed's ZeRO-2 offload CPU figure is max(4 x all GPUs, 16) B per "
                     "parameter on each node; the offloaded states of a node's ranks are 18 B x parameters / nodes")
    notes.append(f"host memory: DeepSpeed's CPU figure is per node, times its additional_buffer_factor "
                 f"{inp.additional_buffer_factor:g}; the planner's plan does not size host memory")
    notes.append("DeepSpeed leaves out activations, logits, communication buffers, the CUDA context, NCCL and "
                 "fragmentation, which the planner's total per rank includes")
    return tuple(notes)


def crosscheck(r: PlanResult, offload_optimizer: str = "none", offload_params: str = "none") -> Crosscheck:
    """DeepSpeed's estimate for the plan beside the planner's figures, or why none was run.

    Runs without deepspeed installed: the result then says the cross-check was skipped.
    """
    reason = not_described(r)
    if reason:
        return Crosscheck(deepspeed=None, reason=reason)
    inp = estimator_inputs(r, offload_optimizer, offload_params)
    try:
        ds = deepspeed_figures(inp)
    except ImportError as e:
        return Crosscheck(deepspeed=None, reason=f"deepspeed is not installed ({e.name or e}); the cross-check "
                          f"was skipped (pip install 'planner[deepspeed]')")
    states, buffers = plan_model_states(r)
    return Crosscheck(deepspeed=DeepSpeedCrosscheck(
        estimator=ESTIMATORS[inp.stage], inputs=inp, deepspeed=ds,
        planner_as_deepspeed=planner_as_deepspeed(inp, r.model),
        planner_model_state_bytes=states, planner_buffer_bytes=buffers,
        planner_total_bytes=r.best.memory.total,  # type: ignore[union-attr]
        notes=difference_notes(r, inp, offload_optimizer, offload_params)))


def crosscheck_json(c: Crosscheck | None) -> dict[str, Any]:
    """The ``crosscheck`` object of ``plan --json``."""
    if c is None:
        return {"deepspeed": None, "reason": "not requested (pass --crosscheck)"}
    if c.deepspeed is None:
        return {"deepspeed": None, "reason": c.reason}
    d = c.deepspeed
    return {"deepspeed": {
        "estimator": d.estimator,
        "inputs": asdict(d.inputs),
        "gpu_bytes": d.deepspeed.gpu_bytes,
        "cpu_bytes": d.deepspeed.cpu_bytes,
        "planner_model_state_bytes": d.planner_model_state_bytes,
        "planner_buffer_bytes": d.planner_buffer_bytes,
        "planner_total_bytes": d.planner_total_bytes,
        "planner_as_deepspeed": {"gpu_bytes": d.planner_as_deepspeed.gpu_bytes,
                                 "cpu_bytes": d.planner_as_deepspeed.cpu_bytes,
                                 "agrees": d.planner_as_deepspeed == d.deepspeed},
        "notes": list(d.notes),
    }}
