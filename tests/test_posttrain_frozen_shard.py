"""Frozen copies in post-training (the RL reference model, the FSDP-held distillation teacher)
are sharded over the same ranks as the policy's dense weights, not over dp alone.

Bug fixed: rollout.frozen_copy_bytes, distill.teacher_weight_bytes and the teacher's gather
time divided by ``dp``; with context parallelism (or ep beside dp) the policy's dense weights
are sharded over dp x cp (x ep), the mesh torchtitan's FSDP2 shards dense parameters over
(torchtitan/distributed/parallel_dims.py: the flattened "dp_shard_cp" mesh passed to
fully_shard) and the group Megatron's distributed optimizer uses (megatron-core
parallel_state.py's dp-cp groups); under FSDP hybrid (HSDP) only the shard group inside a node
holds the pieces (PyTorch FSDP HYBRID_SHARD docs). So the 8 ranks of dp=4 x cp=2 hold a
frozen copy as the 8 ranks of dp=8 do: an eighth each, where dp alone gave a quarter.
"""

from __future__ import annotations

from planner.layouts.layout import Layout
from planner.memory.distill import teacher_shardings, teacher_weight_bytes
from planner.memory.rollout import frozen_copy_bytes
from planner.models.spec import load_model
from planner.training.posttrain import DistillSetup
from planner.units import ceil_div


def test_reference_copy_sharded_over_dp_and_cp() -> None:
    m = load_model("llama3.1-8b")
    whole = frozen_copy_bytes(m, Layout(dp=8, zero_stage=0))
    dp_only = frozen_copy_bytes(m, Layout(dp=8, zero_stage=3, sharding="fsdp-full"))
    with_cp = frozen_copy_bytes(m, Layout(dp=4, cp=2, zero_stage=3, sharding="fsdp-full"))
    assert dp_only == ceil_div(whole, 8)
    assert with_cp == dp_only                 # was ceil_div(whole, 4) before the fix


def test_reference_copy_under_hybrid_shards_inside_a_node() -> None:
    m = load_model("llama3.1-8b")
    whole = frozen_copy_bytes(m, Layout(dp=16, zero_stage=0))
    hybrid = Layout(dp=16, zero_stage=3, sharding="fsdp-hybrid")
    # 16 ranks on 8-GPU nodes: two shard groups of 8 replicate each other
    assert frozen_copy_bytes(m, hybrid, gpus_per_node=8) == ceil_div(whole, 8)    # was whole / 16


def test_fsdp_teacher_sharded_over_dp_and_cp() -> None:
    teacher = load_model("llama3.1-8b")
    d = DistillSetup(teacher="llama3.1-8b")
    lay = Layout(dp=1, cp=8, zero_stage=3, sharding="fsdp-full")
    assert "fsdp" in teacher_shardings(lay)   # was absent: dp = 1
    whole, _ = teacher_weight_bytes(teacher, d, lay, "replicated")
    sharded, _ = teacher_weight_bytes(teacher, d, lay, "fsdp")
    assert sharded == ceil_div(whole, 8)
