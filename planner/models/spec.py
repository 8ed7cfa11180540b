"""Model architectures: ModelSpec, exact parameter counts, FLOPs, and the config.json loader.

A ModelSpec holds what the memory and time models need from an architecture. It is
built from a Hugging Face ``config.json`` (shipped for every preset in
``planner/presets/models/``), so that the same file drives both the planner and the
transformers model that referees its parameter count (tests/test_param_counts.py).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.errors import UserError, unknown_name
from planner.limits import MAX_CONFIG_BYTES, MAX_PARAMS, check_config_types

SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2",
    "gpt2", "bert", "falcon", "bloom", "gpt_neox",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A decoder (or BERT encoder) transformer, as far as memory and FLOPs go.

    Widths: ``d_model`` (h), query width ``n_heads * head_dim``, key/value width
    ``n_kv_heads * head_dim`` (GQA), MLP width ``d_ff`` (per expert for MoE).
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
    n_experts: int = 0              # 0: dense MLP
    n_experts_per_token: int = 0
    causal: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    source: str = ""

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamCount:
    """Exact parameter counts, split the way the memory model places them.

    ``embedding`` sits on the first pipeline stage, ``final`` (final norm, untied LM
    head, MLM head) on the last; ``per_layer`` is one transformer block;
    ``expert_per_layer`` is one expert's MLP inside a block (0 for dense models).
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
    mlp_per_layer: int      # all experts and the router for MoE
    norms_per_layer: int

    @property
    def layers(self) -> int:
        return self.per_layer * self.n_layers

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.final

    @property
    def active(self) -> int:
        """Parameters that touch one token: an MoE token visits k of E experts."""
        idle = (self.n_experts - self.n_experts_per_token) * self.expert_per_layer
        return self.total - idle * self.n_layers

    @property
    def largest_layer(self) -> int:
        """The largest single unit FSDP/ZeRO-3 gathers: a block, or the embedding."""
        return max(self.per_layer, self.embedding, self.lm_head)


def count_params(m: ModelSpec) -> ParamCount:
    """Exact parameter count of the transformers implementation of ``m``.

    Equal to ``sum(p.numel() for p in model.parameters())`` for the model
    transformers builds from the same config.json (tests/test_param_counts.py checks
    every preset). Linear layers are d_in x d_out plus d_out when biased; norms are
    one weight vector (RMSNorm) or weight and bias (LayerNorm); a tied LM head shares
    the embedding's tensor and counts once.
    """
    h = m.d_model
    norm = h * (2 if m.norm == "layernorm" else 1)

    def linear(d_in: int, d_out: int, bias: bool) -> int:
        return d_in * d_out + (d_out if bias else 0)

    q, kv = m.q_dim, m.kv_dim
    attention = (
        linear(h, q, m.qkv_bias) + 2 * linear(h, kv, m.qkv_bias) + linear(q, h, m.out_bias)
    )
    n_mats_in = 2 if m.gated_mlp else 1
    expert = n_mats_in * linear(h, m.d_ff, m.mlp_bias) + linear(m.d_ff, h, m.mlp_bias)
    if m.is_moe:
        router = h * m.n_experts           # Mixtral's gate: Linear(h, E, bias=False)
        mlp = m.n_experts * expert + router
    else:
        mlp = expert
    norms = m.norms_per_layer * norm
    per_layer = attention + mlp + norms

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
        final += linear(h, h, True) + norm + m.vocab_size
    return ParamCount(
        embedding=embedding,
        per_layer=per_layer,
        n_layers=m.n_layers,
        final=final,
        lm_head=lm_head,
        expert_per_layer=expert if m.is_moe else 0,
        n_experts=m.n_experts,
        n_experts_per_token=m.n_experts_per_token,
        attention_per_layer=attention,
        mlp_per_layer=mlp,
        norms_per_layer=norms,
    )


# ---------------------------------------------------------------- config.json loader

def _need(cfg: dict[str, Any], key: str, where: str, *alts: str) -> Any:
    for k in (key, *alts):
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    names = " or ".join(repr(k) for k in (key, *alts))
    raise UserError(f"{where}: missing key {names}; it is required for model_type {cfg.get('model_type')!r}")


def _int(cfg: dict[str, Any], key: str, where: str, *alts: str, minimum: int = 1) -> int:
    v = _need(cfg, key, where, *alts)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise UserError(f"{where}: key {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def _float(cfg: dict[str, Any], key: str, default: float = 0.0) -> float:
    v = cfg.get(key, default)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def spec_from_hf_config(cfg: dict[str, Any], name: str, where: str, source: str = "") -> ModelSpec:
    """Translate a Hugging Face config.json dict into a ModelSpec.

    ``where`` names the file in error messages. Defaults follow transformers'
    configuration classes (e.g. LlamaConfig.tie_word_embeddings=False,
    GPT2Config.n_inner=None meaning 4h, FalconConfig.bias=False).
    """
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: expected a JSON object (a Hugging Face config.json)")
    mt = cfg.get("model_type")
    if mt is None:
        raise UserError(f"{where}: missing key 'model_type'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"{where}: unsupported model_type {mt!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    bad = check_config_types(cfg, where)
    if bad:
        raise UserError(bad)
    cfg = {k: v for k, v in cfg.items() if v is not None}    # a key set to null takes its default
    common: dict[str, Any] = {"name": name, "model_type": mt, "source": source}
    if mt != "gpt2":
        act = cfg.get("hidden_activation") or cfg.get("hidden_act")
        common["activation"] = str(act) if act else ("gelu" if mt in ("bert", "falcon", "bloom", "gpt_neox") else "silu")

    if mt in ("llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2"):
        h = _int(cfg, "hidden_size", where)
        n_heads = _int(cfg, "num_attention_heads", where)
        n_kv = cfg.get("num_key_value_heads") or n_heads
        head_dim = cfg.get("head_dim") or h // n_heads
        bias = bool(cfg.get("attention_bias", False))
        spec = ModelSpec(
            **common,
            n_layers=_int(cfg, "num_hidden_layers", where),
            d_model=h, n_heads=n_heads, n_kv_heads=int(n_kv), head_dim=int(head_dim),
            d_ff=_int(cfg, "intermediate_size", where),
            vocab_size=_int(cfg, "vocab_size", where),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", mt in ("gemma", "gemma2"))),
            qkv_bias=bias or mt == "qwen2",
            out_bias=bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            norms_per_layer=4 if mt == "gemma2" else 2,
            n_experts=int(cfg.get("num_local_experts") or 0) if mt == "mixtral" else 0,
            n_experts_per_token=int(cfg.get("num_experts_per_tok") or 0) if mt == "mixtral" else 0,
            attention_dropout=_float(cfg, "attention_dropout"),
        )
    elif mt == "gpt2":
        h = _int(cfg, "n_embd", where, "hidden_size")
        n_heads = _int(cfg, "n_head", where, "num_attention_heads")
        spec = ModelSpec(
            **common,
            n_layers=_int(cfg, "n_layer", where, "num_hidden_layers"),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=int(cfg.get("n_inner") or 4 * h),
            vocab_size=_int(cfg, "vocab_size", where),
            max_positions=_int(cfg, "n_positions", where, "max_position_embeddings"),
            position="learned", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
            activation=str(cfg.get("activation_function", "gelu_new")),
            hidden_dropout=_float(cfg, "resid_pdrop", 0.1),
            attention_dropout=_float(cfg, "attn_pdrop", 0.1),
        )
    elif mt == "bert":
        h = _int(cfg, "hidden_size", where)
        n_heads = _int(cfg, "num_attention_heads", where)
        spec = ModelSpec(
            **common,
            n_layers=_int(cfg, "num_hidden_layers", where),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=_int(cfg, "intermediate_size", where),
            vocab_size=_int(cfg, "vocab_size", where),
            max_positions=_int(cfg, "max_position_embeddings", where),
            position="learned", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
            embedding_norm=True, n_token_types=int(cfg.get("type_vocab_size", 2)),
            mlm_head=True, causal=False, final_norm=False,
            hidden_dropout=_float(cfg, "hidden_dropout_prob", 0.1),
            attention_dropout=_float(cfg, "attention_probs_dropout_prob", 0.1),
        )
    elif mt == "falcon":
        h = _int(cfg, "hidden_size", where)
        n_heads = _int(cfg, "num_attention_heads", where, "n_head")
        new_arch = bool(cfg.get("new_decoder_architecture", False))
        if new_arch:
            n_kv = int(cfg.get("num_kv_heads") or n_heads)
        elif cfg.get("multi_query", True):
            n_kv = 1
        else:
            n_kv = n_heads
        parallel = bool(cfg.get("parallel_attn", True))
        spec = ModelSpec(
            **common,
            n_layers=_int(cfg, "num_hidden_layers", where, "n_layer"),
            d_model=h, n_heads=n_heads, n_kv_heads=n_kv, head_dim=h // n_heads,
            d_ff=int(cfg.get("ffn_hidden_size") or 4 * h),
            vocab_size=_int(cfg, "vocab_size", where),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            position="alibi" if cfg.get("alibi") else "rope",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm",
            norms_per_layer=2 if (new_arch or not parallel) else 1,
            qkv_bias=bool(cfg.get("bias", False)), out_bias=bool(cfg.get("bias", False)),
            mlp_bias=bool(cfg.get("bias", False)), parallel_block=parallel,
            hidden_dropout=_float(cfg, "hidden_dropout"),
            attention_dropout=_float(cfg, "attention_dropout"),
        )
    elif mt == "bloom":
        h = _int(cfg, "hidden_size", where, "n_embed")
        n_heads = _int(cfg, "n_head", where, "num_attention_heads")
        spec = ModelSpec(
            **common,
            n_layers=_int(cfg, "n_layer", where, "num_hidden_layers"),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=4 * h, vocab_size=_int(cfg, "vocab_size", where),
            position="alibi", tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            gated_mlp=False, norm="layernorm", qkv_bias=True, out_bias=True, mlp_bias=True,
            embedding_norm=True,
            hidden_dropout=_float(cfg, "hidden_dropout"),
            attention_dropout=_float(cfg, "attention_dropout"),
        )
    else:  # gpt_neox
        h = _int(cfg, "hidden_size", where)
        n_heads = _int(cfg, "num_attention_heads", where)
        bias = bool(cfg.get("attention_bias", True))
        spec = ModelSpec(
            **common,
            n_layers=_int(cfg, "num_hidden_layers", where),
            d_model=h, n_heads=n_heads, n_kv_heads=n_heads, head_dim=h // n_heads,
            d_ff=_int(cfg, "intermediate_size", where),
            vocab_size=_int(cfg, "vocab_size", where),
            max_positions=int(cfg.get("max_position_embeddings") or 0),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            gated_mlp=False, norm="layernorm", qkv_bias=bias, out_bias=bias, mlp_bias=True,
            parallel_block=bool(cfg.get("use_parallel_residual", True)),
            hidden_dropout=_float(cfg, "hidden_dropout"),
            attention_dropout=_float(cfg, "attention_dropout"),
        )
    _check_shape(spec, where)
    return spec


def _check_shape(m: ModelSpec, where: str) -> None:
    for key in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
        if getattr(m, key) < 1:
            raise UserError(f"{where}: {key} = {getattr(m, key)} must be at least 1 (check the config's "
                            f"sizes; head_dim is hidden_size // num_attention_heads unless given)")
    if m.n_heads % m.n_kv_heads:
        raise UserError(
            f"{where}: num_attention_heads ({m.n_heads}) must be a multiple of "
            f"num_key_value_heads ({m.n_kv_heads})"
        )
    if m.is_moe and not 0 < m.n_experts_per_token <= m.n_experts:
        raise UserError(f"{where}: num_experts_per_tok must be between 1 and num_local_experts")
    for key in ("n_layers", "d_model", "vocab_size", "d_ff", "head_dim"):
        v = getattr(m, key)
        if v > 10**7:
            raise UserError(f"{where}: {key} = {v} is beyond the planner's limit of 10,000,000")
    n_params = count_params(m).total
    if n_params > MAX_PARAMS:
        raise UserError(f"{where}: {n_params:.3g} parameters is beyond the planner's limit of {MAX_PARAMS:.0e}; "
                        f"check hidden_size, intermediate_size, num_hidden_layers and vocab_size")


# ------------------------------------------------------------------------ presets

@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    name: str
    config: str
    source: str
    description: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)


_PRESET_KEYS = {"name", "config", "source", "description", "aliases"}


@cache
def load_presets() -> dict[str, Preset]:
    """The model catalog (planner/presets/models.toml), by name."""
    text = resources.files("planner.presets").joinpath("models.toml").read_text()
    out: dict[str, Preset] = {}
    for row in tomllib.loads(text)["model"]:
        extra = set(row) - _PRESET_KEYS
        if extra:
            raise ValueError(f"models.toml: unknown keys {sorted(extra)} in {row.get('name')}")
        out[row["name"]] = Preset(**{**row, "aliases": tuple(row.get("aliases", ()))})
    return out


def _aliases() -> dict[str, str]:
    return {a: p.name for p in load_presets().values() for a in p.aliases}


def preset_config(name: str) -> dict[str, Any]:
    """The shipped config.json dict of a preset."""
    p = load_presets()[name]
    return json.loads(resources.files("planner.presets").joinpath(p.config).read_text())


@cache
def load_preset(name: str) -> ModelSpec:
    p = load_presets()[name]
    return spec_from_hf_config(preset_config(name), name, f"preset {name}", p.source)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name or alias, or a Hugging Face config.json by path.

    Raises UserError naming the closest presets, the file, or the missing key.
    """
    key = name_or_path.strip().lower()
    presets = load_presets()
    if key in presets:
        return load_preset(key)
    aliases = _aliases()
    if key in aliases:
        return load_preset(aliases[key])
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists() or "/" in name_or_path:
        return load_config_file(path)
    raise unknown_name("model", name_or_path, [*presets, *aliases], "`plan models`")


def load_hf_config(name_or_path: str) -> dict[str, Any]:
    """The config.json dict behind a preset name, alias or path (for measurement)."""
    key = name_or_path.strip().lower()
    aliases = _aliases()
    if key in load_presets() or key in aliases:
        return preset_config(aliases.get(key, key))
    path = Path(name_or_path)
    load_config_file(path)   # the same checks and errors as for planning
    return json.loads((path / "config.json" if path.is_dir() else path).read_text())


def load_config_file(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json (or a directory holding one)."""
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"model file {str(path)!r} not found; pass a preset name (`plan models`) or a config.json path")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: {path.stat().st_size:,} bytes is too large for a config.json "
                            f"(limit {MAX_CONFIG_BYTES:,}); pass the model's config.json, not its weights")
        raw = path.read_bytes()
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise UserError(f"{path}: not valid JSON ({why}); expected a Hugging Face config.json") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return spec_from_hf_config(cfg, name, str(path), source=str(path))
