"""Megatron-LM's command-line arguments for plans with tensor, pipeline or context parallelism.

Flag names and their choices are Megatron-LM's (megatron/training/arguments.py:
_add_distributed_args, _add_training_args, _add_network_size_args, _add_moe_args, ...);
tests/test_emit.py checks every flag emitted here against a cited list of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.memory.model import stage_layers
from planner.emit import EmitOptions, check_options, chosen

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.layouts.layout import Layout
    from planner.models.spec import ModelSpec

POSITION = {"rope": "rope", "learned": "learned_absolute", "alibi": "none"}
# ZeRO stage -> Megatron's data-parallel sharding: the distributed optimizer shards
# optimizer states (ZeRO-1); Megatron FSDP shards gradients too, or everything
MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}


def pipeline_layout(n_layers: int, pp: int, vp: int) -> str:
    """Megatron's --pipeline-model-parallel-layout for the planner's uneven split.

    Stages are separated by "|", "E" is the embedding, "t" a transformer layer, "L" the
    loss; with virtual stages the list runs over virtual stage first, then pipeline rank
    (megatron/core/transformer/pipeline_parallel_layer_layout.py). Each rank's layers
    (memory.stage_layers) are split evenly over its vp chunks, extra layers first.
    """
    per_rank = stage_layers(n_layers, pp)
    chunks = []
    for v in range(vp):
        for s in range(pp):
            base, extra = divmod(per_rank[s], vp)
            chunks.append(base + (1 if v < extra else 0))
    parts = []
    for i, c in enumerate(chunks):
        text = ("E" if i == 0 else "") + (f"t*{c}" if c > 1 else "t" * c)
        parts.append(text + ("L" if i == len(chunks) - 1 else ""))
    return "|".join(parts)


def _model_args(m: ModelSpec, seq_len: int) -> list[str]:
    args = ["--num-layers", str(m.n_layers), "--hidden-size", str(m.d_model),
            "--ffn-hidden-size", str(m.d_ff), "--num-attention-heads", str(m.n_heads),
            "--seq-length", str(seq_len),
            "--max-position-embeddings", str(max(m.max_positions, seq_len)),
            "--position-embedding-type", POSITION.get(m.position, "none"),
            "--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            "--attention-dropout", repr(m.attention_dropout), "--hidden-dropout", repr(m.hidden_dropout)]
    if m.n_kv_heads != m.n_heads:
        args += ["--group-query-attention", "--num-query-groups", str(m.n_kv_heads)]
    if m.head_dim * m.n_heads != m.d_model:
        args += ["--kv-channels", str(m.head_dim)]
    if m.gated_mlp:
        args += ["--swiglu"]
    if not m.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    if not (m.out_bias or m.mlp_bias):
        args += ["--disable-bias-linear"]
        if m.qkv_bias:
            args += ["--add-qkv-bias"]
    if m.is_moe:
        args += ["--num-experts", str(m.n_experts), "--moe-router-topk", str(m.n_experts_per_token)]
    return args


def _parallel_args(lay: Layout, n_layers: int) -> list[str]:
    args = ["--tensor-model-parallel-size", str(lay.tp), "--pipeline-model-parallel-size", str(lay.pp),
            "--context-parallel-size", str(lay.cp)]
    if lay.ep > 1:
        args += ["--expert-model-parallel-size", str(lay.ep)]
    if lay.sp:
        args += ["--sequence-parallel"]
    even = n_layers % lay.pp == 0 and (n_layers // lay.pp) % lay.vp == 0
    if lay.pp > 1 and not even:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(n_layers, lay.pp, lay.vp)]
    elif lay.vp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(n_layers // (lay.pp * lay.vp))]
    return args


def _sharding_args(lay: Layout) -> list[str]:
    if lay.is_fsdp:
        args = ["--use-torch-fsdp2"]
        if lay.sharding == "fsdp-grad-op":
            args += ["--torch-fsdp2-no-reshard-after-forward"]
        return args
    if lay.zero_stage == 0:
        return []
    args = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if lay.zero_stage >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", MEGATRON_FSDP_STRATEGY[lay.zero_stage]]
    return args


def _recompute_args(recompute: str) -> list[str]:
    """Full: every block keeps only its input (uniform method, one layer per unit);
    selective: Megatron's default module, the core attention (Korthikanti et al. 2022)."""
    if recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if recompute == "selective":
        return ["--recompute-granularity", "selective"]
    return []


def to_megatron_args(r: PlanResult, opts: EmitOptions = EmitOptions()) -> list[str]:
    """Megatron-LM arguments for the chosen plan (pretrain_gpt.py; data and tokenizer
    arguments are the user's).

    Megatron's data-parallel size is world / (tp x pp x cp), which is the planner's
    dp x ep, so --global-batch-size = micro-batch x accumulation x dp x ep.
    """
    cand = chosen(r)
    check_options(r, opts)
    lay = cand.layout
    s = r.setup
    args = _model_args(r.model, lay.seq_len)
    args += _parallel_args(lay, r.model.n_layers)
    args += ["--micro-batch-size", str(lay.micro_batch), "--global-batch-size", str(lay.global_batch)]
    args += _sharding_args(lay)
    args += _recompute_args(lay.recompute)
    if s.precision == "bf16-mixed":
        args += ["--bf16"]
    elif s.precision == "fp16-mixed":
        args += ["--fp16"]
    args += ["--attention-backend", "flash" if s.attention == "flash" else "unfused"]
    if s.optimizer == "sgd":
        args += ["--optimizer", "sgd", "--sgd-momentum", repr(opts.sgd_momentum)]
    else:
        args += ["--optimizer", "adam", "--adam-beta1", repr(opts.betas[0]), "--adam-beta2", repr(opts.betas[1]),
                 "--adam-eps", repr(opts.eps)]
    args += ["--lr", repr(opts.lr), "--weight-decay", repr(opts.weight_decay), "--clip-grad", repr(opts.grad_clip)]
    if opts.offload_optimizer == "cpu":
        args += ["--optimizer-cpu-offload"]
    return args
