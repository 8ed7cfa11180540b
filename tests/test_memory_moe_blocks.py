"""MoE blocks beyond the generic count (planner.memory.moe.moe_block_delta_bytes) against
autograd's saved tensors of transformers 5.24.0's own MLP modules on the CPU: every tensor a
block's MLP (the MoE block with its router, experts and shared experts, or a dense block's MLP)
saves for backward, its input excluded (memory.activations counts it as the MLP input), summed
over the tiny models' blocks, against the generic routed terms plus the delta for each block."""

import json
from pathlib import Path

import pytest
from saved_tensors import saved_bytes, tiny_causal_lm

from planner.layouts.layout import Layout
from planner.memory.activations import layer_activation_terms
from planner.memory.moe import is_routed_term, moe_block_delta_bytes
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"
SEQ, MB = 128, 2


def _mlp_saved_bytes(name: str) -> int:
    """Unique storages autograd saves inside the blocks' MLP modules (bf16, one forward),
    parameters and each MLP's input excluded."""
    model = tiny_causal_lm(json.loads((CONFIGS / f"{name}.json").read_text()))
    inside: list[int] = []      # storage of the running MLP's input, while one runs
    for block in model.model.layers:
        mlp = getattr(block, "mlp", None) or block.feed_forward
        mlp.register_forward_pre_hook(lambda _m, args: inside.append(args[0].untyped_storage().data_ptr()))
        mlp.register_forward_hook(lambda *_: inside.clear())
    return saved_bytes(model, MB, SEQ, lambda ptr: bool(inside) and ptr != inside[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-gpt-oss", "tiny-llama4-text",
                                  "tiny-glm4-moe", "tiny-minimax-m2"])
def test_moe_blocks_keep_what_transformers_keeps(name):
    m = load_model(str(CONFIGS / f"{name}.json"))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16")
    lay = Layout(micro_batch=MB, seq_len=SEQ)
    generic = sum(t.bytes for t in layer_activation_terms(m, setup, lay, "eager") if is_routed_term(t.name))
    predicted = m.n_layers * (generic + moe_block_delta_bytes(m, setup, lay, "eager"))
    assert predicted == pytest.approx(_mlp_saved_bytes(name), rel=0.03)


def test_moe_block_delta_where_transformers_does_not_run():
    """Fused (Megatron-Core) kernels keep the dispatched-token sizing: only the dense blocks
    and shared experts change them; torchtitan, full recomputation and dense models: 0."""
    m = load_model(str(CONFIGS / "tiny-llama4-text.json"))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16")
    lay = Layout(micro_batch=MB, seq_len=SEQ)
    eager, fused = moe_block_delta_bytes(m, setup, lay, "eager"), moe_block_delta_bytes(m, setup, lay, "fused")
    assert 0 < fused < eager
    assert moe_block_delta_bytes(m, setup, lay, "torchtitan") == 0
    assert moe_block_delta_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ, recompute="full"), "eager") == 0
    assert moe_block_delta_bytes(load_model("llama3.1-8b"), setup, lay, "eager") == 0
    qwen = load_model(str(CONFIGS / "tiny-qwen3-moe.json"))      # no dense blocks, no shared experts
    assert moe_block_delta_bytes(qwen, setup, lay, "fused") == 0


def test_expert_side_leaves_out_the_mlp_input():
    """The MLP's input (the norm's output) stays on the tokens' side of the dispatch: the
    imbalance scales the k routed copies only (Mixtral, fused: [gate, up], product and the
    permuted tokens, k = 2)."""
    from planner.memory.moe import expert_side_bytes

    m = load_model("mixtral-8x7b")
    setup = TrainingSetup(seq_len=4096, global_batch=1)
    lay = Layout(micro_batch=1, seq_len=4096)
    tokens, h, f = 4096, m.d_model, m.d_ff
    assert expert_side_bytes(m, setup, lay, "fused") == tokens * 2 * (3 * f + h) * 2
