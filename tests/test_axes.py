"""One object for the parallel layout (issue 31): the axes listed once (layouts.layout.AXES),
each derived group one function that Layout and LayoutArrays both evaluate, and the options'
--ep/--etp checks read from the rules table.

Referees: megatron-core 0.16.1's parallel_state.initialize_model_parallel (run on CPU with
torch.distributed's group calls stubbed, tests/megatron_groups.py) for the group sizes;
click's own parse of `plan` for the options; Megatron-LM's argument parser (tests/megatron_args.py,
a cited copy of megatron/training/arguments.py) for the Megatron arguments.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import require
from megatron_groups import GROUP_STUBS

from planner.cli.main import cli
from planner.hardware.axes import AXES as PLACEMENT_AXES
from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import AXES, AXIS_NAMES, Layout, SearchSpace, ep_folds, reject_reason
from planner.layouts.rules import RULES, option_refusal
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

# (world, tp, pp, cp, ep, etp): unfolded (ep divides world / (tp pp cp)) and folded shapes
SHAPES = [(8, 1, 1, 1, 1, 1), (64, 8, 1, 1, 8, 8), (64, 8, 1, 1, 8, 1), (32, 2, 1, 2, 4, 2), (64, 2, 2, 2, 2, 1),
          (128, 4, 4, 2, 2, 4), (64, 2, 1, 1, 64, 1), (16, 4, 1, 1, 8, 1), (64, 2, 2, 2, 16, 1),
          (32, 4, 1, 1, 16, 2)]

_SCRIPT = GROUP_STUBS + r'''
out = []
for w, tp, pp, cp, ep, etp in json.loads(sys.argv[1]):
    world[0] = w
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 context_parallel_size=cp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=etp)
    out.append({"dp": ps.get_data_parallel_world_size(),
                "dp_cp": ps.get_data_parallel_world_size(with_context_parallel=True),
                "edp": ps.get_expert_data_parallel_world_size(),
                "etp": ps.get_expert_tensor_parallel_world_size(),
                "mp": ps.get_tensor_model_parallel_world_size() * ps.get_pipeline_model_parallel_world_size()
                      * ps.get_context_parallel_world_size()})
print(json.dumps(out))
'''


def _layout(world: int, tp: int, pp: int, cp: int, ep: int, etp: int) -> Layout:
    """The planner's layout of a Megatron-Core shape: dp counts the replicas beside ep, or is
    Megatron's data-parallel size where ep folds (Layout.ep_fold)."""
    fold = ep_folds(world, tp, pp, cp, ep)
    dp = world // (tp * pp * cp) if fold else world // (tp * pp * cp * ep)
    return Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, ep_fold=fold)


@pytest.mark.referee
@pytest.mark.slow
def test_derived_groups_are_megatron_cores_for_a_layout_and_its_batch():
    require("megatron.core")
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(SHAPES)], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    groups = json.loads(done.stdout.strip().splitlines()[-1])
    lays = [_layout(*s) for s in SHAPES]
    a = LayoutArrays.from_layouts(lays)
    for i, (shape, lay, g) in enumerate(zip(SHAPES, lays, groups)):
        got = {"dp": lay.data_parallel, "dp_cp": lay.dense_shard_degree, "edp": lay.expert_shard_degree,
               "etp": lay.expert_tp, "mp": lay.model_parallel}
        assert got == g, shape
        assert lay.n_gpus == shape[0]
        # the batched twin evaluates the same functions
        batch = {"dp": a.data_parallel[i], "dp_cp": a.dense_shard_degree[i], "edp": a.expert_shard_degree[i],
                 "etp": a.expert_tp[i], "mp": a.model_parallel[i]}
        assert {k: int(v) for k, v in batch.items()} == g, shape
        assert int(a.n_gpus[i]) == shape[0]


def test_hsdp_shard_and_replicas_are_one_rule_for_a_layout_and_its_batch():
    # PyTorch HYBRID_SHARD: shard inside a node, replicate across; 8 GPUs a node, tp 2 leaves 4
    lays = [Layout(dp=d, tp=t, sharding="fsdp-hybrid", zero_stage=3) for d in (2, 4, 8, 16, 12) for t in (1, 2)]
    lays.append(Layout(dp=16, zero_stage=3, sharding="fsdp-full"))
    a = LayoutArrays.from_layouts(lays)
    shards = a.hybrid_shard(8)
    assert [lay.hybrid_shard(8) for lay in lays] == shards.tolist()
    assert shards.tolist()[-1] == 0          # not hybrid
    assert lays[6].hybrid_shard(8) == 8 and lays[7].hybrid_shard(8) == 4    # dp 16: a node, or tp 2 of it
    assert lays[8].hybrid_shard(8) == 6 and lays[9].hybrid_shard(8) == 4    # dp 12: 6 of 8, or 4 beside tp 2
    assert [lay.hybrid_replicate(8) for lay in lays] == a.hybrid_replicate(8).tolist()
    assert lays[6].hybrid_replicate(8) == 2 and lays[9].hybrid_replicate(8) == 3 and lays[-1].hybrid_replicate(8) == 1


def test_the_axes_are_the_fields_the_options_and_the_placement_order():
    assert AXIS_NAMES == ("dp", "tp", "pp", "cp", "ep")
    for cls in (Layout, SearchSpace, LayoutArrays):
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(AXIS_NAMES) <= names, cls
    assert set(PLACEMENT_AXES) == set(AXIS_NAMES)
    options = {o for p in cli.params for o in getattr(p, "opts", ())}      # `plan`'s own options, as click has them
    assert {a.flag for a in AXES} <= options


def test_the_megatron_arguments_of_the_axes_are_megatron_lms():
    from megatron_args import ARGUMENTS

    assert {a.megatron for a in AXES if a.megatron is not None} <= set(ARGUMENTS)


def test_the_option_checks_are_the_rules_the_layouts_are_held_to():
    dense, moe = load_model("llama3-8b"), load_model("mixtral-8x7b")
    setup = TrainingSetup(seq_len=4096, global_batch=64)
    # every rule the options are checked against before a search refuses the layout of those options too
    for m, tp, ep, etp in ((dense, 2, 2, None), (dense, 2, None, 2), (dense, None, None, 4), (moe, 8, 8, 3),
                           (moe, 4, 8, 8)):
        why = option_refusal(m, tp, ep, etp)
        assert why is not None
        lay = Layout(tp=tp or etp or 1, ep=ep or 1, etp=etp or 0, dp=1, seq_len=4096, grad_accum=64)
        assert reject_reason(m, setup, lay, 8) is not None
    assert option_refusal(moe, 8, 8, 2) is None and option_refusal(moe, None, 8, 2) is None
    assert option_refusal(dense, 8, None, None) is None
    assert [r.name for r in RULES if r.option_message is not None] == [
        "generic-layouts", "ep-dense", "etp-dense", "etp-divides-tp"]


def test_expert_options_on_the_generic_path_name_the_path_not_a_dense_model():
    # the generic path's spec holds no expert count: an MoE family planned there (DeepSeek-V4 in
    # transformers 5.24) was refused --ep as "dense"; the generic path's rule comes first
    generic = load_model("olmo3-7b")          # a shipped profile: no torch
    assert generic.is_generic
    for tp, ep, etp in ((None, 2, None), (None, None, 1), (2, None, None), (None, 8, 2)):
        why = option_refusal(generic, tp, ep, etp)
        assert why is not None and "generic path" in why and "dense" not in why and "--ep" in why, why


def test_etp_on_a_dense_model_is_refused_by_the_api_as_by_the_cli():
    """Bug: with etp equal to tp, a dense model's layout passed the rules (the API planned it)
    while `plan --etp` refused it; the rule now refuses any etp on a dense model."""
    m = load_model("llama3-8b")
    lay = Layout(dp=4, tp=2, etp=2, seq_len=4096, grad_accum=16)
    assert "needs a mixture-of-experts model" in (reject_reason(m, TrainingSetup(seq_len=4096, global_batch=64),
                                                                lay, 8) or "")
    res = CliRunner().invoke(cli, ["--model", "llama3-8b", "--gpus", "h100", "--tp", "2", "--etp", "2"],
                             prog_name="plan")
    assert res.exit_code == 2 and "--etp 2 needs a mixture-of-experts model" in res.output


def test_the_layout_strings_name_every_axis_of_the_tuple():
    lay = Layout(dp=2, tp=4, pp=2, cp=2, ep=4, sp=True, vp=2, etp=2)
    assert [name for name, _, _ in lay.shown_degrees()] == ["dp", "tp", "pp", "vp", "cp", "ep", "etp"]
    assert lay.key.startswith("dp2_tp4_sp_pp2_vp2_cp2_ep4_etp2_")
    assert np.all([f"{a}=" in lay.describe() for a in AXIS_NAMES])


def test_expert_adapters_split_as_the_experts_they_adapt():
    """Bug: LoRA adapters on experts were split over ep x tp while the experts' weights split
    over ep x etp (memory.params; megatron-core's expert tensor parallelism): with etp below tp
    a rank's expert adapters shrank with tp although its experts did not."""
    from planner.models.spec import count_params
    from planner.timing.dp import trained_split
    from planner.training.finetune import FinetuneSpec

    m = load_model("mixtral-8x7b")
    pc = count_params(m)
    setup = TrainingSetup(seq_len=4096, global_batch=64, finetune=FinetuneSpec.named("lora", targets=("all-linear",)))

    def split(tp: int, etp: int):
        return trained_split(m, pc, setup, Layout(tp=tp, ep=8, etp=etp), 0, m.n_layers)

    # the experts' weights on a rank depend on ep x etp only; so do their adapters
    assert split(8, 1).trainable_expert == split(1, 1).trainable_expert == split(4, 1).trainable_expert
    assert split(8, 8).trainable_expert < split(8, 1).trainable_expert
    assert split(8, 1).trainable_dense == split(8, 8).trainable_dense


def test_a_batch_without_ep_fold_derives_the_sizes_of_its_layouts():
    # a batch that leaves ep_fold absent (the search's grid: no layout folds) takes the shortcut
    # of layouts.data_parallel_size for an int fold; its derived sizes are each layout's own
    # (Layout's, the same functions Megatron-Core's groups check in the referee test above)
    lays = [_layout(*s) for s in SHAPES]
    lays = [lay for lay in lays if not lay.ep_fold]
    assert len(lays) >= 3, "no unfolded shape: the comparison would check nothing"
    full = LayoutArrays.from_layouts(lays)
    absent = dataclasses.replace(full, ep_fold=None)
    for a in (full, absent):
        assert a.data_parallel.tolist() == [lay.data_parallel for lay in lays]
        assert a.dense_shard_degree.tolist() == [lay.dense_shard_degree for lay in lays]
        assert a.expert_shard_degree.tolist() == [lay.expert_shard_degree for lay in lays]
        assert a.n_gpus.tolist() == [lay.n_gpus for lay in lays]
