"""RMSNorms that keep an fp32 normalised tensor (planner.memory.norms) against autograd's saved
tensors of transformers 5.24.0's own norm modules on the CPU (bf16): Gemma 3's four block norms
and OLMo 2's two, and OLMo 2's QK norms (planner.memory.attention.qk_norm_saved_bytes)."""

import json
from pathlib import Path

import pytest
from saved_tensors import saved_bytes, tiny_causal_lm

from planner.layouts.layout import Layout
from planner.memory.activations import norm_saved_bytes
from planner.memory.attention import qk_norm_saved_bytes
from planner.memory.norms import block_norm_delta_bytes
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"
SEQ, MB = 128, 2


def _norm_saved_bytes(name: str, qk: bool) -> int:
    """Unique storages autograd saves inside the blocks' RMSNorm modules (one forward): the
    block norms, or with ``qk`` the attention's q_norm / k_norm; parameters excluded."""
    model = tiny_causal_lm(json.loads((CONFIGS / f"{name}.json").read_text()))
    inside = [False]
    for mod_name, mod in model.model.layers.named_modules():
        if type(mod).__name__.endswith("RMSNorm") and (".self_attn." in f".{mod_name}") == qk:
            mod.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
            mod.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    return saved_bytes(model, MB, SEQ, lambda _ptr: inside[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-gemma3-text", "tiny-olmo2"])
def test_block_norms_keep_an_fp32_normalised_tensor(name):
    m = load_model(str(CONFIGS / f"{name}.json"))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16")
    lay = Layout(micro_batch=MB, seq_len=SEQ)
    generic = MB * SEQ * m.norms_per_layer * m.d_model * norm_saved_bytes(m, 2, "eager")
    predicted = m.n_layers * (generic + block_norm_delta_bytes(m, setup, lay, "eager"))
    measured = _norm_saved_bytes(name, qk=False)
    assert predicted == pytest.approx(measured, rel=0.01)       # rstd and (1 + weight): under 1%
    assert m.n_layers * generic < 0.8 * measured                 # the generic count alone is 25% short


@pytest.mark.slow
def test_olmo2_qk_norms_keep_an_fp32_normalised_tensor():
    m = load_model(str(CONFIGS / "tiny-olmo2.json"))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16")
    predicted = m.n_layers * qk_norm_saved_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ), "eager")
    assert predicted == pytest.approx(_norm_saved_bytes("tiny-olmo2", qk=True), rel=0.01)


def test_block_norm_delta_is_zero_where_it_should_be():
    m = load_model(str(CONFIGS / "tiny-gemma3-text.json"))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16")
    lay = Layout(micro_batch=MB, seq_len=SEQ)
    assert block_norm_delta_bytes(m, setup, lay, "amp") == 0      # autocast: the stream is fp32 already
    assert block_norm_delta_bytes(m, setup, lay, "fused") == 0
    assert block_norm_delta_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ, recompute="full"), "eager") == 0
    assert block_norm_delta_bytes(load_model(str(CONFIGS / "tiny-qwen3.json")), setup, lay, "eager") == 0
