"""QK norm's saved tensors (planner.memory.attention.qk_norm_saved_bytes) against autograd's
saved tensors of transformers' own blocks on the CPU: a Qwen3 decoder block keeps what the
same Llama block keeps plus its q_norm / k_norm tensors, so the difference of the two is the
measured QK-norm term."""

from pathlib import Path

import pytest
from conftest import require
from saved_tensors import saved_bytes, tiny_causal_lm

from planner.layouts.layout import Layout
from planner.memory.attention import attention_saved_delta_bytes, qk_norm_saved_bytes
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"
SEQ, MB = 128, 2


def _block_saved_bytes_at(hf: dict, index: int) -> int:
    return _block_saved_bytes(hf, "bfloat16", index)


def _block_saved_bytes(hf: dict, dtype_name: str, index: int = 0) -> int:
    """Unique storages autograd saves inside decoder block ``index`` (parameters excluded), one forward."""
    model = tiny_causal_lm(hf, dtype_name, attention="sdpa")
    inside = [False]
    block = model.model.layers[index]
    block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    block.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    return saved_bytes(model, MB, SEQ, lambda _ptr: inside[0])


def _as_llama(hf: dict) -> dict:
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
            "vocab_size", "max_position_embeddings", "num_hidden_layers", "rms_norm_eps", "hidden_act")
    return {"model_type": "llama", "tie_word_embeddings": False, **{k: hf[k] for k in keep}}


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name, kernels", [("bfloat16", "eager"), ("float32", "eager")])
def test_qwen3_qk_norm_is_what_its_block_keeps_beyond_llamas(dtype_name, kernels):
    import json

    path = CONFIGS / "tiny-qwen3.json"
    hf = json.loads(path.read_text())
    measured = _block_saved_bytes(hf, dtype_name) - _block_saved_bytes(_as_llama(hf), dtype_name)
    m = load_model(str(path))
    precision = "bf16" if dtype_name == "bfloat16" else "fp32"
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision=precision)
    predicted = qk_norm_saved_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ), kernels)
    assert predicted == pytest.approx(measured, rel=0.01)


def test_qk_norm_term_is_zero_where_it_should_be():
    m = load_model(str(CONFIGS / "tiny-qwen3.json"))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB)
    lay = Layout(micro_batch=MB, seq_len=SEQ)
    assert qk_norm_saved_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ, recompute="full"), "eager") == 0
    assert qk_norm_saved_bytes(load_model("llama3.1-8b"), setup, lay, "eager") == 0
    assert qk_norm_saved_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ, tp=2), "eager") * 2 == \
        qk_norm_saved_bytes(m, setup, lay, "eager")
    assert attention_saved_delta_bytes(m, setup, lay, "eager") == qk_norm_saved_bytes(m, setup, lay, "eager")


@pytest.mark.slow
def test_gpt_oss_eager_sink_scores_against_autograd():
    """gpt-oss's eager attention keeps one 16-bit softmax over s + 1 columns (the sink) and the
    row maximum's int64 indices (transformers 5.24.0): the saved tensors of a tiny block whose
    last dimension is s or s + 1, against planner.memory.attention.sink_eager_scores_bytes."""
    torch = require("torch")
    transformers = require("transformers")
    import json

    from planner.memory.attention import sink_eager_delta_bytes, sink_eager_scores_bytes

    path = CONFIGS / "tiny-gpt-oss.json"
    cfg = json.loads(path.read_text())
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.use_cache = False
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          dtype=torch.bfloat16).train()
    attn = model.model.layers[0].self_attn
    inside = [False]
    attn.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    attn.register_forward_hook(lambda *_: inside.__setitem__(0, False))
    seen: dict[int, int] = {}

    def pack(t):
        if inside[0] and t.dim() == 4 and t.shape[-1] in (SEQ, SEQ + 1, 1) and t.shape[-2] == SEQ:
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.randint(0, config.vocab_size, (MB, SEQ)))
    m = load_model(str(path))
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16", attention="eager")
    lay = Layout(micro_batch=MB, seq_len=SEQ)
    assert sink_eager_scores_bytes(m, setup, lay) == sum(seen.values())
    assert sink_eager_delta_bytes(m, setup, lay, "eager") < 0       # less than an fp32 softmax and its copy
    assert sink_eager_scores_bytes(load_model("llama3.1-8b"), setup, lay) == 0


@pytest.mark.slow
def test_llama4_l2_qk_norm_against_autograd():
    """Llama 4's weightless L2 QK norm (rotary blocks only): a tiny Llama 4 with use_qk_norm keeps,
    over its blocks, what the same model without it keeps plus qk_norm_saved_bytes x layers."""
    import json

    path = CONFIGS / "tiny-llama4-text.json"
    hf = json.loads(path.read_text())

    def total_saved(cfg: dict) -> int:
        return sum(_block_saved_bytes_at(cfg, i) for i in range(cfg["num_hidden_layers"]))

    measured = total_saved(hf) - total_saved({**hf, "use_qk_norm": False})
    m = load_model(str(path))
    assert m.qk_norm == "l2" and m.n_qk_norm_layers == 2
    setup = TrainingSetup(seq_len=SEQ, global_batch=MB, precision="bf16")
    predicted = qk_norm_saved_bytes(m, setup, Layout(micro_batch=MB, seq_len=SEQ), "eager") * m.n_layers
    assert predicted == pytest.approx(measured, rel=0.01)
