"""Megatron-LM's model arguments for gated DeltaNet hybrids (Qwen3-Next and Qwen3.5's text
models, planner.models.deltanet), run by pretrain_gpt.py.

Megatron runs these as a GPTModel, not a MambaModel: Megatron-LM's gpt_builders.py takes the
layer specs of megatron-core's get_transformer_block_with_experimental_attention_variant_spec
when ``--experimental-attention-variant`` is given (megatron-core 0.16.1
models/gpt/experimental_attention_variant_module_specs.py): per decoder layer the token mixer
is ssm/gated_delta_net.py's GatedDeltaNet where the linear-attention pattern says 1 and
softmax attention where it says 0 (an integer N: every N-th layer attention,
get_linear_attention_pattern), and the channel mixer the MoE block where the MoE pattern says 1
(``--moe-layer-freq``, get_moe_layer_pattern). Megatron-Bridge's Qwen3NextBridge
(src/megatron/bridge/models/qwen/qwen3_next_bridge.py, provider_bridge) sets the same fields from
transformers' config: experimental_attention_variant "gated_delta_net", linear_attention_freq =
full_attention_interval, the linear_* head counts and widths and the conv kernel,
attention_output_gate (the q_proj twice as wide), qk_layernorm, zero-centred RMSNorm
(layernorm_zero_centered_gamma, ``--apply-layernorm-1p``), SwiGLU, no linear biases, and the
shared expert's sigmoid gate (moe_shared_expert_gate). Flag names as Megatron-LM's own scripts
pass them (examples/mimo/scripts/run_qwen35_vlm_train.sh).

Two planner letters (token mixer, channel mixer) are one Megatron decoder layer: G or *, then E
or -. The vocabulary, norm epsilon, rope base, dropout and router arguments are the GPT path's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.emit.megatron import moe_args, rope_args, vocab_divisor
from planner.errors import UserError
from planner.memory.model import stage_layers
from planner.models.deltanet import DELTANET_MODEL_TYPES
from planner.stacks.architecture import architecture

if TYPE_CHECKING:
    from planner.layouts.layout import Layout
    from planner.models.spec import ModelSpec


def is_deltanet_model(m: ModelSpec) -> bool:
    """A gated DeltaNet hybrid, which Megatron runs as a GPTModel (this module's docstring)."""
    return m.model_type in DELTANET_MODEL_TYPES


def decoder_layers(m: ModelSpec) -> int:
    """Megatron's --num-layers for ``m``: decoder layers, each ``m.letters_per_block`` letters."""
    return m.n_layers // m.letters_per_block


def layer_patterns(m: ModelSpec) -> tuple[list[int], list[int]]:
    """Per decoder layer: 1 where the token mixer is gated DeltaNet (0: attention), and 1 where
    the channel mixer is the MoE block (0: dense MLP), read from the letter pairs."""
    pairs = [m.layer_pattern[i:i + 2] for i in range(0, m.n_layers, 2)]
    return [int(p[0] == "G") for p in pairs], [int(p[1] == "E") for p in pairs]


def freq_arg(pattern: list[int], every_nth: int) -> str:
    """The pattern as Megatron-LM's frequency arguments take it (arguments.py moe_freq_type: an
    integer or a Python list expression): the smallest N whose rule gives the pattern, where
    ``every_nth`` is 0 when the N-th layer is the odd one out (get_linear_attention_pattern:
    0 if (i + 1) % N == 0) and 1 when it is the first (get_moe_layer_pattern: 1 if i % N == 0);
    else the list itself."""
    n = len(pattern)
    for every in range(1, n + 1):
        rule = ([0 if (i + 1) % every == 0 else 1 for i in range(n)] if every_nth == 0
                else [1 if i % every == 0 else 0 for i in range(n)])
        if rule == pattern:
            return str(every)
    return "[" + ",".join(map(str, pattern)) + "]"


def deltanet_unsupported(m: ModelSpec) -> str | None:
    """What megatron-core 0.16.1's GPTModel with gated DeltaNet cannot build of ``m``, or None."""
    if m.qkv_bias or m.out_bias:
        return ("attention biases (Megatron's --add-qkv-bias leaves the output projection without one; "
                "GatedDeltaNet is built without biases)")
    if m.n_layers % m.letters_per_block or any(p[0] not in "G*" or p[1] not in "E-" for p in
                                               (m.layer_pattern[i:i + 2] for i in range(0, m.n_layers, 2))):
        return f"the layer pattern {m.layer_pattern[:12]}... (each decoder layer G or *, then E or -)"
    return None


def deltanet_model_args(m: ModelSpec, seq_len: int, tp: int = 1) -> list[str]:
    """Megatron-LM's model arguments for the gated DeltaNet hybrid ``m`` (module docstring)."""
    why = deltanet_unsupported(m)
    if why is not None:
        raise UserError(f"Megatron-LM's arguments cannot express {m.name} ({why}); "
                        f"no Megatron files written (use --stack hf)")
    linear, moe = layer_patterns(m)
    arch = architecture(m)
    args = ["--num-layers", str(decoder_layers(m)), "--hidden-size", str(m.d_model),
            "--ffn-hidden-size", str(m.dense_d_ff), "--num-attention-heads", str(m.n_heads),
            "--kv-channels", str(m.head_dim), "--seq-length", str(seq_len),
            "--max-position-embeddings", str(max(m.max_positions, seq_len)),
            "--position-embedding-type", "rope", *rope_args(m),     # base, and the rotated share of head_dim
            "--normalization", "RMSNorm", "--apply-layernorm-1p", "--norm-epsilon", repr(arch.norm_eps),
            "--vocab-size", str(m.vocab_size), "--make-vocab-size-divisible-by", str(vocab_divisor(m.vocab_size, tp)),
            "--attention-dropout", repr(m.attention_dropout), "--hidden-dropout", repr(m.hidden_dropout),
            "--swiglu", "--disable-bias-linear", "--qk-layernorm", "--attention-output-gate",
            "--experimental-attention-variant", "gated_delta_net",
            "--linear-attention-freq", freq_arg(linear, every_nth=0),
            "--linear-conv-kernel-dim", str(m.conv_kernel),
            "--linear-key-head-dim", str(m.gdn_key_dim), "--linear-value-head-dim", str(m.gdn_value_dim),
            "--linear-num-key-heads", str(m.gdn_key_heads), "--linear-num-value-heads", str(m.gdn_value_heads)]
    if m.n_kv_heads != m.n_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.n_kv_heads)]
    if not m.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    if m.is_moe:
        args += moe_args(m)       # experts, router, shared expert's width (the GPT path's)
        args += [] if "--moe-ffn-hidden-size" in args else ["--moe-ffn-hidden-size", str(m.d_ff)]
        if not all(moe) and "--moe-layer-freq" not in args:
            args += ["--moe-layer-freq", freq_arg(moe, every_nth=1)]
        if m.n_shared_experts and m.shared_expert_gate:
            args += ["--moe-shared-expert-gate"]
    return args


def deltanet_layout_refusal(lay: Layout, m: ModelSpec) -> str | None:
    """Why Megatron cannot run ``lay`` of ``m`` as the planner split it, or None: a pipeline
    stage must hold whole decoder layers (Megatron splits --num-layers; the planner splits
    letters), so each stage's letters are twice Megatron's layers for that stage."""
    if lay.pp == 1:
        return None
    letters = stage_layers(m.n_layers, lay.pp)
    layers = stage_layers(decoder_layers(m), lay.pp)
    if letters != [m.letters_per_block * n for n in layers]:
        return (f"its pipeline stages of {letters} letters split a decoder layer (Megatron splits "
                f"{decoder_layers(m)} decoder layers of two letters each): give a pp dividing the layers")
    return None
