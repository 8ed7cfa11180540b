"""A block's LoRA adapter time and the step's adapter FLOPs read one list of adapters
(planner.timing.flops.block_adapters).

The bug this guards (issue 31): the block time counted every adapted layer in every block,
where the FLOPs counted a layer only in the blocks that hold it; on a model whose dense and
MoE blocks differ (Llama 4 Maverick interleaves them) the adapters were timed for layers an
average block does not have.
"""

from __future__ import annotations

import math

import pytest

from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.timing.flops import adapter_flops_per_token
from planner.timing.kernels import Rates, frozen_block_extra_s
from planner.training.finetune import FinetuneSpec

MM_FLOPS_PER_S = 1e15


@pytest.mark.parametrize("name", ["llama4-maverick", "qwen3-30b-a3b", "llama3.1-8b"])
def test_adapter_time_at_an_unbounded_hbm_rate_is_its_flops_at_the_matmul_rate(name: str) -> None:
    # with HBM infinitely fast, a GEMM's time is its FLOPs over the matmul rate (gemm_time_s), so
    # n_layers average blocks' adapter time must be the step's adapter FLOPs per token x tokens
    m = load_model(name)
    ft = FinetuneSpec.named("lora", rank=16, targets=("all-linear",))
    key = Layout(micro_batch=2, seq_len=512)
    rates = Rates(matmul_flops_per_s=MM_FLOPS_PER_S, flash_flops_per_s=MM_FLOPS_PER_S, hbm_bytes_per_s=math.inf)
    adapters_s, _ = frozen_block_extra_s(m, ft, key, rates, 2)
    tokens = key.micro_batch * key.seq_len
    assert m.n_layers * adapters_s == pytest.approx(adapter_flops_per_token(m, ft) * tokens / MM_FLOPS_PER_S,
                                                    rel=1e-12)
