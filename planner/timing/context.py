"""What a batch's step times read of its layouts alone, on any GPUs (timing.fast): the
groups, the kinds of data-parallel step, the settings the batch shares, and each layout's
sequences per step, FLOPs and GPUs. Several GPU types of one count time the same layouts from
one LayoutContext (search.sweep, issue 32)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from planner.layouts.batch import RECOMPUTES, LayoutArrays, Unsupported
from planner.layouts.groups import LayoutGroups
from planner.layouts.groups import rows as _rows
from planner.models.spec import ModelSpec, ParamCount, count_params
from planner.timing.degrees import EXACT_INT, distinct_rows
from planner.timing.dp_overlap import DpKinds
from planner.timing.flops import flops_per_step
from planner.training.images import image_flops_per_sequence
from planner.training.setup import TrainingSetup


def batch_etp(a: LayoutArrays) -> int:
    """The expert tensor-parallel setting the batch shares (Layout.etp: 0, equal to tp, or a
    size the search holds fixed, SearchSpace.etp); the block and degree tables are built per
    setting. Raises Unsupported for a batch that mixes settings."""
    if a.etp is None or not len(a) or not a.etp.any():
        return 0
    first = int(a.etp[0])
    if (a.etp != first).any():
        raise Unsupported("layouts with different expert tensor-parallel sizes in one batch")
    return first


def batch_instances(a: LayoutArrays) -> int:
    """The distributed-optimizer instances the batch shares (Layout.optimizer_instances, fixed by
    the search: SearchSpace.optimizer_instances). Raises Unsupported for a batch that mixes them."""
    inst = a.instances
    if not len(inst):
        return 1
    if (inst != inst[0]).any():
        raise Unsupported("layouts with different distributed-optimizer instances in one batch")
    return int(inst[0])


def batch_fold(a: LayoutArrays) -> int:
    """Whether the batch's ep is folded over tp x cp x dp (Layout.ep_fold): 0 or 1 for every
    layout alike (a folded layout is evaluated as given, never searched beside others).
    Raises Unsupported for a batch that mixes them."""
    if a.ep_fold is None or not len(a) or not a.ep_fold.any():
        return 0
    if not a.ep_fold.all():
        raise Unsupported("folded and unfolded expert parallelism in one batch")
    return 1


class LayoutContext(NamedTuple):
    """What a batch's step times read of its layouts alone, on any GPUs (layout_context()): its
    groups and kinds of data-parallel step, the expert tensor-parallel setting, folding and
    optimizer instances it shares, and per layout its sequences per step, (model, hardware)
    FLOPs and GPUs. Several GPU types of one count time the same layouts from one context
    (search.sweep, issue 32)."""

    m: ModelSpec
    setup: TrainingSetup
    a: LayoutArrays
    pc: ParamCount
    g: LayoutGroups
    kinds: DpKinds
    etp: int
    fold: int
    instances: int
    n_seq: np.ndarray
    flops: np.ndarray
    n_gpus: np.ndarray


def layout_context(m: ModelSpec, setup: TrainingSetup, a: LayoutArrays, pc: ParamCount | None = None,
                   groups: LayoutGroups | None = None) -> LayoutContext:
    """The LayoutContext of the layouts of ``a``. Raises Unsupported as step_times_s()."""
    pc = pc or count_params(m)
    if pc.total * 8 >= EXACT_INT:
        raise Unsupported("parameter bytes too large for exact float conversion")
    g = groups or LayoutGroups.of(a)
    n_seq = a.micro_batch * a.grad_accum * a.data_parallel
    flops = distinct_rows([n_seq, a.recompute], _rows(2, np.float64, "flops", m, setup.seq_len, setup.finetune,
                                                           setup.recomputed_share, setup.mtp_layers,
                                                           setup.images_per_sample),
                           lambda n_, rc_: _flops_row(m, setup.seq_len, n_, rc_, setup))
    return LayoutContext(m, setup, a, pc, g, DpKinds.of(g.pair, g.p_inv, len(g.p_d)), batch_etp(a), batch_fold(a),
                         batch_instances(a), n_seq, flops, a.n_gpus)


def _flops_row(m: ModelSpec, seq_len: int, n_sequences: int, recompute: int, setup: TrainingSetup
               ) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one step of ``n_sequences`` sequences under recomputation mode
    ``recompute`` (an index of RECOMPUTES): timing.flops.flops_per_step plus the images' (training.images), one row of
    layout_context's distinct rows."""
    f = flops_per_step(m, seq_len, n_sequences, RECOMPUTES[recompute], setup.finetune, setup.recomputed_share,
                       setup.mtp_layers)
    image = n_sequences * sum(image_flops_per_sequence(m, setup.finetune, setup.images_per_sample))
    return f.model_flops + image, f.hardware_flops + image
