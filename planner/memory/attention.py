"""Attention's saved tensors where the architecture differs from the generic multi-head /
grouped-query block of memory.activations (per shape, gathered in memory.shapes): DeepSeek's
multi-head latent attention (MLA) and DeepSeek-V3.2's indexer beside it, the RMSNorms on
queries and keys (QK norm) of Qwen3, OLMo 2 and Gemma 3, and gpt-oss's eager attention with sinks.

MLA (DeepSeek-V2/V3, arXiv:2412.19437, Sec. 2.1.1; transformers' DeepseekV3Attention): the
query goes through a q_lora_rank bottleneck (q_a_proj, q_a_layernorm, q_b_proj), keys and
values through one kv_lora_rank latent plus a decoupled rotary key of qk_rope_head_dim
shared by all heads (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj). Beyond the generic
block's terms a block keeps, per token:

* the query latent as its norm keeps it (memory.activations.norm_saved_bytes: its input,
  or for transformers' eager RMSNorm the fp32 copy and the normalised tensor) and as the
  q_b_proj input: q_lora_rank x (norm bytes + a);
* the key/value latent the same way: kv_lora_rank x (norm bytes + a); the decoupled rotary
  key needs nothing more (rotating by the cos/sin tables keeps only the tables, and the
  concatenated per-head K is counted with Q, K and V);

and its values are v_head_dim wide, not head_dim: V and the attention output (the output
projection's input) are n_heads (v_head_dim - head_dim) narrower than the generic count of
n_heads x head_dim each (DeepSeek-V3: v 128 against head_dim 192). The latents come out of
the down-projections, which tensor parallelism does not split (Megatron-Core MLA:
linear_q_down_proj and linear_kv_down_proj are replicated), so they are split by tp only
under sequence parallelism; V and the output are split by tp. Frameworks that absorb the
up-projections into the query and output at inference keep only the latent in the KV
cache; training, as here, materialises the per-head K and V (the non-absorbed layout).
Under full recomputation the block keeps its input only: no change.

Checked against autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks, unique
storages, parameters and the block input excluded) of transformers' DeepseekV3Attention in
bf16 on the CPU (hidden 512, 8 heads, q_lora 192, kv_lora 128, nope 64, rope 32, v 64):
latents 1,540 + 1,028 B per token (each with its fp32 rstd), against 1,536 + 1,024
modelled (-0.3%); the output projection's input 8 x 64 x 2 = 1,024 B per token (the
generic count, n_heads x head_dim, gives 1,536) and V 8 x 64 wide.
"""

from __future__ import annotations

from dataclasses import replace

from planner.layouts.layout import Layout
from planner.memory.activations import layer_activation_terms, norm_saved_bytes
from planner.memory.norms import FP32_NORM_BYTES, keeps_fp32_normalised
from planner.models.dsa import indexer_saved_bytes_per_token
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup


def mla_saved_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one MLA block keeps beyond memory.activations' generic count, per micro-batch on
    one rank (see the module docstring); 0 for other attention and under full recomputation."""
    if not m.is_mla or lay.recompute == "full" or setup.finetune.freezes_base:
        return 0
    a = setup.precision_spec.activation_bytes
    tokens = lay.tokens_per_rank
    sp_div = lay.tp if lay.sp else 1
    latent_b = norm_saved_bytes(m, a, kernels) + a
    latents = (m.q_lora_rank + m.kv_lora_rank) * latent_b
    narrower_v = 2 * m.n_heads * (m.value_head_dim - m.head_dim) * a     # V and the attention output
    return int(tokens * (latents / sp_div + narrower_v / lay.tp))


# QK norm (transformers 5.24.0). Qwen3 (models/qwen3/modeling_qwen3.py, Qwen3Attention:
# q_norm / k_norm = Qwen3RMSNorm(head_dim) on q_proj / k_proj's output viewed per head) runs
# Llama's RMSNorm:
# ``x32 = x.to(float32)``, ``x32 * rsqrt(mean(x32^2) + eps)``, ``weight * normed.to(x.dtype)``.
# Autograd keeps the fp32 copy (for pow and mul), the fp32 rstd per normalised row, and the
# normalised tensor in the input's dtype (for the weight's gradient): 4 + a bytes per
# element of q and k. The projection outputs are in the compute dtype a (under autocast and
# FSDP2's bf16 parameters alike), not the fp32 residual stream. Gemma 3
# (models/gemma3/modeling_gemma3.py, Gemma3RMSNorm: ``normed = _norm(x.float());
# (normed * (1 + weight.float())).type_as(x)``) and OLMo 2 (models/olmo2/modeling_olmo2.py,
# Olmo2Attention: Olmo2RMSNorm over the whole num_heads x head_dim and num_kv_heads x head_dim
# widths, ``(self.weight * hidden_states).to(input_dtype)`` on the fp32 normalised tensor) keep
# the fp32 copy and the fp32 normalised tensor: 8 bytes per element (memory.norms). A fused
# norm kernel keeps its input only (a bytes).
# The rotary embedding that follows keeps only its cos/sin tables; attention keeps the
# normalised, rotated q and k (memory.activations' Q, K, V). Llama 4 (models/llama4/
# modeling_llama4.py, Llama4TextL2Norm: ``_norm(x.float()).type_as(x)``, no weight, after the
# rotary embedding and only in the blocks that use it) keeps the fp32 copy and the rstd: 4 bytes
# per element, in n_qk_norm_layers of the blocks (the figure is the mean block's).


def qk_norm_saved_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one block's QK norms keep for backward, per micro-batch on one rank (see the
    comment above); 0 without QK norm, for frozen blocks and under full recomputation. q and
    k come out of column-parallel projections, so tensor parallelism splits them."""
    if not m.qk_norm or lay.recompute == "full" or setup.finetune.freezes_base:
        return 0
    a = setup.precision_spec.activation_bytes
    tokens = lay.tokens_per_rank
    if kernels == "fused":
        per_element = a
    elif m.qk_norm == "l2":
        per_element = 4
    else:
        per_element = FP32_NORM_BYTES if keeps_fp32_normalised(m) else 4 + a
    rows = 2 if m.qk_norm == "full" else m.n_heads + m.n_kv_heads     # fp32 rstd per row
    share = (m.n_qk_norm_layers or m.n_layers) / m.n_layers
    return int(tokens * ((m.q_dim + m.kv_dim) * per_element + 4 * rows) * share / lay.tp)


def attention_saved_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Everything this module adds to memory.activations' generic block: MLA's latents and
    narrower values, and the QK norms' saved tensors (bytes per block, per micro-batch, on
    one rank). memory.shapes can call it where it calls mla_saved_delta_bytes, for every
    model with ``m.is_mla or m.qk_norm``."""
    return (mla_saved_delta_bytes(m, setup, lay, kernels) + qk_norm_saved_bytes(m, setup, lay, kernels)
            + indexer_saved_bytes(m, setup, lay, kernels))


def indexer_saved_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes one block's DeepSeek-V3.2 indexer keeps for backward, per micro-batch on one rank
    (planner.models.dsa.indexer_saved_bytes_per_token: fused kernels only, ASSUMED; transformers'
    eager model keeps none). The indexer runs unsplit on every tp rank, over the rank's cp share
    of the tokens; nothing under full recomputation or for frozen blocks."""
    if not m.index_n_heads or lay.recompute == "full" or setup.finetune.freezes_base:
        return 0
    per_token = indexer_saved_bytes_per_token(m, lay.seq_len, setup.precision_spec.activation_bytes,
                                              fused=kernels == "fused")
    return int(lay.tokens_per_rank * per_token)


def attention_saved_delta_full_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """attention_saved_delta_bytes without recomputation (what a recomputed block rebuilds)."""
    return attention_saved_delta_bytes(m, setup, replace(lay, recompute="none"), kernels)


# gpt-oss's eager attention (transformers 5.24.0 models/gpt_oss/modeling_gpt_oss.py,
# eager_attention_forward; the only attention transformers runs it with): the scores get one
# sink logit per head as an extra column (``torch.cat([attn_weights, sinks], dim=-1)``), the
# row maximum is subtracted (``max(dim=-1)`` keeps its int64 indices), and the softmax runs in
# the scores' own dtype (``F.softmax(..., dtype=combined_logits.dtype)``), not in fp32 as
# Llama's eager attention does. Autograd keeps the softmax output, s + 1 columns in the compute
# dtype, of which the scores are a view, and the indices; nothing in fp32.
SOFTMAX_TERM = "softmax output (b x heads x s x s)"


def sink_eager_scores_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """What gpt-oss's eager attention keeps of its scores, per block, micro-batch and rank:
    n_heads x s x ((s + 1) x a + 8) per sequence (see the comment above); 0 without sinks,
    with flash attention or under full recomputation."""
    if not m.attention_sinks or setup.attention != "eager" or lay.recompute == "full":
        return 0
    a = setup.precision_spec.activation_bytes
    s = lay.seq_len_per_rank
    return int(lay.micro_batch * m.n_heads * s * ((s + 1) * a + 8) / lay.tp)


def sink_eager_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """sink_eager_scores_bytes less what memory.activations counts for the softmax (its
    generic eager term: an fp32 softmax and its 16-bit cast); negative for gpt-oss in 16 bits.
    memory.shapes can add it per shape like mla_saved_delta_bytes."""
    ours = sink_eager_scores_bytes(m, setup, lay)
    if not ours:
        return 0
    generic = sum(t.bytes for t in layer_activation_terms(m, setup, lay, kernels) if t.name == SOFTMAX_TERM)
    return ours - generic
