"""The linear layers of a model's blocks and outside them, as transformers names them: what
LoRA can adapt, what QLoRA quantizes and what freeze leaves frozen (planner.training.finetune
reads them). Each family's pattern follows its transformers modeling file (names below)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from planner.models.deltanet import DELTANET_MODEL_TYPES
from planner.models.spec import ModelSpec

# minimax_m2: q/k/v/o_proj, mlp.gate (MiniMaxM2TopKRouter) and mlp.experts as Mixtral's, which
# transformers 5 converts by the same "mixtral" pattern (w1 + w3 -> gate_up_proj, w2 -> down_proj)
LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2", "qwen3", "gemma3_text", "olmo2",
              "minimax_m2")
# The written families whose experts transformers 5 converts by its "qwen2_moe" pattern
# (transformers/conversion_mapping.py: qwen3_moe, deepseek_v3 and glm4_moe map to it), so that
# PEFT adapts gate_proj + up_proj as the experts' one fused gate_up_proj (_qwen2_moe_pattern)
QWEN2_MOE_CONVERSION_TYPES = ("qwen3_moe", "deepseek_v3", "glm4_moe", "deepseek_v32")


@dataclass(frozen=True, kw_only=True, slots=True)
class Linear:
    """One linear layer of a transformer block (or, with ``outside``, beside the blocks).

    ``name`` is its module path inside the block as transformers names it; ``aliases`` are
    further names a target may use. ``n_copies`` counts experts (E for an MoE expert
    projection). ``rank_factor``: PEFT raises the rank on fused expert projections (Mixtral's
    w1 and w3 are one ``gate_up_proj`` in transformers 5, adapted at rank 2r:
    peft/utils/transformers_weight_conversion.py).
    """

    name: str
    d_in: int
    d_out: int
    group: str                  # attention | mlp | router | outside
    bias: bool = False
    n_copies: int = 1
    rank_factor: int = 1
    aliases: tuple[str, ...] = ()
    expert: bool = False
    n_blocks: int = 0           # blocks that hold this layer; 0: every block (see blocks_with)
    adaptable: bool = True      # False: PEFT attaches no adapter to it under any target name

    @property
    def weight_numel(self) -> int:
        return self.d_in * self.d_out * self.n_copies

    def matches(self, target: str) -> bool:
        return any(n == target or n.endswith("." + target) for n in (self.name, *self.aliases))


def blocks_with(m: ModelSpec, lin: Linear) -> int:
    """How many of ``m``'s blocks hold ``lin`` (an MoE model's dense blocks differ from its MoE blocks)."""
    return lin.n_blocks or m.n_layers


def _recent_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """The nn.Linear modules of a block of the 2024-2026 MoE, MLA and fused families, named
    as transformers 5 names them (modeling_<type>.py). Their routed experts are 3-D
    parameters and their routers (except Llama 4's, an nn.Linear subclass) plain modules:
    PEFT's LoRA adapts neither (its all-linear picks nn.Linear only, tuners_utils.py
    _maybe_include_all_linear_layers) and bitsandbytes quantizes neither, so they are not
    listed. ``n_blocks`` tells the dense blocks' MLP from the MoE blocks' shared experts."""
    h, q, kv, f, t = m.d_model, m.q_dim, m.kv_dim, m.d_ff, m.model_type
    n_dense, n_moe = (m.n_dense_layers, m.n_moe_layers) if m.is_moe else (0, 0)

    def mlp(prefix: str, width: int, n_blocks: int, bias: bool = False) -> tuple[Linear, ...]:
        return (Linear(name=f"{prefix}.gate_proj", d_in=h, d_out=width, group="mlp", bias=bias, n_blocks=n_blocks),
                Linear(name=f"{prefix}.up_proj", d_in=h, d_out=width, group="mlp", bias=bias, n_blocks=n_blocks),
                Linear(name=f"{prefix}.down_proj", d_in=width, d_out=h, group="mlp", bias=bias, n_blocks=n_blocks))

    def qkvo(bias: bool) -> tuple[Linear, ...]:
        return (Linear(name="self_attn.q_proj", d_in=h, d_out=q, group="attention", bias=bias),
                Linear(name="self_attn.k_proj", d_in=h, d_out=kv, group="attention", bias=bias),
                Linear(name="self_attn.v_proj", d_in=h, d_out=kv, group="attention", bias=bias),
                Linear(name="self_attn.o_proj", d_in=q, d_out=h, group="attention", bias=bias))

    if t in ("deepseek_v3", "deepseek_v32"):    # DeepseekV3Attention (V3.2: its indexer), MLP, MoE.shared_experts
        att = _mla_linears(m, 0)
        if m.index_n_heads:     # DeepseekV32Indexer's nn.Linear modules (planner.models.dsa)
            att += (Linear(name="self_attn.indexer.wq_b", d_in=m.q_lora_rank, d_out=m.index_n_heads * m.index_head_dim,
                           group="attention"),
                    Linear(name="self_attn.indexer.wk", d_in=h, d_out=m.index_head_dim, group="attention"),
                    Linear(name="self_attn.indexer.weights_proj", d_in=h, d_out=m.index_n_heads, group="attention"))
        if not m.is_moe:
            return att + mlp("mlp", f, 0)
        return att + _qwen2_moe_pattern(m, n_dense, n_moe, mlp)
    if t == "qwen3_moe":        # Qwen3MoeDecoderLayer: Qwen3MoeMLP in mlp_only_layers
        if not m.is_moe:
            return qkvo(m.qkv_bias) + mlp("mlp", f, 0)
        return qkvo(m.qkv_bias) + _qwen2_moe_pattern(m, n_dense, n_moe, mlp)
    if t == "glm4_moe":         # Glm4MoeAttention (o_proj never biased), Glm4MoeMLP, Glm4MoeMoE.shared_experts
        att = qkvo(m.qkv_bias)[:3] + (Linear(name="self_attn.o_proj", d_in=q, d_out=h, group="attention"),)
        if not m.is_moe:
            return att + mlp("mlp", f, 0)
        return att + _qwen2_moe_pattern(m, n_dense, n_moe, mlp)
    if t == "llama4_text":      # Llama4TextDecoderLayer.feed_forward: Llama4TextMLP or Llama4TextMoe
        if not m.is_moe:
            return qkvo(m.qkv_bias) + mlp("feed_forward", f, 0)
        return (qkvo(m.qkv_bias) + (mlp("feed_forward", m.dense_d_ff, n_dense) if n_dense else ())
                + (Linear(name="feed_forward.router", d_in=h, d_out=m.n_experts, group="router", n_blocks=n_moe),)
                + mlp("feed_forward.shared_expert", m.shared_d_ff, n_moe))
    if t == "gpt_oss":          # attention only: GptOssExperts and GptOssTopKRouter are not nn.Linear
        return qkvo(True)
    # phi3: fused qkv_proj and gate_up_proj (Phi3Attention, Phi3MLP)
    return (Linear(name="self_attn.qkv_proj", d_in=h, d_out=q + 2 * kv, group="attention"),
            Linear(name="self_attn.o_proj", d_in=q, d_out=h, group="attention"),
            Linear(name="mlp.gate_up_proj", d_in=h, d_out=2 * f, group="mlp"),
            Linear(name="mlp.down_proj", d_in=f, d_out=h, group="mlp"))


def _qwen2_moe_pattern(m: ModelSpec, n_dense: int, n_moe: int, mlp: Any,
                       shared: str = "mlp.shared_experts") -> tuple[Linear, ...]:
    """The MLP side of qwen3_moe, deepseek_v3 and qwen3_next blocks as PEFT 0.22 adapts it
    (``shared``: the shared experts' module path).

    Both follow transformers 5's "qwen2_moe" conversion pattern (transformers/conversion_mapping.py),
    and PEFT's conversion for it (peft/utils/transformers_weight_conversion.py,
    _MOE_TARGET_MODULE_MAPPING["qwen2_moe"], _MOE_FUSED_TARGETS) adds to the targets gate_proj +
    up_proj, down_proj and gate the routed experts' fused 3-D parameters (gate_up_proj at rank 2r)
    and the router's weight. PEFT 0.22 keeps the module targets too, so the dense blocks' MLP and
    the shared experts, nn.Linear modules of the same names, get their adapters as well; PEFT 0.21
    dropped them (no adapter there), which this function followed until PEFT 0.22 (checked against
    get_peft_model in tests/test_models_recent.py and tests/test_deltanet.py).
    """
    h, f, e = m.d_model, m.d_ff, m.n_experts
    out: tuple[Linear, ...] = (
        Linear(name="mlp.gate", d_in=h, d_out=e, group="router", n_blocks=n_moe),
        Linear(name="mlp.experts.gate_up_proj", d_in=h, d_out=2 * f, group="mlp", n_copies=e, rank_factor=2,
               aliases=("gate_proj", "up_proj"), expert=True, n_blocks=n_moe),
        Linear(name="mlp.experts.down_proj", d_in=f, d_out=h, group="mlp", n_copies=e, aliases=("down_proj",),
               expert=True, n_blocks=n_moe),
    )
    dense: tuple[Linear, ...] = mlp("mlp", m.dense_d_ff, n_dense) if n_dense else ()
    if m.shared_d_ff:
        dense += mlp(shared, m.shared_d_ff, n_moe)
    return out + dense


@lru_cache(maxsize=256)
def block_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """The linear layers of one block of ``m``, with transformers' module names (a tuple of
    frozen Linears, kept per model: the step time's stage splits and memory's per-shape code ask
    for them again, 4,000 times in issue 32's 256-job `plan buy`)."""
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    t = m.model_type
    if t in ("deepseek_v3", "qwen3_moe", "llama4_text", "gpt_oss", "phi3", "glm4_moe", "deepseek_v32"):
        return _recent_linears(m)
    if t in DELTANET_MODEL_TYPES:
        return _deltanet_linears(m)
    if m.kda_gate_rank:
        return _kimi_linears(m)
    if m.layer_pattern:
        return _hybrid_linears(m)
    if t in LLAMA_LIKE:
        att = (Linear(name="self_attn.q_proj", d_in=h, d_out=q, group="attention", bias=m.qkv_bias),
               Linear(name="self_attn.k_proj", d_in=h, d_out=kv, group="attention", bias=m.qkv_bias),
               Linear(name="self_attn.v_proj", d_in=h, d_out=kv, group="attention", bias=m.qkv_bias),
               Linear(name="self_attn.o_proj", d_in=q, d_out=h, group="attention", bias=m.out_bias))
        if m.is_moe:
            e = m.n_experts
            return att + (
                Linear(name="mlp.gate", d_in=h, d_out=e, group="router"),
                Linear(name="mlp.experts.gate_up_proj", d_in=h, d_out=2 * f, group="mlp", n_copies=e,
                       rank_factor=2, aliases=("w1", "w3"), expert=True),
                Linear(name="mlp.experts.down_proj", d_in=f, d_out=h, group="mlp", n_copies=e,
                       aliases=("w2",), expert=True),
            )
        return att + (Linear(name="mlp.gate_proj", d_in=h, d_out=f, group="mlp", bias=m.mlp_bias),
                      Linear(name="mlp.up_proj", d_in=h, d_out=f, group="mlp", bias=m.mlp_bias),
                      Linear(name="mlp.down_proj", d_in=f, d_out=h, group="mlp", bias=m.mlp_bias))
    if t == "gpt2":    # Conv1D layers; PEFT adapts c_attn as one h x 3h layer
        return (Linear(name="attn.c_attn", d_in=h, d_out=3 * h, group="attention", bias=True),
                Linear(name="attn.c_proj", d_in=h, d_out=h, group="attention", bias=True),
                Linear(name="mlp.c_fc", d_in=h, d_out=f, group="mlp", bias=True),
                Linear(name="mlp.c_proj", d_in=f, d_out=h, group="mlp", bias=True))
    if t == "bert":
        return (Linear(name="attention.self.query", d_in=h, d_out=h, group="attention", bias=True),
                Linear(name="attention.self.key", d_in=h, d_out=h, group="attention", bias=True),
                Linear(name="attention.self.value", d_in=h, d_out=h, group="attention", bias=True),
                Linear(name="attention.output.dense", d_in=h, d_out=h, group="attention", bias=True),
                Linear(name="intermediate.dense", d_in=h, d_out=f, group="mlp", bias=True),
                Linear(name="output.dense", d_in=f, d_out=h, group="mlp", bias=True))
    prefix = "attention" if t == "gpt_neox" else "self_attention"   # falcon, bloom
    return (Linear(name=f"{prefix}.query_key_value", d_in=h, d_out=q + 2 * kv, group="attention",
                   bias=m.qkv_bias),
            Linear(name=f"{prefix}.dense", d_in=q, d_out=h, group="attention", bias=m.out_bias),
            Linear(name="mlp.dense_h_to_4h", d_in=h, d_out=f, group="mlp", bias=m.mlp_bias),
            Linear(name="mlp.dense_4h_to_h", d_in=f, d_out=h, group="mlp", bias=m.mlp_bias))


def outside_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """Linear layers outside the blocks that PEFT may adapt (never the LM head):
    BERT's masked-LM transform, ``cls.predictions.transform.dense``."""
    if m.mlm_head:
        return (Linear(name="cls.predictions.transform.dense", d_in=m.d_model, d_out=m.d_model,
                       group="outside", bias=True),)
    return ()


def _hybrid_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """The nn.Linear modules of a Nemotron-H model's layers (transformers 5.x modeling_nemotron_h.py:
    every NemotronHBlock holds one ``mixer``), each in the layers of its letter: M the Mamba-2
    in_proj and out_proj (group "mixer"), * q/k/v/o_proj, - up_proj and down_proj, E the shared
    expert's up/down_proj and, under latent MoE, fc1/fc2_latent_proj. The routed experts
    (NemotronHExperts' 3-D parameters) and the router's weight are not nn.Linear: PEFT's
    all-linear does not adapt them and bitsandbytes does not quantize them, so they are not
    listed (as for _recent_linears' families). PEFT 0.21 refuses LoRA on a Mamba model's out_proj
    (tuners_utils.py _check_lora_target_modules_mamba: out_proj and conv1d "incompatible with
    Mamba-based models", all-linear included; NVIDIA's Nemotron LoRA recipes exclude *.out_proj):
    it is listed, not adaptable, so all-linear plans every other linear layer."""
    h, q, kv = m.d_model, m.q_dim, m.kv_dim
    b, mb = m.mamba_bias, m.mlp_bias
    out: tuple[Linear, ...] = ()
    if m.n_mamba_layers:
        n = m.n_mamba_layers
        in_proj = 2 * m.mamba_inner + 2 * m.ssm_groups * m.ssm_state + m.mamba_heads
        out += (Linear(name="mixer.in_proj", d_in=h, d_out=in_proj, group="mixer", bias=b, n_blocks=n),
                Linear(name="mixer.out_proj", d_in=m.mamba_inner, d_out=h, group="mixer", bias=b, n_blocks=n,
                       adaptable=False))
    if m.n_attention_layers:
        n = m.n_attention_layers
        out += (Linear(name="mixer.q_proj", d_in=h, d_out=q, group="attention", n_blocks=n),
                Linear(name="mixer.k_proj", d_in=h, d_out=kv, group="attention", n_blocks=n),
                Linear(name="mixer.v_proj", d_in=h, d_out=kv, group="attention", n_blocks=n),
                Linear(name="mixer.o_proj", d_in=q, d_out=h, group="attention", n_blocks=n))
    if m.n_mlp_layers:
        n, f = m.n_mlp_layers, m.dense_d_ff
        out += (Linear(name="mixer.up_proj", d_in=h, d_out=f, group="mlp", bias=mb, n_blocks=n),
                Linear(name="mixer.down_proj", d_in=f, d_out=h, group="mlp", bias=mb, n_blocks=n))
    if m.n_moe_layers:
        n, f = m.n_moe_layers, m.shared_d_ff
        out += (Linear(name="mixer.shared_experts.up_proj", d_in=h, d_out=f, group="mlp", bias=mb, n_blocks=n),
                Linear(name="mixer.shared_experts.down_proj", d_in=f, d_out=h, group="mlp", bias=mb, n_blocks=n))
        if m.moe_latent:
            out += (Linear(name="mixer.fc1_latent_proj", d_in=h, d_out=m.moe_latent, group="mlp", bias=mb,
                           n_blocks=n),
                    Linear(name="mixer.fc2_latent_proj", d_in=m.moe_latent, d_out=h, group="mlp", bias=mb,
                           n_blocks=n))
    return out


def _mla_linears(m: ModelSpec, n_blocks: int) -> tuple[Linear, ...]:
    """Multi-head latent attention's nn.Linear modules (DeepseekV3Attention, KimiLinearAttention)
    in ``n_blocks`` blocks (0: every block): q_proj, or q_a_proj and q_b_proj under a query
    bottleneck; kv_a_proj_with_mqa, kv_b_proj, o_proj; the a-projections and o_proj biased with
    attention_bias."""
    h, qk, v, b, n = m.d_model, m.head_dim, m.value_head_dim, m.qkv_bias, n_blocks
    if m.q_lora_rank:
        att: tuple[Linear, ...] = (
            Linear(name="self_attn.q_a_proj", d_in=h, d_out=m.q_lora_rank, group="attention", bias=b, n_blocks=n),
            Linear(name="self_attn.q_b_proj", d_in=m.q_lora_rank, d_out=m.n_heads * qk, group="attention",
                   n_blocks=n))
    else:
        att = (Linear(name="self_attn.q_proj", d_in=h, d_out=m.n_heads * qk, group="attention", n_blocks=n),)
    return att + (
        Linear(name="self_attn.kv_a_proj_with_mqa", d_in=h, d_out=m.kv_lora_rank + m.qk_rope_head_dim,
               group="attention", bias=b, n_blocks=n),
        Linear(name="self_attn.kv_b_proj", d_in=m.kv_lora_rank, d_out=m.n_heads * (qk - m.qk_rope_head_dim + v),
               group="attention", n_blocks=n),
        Linear(name="self_attn.o_proj", d_in=m.n_heads * v, d_out=h, group="attention", bias=m.out_bias, n_blocks=n))


def _kimi_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """The nn.Linear modules of a Kimi Linear model's layers (transformers 5.x
    modeling_kimi_linear.py; planner.models.kimi), each in the letters of its kind. G
    (KimiLinearDeltaAttention, group "mixer"): self_attn.q/k/v_proj, b_proj, g_a_proj, g_b_proj,
    o_proj and forget_gate.f_a_proj, f_b_proj. *: MLA (_mla_linears). -: mlp.gate/up/down_proj.
    E: the shared experts' MLP; PEFT 0.21 has no weight conversion for kimi_linear, so the routed
    experts (3-D parameters) and the router (a plain weight) are not nn.Linear and not listed, as
    for _hybrid_linears. Checked against get_peft_model in tests/test_kimi_linear.py."""
    h = m.d_model
    out: tuple[Linear, ...] = ()
    if m.n_deltanet_layers:
        n, k, v, r = m.n_deltanet_layers, m.gdn_key_width, m.gdn_value_width, m.kda_gate_rank
        out += tuple(Linear(name=f"self_attn.{name}", d_in=d_in, d_out=d_out, group="mixer", n_blocks=n)
                     for name, d_in, d_out in (("q_proj", h, k), ("k_proj", h, k), ("v_proj", h, v),
                                               ("b_proj", h, m.gdn_value_heads), ("g_a_proj", h, r),
                                               ("g_b_proj", r, v), ("o_proj", v, h), ("forget_gate.f_a_proj", h, r),
                                               ("forget_gate.f_b_proj", r, k)))
    if m.n_attention_layers:
        out += _mla_linears(m, m.n_attention_layers)
    for prefix, f, n in (("mlp", m.dense_d_ff, m.n_mlp_layers), ("mlp.shared_experts", m.shared_d_ff, m.n_moe_layers)):
        if n and f:
            out += (Linear(name=f"{prefix}.gate_proj", d_in=h, d_out=f, group="mlp", n_blocks=n),
                    Linear(name=f"{prefix}.up_proj", d_in=h, d_out=f, group="mlp", n_blocks=n),
                    Linear(name=f"{prefix}.down_proj", d_in=f, d_out=h, group="mlp", n_blocks=n))
    return out


def _deltanet_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """The linear layers of a Qwen3-Next or Qwen3.5 model's layers (transformers 5.x
    modeling_qwen3_next.py, modeling_qwen3_5.py, modeling_qwen3_5_moe.py), each in the letters of
    its kind (planner.models.deltanet).

    G: linear_attn.in_proj_qkvz and in_proj_ba (Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b,
    in_proj_a) and out_proj, group "mixer" (PEFT 0.21 refuses out_proj and conv1d only for its
    Mamba model types, not these). *: self_attn.q_proj (queries and their output gate, 2 q wide),
    k/v/o_proj. The MLP side as PEFT adapts transformers 5's "qwen2_moe" conversion pattern
    (_qwen2_moe_pattern: the router, the routed experts' 3-D parameters and, since PEFT 0.22, the
    dense and shared-expert MLPs adapted); Qwen3.5's MoE text model, which PEFT does not
    convert: the shared expert's MLP adapted, the routed experts and router not listed; and
    mlp.shared_expert_gate (h -> 1, an nn.Linear that all-linear adapts). A model without
    experts: its dense MLPs, adaptable. Checked against get_peft_model in tests/test_deltanet.py.
    """
    h, q, kv, b = m.d_model, m.q_dim, m.kv_dim, m.qkv_bias
    out: tuple[Linear, ...] = ()

    def mlp(prefix: str, f: int, n: int) -> tuple[Linear, ...]:
        return (Linear(name=f"{prefix}.gate_proj", d_in=h, d_out=f, group="mlp", n_blocks=n),
                Linear(name=f"{prefix}.up_proj", d_in=h, d_out=f, group="mlp", n_blocks=n),
                Linear(name=f"{prefix}.down_proj", d_in=f, d_out=h, group="mlp", n_blocks=n))

    if m.n_deltanet_layers:
        n, v, k2, hv = m.n_deltanet_layers, m.gdn_value_width, 2 * m.gdn_key_width, m.gdn_value_heads
        if m.model_type == "qwen3_next":
            out += (Linear(name="linear_attn.in_proj_qkvz", d_in=h, d_out=k2 + 2 * v, group="mixer", n_blocks=n),
                    Linear(name="linear_attn.in_proj_ba", d_in=h, d_out=2 * hv, group="mixer", n_blocks=n))
        else:   # Qwen3_5GatedDeltaNet: the same projection in four linears
            out += (Linear(name="linear_attn.in_proj_qkv", d_in=h, d_out=k2 + v, group="mixer", n_blocks=n),
                    Linear(name="linear_attn.in_proj_z", d_in=h, d_out=v, group="mixer", n_blocks=n),
                    Linear(name="linear_attn.in_proj_b", d_in=h, d_out=hv, group="mixer", n_blocks=n),
                    Linear(name="linear_attn.in_proj_a", d_in=h, d_out=hv, group="mixer", n_blocks=n))
        out += (Linear(name="linear_attn.out_proj", d_in=v, d_out=h, group="mixer", n_blocks=n),)
    if m.n_attention_layers:
        n = m.n_attention_layers
        out += (Linear(name="self_attn.q_proj", d_in=h, d_out=2 * q, group="attention", bias=b, n_blocks=n),
                Linear(name="self_attn.k_proj", d_in=h, d_out=kv, group="attention", bias=b, n_blocks=n),
                Linear(name="self_attn.v_proj", d_in=h, d_out=kv, group="attention", bias=b, n_blocks=n),
                Linear(name="self_attn.o_proj", d_in=q, d_out=h, group="attention", bias=m.out_bias, n_blocks=n))
    if not m.is_moe:
        return out + mlp("mlp", m.dense_d_ff, m.n_mlp_layers)
    if m.model_type == "qwen3_5_moe_text":
        # PEFT 0.21 converts no qwen3_5_moe_text experts: its all-linear takes the nn.Linear
        # modules, the shared expert's among them (the routed experts' 3-D parameters and the
        # router's weight are not nn.Linear: not listed, as for _hybrid_linears)
        out += mlp("mlp.shared_expert", m.shared_d_ff, m.n_moe_layers)
    else:
        out += _qwen2_moe_pattern(m, m.n_mlp_layers, m.n_moe_layers, mlp, shared="mlp.shared_expert")
    if m.shared_expert_gate:
        out += (Linear(name="mlp.shared_expert_gate", d_in=h, d_out=1, group="mlp", n_blocks=m.n_moe_layers),)
    return out
