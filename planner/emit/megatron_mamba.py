"""Megatron-LM's model arguments for hybrid Mamba-2 models (Nemotron-H, Nemotron 3:
planner.models.hybrid), run by pretrain_mamba.py, which builds megatron-core's MambaModel; what
MambaModel cannot build or run is refused here (docs/emit.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.emit.megatron import moe_args, vocab_divisor
from planner.errors import UserError
from planner.stacks.architecture import architecture

if TYPE_CHECKING:
    from planner.layouts.layout import Layout
    from planner.models.spec import ModelSpec
    from planner.training.setup import TrainingSetup

# Megatron-LM's entry point and layer spec for hybrid models: pretrain_mamba.py builds
# megatron-core's MambaModel from the stack spec --spec names (its model_provider stops without
# one); megatron/core/models/mamba/mamba_layer_specs.py mamba_stack_spec, the spec NVIDIA's
# Nemotron-H and Nemotron 3 scripts give
MAMBA_SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")
# What megatron-core 0.16.1's MambaLayer builds its MambaMixer with, which Megatron-LM's
# arguments do not set (ssm/mamba_mixer.py __init__ defaults: d_conv=4, chunk_size=128,
# conv_bias=True; "assert not bias" on in_proj/out_proj)
MEGATRON_MAMBA_CONV_KERNEL = 4
MEGATRON_MAMBA_CHUNK = 128


def _hybrid_unsupported(m: ModelSpec) -> str | None:
    """What megatron-core 0.16.1's MambaModel cannot build of a hybrid ModelSpec, or None."""
    if m.kda_gate_rank:     # no module of megatron-core 0.16.1 names Kimi Delta Attention
        return "Kimi Delta Attention layers (megatron-core 0.16.1 has no KDA layer)"
    if m.mamba_bias:
        return "biased Mamba in_proj/out_proj (megatron-core's MambaMixer asserts no bias)"
    if not m.conv_bias:
        return "a Mamba conv1d without bias (megatron-core's MambaMixer always builds one)"
    if m.conv_kernel != MEGATRON_MAMBA_CONV_KERNEL:
        return (f"a Mamba conv kernel of {m.conv_kernel} "
                f"(megatron-core's MambaLayer builds {MEGATRON_MAMBA_CONV_KERNEL})")
    if m.ssm_chunk != MEGATRON_MAMBA_CHUNK:
        return f"an SSD chunk of {m.ssm_chunk} (megatron-core's MambaLayer runs {MEGATRON_MAMBA_CHUNK})"
    if m.gated_mlp or m.activation != "relu2":
        return f"{m.activation} MLPs (Megatron-LM's hybrid arguments here write squared-ReLU MLPs)"
    if m.position != "none":
        return f"{m.position} positions on the attention layers"
    if m.tied_embeddings:
        return "tied embeddings"
    return None


def hybrid_model_args(m: ModelSpec, seq_len: int, tp: int = 1) -> list[str]:
    """Megatron-LM's model arguments for a hybrid Mamba-2 / attention / MLP / MoE model
    (planner.models.hybrid), run by pretrain_mamba.py: the layer pattern as
    --hybrid-override-pattern (Megatron's own letters: M Mamba, * attention, - MLP, E MoE;
    megatron-core 0.16.1 ssm/mamba_hybrid_layer_allocation.py Symbols), the Mamba mixer's
    heads, head width, state and groups (TransformerConfig mamba_num_heads, mamba_head_dim,
    mamba_state_dim, mamba_num_groups; is_hybrid_model), attention without positions,
    squared-ReLU MLPs (--squared-relu) of --ffn-hidden-size on '-' layers and of
    --moe-ffn-hidden-size in the experts, the shared expert's total width, the latent MoE width.
    The vocabulary, norm, dropout and router arguments are the GPT path's."""
    why = _hybrid_unsupported(m)
    if why is not None:
        raise UserError(f"Megatron-LM's hybrid arguments cannot express {m.name} ({why}); "
                        f"no Megatron files written (use --stack hf)")
    div = vocab_divisor(m.vocab_size, tp)
    args = ["--num-layers", str(m.n_layers), "--hidden-size", str(m.d_model),
            "--ffn-hidden-size", str(m.dense_d_ff), "--num-attention-heads", str(m.n_heads),
            "--kv-channels", str(m.head_dim),
            "--seq-length", str(seq_len), "--max-position-embeddings", str(max(m.max_positions, seq_len)),
            "--position-embedding-type", "none",
            "--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            "--norm-epsilon", repr(architecture(m).norm_eps),
            "--vocab-size", str(m.vocab_size), "--make-vocab-size-divisible-by", str(div),
            "--attention-dropout", repr(m.attention_dropout), "--hidden-dropout", repr(m.hidden_dropout),
            "--squared-relu", "--untie-embeddings-and-output-weights",
            "--is-hybrid-model", "--hybrid-override-pattern", m.layer_pattern,
            "--mamba-num-heads", str(m.mamba_heads), "--mamba-head-dim", str(m.mamba_head_dim),
            "--mamba-state-dim", str(m.ssm_state), "--mamba-num-groups", str(m.ssm_groups),
            "--spec", *MAMBA_SPEC]
    if m.n_kv_heads != m.n_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.n_kv_heads)]
    if not (m.out_bias or m.mlp_bias):
        args += ["--disable-bias-linear"]
    args += moe_args(m)
    if m.is_moe:
        args += ["--moe-ffn-hidden-size", str(m.d_ff)]
        if m.n_shared_experts:
            args += ["--moe-shared-expert-intermediate-size", str(m.n_shared_experts * m.shared_d_ff)]
        if m.moe_latent:
            args += ["--moe-latent-size", str(m.moe_latent)]
    return args


def hybrid_layout_refusal(lay: Layout, m: ModelSpec, setup: TrainingSetup) -> str | None:
    """Why megatron-core 0.16.1's MambaModel cannot run ``lay`` of the hybrid ``m``, or None:
    the rules table's --stack megatron refusals (layouts.rules STACK_REFUSALS, MambaStack's
    pipeline split, virtual stages and MTP) and its full recomputation
    (layouts.rules.mamba_stack_refusal), read here as the search reads them."""
    from dataclasses import replace as _replace

    from planner.layouts.rules import STACK_REFUSALS, RuleView, hybrid_cannot, mamba_stack_refusal

    why = mamba_stack_refusal(m, lay.recompute)
    if why is not None:
        return why
    if setup.mtp_layers:
        # planned (and timed) as Megatron-Bridge's Nemotron 3 recipes train them, on a later
        # megatron-core whose MultiTokenPredictionLayer builds hybrid patterns; the files written
        # here are 0.16.1's, whose MambaModel has none
        return hybrid_cannot(m, "MTP layers", "megatron-core 0.16.1's MambaModel builds none") + ": drop --mtp"
    v = RuleView.of(m, _replace(setup, stack="megatron"), lay, gpus_per_node=1)
    for fails, message in STACK_REFUSALS["megatron"]:
        if bool(fails(v)):
            return message(v, lay)
    return None
