"""DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): the lightning indexer beside MLA, and the
top-k keys each query attends to.

Source: DeepSeek-V3.2 (arXiv:2512.02556), Sec. 2.1: a lightning indexer of H^I heads of D^I
dimensions scores every preceding token, I(t, s) = sum_j w(t, j) ReLU(q(t, j) . k(s)), and the
main MLA attention of query t runs over the index_topk (2,048) keys of highest score only; the
indexer is trained by a KL loss on its own, its input detached from the main model's graph.
Shapes from transformers 5.x's DeepseekV32Indexer (models/deepseek_v32/modeling_deepseek_v32.py):
wq_b (q_lora_rank -> H^I D^I, reading MLA's normalised query latent), wk (h -> D^I, one key head
shared by all index heads), k_norm (LayerNorm of D^I: weight and bias), weights_proj (h -> H^I).
transformers computes the scores over all keys and masks, runs the indexer under no_grad, and
folds the top-k into the attention mask (dense attention); the planner counts what DSA's kernels
run (below), and tests/test_deepseek_v32.py checks the difference against FlopCounterMode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner.models.spec import ModelSpec


def indexer_params(m: ModelSpec) -> int:
    """One block's lightning indexer: wq_b, wk, k_norm (LayerNorm: weight and bias), weights_proj."""
    if not m.index_n_heads:
        return 0
    heads, dim = m.index_n_heads, m.index_head_dim
    return m.q_lora_rank * heads * dim + m.d_model * dim + 2 * dim + m.d_model * heads


def attended_keys(m: ModelSpec, seq_len: int) -> int:
    """Keys each query's attention runs over in the model-FLOPs convention (the full s, no causal
    halving: timing.flops): s for dense attention, min(s, index_topk) under DSA, whose sparse
    kernel gathers exactly the selected keys (arXiv:2512.02556 Sec. 2.1)."""
    return min(seq_len, m.index_topk) if m.index_topk else seq_len


def indexer_score_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the indexer's scores over all s keys (the full s x s, as the
    paper's O(L^2) indexer and transformers both compute them): per key, H^I dot products of D^I
    and the H^I-weighted sum, 2 s (H^I D^I + H^I). Its projections are GEMMs (models.matmuls)."""
    if not m.index_n_heads:
        return 0.0
    return 2.0 * seq_len * (m.index_n_heads * m.index_head_dim + m.index_n_heads)


def sparse_attention_share(m: ModelSpec, seq_len: int) -> float:
    """The share of the s x s scores DSA's attention kernel computes: query p attends to
    min(p, k) keys, the count a sliding window of k keys gives (timing.kernels'
    local_attention_share): (k - k (k - 1) / (2 s)) / s for k <= s, the causal half beyond."""
    s, k = seq_len, min(m.index_topk, seq_len)
    return min(0.5, (k - k * (k - 1) / (2 * s)) / s)


def indexer_saved_bytes_per_token(m: ModelSpec, seq_len: int, a: int, fused: bool) -> float:
    """Bytes per token one block's indexer keeps for backward. Fused kernels (DeepSeek's training,
    ASSUMED from arXiv:2512.02556 Sec. 2.1: the indexer learns from its own KL loss, so its query
    (H^I D^I), key (D^I) and head weights (H^I) are kept in the activation dtype, and the sparse
    attention's backward reads the min(s, k) selected indices, int32). transformers' eager model
    runs the indexer under no_grad and keeps none of it: 0."""
    if not m.index_n_heads or not fused:
        return 0.0
    return (m.index_n_heads * m.index_head_dim + m.index_head_dim + m.index_n_heads) * a \
        + 4 * attended_keys(m, seq_len)


def indexer_working_bytes_per_token(m: ModelSpec, seq_len: int, fused: bool) -> float:
    """Bytes per token the indexer's scores take while a block runs it (not kept for backward).
    transformers (DeepseekV32Indexer.forward, under no_grad): ``torch.matmul(q.float(),
    k.transpose(-1, -2).float().unsqueeze(1))`` broadcasts the one key head over the queries and
    copies it, a (batch, s, D^I, s) fp32 tensor, beside which the matmul writes H^I fp32 scores per
    key: (D^I + H^I) x 4 bytes per key (seen with a dispatch mode on the tiny config: the copy,
    64 MiB at 2 x 512 tokens and D^I 32, and the scores at the forward's peak). DeepSeek's fused
    kernel: the head-summed fp32 score per key it takes the top-k from, 4 bytes per key (ASSUMED,
    arXiv:2512.02556 Sec. 2.1)."""
    if not m.index_n_heads:
        return 0.0
    return (4.0 if fused else (m.index_head_dim + m.index_n_heads) * 4.0) * seq_len
