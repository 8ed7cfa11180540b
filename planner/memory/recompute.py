"""Megatron-Core's selective recomputation by module (--recompute-modules): what each module it
recomputes takes off a block's saved tensors, per micro-batch on one rank (<= 0; gathered per
shape in memory.shapes beside the other deltas).

megatron-core 0.16.1 TransformerConfig.recompute_modules (transformer/transformer_config.py),
with --recompute-granularity selective; default ["core_attn"]:

* ``core_attn``: the core attention (the planner's --recompute selective: the attention scores,
  Korthikanti et al. 2022 Sec. 4.2; nothing under flash attention, which keeps no scores);
* ``layernorm``: input_layernorm and pre_mlp_layernorm: their outputs, the inputs of the QKV and
  first MLP projections, are recomputed, not kept (memory.activations' "attention input" and
  "MLP input" terms, at the bytes the FP8 recipe keeps them in);
* ``moe_act``: the experts' activation function: its output, the experts' second projection's
  input, is recomputed (one of the three d_ff-wide tensors per routed copy of the fused SwiGLU,
  one of the two of a plain activation such as Nemotron 3's squared ReLU: moe/experts.py
  TEGroupedMLP.forward and GroupedMLP.forward checkpoint the activation with
  CheckpointWithoutOutput whatever its function, gated or not);
* ``mla_up_proj``: MLA's up-projections and RoPE: their outputs, the per-head Q, K and V that
  core attention keeps, are discarded and recomputed in backward (CheckpointWithoutOutput);
* ``mlp``: the dense MLP, which keeps only its input (DeepSeek-V3's three dense layers; every
  layer of a dense model).

``moe`` and ``shared_experts`` are not modelled (refused at the CLI).
"""

from __future__ import annotations

from planner.layouts.layout import Layout
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp")
NOT_MODELLED = ("moe", "shared_experts")


def module_recompute_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one (mean) block's saved tensors change by when Megatron recomputes
    setup.recompute_modules under --recompute selective (see the module docstring); 0
    elsewhere. The core attention's terms are memory.activations' selective ones, which
    --recompute selective already drops: without core_attn in the list they are kept."""
    mods = setup.recompute_modules
    if not mods or lay.recompute != "selective" or setup.stack != "megatron":
        return 0
    from planner.memory.activations import layer_activation_terms

    terms = layer_activation_terms(m, setup, lay, kernels)
    a = setup.precision_spec.activation_bytes
    fp8 = setup.precision_spec.fp8
    saved = fp8.saved_input_bytes if fp8 is not None else a     # a linear input as the recipe keeps it
    tokens = lay.tokens_per_rank
    sp_div = lay.tp if lay.sp else 1
    delta = 0.0
    if "core_attn" not in mods:
        delta += sum(t.bytes for t in terms if t.selective)
    if "layernorm" in mods:
        n_inputs = 1 if m.parallel_block else 2
        delta -= tokens * n_inputs * m.d_model * saved / sp_div
    moe_share = m.n_moe_layers / m.n_layers if m.is_moe else 0.0
    if "moe_act" in mods and m.is_moe:
        delta -= moe_share * tokens * m.n_experts_per_token * m.d_ff * saved / lay.tp
    if "mla_up_proj" in mods and m.is_mla:
        qkv = m.n_heads * (2 * m.head_dim + m.value_head_dim)
        delta -= tokens * qkv * a / lay.tp
    if "mlp" in mods:
        dense_f = (m.dense_d_ff or m.d_ff) if m.is_moe else m.d_ff
        share = 1.0 - moe_share
        if m.gated_mlp:     # fused SwiGLU: [gate, up] and the product (the product at the recipe's bytes)
            delta -= share * tokens * dense_f * (2 * a + saved) / lay.tp
        else:
            delta -= share * tokens * dense_f * (a + saved) / lay.tp
    return int(delta)
