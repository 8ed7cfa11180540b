"""FLOPs of a block, of the LM head and of a training step (2 FLOPs per multiply-add).

FLOPs follow the papers' convention: attention scores count the full s x s (no causal
halving), norms and element-wise work are not counted. "Model" FLOPs exclude recomputation
(MFU, Chowdhery et al. 2022, PaLM, App. B; Korthikanti et al. 2022); "hardware" FLOPs include
it (the convention of Narayanan et al.'s Table 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.models.spec import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerFlops:
    """Forward FLOPs of one transformer block, per token (2 FLOPs per multiply-add).

    qkv: 2 h (q + 2 kv), GQA narrows K and V to n_kv_heads; scores: Q K^T and the
    attention-weighted V, 2 s q each over the full s x s (Megatron's convention);
    out: 2 q h; mlp: 2 h f per d_model x d_ff matrix, three for a gated MLP, two
    otherwise, times the k experts each token visits, plus the router's 2 h E.
    """

    qkv: float
    scores: float
    out: float
    mlp: float

    @property
    def total(self) -> float:
        return self.qkv + self.scores + self.out + self.mlp


def layer_flops(m: ModelSpec, seq_len: int) -> LayerFlops:
    """Forward FLOPs per token of one block (see LayerFlops)."""
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    k = m.n_experts_per_token if m.is_moe else 1
    mats = 3 if m.gated_mlp else 2
    router = 2 * h * m.n_experts if m.is_moe else 0
    return LayerFlops(qkv=2 * h * (q + 2 * kv), scores=4 * seq_len * q, out=2 * q * h,
                      mlp=k * mats * 2 * h * f + router)


def head_flops(m: ModelSpec) -> float:
    """Forward FLOPs per token of the LM head (2 h V; BERT's MLM transform adds 2 h^2)."""
    return 2 * m.d_model * m.vocab_size + (2 * m.d_model**2 if m.mlm_head else 0)


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token without recomputation: backward is twice forward.

    For a GPT block (ffn 4h, no GQA) this is 72 l h^2 (1 + s/6h + V/12lh) per token,
    Korthikanti et al. 2022, arXiv:2205.05198, Eq. 7 ("model FLOPs").
    """
    return 3 * (m.n_layers * layer_flops(m, seq_len).total + head_flops(m))


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str) -> float:
    """Training FLOPs per token the GPUs execute, recomputation included.

    full: every block runs its forward twice. For a GPT block that gives
    96 l h^2 (1 + s/6h + V/16lh) per token, Narayanan et al. 2021, arXiv:2104.04473, Eq. 3.
    selective: the attention scores (Q K^T and scores x V) are recomputed, Korthikanti et
    al. 2022, Sec. 4.2, i.e. 4 s q more forward FLOPs per block.
    """
    lf = layer_flops(m, seq_len)
    extra = {"none": 0.0, "selective": lf.scores, "full": lf.total}[recompute]
    return model_flops_per_token(m, seq_len) + m.n_layers * extra


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFlops:
    model_flops: float        # no recomputation (for MFU)
    hardware_flops: float     # with recomputation


def flops_per_step(m: ModelSpec, seq_len: int, n_sequences: int, recompute: str = "none") -> StepFlops:
    """FLOPs of one optimizer step over ``n_sequences`` sequences of ``seq_len`` tokens.

    Whatever trains, these count full training's FLOPs (6N per token for the weights, as
    Kaplan's and PaLM's MFU do): under LoRA, QLoRA and freeze the GPUs skip the frozen
    weights' gradients (layer_time), so MFU and HFU there compare the step with full
    training's work, not with the work the GPUs did."""
    tokens = n_sequences * seq_len
    return StepFlops(model_flops=tokens * model_flops_per_token(m, seq_len),
                     hardware_flops=tokens * hardware_flops_per_token(m, seq_len, recompute))
