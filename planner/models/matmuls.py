"""The matrix multiplies of a model's blocks, as its own code runs them: the one list that
model FLOPs (timing.flops) and GEMM times (timing.kernels) both read.

Each entry is one GEMM (or one group of expert GEMMs) per token, with the blocks that hold
it and how tensor parallelism splits it. Shapes follow transformers 5's modeling files
(modeling_<type>.py) and, for the fused projections, Megatron-Core's layers (one QKV GEMM,
one gate+up GEMM: megatron/core/transformer/attention.py linear_qkv, mlp.py linear_fc1),
which multiply the same FLOPs in fewer launches.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.models.spec import ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Matmul:
    """One GEMM of a block, per token: (tokens x d_in) @ (d_in x d_out).

    ``visits``: how many times a token passes through it (k for the routed experts: each token
    visits k of them; 1 otherwise). ``n_blocks``: blocks that hold it (0: every block).
    A hybrid's "mamba" GEMMs (the Mamba-2 and gated DeltaNet in_proj and out_proj) are timed and
    split like "attention" ones.
    ``split``: how tensor parallelism splits it: "column" (d_out / tp), "row" (d_in / tp),
    "none" (every tp rank runs it whole: the router, MLA's down-projections, which
    megatron-core 0.16 keeps unsplit, transformer/multi_latent_attention.py linear_q_down_proj
    and linear_kv_down_proj built with parallel_mode "duplicated"). ``kind``: "attention",
    "mlp" (a dense MLP or shared experts), "expert" (routed experts, grouped) or "router"
    (kept in 16 bits under FP8 recipes).
    """

    name: str
    d_in: int
    d_out: int
    kind: str
    split: str
    visits: int = 1
    n_blocks: int = 0

    def flops_per_token(self) -> float:
        """Forward FLOPs per token of this GEMM in one block that holds it (2 per multiply-add)."""
        return 2.0 * self.d_in * self.d_out * self.visits


def mtp_eh_proj(m: ModelSpec) -> Matmul:
    """The projection each MTP module runs before its layers: the normed hidden state and the
    next token's embedding concatenated (2h) down to h (DeepSeek-V3, arXiv:2412.19437, Sec. 2.2,
    M_k; megatron-core's MultiTokenPredictionLayer eh_proj), split by tp over its output. The one
    shape the MTP modules' FLOPs (timing.flops.mtp_flops), time (timing.layer) and parameters
    (memory.shapes) read."""
    return Matmul(name="mtp_eh_proj", d_in=2 * m.d_model, d_out=m.d_model, kind="mlp", split="column")


def _attention_matmuls(m: ModelSpec) -> tuple[Matmul, ...]:
    """Attention projections. MLA (DeepSeek-V2 arXiv:2405.04434 Sec. 2.1, transformers'
    DeepseekV3Attention): q_a (h -> q_lora) then q_b (q_lora -> n_heads x 192), or a full q_proj;
    kv_a (h -> kv_lora + rope 64), kv_b (kv_lora -> n_heads x (nope 128 + v 128)); o (n_heads x
    v -> h), and DeepSeek-V3.2's indexer projections (_indexer_matmuls). Others: one fused QKV
    (h -> q + 2 kv, GQA/MQA narrowing kv) and o (q -> h)."""
    h = m.d_model
    if m.is_mla:
        qk, v, heads = m.head_dim, m.value_head_dim, m.n_heads
        if m.q_lora_rank:
            q: tuple[Matmul, ...] = (
                Matmul(name="q_down", d_in=h, d_out=m.q_lora_rank, kind="attention", split="none"),
                Matmul(name="q_up", d_in=m.q_lora_rank, d_out=heads * qk, kind="attention", split="column"))
        else:
            q = (Matmul(name="q", d_in=h, d_out=heads * qk, kind="attention", split="column"),)
        return q + (
            Matmul(name="kv_down", d_in=h, d_out=m.kv_lora_rank + m.qk_rope_head_dim, kind="attention",
                   split="none"),
            Matmul(name="kv_up", d_in=m.kv_lora_rank, d_out=heads * (qk - m.qk_rope_head_dim + v),
                   kind="attention", split="column"),
            Matmul(name="o", d_in=heads * v, d_out=h, kind="attention", split="row")) + _indexer_matmuls(m)
    q_out = 2 * m.q_dim if m.attention_gate else m.q_dim      # Qwen3NextAttention's q_proj: queries and gate
    return (Matmul(name="qkv", d_in=h, d_out=q_out + 2 * m.kv_dim, kind="attention", split="column"),
            Matmul(name="o", d_in=m.q_dim, d_out=h, kind="attention", split="row"))


def _indexer_matmuls(m: ModelSpec) -> tuple[Matmul, ...]:
    """DeepSeek-V3.2's lightning indexer (planner.models.dsa): wq_b (q_lora -> H^I D^I), wk
    (h -> D^I), weights_proj (h -> H^I); every tp rank runs them whole (ASSUMED: one key head
    and a sum over the index heads, as MLA's down-projections stay unsplit). None without DSA."""
    if not m.index_n_heads:
        return ()
    heads, dim = m.index_n_heads, m.index_head_dim
    return (Matmul(name="indexer_q", d_in=m.q_lora_rank, d_out=heads * dim, kind="attention", split="none"),
            Matmul(name="indexer_k", d_in=m.d_model, d_out=dim, kind="attention", split="none"),
            Matmul(name="indexer_weights", d_in=m.d_model, d_out=heads, kind="attention", split="none"))


def _mlp(name: str, m: ModelSpec, width: int, kind: str, visits: int = 1, n_blocks: int = 0) -> tuple[Matmul, ...]:
    mats_in = 2 if m.gated_mlp else 1
    return (Matmul(name=f"{name}_in", d_in=m.d_model, d_out=mats_in * width, kind=kind, split="column",
                   visits=visits, n_blocks=n_blocks),
            Matmul(name=f"{name}_out", d_in=width, d_out=m.d_model, kind=kind, split="row", visits=visits,
                   n_blocks=n_blocks))


def block_matmuls(m: ModelSpec) -> tuple[Matmul, ...]:
    """Every GEMM of ``m``'s blocks. Dense models: one MLP of d_ff per block. MoE models (on
    their n_moe_layers blocks): the router (h -> E), the routed experts (k visits of d_ff each,
    gated: gate+up and down), the shared experts (shared_d_ff, every token); their dense blocks
    (DeepSeek-V3's first 3, Llama 4's interleaved ones, Qwen3-MoE's mlp_only_layers) one MLP of
    dense_d_ff. The LM head and MTP modules are outside the blocks (flops.head_flops).
    A generic model (planner.models.generic): one GEMM of d_model x n whose FLOPs are the mean
    block's measured forward FLOPs that do not grow with the sequence, so that the kernel times
    run at the measured work (its shapes are not known one by one)."""
    if m.profile is not None:
        per_token = m.profile.mean_block("fwd_flops_per_token")
        return (Matmul(name="measured", d_in=m.d_model, d_out=max(1, round(per_token / (2 * m.d_model))),
                       kind="mlp", split="none"),)
    if m.layer_pattern:
        return _hybrid_matmuls(m)
    att = _attention_matmuls(m)
    if not m.is_moe:
        return att + _mlp("mlp", m, m.d_ff, "mlp")
    n_moe = m.n_moe_layers
    out = att + (Matmul(name="router", d_in=m.d_model, d_out=m.n_experts, kind="router", split="none",
                        n_blocks=n_moe),)
    out += _mlp("experts", m, m.d_ff, "expert", visits=m.n_experts_per_token, n_blocks=n_moe)
    if m.shared_d_ff:
        out += _mlp("shared", m, m.shared_d_ff, "mlp", n_blocks=n_moe)
    if m.n_dense_layers:
        out += _mlp("dense_mlp", m, m.dense_d_ff or m.d_ff, "mlp", n_blocks=m.n_dense_layers)
    return out


def _hybrid_matmuls(m: ModelSpec) -> tuple[Matmul, ...]:
    """A hybrid's GEMMs, each in the layers of its letter (planner.models.hybrid). M: the Mamba-2
    in_proj (h -> z, x, B, C, dt) and out_proj (d_inner -> h); megatron-core 0.16.1's MambaMixer
    splits in_proj by columns and out_proj by rows over tp (ssm/mamba_mixer.py, lines 268 and
    367: in_proj and out_proj built from the layer spec's column- and row-parallel linears), so
    a layer needs one tp all-reduce per pass, as an attention or MLP layer does. *: QKV and O.
    -: up and down (and gate when gated). E: the router, the k routed experts (in the latent width
    under latent MoE, with fc1/fc2 latent projections h -> L -> h around them, column and row split
    like an MLP), the shared expert and Qwen3-Next's shared_expert_gate (h -> 1, unsplit). G: gated
    DeltaNet's in_proj_qkvz and in_proj_ba (h -> 2K + 2V + 2 Hv) and out_proj (V -> h);
    megatron-core 0.16.1's GatedDeltaNet builds one column-parallel in_proj of that width and a
    row-parallel out_proj (ssm/gated_delta_net.py, in_proj_dim, lines 139-160 and 209), every
    head split by tp. Kimi Delta Attention (planner.models.kimi): q/k/v_proj, b_proj, f_a_proj and
    g_a_proj (h -> 2K + V + Hv + 2 r) and f_b_proj and g_b_proj (r -> K + V), ASSUMED split by
    columns as gated DeltaNet's in_proj (megatron-core 0.16.1 has no KDA; the r-wide a-projections
    would be replicated), o_proj row split. The scans and the convs are not GEMMs (hybrid.ssd_scan_flops_per_token,
    deltanet.delta_rule_flops_per_token)."""
    h, n_moe = m.d_model, m.n_moe_layers
    in_proj = 2 * m.mamba_inner + 2 * m.ssm_groups * m.ssm_state + m.mamba_heads
    out: tuple[Matmul, ...] = ()
    if m.n_deltanet_layers:
        gdn_in = 2 * m.gdn_key_width + 2 * m.gdn_value_width + 2 * m.gdn_value_heads
        if m.kda_gate_rank:     # KDA: q, k, v, b and the gates' low-rank a-projections, then their b-projections
            gdn_in = m.gdn_conv_dim + m.gdn_value_heads + 2 * m.kda_gate_rank
            out += (Matmul(name="kda_gates", d_in=m.kda_gate_rank, d_out=m.gdn_key_width + m.gdn_value_width,
                           kind="mamba", split="column", n_blocks=m.n_deltanet_layers),)
        out += (Matmul(name="deltanet_in", d_in=h, d_out=gdn_in, kind="mamba", split="column",
                       n_blocks=m.n_deltanet_layers),
                Matmul(name="deltanet_out", d_in=m.gdn_value_width, d_out=h, kind="mamba", split="row",
                       n_blocks=m.n_deltanet_layers))
    if m.n_mamba_layers:
        out += (Matmul(name="mamba_in", d_in=h, d_out=in_proj, kind="mamba", split="column",
                       n_blocks=m.n_mamba_layers),
                Matmul(name="mamba_out", d_in=m.mamba_inner, d_out=h, kind="mamba", split="row",
                       n_blocks=m.n_mamba_layers))
    if m.n_attention_layers:
        out += tuple(Matmul(name=a.name, d_in=a.d_in, d_out=a.d_out, kind=a.kind, split=a.split,
                            n_blocks=m.n_attention_layers) for a in _attention_matmuls(m))
    if m.n_mlp_layers:
        out += _mlp("dense_mlp", m, m.dense_d_ff, "mlp", n_blocks=m.n_mlp_layers)
    if n_moe:
        width = m.moe_latent or h
        out += (Matmul(name="router", d_in=h, d_out=m.n_experts, kind="router", split="none", n_blocks=n_moe),
                Matmul(name="experts_in", d_in=width, d_out=(2 if m.gated_mlp else 1) * m.d_ff, kind="expert",
                       split="column",
                       visits=m.n_experts_per_token, n_blocks=n_moe),
                Matmul(name="experts_out", d_in=m.d_ff, d_out=width, kind="expert", split="row",
                       visits=m.n_experts_per_token, n_blocks=n_moe))
        if m.moe_latent:
            out += (Matmul(name="latent_in", d_in=h, d_out=m.moe_latent, kind="mlp", split="column", n_blocks=n_moe),
                    Matmul(name="latent_out", d_in=m.moe_latent, d_out=h, kind="mlp", split="row", n_blocks=n_moe))
        if m.shared_d_ff:
            out += _mlp("shared", m, m.shared_d_ff, "mlp", n_blocks=n_moe)
        if m.shared_expert_gate:
            out += (Matmul(name="shared_gate", d_in=h, d_out=1, kind="router", split="none", n_blocks=n_moe),)
    return out


def blocks_holding(m: ModelSpec, mm: Matmul) -> int:
    """How many of ``m``'s blocks run ``mm``."""
    return mm.n_blocks or m.n_layers


def mean_block_share(m: ModelSpec, mm: Matmul) -> float:
    """The share of blocks that run ``mm``: the mean block runs it this many times."""
    return blocks_holding(m, mm) / m.n_layers
