"""What the data-parallel part of a step (timing.fast) reads per distinct shape: the parameters a
rank trains and the frozen bytes it gathers (trained_split), the HBM bytes of the optimizer
update per trainable parameter, and the links of distributed-optimizer instances
(instance_links)."""

from __future__ import annotations

from functools import lru_cache

from planner.hardware.axes import AxisSizes
from planner.hardware.placement import AxisLink, Cluster, axis_links
from planner.layouts.layout import Layout
from planner.memory.model import rank_params, stage_layers
from planner.memory.params import optimizer_state_bytes, with_mtp_params
from planner.models.spec import ModelSpec, ParamCount
from planner.timing.kernels import backward_layers
from planner.training.finetune import (
    FinetuneSpec,
    RankSplit,
    rank_split,
)
from planner.training.setup import Precision, TrainingSetup


@lru_cache(maxsize=4096)
def _rank_split(m: ModelSpec, pc: ParamCount, ft: FinetuneSpec, tp: int, ep: int, pp: int, stage: int,
                n_layers: int, weight_bytes: int, etp: int = 0, balance: str = "none", mtp: int = 0) -> RankSplit:
    lay = Layout(tp=tp, ep=ep, pp=pp, etp=etp)
    # the last stage's MTP modules train too: their blocks and own parameters, as memory counts them
    # (memory.shapes; with_mtp_params), reduced and updated with the stage's
    held = mtp if stage == pp - 1 else 0
    rp = with_mtp_params(m, rank_params(m, pc, lay, stage, n_layers + held), tp, held)
    first = sum(stage_layers(m.n_layers, pp, balance, mtp)[:stage])
    return rank_split(m, pc, ft, lay, rp.dense, rp.expert, rp.root_unit, n_layers + held,
                      backward_layers(ft, m.n_layers, first, n_layers + held), stage == pp - 1, weight_bytes, 0,
                      first_stage=stage == 0)


def trained_split(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, lay: Layout, stage: int,
                  n_layers: int) -> RankSplit:
    """The parameters of one rank of ``stage`` split into those that train and the frozen
    base (finetune.rank_split, as memory.per_rank_memory splits them): the data-parallel
    gradient reductions and the optimizer update cover the trainable ones; ZeRO-3/FSDP
    gathers the frozen base too, at its stored bytes (4-bit under QLoRA). Full training:
    every parameter trains, nothing is frozen."""
    return degrees_split(m, pc, setup, lay.tp, lay.ep, lay.pp, lay.etp, stage, n_layers)


def degrees_split(m: ModelSpec, pc: ParamCount, setup: TrainingSetup, tp: int, ep: int, pp: int, etp: int,
                  stage: int, n_layers: int) -> RankSplit:
    """trained_split() of a layout of these degrees, the only fields it reads (the step time's
    per-degree tables ask it per (tp, ep, pp) row without building a Layout for it)."""
    return _rank_split(m, pc, setup.finetune, tp, ep, pp, stage, n_layers, setup.precision_spec.weight_bytes, etp,
                       setup.pp_balance, setup.mtp_layers)


def optimizer_update_bytes_per_param(m: ModelSpec, setup: TrainingSetup) -> float:
    """HBM bytes the optimizer update moves per trainable parameter (the update is memory
    bound: timing.fast divides these bytes on the rank's shard by the HBM rate): it reads and writes
    the fp32 master copy and the optimizer states, reads the gradient and writes the
    16-bit weight (AdamW mixed precision: 2 x (4 + 8) + 2 + 2 = 28 bytes). The states are
    the ones the memory model holds (memory.params.optimizer_state_bytes: an override, paged
    8-bit AdamW, Adafactor's factored moment from the model's shapes). QLoRA's 16-bit
    adapters keep no master copy and its paged 8-bit AdamW two int8 states (Dettmers et al.
    2023, arXiv:2305.14314, Sec. 3), as memory.per_rank_memory counts them:
    2 x (2 + 8/2048) + 2 + 2 = 8.0 bytes."""
    ft = setup.finetune
    prec = setup.precision_spec
    if ft.has_16_bit_adapters:
        prec = Precision.named("bf16")
    state = prec.master_bytes + optimizer_state_bytes(m, setup)
    return 2 * state + prec.grad_bytes + prec.weight_bytes



@lru_cache(maxsize=4096)
def instance_links(cluster: Cluster, tp: int, instance_ranks: int, instances: int) -> tuple[AxisLink, AxisLink]:
    """(the ring inside one distributed-optimizer instance, the ring across the instances) for
    ``instances`` instances of ``instance_ranks`` data-parallel ranks each (Layout.hybrid_shard):
    the one place the step time reads the HSDP groups of megatron-core's
    num_distributed_optimizer_instances. megatron-core 0.16.1 parallel_state.py lines 878-895 cuts
    each data-parallel (x cp) group's rank list into consecutive instances and joins the ranks at
    the same place of each into an inter-instance group; with tp innermost (the default order
    tp-cp-ep-dp-pp) an instance is ``instance_ranks`` ranks at stride tp and the ranks across
    instances are at stride tp x instance_ranks: the dp and pp axes of a grid (tp, 1, 1,
    instance_ranks, instances) placed in that order (placement.axis_links; the grid leaves out
    the pipeline stages, which run the same groups side by side)."""
    links = axis_links(cluster, AxisSizes(tp=tp, dp=instance_ranks, pp=instances))
    return links["dp"], links["pp"]
