"""Model architectures: ModelSpec and its exact parameter count.

A ModelSpec holds what the memory and time models need from an architecture. It is
built from a Hugging Face ``config.json`` (planner.models.families, shipped for every
preset in ``planner/presets/models/``), so that the same file drives both the planner and
the transformers model that referees its parameter count (tests/test_param_counts.py).

The loaders (presets, config files, the Hugging Face cache) live in planner.models.load;
their names are still reachable here (``from planner.models.spec import load_model``) for
the modules written before the split.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from planner.models.generic.profile import GenericProfile
from planner.models.vision.profile import VisionProfile
from planner.units import hash_once, stored_hash, unpickle_hashed


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder (or BERT encoder) transformer, as far as memory and FLOPs go.

    Widths: ``d_model`` (h), query width ``n_heads * head_dim``, key/value width
    ``n_kv_heads * head_dim`` (GQA), MLP width ``d_ff`` (per routed expert for MoE).

    Fields after ``source``'s block describe the architectures of 2024-2026. Their
    defaults are the classic dense transformer, so a model that does not set them is
    unchanged. The memory and time models see every block as the *mean* block (see
    ParamCount); the per-layer-type terms these fields describe (multi-head latent
    attention's saved tensors and latent KV cache, sliding-window and chunked attention,
    shared experts, dispatch buffers) are not modelled there yet.

    Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1; DeepSeek-V3,
    arXiv:2412.19437, Sec. 2.1): ``kv_lora_rank`` > 0. Queries go through a rank
    ``q_lora_rank`` bottleneck (0: a full q_proj), keys and values through a shared latent of
    ``kv_lora_rank`` plus a decoupled rotary key of ``qk_rope_head_dim`` shared by all heads;
    each head's query/key has ``head_dim = qk_nope_head_dim + qk_rope_head_dim`` dimensions
    and its value ``v_head_dim``. ``n_kv_heads = n_heads``: transformers' implementation
    (modeling_deepseek_v3.py) expands the latent to full per-head keys and values and
    never absorbs the up-projections, so q_dim/kv_dim are what it materialises.
    """

    name: str
    model_type: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    max_positions: int = 0
    position: str = "rope"          # rope | learned | alibi
    tied_embeddings: bool = False
    gated_mlp: bool = True          # SwiGLU/GeGLU: three d_model x d_ff matrices
    activation: str = "silu"        # the config's hidden_act / activation_function
    norm: str = "rmsnorm"           # rmsnorm (weight) | layernorm (weight + bias)
    norms_per_layer: int = 2
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    final_norm: bool = True         # a norm after the last block (not in post-LN BERT)
    embedding_norm: bool = False    # BLOOM's word_embeddings_layernorm, BERT's embeddings.LayerNorm
    n_token_types: int = 0          # BERT's token_type_embeddings
    mlm_head: bool = False          # BERT's cls.predictions.transform (dense + norm) and bias
    parallel_block: bool = False    # attention and MLP read the same input (Falcon, GPT-J)
    n_experts: int = 0              # routed experts per MoE block; 0: dense MLP
    n_experts_per_token: int = 0
    causal: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    source: str = ""
    # ---- 2024-2026 architectures (defaults: the classic dense block)
    qk_norm: str = ""               # "": none | "head": RMSNorm over head_dim on q and k (Qwen3, Gemma 3)
    #                                 | "full": RMSNorm over the whole q and k widths (OLMo 2)
    #                                 | "l2": weightless L2 norm over head_dim (Llama 4's rotary blocks)
    n_qk_norm_layers: int = 0       # blocks with the QK norm; 0: every block
    q_lora_rank: int = 0            # MLA query bottleneck; 0: a full q_proj
    kv_lora_rank: int = 0           # MLA key/value latent; 0: not MLA
    qk_rope_head_dim: int = 0       # MLA decoupled rotary part of head_dim, shared by all heads
    v_head_dim: int = 0             # 0: head_dim
    n_dense_layers: int = 0         # blocks of an MoE model with a dense MLP instead of experts
    dense_d_ff: int = 0             # their MLP width (0: d_ff)
    n_shared_experts: int = 0       # always-on experts beside the routed ones
    shared_d_ff: int = 0            # total MLP width of the shared experts (DeepSeek: n_shared x moe width)
    router_bias: bool = False       # gpt-oss's router has a bias
    attention_sinks: bool = False   # gpt-oss: one learned sink logit per head and block
    local_attention: str = ""       # "": none | "sliding" (Gemma 3, gpt-oss) | "chunked" (Llama 4)
    attention_window: int = 0       # tokens a local layer sees: the sliding window or the chunk
    n_local_layers: int = 0         # blocks with local attention; the others attend to every token
    n_mtp_modules: int = 0          # DeepSeek-V3 multi-token prediction modules counted (0: as transformers)
    routing_groups: int = 0         # group-limited routing: the routed experts in this many groups (0: none)
    routing_group_limit: int = 0    # each token's experts in at most this many of them (DeepSeek-V3: 4 of 8)
    # ---- DeepSeek Sparse Attention (DeepSeek-V3.2, planner.models.dsa): MLA plus a lightning
    # indexer of index_n_heads heads of index_head_dim that picks index_topk keys per query
    index_n_heads: int = 0          # 0: no indexer, dense attention
    index_head_dim: int = 0
    index_topk: int = 0
    # ---- hybrid Mamba-2 models (Nemotron-H, Nemotron 3; planner.models.hybrid): the layer
    # pattern in Megatron-Core's hybrid syntax, one letter per layer (M: a Mamba-2 mixer,
    # *: self-attention, E: an MoE MLP, -: a dense MLP; each layer one norm and one mixer)
    layer_pattern: str = ""
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state: int = 0              # N, the state size per head
    ssm_groups: int = 0             # G, the groups B and C are shared by
    conv_kernel: int = 0
    ssm_chunk: int = 0              # Q, the chunk length of the SSD scan
    mamba_bias: bool = False        # in_proj/out_proj biases (use_bias)
    conv_bias: bool = True
    moe_latent: int = 0             # latent MoE: experts run in this width (fc1/fc2_latent_proj); 0: h
    # ---- gated DeltaNet layers (letter G; Qwen3-Next, planner.models.deltanet): key heads of
    # gdn_key_dim, value heads of gdn_value_dim; conv_kernel and ssm_chunk (the delta rule's
    # chunk) are shared with the Mamba fields above
    gdn_key_heads: int = 0
    gdn_value_heads: int = 0
    gdn_key_dim: int = 0
    gdn_value_dim: int = 0
    kda_gate_rank: int = 0          # Kimi Delta Attention (planner.models.kimi): the low-rank width of its forget
    #                                 gate (f_a/f_b) and output gate (g_a/g_b); 0 for gated DeltaNet
    attention_gate: bool = False    # Qwen3-Next's gated attention: q_proj also yields a sigmoid output gate
    letters_per_block: int = 1      # pattern letters in one layer module of the model's code (the unit FSDP
    #                                 wraps): 2 for a Qwen3NextDecoderLayer (token mixer and MLP), 1 for NemotronHBlock
    shared_expert_gate: bool = False    # a sigmoid gate (h -> 1) on the shared expert's output (Qwen2-MoE, Qwen3-Next)
    # ---- the generic path (planner.models.generic): a family no translator is written for,
    # measured on transformers' own model; its parameters, saved tensors and FLOPs come from here
    profile: GenericProfile | None = None
    # ---- a vision-language model (planner.models.vision): the text tower above, plus the image
    # side's exact parameters (vision encoder and projector), held on the first pipeline stage
    vision: VisionProfile | None = None
    # the hash of every field, worked out once (planner.units.hash_once): the per-shape caches of
    # the memory and step-time models look a model up hundreds of thousands of times per `plan buy`
    # (issue 32), and a dataclass's own hash hashes every field each time (about 0.9 us)
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    __hash__, __setstate__ = stored_hash, unpickle_hashed

    def __post_init__(self) -> None:
        hash_once(self)

    @property
    def is_generic(self) -> bool:
        """Planned from a measured profile: data parallel, ZeRO/FSDP and pipeline stages only."""
        return self.profile is not None

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def n_moe_layers(self) -> int:
        if self.layer_pattern:
            return self.layer_pattern.count("E")
        return self.n_layers - self.n_dense_layers if self.is_moe else 0

    @property
    def is_hybrid(self) -> bool:
        """Layers of one mixer each, in Megatron's hybrid pattern (planner.models.hybrid)."""
        return bool(self.layer_pattern)

    @property
    def n_attention_layers(self) -> int:
        """Layers with self-attention: every block, or a hybrid's '*' layers."""
        return self.layer_pattern.count("*") if self.layer_pattern else self.n_layers

    @property
    def n_mamba_layers(self) -> int:
        return self.layer_pattern.count("M")

    @property
    def n_mlp_layers(self) -> int:
        """A hybrid's dense MLP layers ('-')."""
        return self.layer_pattern.count("-")

    @property
    def n_deltanet_layers(self) -> int:
        """A hybrid's gated DeltaNet layers ('G')."""
        return self.layer_pattern.count("G")

    @property
    def gdn_key_width(self) -> int:
        """Gated DeltaNet's query (and key) width: key heads x key head dim."""
        return self.gdn_key_heads * self.gdn_key_dim

    @property
    def gdn_value_width(self) -> int:
        """Gated DeltaNet's value (and output gate z) width: value heads x value head dim."""
        return self.gdn_value_heads * self.gdn_value_dim

    @property
    def gdn_decay_width(self) -> int:
        """Decays per token of a gated DeltaNet layer: one per value head, or one per key channel
        under Kimi Delta Attention (kda_gate_rank > 0; KimiLinearForgetGate returns H x d)."""
        return self.gdn_key_width if self.kda_gate_rank else self.gdn_value_heads

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of gated DeltaNet's conv1d: q, k and v (2 key widths + the value width)."""
        return 2 * self.gdn_key_width + self.gdn_value_width

    @property
    def mamba_inner(self) -> int:
        """The Mamba-2 mixer's inner width: heads x head dim (d_inner, expand x h in the paper)."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the Mamba-2 conv1d: x, B and C (d_inner + 2 G N)."""
        return self.mamba_inner + 2 * self.ssm_groups * self.ssm_state


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockKind:
    """The parameters of one kind of block (``n_layers`` of them): dense or MoE."""

    kind: str               # "dense" | "moe"
    n_layers: int
    attention: int
    routed: int             # all routed experts and the router
    other_mlp: int          # a dense block's MLP; an MoE block's shared experts
    norms: int

    @property
    def per_layer(self) -> int:
        return self.attention + self.routed + self.other_mlp + self.norms


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamCount:
    """Exact parameter counts, split the way the memory model places them.

    ``embedding`` sits on the first pipeline stage, ``final`` (final norm, untied LM
    head, MLM head, multi-token prediction modules) on the last; ``blocks`` lists each
    kind of transformer block exactly, and ``total``, ``layers`` and ``active`` are exact.

    The per-layer fields describe the *mean* block, rounded down, for the memory and time
    models, which see every block alike: ``per_layer`` (so ``per_layer * n_layers`` is
    short of ``layers`` by less than ``n_layers``), ``expert_per_layer`` (one routed
    expert, spread over all blocks), ``mlp_per_layer`` (the routed experts and the router
    for MoE, the MLP for dense models; an MoE model's dense MLPs and shared experts are in
    ``other_mlp_per_layer``). For a model whose blocks are all alike (Llama, Mixtral) the
    mean block is the block.
    """

    embedding: int
    per_layer: int
    n_layers: int
    final: int
    lm_head: int            # untied output projection, 0 when tied (included in final)
    expert_per_layer: int
    n_experts: int
    n_experts_per_token: int
    attention_per_layer: int
    mlp_per_layer: int      # all routed experts and the router for MoE
    norms_per_layer: int
    other_mlp_per_layer: int = 0   # MoE models: dense blocks' MLPs and shared experts, per mean block
    blocks: tuple[BlockKind, ...] = ()
    one_expert: int = 0     # one routed expert of one MoE block, exact
    mtp: int = 0            # multi-token prediction modules (in final)
    mtp_idle_experts: int = 0   # routed expert parameters of the MTP modules a token skips

    @property
    def layers(self) -> int:
        if self.blocks:
            return sum(b.per_layer * b.n_layers for b in self.blocks)
        return self.per_layer * self.n_layers

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.final

    @property
    def n_moe_layers(self) -> int:
        return sum(b.n_layers for b in self.blocks if b.kind == "moe")

    @property
    def active(self) -> int:
        """Parameters that touch one token: an MoE token visits k of E routed experts."""
        idle = (self.n_experts - self.n_experts_per_token) * self.one_expert
        return self.total - idle * self.n_moe_layers - self.mtp_idle_experts


def _linear(d_in: int, d_out: int, bias: bool) -> int:
    return d_in * d_out + (d_out if bias else 0)


def attention_params(m: ModelSpec) -> int:
    """One block's attention: projections, QK norms, sinks (no block norms).

    Standard/GQA: q (h x n_heads d), k and v (h x n_kv d), o (n_heads d x h); a gated
    attention's q_proj twice as wide (attention_gate).
    MLA (transformers' DeepseekV3Attention): q_a_proj h x q_lora, q_a_layernorm q_lora,
    q_b_proj q_lora x n_heads (nope + rope) (or q_proj h x n_heads (nope + rope) without a
    query bottleneck); kv_a_proj_with_mqa h x (kv_lora + rope), kv_a_layernorm kv_lora,
    kv_b_proj kv_lora x n_heads (nope + v); o_proj n_heads v x h. The a-projections and
    o_proj carry attention_bias, the b-projections never do. DeepSeek-V3.2 adds its lightning
    indexer (planner.models.dsa.indexer_params).
    """
    h = m.d_model
    if m.is_mla:
        bias = m.qkv_bias
        qk, v = m.head_dim, m.value_head_dim
        if m.q_lora_rank:
            q = _linear(h, m.q_lora_rank, bias) + m.q_lora_rank + m.q_lora_rank * m.n_heads * qk
        else:
            q = _linear(h, m.n_heads * qk, False)
        kv = (_linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias) + m.kv_lora_rank
              + m.kv_lora_rank * m.n_heads * (qk - m.qk_rope_head_dim + v))
        from planner.models.dsa import indexer_params

        return q + kv + _linear(m.n_heads * v, h, m.out_bias) + indexer_params(m)
    q, kv = m.q_dim, m.kv_dim
    out = _linear(h, q, m.qkv_bias) + 2 * _linear(h, kv, m.qkv_bias) + _linear(q, h, m.out_bias)
    if m.attention_gate:    # Qwen3NextAttention: q_proj is h x 2 q (queries and their output gate)
        out += _linear(h, q, m.qkv_bias)
    if m.qk_norm == "head":
        out += 2 * m.head_dim
    elif m.qk_norm == "full":
        out += q + kv
    if m.attention_sinks:
        out += m.n_heads
    return out


def mlp_params(m: ModelSpec, d_ff: int, bias: bool) -> int:
    """One MLP of width d_ff: gate (when gated), up and down."""
    n_mats_in = 2 if m.gated_mlp else 1
    return n_mats_in * _linear(m.d_model, d_ff, bias) + _linear(d_ff, m.d_model, bias)


def count_params(m: ModelSpec) -> ParamCount:
    """Exact parameter count of the transformers implementation of ``m``.

    Equal to ``sum(p.numel() for p in model.parameters())`` for the model
    transformers builds from the same config.json (tests/test_param_counts.py checks
    every preset). Linear layers are d_in x d_out plus d_out when biased; norms are
    one weight vector (RMSNorm) or weight and bias (LayerNorm); a tied LM head shares
    the embedding's tensor and counts once. An MoE block holds E routed experts, a
    router h x E (plus E with a bias, gpt-oss) and its shared experts; an MoE model's
    dense blocks (DeepSeek-V3's first k, Llama 4's interleaved ones) hold one MLP of
    ``dense_d_ff``. Buffers (DeepSeek-V3's e_score_correction_bias) are not parameters.
    A generic model's count is its measured profile's (profile_param_count). A
    vision-language model's vision encoder and projector (``m.vision``, exact) are counted
    with the embedding: they sit before the first block, on the first pipeline stage,
    replicated across tensor-parallel ranks.
    """
    pc = _text_params(m)
    if m.vision is None:
        return pc
    return replace(pc, embedding=pc.embedding + m.vision.params)


def _text_params(m: ModelSpec) -> ParamCount:
    """count_params of the text model (all of a model but a vision-language one's image side)."""
    if m.profile is not None:
        return profile_param_count(m.profile)
    if m.layer_pattern:
        from planner.models.hybrid import hybrid_param_count

        return hybrid_param_count(m)
    h = m.d_model
    norm = h * (2 if m.norm == "layernorm" else 1)
    attention = attention_params(m)
    norms = m.norms_per_layer * norm
    expert = mlp_params(m, m.d_ff, m.mlp_bias) if m.is_moe else 0
    blocks: list[BlockKind] = []
    if m.is_moe:
        router = h * m.n_experts + (m.n_experts if m.router_bias else 0)
        shared = mlp_params(m, m.shared_d_ff, False) if m.shared_d_ff else 0
        moe = BlockKind(kind="moe", n_layers=m.n_moe_layers, attention=attention,
                        routed=m.n_experts * expert + router, other_mlp=shared, norms=norms)
        if m.n_dense_layers:
            blocks.append(BlockKind(kind="dense", n_layers=m.n_dense_layers, attention=attention, routed=0,
                                    other_mlp=mlp_params(m, m.dense_d_ff or m.d_ff, m.mlp_bias), norms=norms))
        blocks.append(moe)
    else:
        blocks.append(BlockKind(kind="dense", n_layers=m.n_layers, attention=attention, routed=0,
                                other_mlp=mlp_params(m, m.d_ff, m.mlp_bias), norms=norms))

    embedding = m.vocab_size * h
    if m.position == "learned":
        embedding += m.max_positions * h
    embedding += m.n_token_types * h
    if m.embedding_norm:
        embedding += norm

    lm_head = 0 if m.tied_embeddings else m.vocab_size * h
    final = lm_head + (norm if m.final_norm else 0)
    if m.mlm_head:
        # BERT: cls.predictions.transform.dense (h x h + h), its LayerNorm, output bias (vocab)
        final += _linear(h, h, True) + norm + m.vocab_size
    mtp = mtp_idle = 0
    if m.n_mtp_modules:
        # DeepSeek-V3 Sec. 2.2 and its checkpoint (model.layers.61): per module enorm and
        # hnorm (h each), eh_proj (2h x h), one MoE block and shared_head.norm (h); the
        # embedding and the output head are shared with the main model.
        last = blocks[-1]
        mtp = m.n_mtp_modules * (3 * norm + 2 * h * h + last.per_layer)
        mtp_idle = m.n_mtp_modules * (m.n_experts - m.n_experts_per_token) * expert
        final += mtp

    n = m.n_layers
    layers = sum(b.per_layer * b.n_layers for b in blocks)
    n_moe = m.n_moe_layers
    routed_all = sum(b.routed * b.n_layers for b in blocks)
    other_all = sum(b.other_mlp * b.n_layers for b in blocks)
    if m.is_moe:
        mlp_mean, other_mean = routed_all // n, other_all // n
    else:
        mlp_mean, other_mean = other_all // n, 0
    return ParamCount(
        embedding=embedding,
        per_layer=layers // n,
        n_layers=n,
        final=final,
        lm_head=lm_head,
        expert_per_layer=expert * n_moe // n if m.is_moe else 0,
        n_experts=m.n_experts,
        n_experts_per_token=m.n_experts_per_token,
        attention_per_layer=attention,
        mlp_per_layer=mlp_mean,
        norms_per_layer=norms,
        other_mlp_per_layer=other_mean,
        blocks=tuple(blocks),
        one_expert=expert,
        mtp=mtp,
        mtp_idle_experts=mtp_idle,
    )


def profile_param_count(p: GenericProfile) -> ParamCount:
    """The ParamCount of a measured profile: each distinct block kind exact (softmax attention
    and state-space/linear-attention mixers as its attention, routed experts and router as
    routed, MLPs, shared experts and the rest as other_mlp); the untied head and everything
    else outside the blocks in ``final``. Routed experts are not told apart one by one, so
    ``active`` is the total (FLOPs are measured per token instead)."""
    blocks = tuple(BlockKind(kind="moe" if b.experts else "dense", n_layers=b.n_layers,
                             attention=b.attention + b.mixer, routed=b.experts, other_mlp=b.mlp + b.other,
                             norms=b.norms) for b in p.blocks)
    n = max(p.n_layers, 1)
    layers = sum(b.per_layer * b.n_layers for b in blocks)

    def mean(field: str) -> int:
        return sum(getattr(b, field) * b.n_layers for b in blocks) // n

    return ParamCount(
        embedding=p.embedding, per_layer=layers // n, n_layers=p.n_layers, final=p.head + p.final,
        lm_head=p.head, expert_per_layer=0, n_experts=0, n_experts_per_token=0,
        attention_per_layer=mean("attention"), mlp_per_layer=mean("routed") + mean("other_mlp"),
        norms_per_layer=mean("norms"), blocks=blocks)


# Names that moved to planner.models.load and planner.models.families in the split;
# resolved on first use so that neither module is imported before this one is complete.
_MOVED = {
    "load_model": "load", "load_preset": "load", "load_presets": "load", "preset_config": "load",
    "load_config_file": "load", "load_hf_config": "load", "Preset": "load",
    "spec_from_hf_config": "families", "SUPPORTED_MODEL_TYPES": "families",
}


def __getattr__(name: str) -> Any:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"planner.models.{home}"), name)
