"""The linear inputs a layer saves for backward under a low-precision recipe, per kind of layer
(memory.fp8.saved_input_widths: hybrids, and MLA with dense first layers), against the modules
of transformers 5.x's NemotronHForCausalLM, Qwen3NextForCausalLM and DeepseekV3ForCausalLM built
on the meta device: each nn.Linear's
in_features and the routed experts' 3-D weights (modeling_nemotron_h.py: NemotronHMamba2Mixer
in_proj/out_proj, NemotronHAttention q/k/v/o_proj, NemotronHMLP up/down_proj, NemotronHMoE with
its experts, shared_experts and fc1/fc2_latent_proj). Before the fix every layer, Mamba ones
included, was charged an attention + MoE block's inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require
from test_deltanet import TINY as DELTANET_TINY
from test_hybrid import TINY as HYBRID_TINY

from planner.layouts.layout import Layout
from planner.memory.activations import layer_activation_bytes, layer_activation_terms
from planner.memory.fp8 import saved_input_delta_bytes, saved_input_widths
from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.training.setup import TrainingSetup

ROOT = Path(__file__).resolve().parent.parent
# test_hybrid's tiny Nemotron-H with every letter, q (4 x 48), d_inner (8 x 32) and h (128) made to differ
TINY = {**HYBRID_TINY, "hybrid_override_pattern": "ME*-MEM", "head_dim": 48, "mamba_head_dim": 32}
VARIANTS = {"plain": TINY, "latent-moe": {**TINY, "moe_latent_size": 48},
            # test_deltanet's tiny Qwen3-Next (gated DeltaNet, gated attention, MoE with a shared
            # expert and its sigmoid gate), one layer a dense MLP
            "qwen3-next": {**DELTANET_TINY, "mlp_only_layers": [1]},
            # bench/configs' tiny DeepSeek-V3: MLA (q and kv latents 96 and 64 wide, v heads 32 against
            # q heads 48), one dense first layer, routed and shared experts. The figure these widths
            # replaced for every non-hybrid model counted the output projection's input q_dim wide and
            # no latent, the dense layer as a MoE one
            "deepseek-v3": json.loads((ROOT / "bench" / "configs" / "tiny-deepseek-v3.json").read_text())}


def _mixers(model):
    """Each layer's token mixer and MLP side (NemotronHBlock: one mixer; Qwen3NextDecoderLayer: both)."""
    for layer in model.model.layers:
        if hasattr(layer, "mixer"):
            yield layer.mixer
        else:
            yield getattr(layer, "linear_attn", None) or layer.self_attn
            yield layer.mlp


def _transformers_inputs(cfg: dict) -> tuple[float, float]:
    """Per token, summed over the layers of transformers' model: (inputs of the column-parallel
    side, inputs of the row-parallel side). Megatron-core 0.16.1 builds out_proj, linear_proj,
    linear_fc2 and the experts' fc2 as row-parallel (ssm/mamba_mixer.py, ssm/gated_delta_net.py,
    transformer/attention.py, transformer/mlp.py); their inputs are the tensor-parallel region's
    (split by tp)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    k = cfg["num_experts_per_tok"]
    col = row = 0.0
    for mix in _mixers(model):
        kind = type(mix).__name__
        if kind == "NemotronHMamba2Mixer":
            col += mix.in_proj.in_features
            row += mix.out_proj.in_features
        elif kind == "Qwen3NextGatedDeltaNet":
            # in_proj_qkvz and in_proj_ba read the same hidden_states: one tensor
            assert mix.in_proj_qkvz.in_features == mix.in_proj_ba.in_features
            col += mix.in_proj_qkvz.in_features
            row += mix.out_proj.in_features
        elif kind in ("NemotronHAttention", "Qwen3NextAttention"):
            # q, k and v_proj read the same hidden_states (the attention's forward): one tensor
            assert mix.q_proj.in_features == mix.k_proj.in_features == mix.v_proj.in_features
            col += mix.q_proj.in_features
            row += mix.o_proj.in_features
        elif kind == "DeepseekV3Attention":
            # q_a_proj and kv_a_proj_with_mqa read the same hidden_states; q_b_proj and kv_b_proj
            # the two latents after their norms; o_proj the heads' values (n_heads x v_head_dim)
            assert mix.q_a_proj.in_features == mix.kv_a_proj_with_mqa.in_features
            col += mix.q_a_proj.in_features + mix.q_b_proj.in_features + mix.kv_b_proj.in_features
            row += mix.o_proj.in_features
        elif kind in ("NemotronHMLP", "Qwen3NextMLP", "DeepseekV3MLP"):
            col += mix.up_proj.in_features      # Qwen3NextMLP's gate_proj reads the same tensor
            row += mix.down_proj.in_features
        else:
            assert kind in ("NemotronHMoE", "Qwen3NextSparseMoeBlock", "DeepseekV3MoE"), kind
            # the routed experts' weights are (E, out, in): each token's k copies enter the first
            # at its in width and down_proj at the expert width; the router, the shared expert's
            # first projection(s), its sigmoid gate and fc1_latent_proj read the layer's norm
            # output, which the 16-bit router keeps
            first = getattr(mix.experts, "up_proj", None)
            first = mix.experts.gate_up_proj if first is None else first
            shared = getattr(mix, "shared_experts", None) or mix.shared_expert
            col += k * first.shape[2]
            row += k * mix.experts.down_proj.shape[2] + shared.down_proj.in_features
            if isinstance(getattr(mix, "fc2_latent_proj", None), torch.nn.Linear):    # else nn.Identity
                row += mix.fc2_latent_proj.in_features
    return col, row


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_saved_linear_inputs_per_kind_are_transformers_modules(name):
    require("torch")
    require("transformers")
    cfg = VARIANTS[name]
    m = spec_from_hf_config(dict(cfg), name, "test")
    col, row = _transformers_inputs(cfg)
    n = m.n_layers      # the mean layer is one letter (a Qwen3-Next decoder layer holds two)
    split_by_sp, split_by_tp = saved_input_widths(m)
    # the mean layer's widths, each kind weighted by its share of the layers
    assert split_by_sp == pytest.approx(col / n, rel=1e-12)
    assert split_by_tp == pytest.approx(row / n, rel=1e-12)


@pytest.mark.parametrize("precision,recipe", [("nvfp4", "auto"), ("fp8", "mxfp8"), ("fp8", "tensorwise")])
def test_delta_never_exceeds_what_the_layer_keeps(precision, recipe):
    # A recipe can at most shrink the 16-bit tensors the layer keeps to its saved bytes: the
    # delta stays within (1 - saved / 2) of the BF16 mean layer's bytes. At Megatron-Bridge's
    # Nemotron 3 Super NVFP4 layout (tp 2 with sp, 8,192 tokens) the old per-block figure took
    # 927 MB off a 1,058 MB mean layer, over the 0.72 x 1,058 = 760 MB bound
    m = load_model("nemotron-3-super")
    lay = Layout(tp=2, sp=True, micro_batch=1, seq_len=8192, recompute="none")
    setup = TrainingSetup(stack="megatron", precision=precision, fp8_recipe=recipe)
    bf16 = layer_activation_bytes(m, TrainingSetup(stack="megatron"), lay, "fused")
    delta = saved_input_delta_bytes(m, setup, lay)
    saved = setup.precision_spec.fp8.saved_input_bytes
    assert delta < 0
    assert -delta <= (1 - saved / 2) * bf16


def test_latent_moe_routes_latent_wide_tokens():
    # transformers' NemotronHMoE.forward runs fc1_latent_proj before self.experts, whose up_proj
    # takes the latent width (its (E, out, in) weight), and fc2_latent_proj after them; megatron-core
    # 0.16.1 MoELayer.preprocess projects before dispatch_preprocess: each MoE layer keeps k routed
    # copies of experts.up_proj's in width and fc2_latent_proj's input, 2 bytes each in bf16
    require("torch")
    import torch
    import transformers

    cfg = VARIANTS["latent-moe"]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    moe = next(layer.mixer for layer in model.model.layers if type(layer.mixer).__name__ == "NemotronHMoE")
    m = spec_from_hf_config(dict(cfg), "latent-moe", "test")
    lay = Layout(tp=1, micro_batch=1, seq_len=64, recompute="none")
    terms = layer_activation_terms(m, TrainingSetup(stack="megatron"), lay, "fused")
    n, n_moe, k = m.n_layers, m.n_moe_layers, cfg["num_experts_per_tok"]
    routed = sum(t.bytes for t in terms if t.name.startswith("tokens permuted"))
    combined = sum(t.bytes for t in terms if "fc2_latent_proj input" in t.name)
    assert routed == 64 * k * moe.experts.up_proj.shape[2] * 2 * n_moe // n
    assert combined == 64 * moe.fc2_latent_proj.in_features * 2 * n_moe // n
