"""Mixture-of-experts blocks in memory (per shape, gathered in memory.shapes): what a MoE
model's blocks keep beyond memory.activations' generic MoE block (dense blocks, shared experts,
transformers' own MoE tensors: moe_block_delta_bytes), and under routing imbalance the extra
tokens the most loaded expert-parallel rank's experts receive and keep for backward
(TrainingSetup.moe_imbalance; its source there)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from planner.layouts.layout import Layout
from planner.memory.activations import PERMUTED_TOKENS, block_terms
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup

# the saved tensors of a MoE block that live on the experts' side of the dispatch: the
# expert MLP's tensors and the tokens the dispatch permuted to them (memory.activations)
EXPERT_SIDE_PREFIXES = ("MLP ", PERMUTED_TOKENS, "silu written", "gelu")
MLP_INPUT = "MLP input"     # the norm's output: the MLP's input, on the tokens' side of the dispatch


def expert_side_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes of one block's saved tensors on the experts' side of the dispatch (the routed
    copies: k per token), per micro-batch on one rank, balanced; 0 for dense models and
    under full recomputation (the block keeps its input only)."""
    if not m.is_moe or lay.recompute == "full":
        return 0
    return sum(t.bytes for t in block_terms(m, setup, lay, kernels)
               if t.name.startswith(EXPERT_SIDE_PREFIXES) and not t.name.startswith(MLP_INPUT))


def imbalance_extra_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Extra bytes one block of the most loaded expert-parallel rank keeps under routing
    imbalance: (moe_imbalance - 1) x its expert-side tensors (the dispatched tokens in the
    all-to-all receive buffer, which the expert GEMMs keep for backward, and the expert
    MLP's tensors). Without expert parallelism a rank holds every expert and receives k
    copies of each of its tokens however they are routed: no change."""
    imb = setup.moe_imbalance
    if not m.is_moe or lay.ep <= 1 or imb == 1.0:
        return 0
    return int((imb - 1.0) * expert_side_bytes(m, setup, lay, kernels))


# ---- what a MoE model's blocks keep beyond memory.activations' generic MoE block
# memory.activations counts every block of a MoE model as k routed experts per token (the
# "MLP ..." term x k), the permuted tokens and the fp32 router probabilities. The blocks of the
# 2025-2026 families differ (per block, per token; a = activation bytes, f = the routed
# expert's width, T tokens of the micro-batch):
#
# * dense blocks (DeepSeek-V3's first_k_dense_replace, Llama 4's interleave_moe_layer_step)
#   keep one dense MLP of dense_d_ff (the generic MLP term at k = 1), no router, no dispatch;
# * shared experts (DeepSeek-V3's n_shared_experts, Llama 4's shared_expert) run every token
#   through an MLP of shared_d_ff beside the routed experts: the generic MLP term at that width.
#   Both hold in Megatron-Core too (0.16.1: transformer/moe/shared_experts.py, SharedExpertMLP, an
#   MLP on every token; models/gpt/gpt_layer_specs.py parses moe_layer_freq into expert and dense
#   layers), so these two apply under fused kernels as well;
# * transformers 5.24.0's grouped-GEMM experts (integrations/moe.py, grouped_mm_experts_forward,
#   the default experts implementation of Qwen3-MoE, DeepSeek-V3 and gpt-oss) weight the expert
#   output by the routing weight (``weighted_out = proj_out * sample_weights_g.unsqueeze(-1)``),
#   which keeps the k x h expert output, and keep three int64 index vectors of k T entries
#   (the sort's ``perm``, the gather index ``perm // num_top_k``, ``inv_perm``) and the router's
#   int64 top-k indices: k (h a + 4 x 8) per token;
# * gpt-oss's clamped SwiGLU (models/gpt_oss/modeling_gpt_oss.py, GptOssExperts._apply_gate:
#   clamp, ``gate * sigmoid(gate * alpha)``, ``(up + 1) * glu``) keeps the clamped gate, the
#   sigmoid, up + 1 and the glu beside the fused gate_up output and the product: 3 f-wide
#   tensors per routed copy more than the gate, up, activation and product of the generic term;
# * DeepSeek-V3's router (models/deepseek_v3/modeling_deepseek_v3.py, DeepseekV3TopkRouter:
#   ``F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))``) keeps an
#   fp32 copy of its input: 4 h per token;
# * Llama 4's Llama4TextMoe (models/llama4/modeling_llama4.py) runs every token through every
#   expert: ``routed_in = hidden_states.repeat(num_experts, 1)`` is scaled by the router scores
#   (both kept: the repeated input and the scaled one, 2 E h a, and the E scores in a) and the
#   experts' batched matmul keeps the fused gate_up output, the activation and the product for
#   all E copies (the generic MLP term at E in place of k).
#
# The transformers-specific terms apply where the planner's kernels are transformers' own eager
# modules (kernels "eager" or "amp": --stack hf and deepspeed, or auto without tp/pp/cp); fused
# kernels (Megatron-Core's grouped GEMM, which weights the probabilities into the unpermute) keep
# the dispatched-token sizing; torchtitan's block terms (memory.activations.titan_block_terms)
# are its own: no change there. Checked against autograd's saved tensors of each transformers
# block in tests/test_memory_moe_blocks.py.
ROUTED_PREFIXES = ("MLP ", PERMUTED_TOKENS, "router probabilities")


def is_routed_term(name: str) -> bool:
    """Whether memory.activations' term ``name`` is one of a MoE block's routed tensors (the
    expert MLP, the permuted tokens, the router's probabilities), not the MLP's input."""
    return name.startswith(ROUTED_PREFIXES) and not name.startswith(MLP_INPUT)
HF_KERNELS = ("eager", "amp")
GROUPED_GEMM_TYPES = ("qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next", "qwen3_5_moe_text", "glm4_moe",
                      "minimax_m2", "deepseek_v32")
# Glm4MoeTopkRouter (modeling_glm4_moe.py) casts its input to fp32 as DeepseekV3TopkRouter does
FP32_ROUTER_INPUT_TYPES = ("deepseek_v3", "glm4_moe", "deepseek_v32")
ALL_EXPERTS_TYPES = ("llama4_text", "llama4")
CLAMPED_SWIGLU_TYPES = ("gpt_oss",)


def grouped_experts_bytes_per_token(m: ModelSpec, a: int) -> int:
    """What transformers' grouped experts keep per token beyond the generic MoE terms under its
    eager modules (the comment above): the k x h expert output and four int64 index vectors of k
    entries, k (h a + 32); 0 for the families that do not run them."""
    return m.n_experts_per_token * (m.d_model * a + 4 * 8) if m.model_type in GROUPED_GEMM_TYPES else 0


def _mlp_term_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str, copies: int) -> int:
    """The generic MLP term (memory.activations) at ``copies`` experts per token."""
    per_copy = sum(t.bytes for t in block_terms(m, setup, lay, kernels)
                   if t.name.startswith("MLP ") and not t.name.startswith(MLP_INPUT))
    return per_copy * copies // max(1, m.n_experts_per_token)


@lru_cache(maxsize=64)
def _with_d_ff(m: ModelSpec, d_ff: int) -> ModelSpec:
    """``m`` with MLP width ``d_ff`` (a shared expert's, a dense block's): one copy per width."""
    return replace(m, d_ff=d_ff)


def moe_block_delta_bytes(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str) -> int:
    """Bytes a MoE model's mean block keeps beyond memory.activations' generic MoE block, per
    micro-batch on one rank (see the comment above): its dense blocks, shared experts and
    transformers' MoE tensors. 0 for dense models, frozen blocks, torchtitan's block, under
    full recomputation and for hybrids, whose layers memory.hybrid sizes letter by letter."""
    if (not m.is_moe or lay.recompute == "full" or kernels == "torchtitan"
            or setup.finetune.freezes_base or m.layer_pattern):
        return 0
    a = setup.precision_spec.activation_bytes
    tokens = lay.tokens_per_rank
    k, n_experts = m.n_experts_per_token, m.n_experts
    generic = sum(t.bytes for t in block_terms(m, setup, lay, kernels) if is_routed_term(t.name))
    extra_moe = 0
    if m.shared_d_ff:
        extra_moe += _mlp_term_bytes(_with_d_ff(m, m.shared_d_ff), setup, lay, kernels, 1)
    if kernels in HF_KERNELS:
        if m.model_type in ALL_EXPERTS_TYPES:
            routed_all = _mlp_term_bytes(m, setup, lay, kernels, n_experts) - _mlp_term_bytes(m, setup, lay, kernels, k)
            repeat = tokens * n_experts * (2 * m.d_model * a + a) - tokens * k * m.d_model * a
            extra_moe += routed_all + repeat // lay.tp
        extra_moe += int(tokens * grouped_experts_bytes_per_token(m, a)) // lay.tp
        if m.model_type in CLAMPED_SWIGLU_TYPES:
            extra_moe += tokens * k * 3 * m.d_ff * a // lay.tp
        if m.model_type in FP32_ROUTER_INPUT_TYPES:
            extra_moe += tokens * m.d_model * 4 // (lay.tp if lay.sp else 1)
    dense_block = _mlp_term_bytes(_with_d_ff(m, m.dense_d_ff or m.d_ff), setup, lay, kernels, 1)
    n_moe, n_dense = m.n_moe_layers, m.n_dense_layers
    total = n_moe * extra_moe + n_dense * (dense_block - generic)
    return int(total / m.n_layers)
