"""The hybrid-nodes rule and FSDP hybrid's shard group count a node's data-parallel ranks alike.

Bug fixed: layouts/rules.py's "hybrid-nodes" rule counted gpus_per_node // (tp x pp) data
ranks per node while Layout.hybrid_shard (hybrid_shard_ranks) counts gpus_per_node // tp. The
pipeline is the outermost axis of the rank order (megatron-core parallel_state.py's default
order "tp-cp-ep-dp-pp"; torchtitan's device mesh ["pp", "dp_replicate", "dp_shard", "cp",
"tp"]), so dp=8, tp=1, pp=2 on 8-GPU nodes puts each stage's 8 data ranks on one node: HSDP
has nothing to replicate across nodes (one replica), which the rule let through as a second
name for full shard.
"""

from __future__ import annotations

from planner.layouts.layout import Layout, reject_reason
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup


def test_hybrid_with_one_node_per_stage_is_rejected() -> None:
    m, setup = load_model("llama3.1-8b"), TrainingSetup(global_batch=256)
    one_node = Layout(dp=8, pp=2, zero_stage=3, sharding="fsdp-hybrid", grad_accum=32)
    assert one_node.hybrid_replicate(8) == 1
    assert reject_reason(m, setup, one_node, 8) == "hybrid sharding needs data-parallel ranks on more than one node"


def test_hybrid_across_nodes_is_kept() -> None:
    m, setup = load_model("llama3.1-8b"), TrainingSetup(global_batch=256)
    for lay in (Layout(dp=16, pp=2, zero_stage=3, sharding="fsdp-hybrid", grad_accum=16),
                Layout(dp=8, tp=2, zero_stage=3, sharding="fsdp-hybrid", grad_accum=32)):
        assert lay.hybrid_replicate(8) == 2
        assert reject_reason(m, setup, lay, 8) is None
