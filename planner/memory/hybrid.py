"""What a hybrid Mamba-2 / attention / MoE model's layers keep for backward (Nemotron-H,
Nemotron 3; planner.models.hybrid), per micro-batch on one rank, as the mean layer the memory
model sizes: each letter's tensors weighted by its share of the layers.

Attention ('*'), MoE ('E') and MLP ('-') layers keep what memory.activations' block keeps for
its attention half or its MLP half (one norm per layer, each layer's own norm output as its
input); Mamba-2 layers ('M') are written here, for the two implementations that run them:

* fused (Megatron-Core's MambaMixer on mamba_ssm's kernels): the in_proj output zxbcdt and the
  scan output are what mamba_ssm's MambaSplitConv1dScanCombinedFn saves (mamba_ssm
  ops/triton/ssd_combined.py, ``ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias,
  out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, ...)``; the conv output
  and dt are recomputed in its backward). megatron-core 0.16.1 (ssm/mamba_mixer.py, lines
  659-684 and 447) calls it without the norm and the output projection, then runs its gated
  RMSNorm (which keeps its input y and an fp32 rstd per group) and out_proj (a row-parallel
  linear, which keeps its input): so a d more than mamba_ssm's own Mamba2 module keeps.
  MODELLED from those sources, no GPU tracker here;
* transformers' torch path (kernels eager/amp: mamba2_chunk_scan and causal_conv1d_fn of
  modeling_nemotron_h.py, what runs without mamba_ssm): read tensor by tensor from autograd's
  saved tensors of one NemotronHMamba2Mixer under fake tensors (torch 2.13, transformers 5.x;
  tests/test_hybrid.py checks the total against the measurement), see torch_mamba_bytes_per_token.

Tensor parallelism splits every d_inner-wide tensor (megatron-core's MambaMixer holds
nheads / tp heads and ngroups / tp groups per rank); h-wide ones only under sequence
parallelism.
"""

from __future__ import annotations

from dataclasses import replace

from planner.layouts.layout import Layout
from planner.memory.activations import PERMUTED_TOKENS, ActivationTerm
from planner.memory.moe import grouped_experts_bytes_per_token
from planner.models.spec import ModelSpec
from planner.training.setup import TrainingSetup
from planner.units import ceil_div

# memory.activations' term names, by the half of the block that keeps them
_NORM = "norm inputs"
_MLP_HALF = ("MLP", PERMUTED_TOKENS, "router probabilities", "dropout mask after the MLP")


def _half(name: str) -> str:
    if name.startswith(_NORM):
        return "norm"
    if name.startswith(_MLP_HALF) or "written in Python ops" in name:
        return "mlp"
    return "attention"


def torch_mamba_bytes_per_token(m: ModelSpec, seq_len: int, a: int) -> float:
    """Bytes per token one Mamba-2 mixer keeps under transformers' torch path (a: activation
    bytes; the mixer's input norm is not included), for a sequence of at least two chunks.
    With d = d_inner, H heads of P, G groups of state N, chunk Q, c = ceil(s / Q) chunks:

    - in_proj's output (the conv's input is a view of it): a (2 d + 2 G N + H);
    - the conv output, s + K - 1 positions (F.conv1d pads both sides; silu keeps it): a (d + 2 G N)(s + K - 1) / s;
    - dt + dt_bias and its softplus (softplus, clamp): 2 a H; dt in fp32 twice, the decays
      exp(A_cumsum) at the chunk ends and per position: 16 H;
    - x in fp32, x dt, and their contiguous copies for the two einsums that read x dt: 16 d;
    - B and C repeated to every head (fp32), B times its decays, and the einsums' copies: 20 H N;
    - the intra-chunk decays L = exp(segsum), the scores C B^T and the masked scores' copy: 12 H Q;
    - the chunk states (c + 1 with the initial one) and the copy C h reads (c): 4 H P N (2c + 1) / s;
    - C h, the gated RMSNorm's fp32 gate, silu(gate), product, its square's input and the
      normalised output: 24 d, and its rstd per group 4 G; out_proj's 16-bit input: a d;
    - the segsum masks, 2 Q^2 bytes per sequence.

    Measured 106,005 bytes per token at h 512, d 1024, H 16, P 64, G 2, N 64, Q 128, s 256
    (this sum gives the same); at s = Q (one chunk) torch's einsums skip copies and it keeps less
    (96,955 measured at s 128)."""
    d, hh, p, g, n, q = m.mamba_inner, m.mamba_heads, m.mamba_head_dim, m.ssm_groups, m.ssm_state, m.ssm_chunk
    s = max(seq_len, 1)
    c = -(-s // q)
    return (a * (2 * d + 2 * g * n + hh) + a * m.mamba_conv_dim * (s + m.conv_kernel - 1) / s
            + 2 * a * hh + 16 * hh + 16 * d + 20 * hh * n + 12 * hh * q + 4 * hh * p * n * (2 * c + 1) / s
            + 24 * d + 4 * g + a * d + 2 * q * q / s)


def torch_deltanet_bytes_per_token(m: ModelSpec, seq_len: int, a: int) -> float:
    """Bytes per token one gated DeltaNet mixer keeps under transformers' torch path
    (torch_chunk_gated_delta_rule and causal_conv1d_fn of modeling_qwen3_next.py, what runs without
    fla; the mixer's input norm not included), for a sequence of whole chunks. With Hv value heads,
    dk, dv, K = Hk dk, V = Hv dv, conv channels D = 2K + V, kernel W, chunk C, c = ceil(s / C):

    - the conv's input (the transposed q, k, v) a D, and its output over s + W - 1 positions
      (F.conv1d pads both sides; silu keeps it) a D (s + W - 1) / s;
    - beta = sigmoid(b) a Hv; softplus's fp32 input and output 8 Hv; the fp32 L2-norm scales of q
      and k and beta 12 Hv; the decays per position 12 Hv; the gated norm's rstd 4 Hv;
    - the delta rule's fp32 tensors per value head (q and k repeated to it): 8 of dk (q, k before and
      after their L2 norm, the scaled and decayed copies the chunk matmuls read), 5 of C (the
      pairwise decays, the UT system, the intra-chunk scores and their solves), 3 of dv (v, v beta,
      the chunks' new values): 4 Hv (8 dk + 5 C + 3 dv);
    - the recurrent state read by each chunk, fp32: 4 Hv dk dv c / s;
    - the gated RMSNorm's fp32 input, normalised and gate tensors 12 V, its 16-bit products 2 a V,
      out_proj's input a V; the chunk mask C^2 / s and A_log's fp32 copies 8 Hv / s and the
      chunk decays 4 Hv c / s per sequence.

    Measured 57,694.75 bytes per token at h 512, Hv 8, Hk 4, dk 32, dv 128, s 256 (bf16), the same
    as this sum (tests/test_deltanet.py checks it against the probe's measurement)."""
    hv, dk, dv, q = m.gdn_value_heads, m.gdn_key_dim, m.gdn_value_dim, m.ssm_chunk
    v, conv = m.gdn_value_width, m.gdn_conv_dim
    s = max(seq_len, 1)
    c = -(-s // q)
    # Kimi Delta Attention's torch path (chunk_kimi_delta_attention): its channel-wise decays make
    # the pairwise decay, the k_beta k products and each chunk's q k products C x C x dk fp32
    # tensors (3 of C dk per head), and its triangular loop's clones about C^2 / 3 per head
    kda = 4 * hv * (3 * q * dk + q * q / 3) if m.kda_gate_rank else 0.0
    return kda + (a * conv + a * conv * (s + m.conv_kernel - 1) / s + a * hv + 8 * hv + 12 * hv + 12 * hv + 4 * hv
            + 4 * hv * (8 * dk + 5 * q + 3 * dv) + 4 * hv * dk * dv * c / s
            + 12 * v + 2 * a * v + a * v + (q * q + 8 * hv + 4 * hv * c) / s)


def fused_deltanet_bytes_per_token(m: ModelSpec, a: int) -> float:
    """Bytes per token one gated DeltaNet mixer keeps under megatron-core's GatedDeltaNet on fla's
    kernels (ssm/gated_delta_net.py: causal_conv1d_fn, then fla's chunk_gated_delta_rule, whose
    ChunkGatedDeltaRuleFunction saves q, k (L2-normalised in the kernel) and their fp32 rstd, v, g,
    beta and the fp32 UT inverse A of C per value head, fla/ops/gated_delta_rule/chunk.py; the
    gated norm keeps its input and gate, out_proj its input), MODELLED from those sources, no GPU
    tracker here: the conv's input a D and output a (2K + V), z a V, rstd 8 Hv, g 4 Hv, beta a Hv,
    A 4 Hv C, the rule's output (the norm's input) a V, the norm's rstd 4 Hv, out_proj's input a V.
    Kimi Delta Attention (kda_gate_rank r; planner.models.kimi) as fla's chunk_kda would keep the
    same tensors, ASSUMED: its decay g is per channel (ModelSpec.gdn_decay_width: 4 K in place of
    4 Hv), the output gate (g_b_proj's output) a V in place of z, and the two
    low-rank gates' r-wide inputs of f_b_proj and g_b_proj 2 a r."""
    hv, v = m.gdn_value_heads, m.gdn_value_width
    return (a * m.gdn_conv_dim + a * (2 * m.gdn_key_width + v) + a * v + 8 * hv + 4 * m.gdn_decay_width
            + 2 * a * m.kda_gate_rank + a * hv
            + 4 * hv * m.ssm_chunk + a * v + 4 * hv + a * v)


def fused_mamba_bytes_per_token(m: ModelSpec, a: int) -> float:
    """Bytes per token one Mamba-2 mixer keeps under Megatron-Core's fused path (module
    docstring): zxbcdt a (2 d + 2 G N + H), the scan output a d, the gated norm's input a d and
    rstd 4 G, out_proj's input a d."""
    d, g, n = m.mamba_inner, m.ssm_groups, m.ssm_state
    return a * (2 * d + 2 * g * n + m.mamba_heads) + 3 * a * d + 4 * g


def _latent_routed(m: ModelSpec, t: ActivationTerm) -> ActivationTerm:
    """``t``, the block's routed tokens sized in the latent width under latent MoE: the tokens are
    projected to moe_latent before they are dispatched (megatron-core 0.16.1
    transformer/moe/moe_layer.py MoELayer.preprocess: fc1_latent_proj, then
    token_dispatcher.dispatch_preprocess; transformers' NemotronHMoE.forward: fc1_latent_proj, then
    self.experts), so the permuted copies are k x moe_latent wide, not k x d_model."""
    if not m.moe_latent or not t.name.startswith(PERMUTED_TOKENS):
        return t
    return replace(t, name=f"{t.name} (latent width)", bytes=t.bytes * m.moe_latent // m.d_model)


def hybrid_block_terms(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str,
                       block_terms: object) -> list[ActivationTerm]:
    """The mean layer's saved tensors (module docstring). ``block_terms``: memory.activations'
    layer_activation_terms, called on the classic views of the model (passed in so that the
    one function that sizes a transformer block sizes the halves here too)."""
    n = m.n_layers
    tokens = lay.tokens_per_rank
    a = setup.precision_spec.activation_bytes
    tp, sp_div = lay.tp, (lay.tp if lay.sp else 1)
    flat = replace(m, layer_pattern="")
    terms: list[ActivationTerm] = []

    def share(t: ActivationTerm, n_layers: int, label: str) -> None:
        if n_layers:
            terms.append(replace(t, name=f"{t.name} [{label}: {n_layers} of {n} layers]",
                                 bytes=t.bytes * n_layers // n))

    def add(name: str, per_token: float, divisor: int, n_layers: int, label: str) -> None:
        share(ActivationTerm(name=name, bytes=ceil_div(int(tokens * per_token), divisor)), n_layers, label)

    base = block_terms(flat, setup, lay, kernels)      # type: ignore[operator]
    for t in base:
        if _half(t.name) == "norm":
            share(t, n, "every layer")
        elif _half(t.name) == "attention":
            share(t, m.n_attention_layers, "attention")
    if m.n_moe_layers:
        for t in base:
            if _half(t.name) == "mlp":
                share(_latent_routed(m, t), m.n_moe_layers, "MoE")
        if m.moe_latent:
            add("latent MoE: fc2_latent_proj input (the combined experts' output)", a * m.moe_latent, sp_div,
                m.n_moe_layers, "MoE")
        shared = replace(flat, n_experts=0, n_experts_per_token=0, d_ff=m.shared_d_ff)
        for t in block_terms(shared, setup, lay, kernels):      # type: ignore[operator]
            if _half(t.name) == "mlp" and not t.name.startswith("MLP input"):
                share(replace(t, name=f"shared expert: {t.name}"), m.n_moe_layers, "MoE")
        if m.shared_expert_gate:
            # Qwen3NextSparseMoeBlock: sigmoid(shared_expert_gate(x)) * shared_expert(x) keeps the product's inputs
            add("shared expert output and its sigmoid gate", a * (m.d_model + 1), sp_div, m.n_moe_layers, "MoE")
        if kernels != "fused" and grouped_experts_bytes_per_token(m, a):
            add("grouped experts' outputs and index vectors (transformers' grouped_mm)",
                grouped_experts_bytes_per_token(m, a), tp, m.n_moe_layers, "MoE")
        if kernels != "fused" and m.model_type == "nemotron_h":
            # NemotronHTopkRouter: F.linear(hidden_states.type(torch.float32), ...) keeps an fp32 copy
            add("router input (fp32 copy)", 4 * m.d_model, sp_div, m.n_moe_layers, "MoE")
    if m.n_mlp_layers:
        dense = replace(flat, n_experts=0, n_experts_per_token=0, d_ff=m.dense_d_ff)
        for t in block_terms(dense, setup, lay, kernels):       # type: ignore[operator]
            if _half(t.name) == "mlp":
                share(t, m.n_mlp_layers, "MLP")
    if m.attention_gate and m.n_attention_layers:
        # Qwen3NextAttention: attn_output * sigmoid(gate) keeps both factors (q wide each)
        add("attention output gate: sigmoid(gate) and the ungated output", 2 * a * m.q_dim, tp,
            m.n_attention_layers, "attention")
    if m.n_deltanet_layers:
        add("gated DeltaNet mixer input (norm output)", m.d_model * a, sp_div, m.n_deltanet_layers, "DeltaNet")
        if kernels == "fused":
            add("gated DeltaNet conv, delta-rule inputs, UT inverse, gated norm (fla kernels)",
                fused_deltanet_bytes_per_token(m, a), tp, m.n_deltanet_layers, "DeltaNet")
        else:
            add("gated DeltaNet conv, chunked delta rule and gated norm tensors (transformers' torch path)",
                torch_deltanet_bytes_per_token(m, lay.seq_len_per_rank, a), tp, m.n_deltanet_layers, "DeltaNet")
    if m.n_mamba_layers:
        add("Mamba-2 mixer input (norm output)", m.d_model * a, sp_div, m.n_mamba_layers, "Mamba")
        if kernels == "fused":
            add("Mamba-2 in_proj output, scan output, rstd, out_proj input (fused kernels)",
                fused_mamba_bytes_per_token(m, a), tp, m.n_mamba_layers, "Mamba")
        else:
            add("Mamba-2 conv, chunked scan and gated norm tensors (transformers' torch path)",
                torch_mamba_bytes_per_token(m, lay.seq_len_per_rank, a), tp, m.n_mamba_layers, "Mamba")
    return terms


# hybrid_block_terms' labels, by letter of the pattern
_LABELS = {"M": "Mamba", "G": "DeltaNet", "*": "attention", "E": "MoE", "-": "MLP"}


def largest_unit_share(m: ModelSpec, setup: TrainingSetup, lay: Layout, kernels: str, block_terms: object) -> float:
    """The largest layer module's unrecomputed saved bytes over letters_per_block mean layers'
    (hybrid_block_terms without recomputation): what a full recomputation reruns at once is one
    module of the model's code (a NemotronHBlock: one letter; a Qwen3NextDecoderLayer: its token
    mixer and its MLP), and the largest of them sets the peak of its backward, as the largest
    block kind does for FSDP (memory.peak.largest_block_share). 1.0 for a pattern of one kind."""
    terms = hybrid_block_terms(m, setup, replace(lay, recompute="none"), kernels, block_terms)
    n, k = m.n_layers, m.letters_per_block
    norm = sum(t.bytes for t in terms if "[every layer" in t.name)

    def letter(c: str) -> float:
        count = m.layer_pattern.count(c)
        return norm + sum(t.bytes for t in terms if f"[{_LABELS[c]}:" in t.name) * n / count

    mean = sum(t.bytes for t in terms) * k
    units = {m.layer_pattern[i:i + k] for i in range(0, n - k + 1, k)}
    largest = max(sum(letter(c) for c in unit) for unit in units)
    return largest / mean if mean else 1.0
