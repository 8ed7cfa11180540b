"""The step-time tables worked out over arrays (issue 32's ninth pass): the link tables of many
degree tuples at once (placement.axis_link_table, all_to_all_table, degrees.layout_link_table)
and the block rows of many block shapes at once (layer.layer_time_table, kernels.block_compute_s)
give each column exactly what that column asked alone gives, whatever else is in the batch:
the grouping of distinct strides and shapes, the fall-back to the GpuSpec's links where the
topology is too small, and the masks of each branch must keep every column apart.

The referee is the one-column call, which the scalar functions (axis_links, all_to_all_link,
layout_links, layer_time) make; that each of those gives the model's figures is what the other
timing tests check (test_timing.py, test_all_to_all_link.py, test_ep_fold.py and the rest). The
batches were also compared bit for bit with the per-tuple and per-shape code they replace
(every `--json` answer of the ninth pass's commands, and 35,100 layer_time results)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from planner.hardware.axes import AXES
from planner.hardware.gpus import get_gpu
from planner.hardware.placement import Cluster, all_to_all_table, axis_link_table, cluster_for
from planner.layouts.batch import RECOMPUTES
from planner.layouts.groups import Rows
from planner.layouts.layout import Layout
from planner.models.load import load_model
from planner.timing.degrees import layout_link_table
from planner.timing.efficiency import DEFAULT_EFFICIENCY
from planner.timing.layer import LAYER_TIME_FIELDS, layer_time_table
from planner.training.finetune import FinetuneSpec
from planner.training.setup import TrainingSetup

ORDERS = [AXES, ("tp", "cp", "ep", "pp", "dp")]


def _degrees(n: int, seed: int) -> np.ndarray:
    """n degree tuples (tp, cp, ep, dp, pp), some of them past the topology's nodes (1,024-way dp)."""
    rng = random.Random(seed)
    sizes = [1, 1, 2, 4, 8, 16, 3, 6, 64, 1024]
    return np.array([[rng.choice(sizes) for _ in range(5)] for _ in range(n)], dtype=np.int64).T


CLUSTERS = {
    "dgx-h100": lambda: cluster_for(get_gpu("h100")),
    "gb200-nvl72": lambda: cluster_for(get_gpu("gb200")),
    "h100-pcie-8x": lambda: cluster_for(get_gpu("h100-pcie")),
    "gh200-quad (mesh)": lambda: cluster_for(get_gpu("gh200")),
    "no topology": lambda: Cluster(gpu=get_gpu("h100"), topology=None),
}


@pytest.mark.parametrize("name", sorted(CLUSTERS))
def test_each_column_of_a_link_table_is_its_tuple_alone(name):
    cluster = CLUSTERS[name]()
    sizes = _degrees(60, seed=len(name))
    for order in ORDERS:
        rings, a2a = axis_link_table(cluster, sizes, order), all_to_all_table(cluster, sizes, order, (8, 8, 4))
        for i in range(sizes.shape[1]):
            col = sizes[:, i:i + 1]
            assert rings[:, i].tolist() == axis_link_table(cluster, col, order)[:, 0].tolist()
            assert a2a[:, i].tolist() == all_to_all_table(cluster, col, order, (8, 8, 4))[:, 0].tolist()


@pytest.mark.parametrize("etp, ep_fold", [(0, 0), (1, 0), (1, 1)])
def test_each_column_of_a_layout_link_table_is_its_layout_alone(etp, ep_fold):
    cluster = cluster_for(get_gpu("h100"))
    sizes = _degrees(40, seed=7 + etp + ep_fold)
    tp, cp, ep, dp, _ = sizes
    # folded, ep divides tp x cp x dp (layouts.rules: "ep-fold-divides"): keep those columns only
    sizes = sizes[:, (tp * cp * dp) % ep == 0] if ep_fold else sizes
    table = layout_link_table(cluster, sizes, AXES, etp, ep_fold)
    for i in range(sizes.shape[1]):
        alone = layout_link_table(cluster, sizes[:, i:i + 1], AXES, etp, ep_fold)[:, 0]
        assert table[:, i].tolist() == alone.tolist()


SETUPS = {
    "full": TrainingSetup(seq_len=2048),
    "lora": TrainingSetup(seq_len=2048, finetune=FinetuneSpec.named("lora", rank=16)),
    "qlora": TrainingSetup(seq_len=2048, finetune=FinetuneSpec.named("qlora", rank=16)),
    "fp8": TrainingSetup(seq_len=2048, precision="fp8"),
    "torchtitan": TrainingSetup(seq_len=2048, stack="torchtitan"),
    "eager": TrainingSetup(seq_len=2048, attention="eager"),
}


@pytest.mark.parametrize("model, setup", [("llama3.1-8b", s) for s in SETUPS] + [("mixtral-8x7b", "full"),
                                                                                ("deepseek-v3", "fp8"),
                                                                                ("gemma3-27b", "full")])
def test_each_column_of_a_block_table_is_its_shape_alone(model, setup):
    """A batch of block shapes with repeats, under every recomputation: each column is the
    shape's layer_time_table alone, and layer_time's fields are that column."""
    from planner.timing.layer import layer_time

    m, s, gpu = load_model(model), SETUPS[setup], get_gpu("h100")
    shapes = [(tp, sp, cp, ep, mb, rc) for tp, cp, ep, mb, rc in itertools.product(
        (1, 2, 8), (1, 2), (1, 8) if m.is_moe else (1,), (1, 2), range(len(RECOMPUTES))) for sp in (0, 1)
        if tp > 1 or not sp]
    shapes = shapes + shapes[::3]                        # repeats
    cols = [np.array(c, dtype=np.int64) for c in zip(*shapes)]
    for kernels in ("fused", "eager", "torchtitan"):
        table = layer_time_table(m, s, kernels, gpu, DEFAULT_EFFICIENCY, s.seq_len, 0, *cols)
        for i, (tp, sp, cp, ep, mb, rc) in enumerate(shapes):
            alone = layer_time_table(m, s, kernels, gpu, DEFAULT_EFFICIENCY, s.seq_len, 0,
                                     *(c[i:i + 1] for c in cols))[:, 0]
            assert table[:, i].tolist() == alone.tolist()
            key = Layout(tp=tp, sp=bool(sp), cp=cp, ep=ep, micro_batch=mb, seq_len=s.seq_len,
                         recompute=RECOMPUTES[rc])
            lt = layer_time(m, s, key, kernels, gpu, DEFAULT_EFFICIENCY)
            assert [float(getattr(lt, f)) for f in LAYER_TIME_FIELDS] == alone.tolist()


def test_rows_number_new_keys_in_order_either_way():
    """groups.Rows numbers new keys in the order they first occur, whether one function call per
    key (fn) or one for all of them (many) works out their rows."""
    keys = [(3, 1), (1, 2), (3, 1), (2, 2), (1, 2), (5, 0)]
    one, many = Rows(2, np.float64), Rows(2, np.float64)
    ids_one = one.ids(keys, lambda a, b: (a * 10.0, b / 3))
    ids_many = many.ids(keys, many=lambda new: np.stack([new[0] * 10.0, new[1] / 3]).T)
    assert ids_one.tolist() == ids_many.tolist() == [0, 1, 0, 2, 1, 3]
    assert one.table.tolist() == many.table.tolist()
    more = [(2, 2), (7, 7)]
    assert one.ids(more, lambda a, b: (a * 10.0, b / 3)).tolist() == many.ids(
        more, many=lambda new: np.stack([new[0] * 10.0, new[1] / 3]).T).tolist() == [2, 4]


def test_spread_keeps_a_bounded_number_of_last_answers():
    """groups.Rows.spread: each element's row is fn of its columns (computed here element by
    element), whether the answer is fresh or a table's kept last one; and only
    groups.SPREAD_HOLDERS tables keep one, however many are asked (each answer is a batch's size)."""
    from planner.layouts import groups

    rng = np.random.default_rng(7)
    tables = [Rows(2, np.int64) for _ in range(3 * groups.SPREAD_HOLDERS)]
    for i, t in enumerate(tables):
        cols = [rng.integers(0, 5, 300), rng.integers(1, 4, 300)]
        for _ in range(2):      # the second ask: the kept answer
            out = t.spread(cols, lambda a, b, i=i: (a * b + i, a - b))
            assert out.tolist() == [[int(a * b + i) for a, b in zip(*cols)], [int(a - b) for a, b in zip(*cols)]]
            assert not out.flags.writeable
    assert sum(t.last_spread is not None for t in tables) == groups.SPREAD_HOLDERS
    assert all(t.last_spread is not None for t in tables[-groups.SPREAD_HOLDERS:])   # the most recently asked
