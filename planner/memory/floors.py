"""Lower bounds on a layout's peak memory, from its degrees and sharding alone: what the
search and the sweep use to drop GPU counts and layout shapes without sizing them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout
from planner.memory.activations import (
    activation_key,
    block_activations,
)
from planner.memory.params import (
    optimizer_state_bytes,
    rank_params,
    stage_layers,
    stages_to_check,
)
from planner.memory.shapes import in_flight_microbatches
from planner.memory.states import expert_padding, model_state_bytes
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.training.finetune import FinetuneSpec, activation_layers, frozen_vision_params
from planner.training.kernels import layout_kernels
from planner.training.setup import TrainingSetup


def min_model_state_bytes_per_param(setup: TrainingSetup) -> float:
    """The fewest bytes per parameter that weights, gradients and optimizer states take
    summed over all ranks, under any sharding: each state exists at least once. What is
    offloaded leaves the GPUs; a frozen base (LoRA, QLoRA, freeze) keeps only its weights,
    quantized or in 16 bits, a lower bound that ignores the adapters."""
    p = setup.precision_spec
    if setup.offload_params != "none":
        return 0.0
    ft = setup.finetune
    if not ft.is_full:
        return {"nf4": 0.5, "int4": 0.5, "int8": 1.0}.get(ft.quant, float(p.weight_bytes))
    opt = optimizer_state_bytes(None, setup)       # no model here: Adafactor's lower bound, 0
    if setup.offload_optimizer != "none":
        return float(p.weight_bytes)
    zero = p.weight_bytes + p.grad_bytes + p.master_bytes + opt
    fsdp = (8 if p.is_mixed else p.weight_bytes + p.grad_bytes) + opt
    return min(zero, fsdp)


def activation_floor_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """A lower bound on per_rank_memory(m, setup, lay).total whatever the sharding: at the
    start of backward a stage holds its blocks' activations for every in-flight
    micro-batch, and the overhead adds the fixed costs and fragmentation on at least those
    bytes. A search can drop a layout shape whose floor exceeds the GPU without sizing it."""
    return overhead_floor_bytes(setup, lay, held_activation_floor_bytes(m, setup, lay))


def overhead_floor_bytes(setup: TrainingSetup, lay: Layout, tracked_bytes: int) -> int:
    """The total per_rank_memory() reports when the tracked tensors come to at least
    ``tracked_bytes``: fixed costs plus fragmentation on top."""
    return tracked_bytes + setup.overheads.untracked_bytes(tracked_bytes, lay.n_gpus > 1)


def held_activation_floor_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """The block activations the most loaded stage holds at the start of backward (the
    largest over the stages per_rank_memory checks), a part of its tracked bytes then."""
    ft = setup.finetune
    kernels = layout_kernels(setup, lay)
    if kernels == "amp" and not ft.is_full:
        kernels = "eager"
    layer_act, _ = block_activations(m, setup, activation_key(lay), kernels)
    balance, mtp = setup.pp_balance, setup.mtp_layers
    counts = stage_layers(m.n_layers, lay.pp, balance, mtp)
    return max(int(n_act * layer_act * float(in_flight_microbatches(
        lay, s, m.n_layers, balance, np.int64(counts[s]), setup.pp_microbatch_group, mtp)))  # type: ignore[arg-type]
        for s, n_act in _activation_stages(m.n_layers, lay.pp, ft, balance, mtp))


@lru_cache(maxsize=1024)
def _activation_stages(n_layers: int, pp: int, ft: FinetuneSpec, balance: str = "none", mtp: int = 0
                       ) -> tuple[tuple[int, int], ...]:
    """(stage, blocks that keep activations) of the stages per_rank_memory checks."""
    counts = stage_layers(n_layers, pp, balance, mtp)
    return tuple((s, activation_layers(ft, n_layers, sum(counts[:s]), counts[s])) for s in stages_to_check(counts))


@dataclass(frozen=True, kw_only=True, slots=True)
class StateFloor:
    """Lower bounds on the model states a rank of a layout holds, read from its degrees and
    sharding alone (bytes): at the optimizer step (weights, gradients and optimizer states
    of the most loaded stage), and at the start of backward on whichever stage peaks there
    (weights and optimizer states; the gradients, held then when they persist)."""

    at_step: int
    weights_and_optimizer: int = 0
    gradients: int = 0
    fsdp: bool = False           # the sharding is FSDP's (gradients persist under DDP/ZeRO only)

    def tracked_floor_bytes(self, lay: Layout, held_activations: int) -> int:
        """Tracked bytes at the peak of a layout with ``lay``'s degrees, micro-batches and this
        floor's sharding (``lay``'s own sharding is not read) are at least this."""
        persistent = lay.grad_accum > 1 or lay.pp > 1 or (not self.fsdp and lay.dense_shard_degree > 1)
        start = held_activations + self.weights_and_optimizer + (self.gradients if persistent else 0)
        return max(self.at_step, start)


def model_state_floor(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount | None = None,
                      gpus_per_node: int = 8) -> StateFloor:
    """StateFloor of ``lay`` (model_state_floors of one layout)."""
    return model_state_floors(m, setup, [lay], pc, gpus_per_node)[0]


def model_state_floors(m: ModelSpec, setup: TrainingSetup, lays: list[Layout], pc: ParamCount | None = None,
                       gpus_per_node: int = 8) -> list[StateFloor]:
    """StateFloor of each of ``lays``, which share their degrees (the sweep asks for every
    sharding of one shape), sized as one batch. For full training without offload or
    autocast the states are states.model_state_bytes() of each stage's parameters, as the
    model counts them; otherwise each state exists at least once over the ranks that share
    the rank's parameters (min_model_state_bytes_per_param), which bounds the optimizer step
    only. A floor reads the degrees and the sharding only: kept per distinct ones."""
    keys = tuple(Layout(dp=x.dp, tp=x.tp, pp=x.pp, cp=x.cp, ep=x.ep, zero_stage=x.zero_stage, sharding=x.sharding,
                        ep_fold=x.ep_fold) for x in lays)
    return list(_model_state_floors(m, setup, keys, pc or count_params(m), gpus_per_node))


@lru_cache(maxsize=8192)
def _model_state_floors(m: ModelSpec, setup: TrainingSetup, lays: tuple[Layout, ...], pc: ParamCount,
                        gpus_per_node: int) -> tuple[StateFloor, ...]:
    out: list[StateFloor | None] = [None] * len(lays)
    plain_rows = []
    frozen_vision = frozen_vision_params(m, setup.finetune)

    def frozen_off(stage: int) -> int:
        """A frozen image side's parameters, left out of the first stage's floor (its weights
        alone would be a lower bound; leaving them out keeps one, looser)."""
        return frozen_vision if stage == 0 else 0

    offload = setup.offload_optimizer != "none" or setup.offload_params != "none"
    for i, lay in enumerate(lays):
        if setup.finetune.is_full and not offload and layout_kernels(setup, lay) != "amp":
            plain_rows.append(i)
            continue
        per_param = min_model_state_bytes_per_param(setup)
        counts = stage_layers(m.n_layers, lay.pp, setup.pp_balance, setup.mtp_layers)
        rps = [(s, rank_params(m, pc, lay, s, counts[s])) for s in stages_to_check(counts)]
        out[i] = StateFloor(at_step=max(int((rp.dense - frozen_off(s)) * per_param / lay.dense_shard_degree
                                            + rp.expert * per_param / lay.expert_shard_degree) for s, rp in rps),
                            fsdp=lay.is_fsdp)
    if plain_rows:
        opt_pp = optimizer_state_bytes(m, setup)
        plain = [lays[i] for i in plain_rows]
        a = LayoutArrays.from_layouts(plain)
        hybrid = a.hybrid_shard(gpus_per_node)
        # (slot, layout): the parameters of each stage that can be the most loaded
        stage_params = []
        for lay in plain:
            counts = stage_layers(m.n_layers, lay.pp, setup.pp_balance, setup.mtp_layers)
            stage_params.append([(s, rank_params(m, pc, lay, s, counts[s])) for s in stages_to_check(counts)])
        n_slots = max(len(p) for p in stage_params)
        dense = np.zeros((n_slots, len(plain)), dtype=np.int64)
        expert = np.zeros((n_slots, len(plain)), dtype=np.int64)
        valid = np.zeros((n_slots, len(plain)), dtype=bool)
        for j, rps in enumerate(stage_params):
            for k, (s, rp) in enumerate(rps):
                dense[k, j], expert[k, j], valid[k, j] = rp.dense - frozen_off(s), rp.expert, True
        ms = model_state_bytes(dense, expert, setup.precision_spec, opt_pp, a, hybrid,
                               expert_padding=expert_padding(m, a, hybrid))
        big = np.iinfo(np.int64).max
        at_step = np.where(valid, ms.total, -1).max(axis=0)
        w_o = np.where(valid, ms.weights + ms.unsharded_weights + ms.optimizer, big).min(axis=0)
        grads = np.where(valid, ms.gradients, big).min(axis=0)
        for j, i in enumerate(plain_rows):
            out[i] = StateFloor(at_step=int(at_step[j]), weights_and_optimizer=int(w_o[j]), gradients=int(grads[j]),
                                fsdp=lays[i].is_fsdp)
    return tuple(x for x in out if x is not None)


def memory_floor_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, pc: ParamCount | None = None,
                       gpus_per_node: int = 8) -> int:
    """A lower bound on per_rank_memory(m, setup, lay, pc, gpus_per_node).total from the
    model states (model_state_floor) and the held activations, without the phases,
    buffers, logits and temporaries."""
    floor = model_state_floor(m, setup, lay, pc, gpus_per_node)
    return overhead_floor_bytes(setup, lay, floor.tracked_floor_bytes(lay, held_activation_floor_bytes(m, setup, lay)))
