"""A torchtitan 0.3.0 job for a plan: a config_registry module its own ConfigManager loads.

torchtitan 0.3.0 has no TOML job files: its ConfigManager (torchtitan/config/manager.py)
takes ``--module M --config F``, imports M (a short name under torchtitan.models, or any
importable module) and calls F() for a ``Trainer.Config``, then applies ``--section.key``
overrides with tyro. So the job is a small Python module, torchtitan_job.py, whose
``planner_job()`` starts from torchtitan's own Llama 3 recipe (llama3_8b: AdamW, chunked
loss, data loader, checkpoints) and sets what the plan decides:

- parallelism (torchtitan/config/configs.py ParallelismConfig): data_parallel_replicate_degree,
  data_parallel_shard_degree, fsdp_reshard_after_forward, tensor_parallel_degree,
  enable_sequence_parallel, pipeline_parallel_degree, pipeline_parallel_microbatch_size,
  context_parallel_degree;
- training (TrainingConfig): local_batch_size (the micro-batch x the micro-batches a
  pipeline splits it into), global_batch_size, seq_len, steps, enable_cpu_offload;
- lr_scheduler: LRSchedulersContainer.Config with the run's warmup, cosine decay and floor
  (planner.emit.schedule; training.steps is the run's length from --tokens);
- activation_checkpoint: SelectiveAC.Config() / FullAC.Config() / None;
- FP8 (``--precision fp8``, recipe rowwise): torchtitan's Float8LinearConverter
  (torchtitan/components/quantization/float8.py, ``Config(recipe_name="rowwise",
  filter_fqns=[...])``) among the model's converters, with the output head filtered out
  as torchtitan's own llama3_405b recipe does (``filter_fqns=["lm_head"]``); it needs
  torchao and an SM89+ GPU at run time;
- 16-bit Adam moments (``--optimizer adamw-bf16-states``): the optimizer container's
  ``implementation="fused_opt_states_bf16"`` (torchtitan/components/optimizer/optimizer.py:
  fp32 parameters, bf16 exp_avg and exp_avg_sq through the fused CUDA kernel);
- the model: torchtitan's flavor (model_registry("8B"), "70B", "405B") when the model is
  one of them, else a Llama3Model.Config built from the planner's numbers with torchtitan's
  public builders (make_gqa_config, make_ffn_config, ComplexRoPE, RMSNorm), the way
  torchtitan/models/llama3/__init__.py builds its flavors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.emit import EmitOptions, chosen, label
from planner.stacks.architecture import architecture

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.models.spec import ModelSpec

MODULE = "torchtitan_job"
CONFIG = "planner_job"
# torchtitan/models/llama3/__init__.py: the flavors' shapes (dim, layers, heads, kv heads,
# FFN hidden, vocab), all untied, rope theta 500000 with Llama scaling
FLAVORS = {
    "8B": (4096, 32, 32, 8, 14336, 128256),
    "70B": (8192, 80, 64, 8, 28672, 128256),
    "405B": (16384, 126, 128, 8, 53248, 128256),
}
RESHARD = {"fsdp-full": "default", "fsdp-hybrid": "default", "fsdp-grad-op": "never"}


def flavor(m: ModelSpec) -> str | None:
    """torchtitan's Llama 3 flavor that is exactly ``m``, or None."""
    arch = architecture(m)
    shape = (m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.d_ff, m.vocab_size)
    sc = arch.rope_scaling
    llama31 = (arch.rope_theta == 500000.0 and sc is not None and sc.rope_type == "llama3" and sc.factor == 8.0
               and not m.tied_embeddings)
    return next((name for name, s in FLAVORS.items() if s == shape and llama31), None)


def parallelism(r: PlanResult) -> dict[str, object]:
    """ParallelismConfig fields for the chosen layout.

    FSDP full / grad-op shard over all dp ranks; hybrid shards inside the mesh the memory
    model sizes and replicates the rest (emit.fsdp.mesh_shape); ZeRO-0 is DDP replicas.
    """
    from planner.emit.fsdp import mesh_shape

    lay = chosen(r).layout
    if lay.is_fsdp:
        mesh = mesh_shape(lay, r.gpu.gpus_per_node)
        replicate, shard = mesh["dp_replicate_size"], mesh["dp_shard_size"]
    else:
        replicate, shard = lay.dp, 1
    out: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": RESHARD.get(lay.sharding, "default"),
        "tensor_parallel_degree": lay.tp,
        "enable_sequence_parallel": lay.sp or lay.tp == 1,
        "pipeline_parallel_degree": lay.pp,
        "context_parallel_degree": lay.cp,
    }
    if lay.pp > 1:
        out["pipeline_parallel_microbatch_size"] = lay.micro_batch
        out["pipeline_parallel_schedule"] = "Interleaved1F1B" if lay.vp > 1 else "1F1B"
        if lay.vp > 1:
            out["pipeline_parallel_layers_per_stage"] = -(-r.model.n_layers // (lay.pp * lay.vp))
    return out


def training(r: PlanResult, opts: EmitOptions) -> dict[str, object]:
    """TrainingConfig fields: torchtitan's local batch is one data rank's share of a step.

    Without pipeline parallelism torchtitan accumulates gradients over
    global / (local x dp) micro-batches; with it, the pipeline splits the local batch into
    micro-batches of pipeline_parallel_microbatch_size, so the local batch is the
    micro-batch x the accumulation steps.
    """
    from planner.emit.schedule import training_schedule

    lay = chosen(r).layout
    local = lay.micro_batch * (lay.grad_accum if lay.pp > 1 else 1)
    steps = training_schedule(r, opts).steps
    return {
        "local_batch_size": local,
        "global_batch_size": lay.global_batch,
        "seq_len": lay.seq_len,
        "steps": steps,
        "max_norm": opts.grad_clip,
        "enable_cpu_offload": opts.offload_params == "cpu",
        # Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet"
        "disable_cuda_graphs": lay.pp > 1,
        "mixed_precision_param": "bfloat16" if r.setup.precision in ("bf16-mixed", "fp8") else "float32",
    }


FP8_HEAD_FILTER = ["lm_head"]      # torchtitan 0.3.0 models/llama3/config_registry.py, llama3_405b


def lr_scheduler(r: PlanResult, opts: EmitOptions) -> str:
    """The LRSchedulersContainer.Config expression of the run's schedule (planner.emit.schedule):
    warmup_steps, cosine decay over the rest (decay_ratio None: decay right after the warmup),
    min_lr_factor = min lr / peak lr (torchtitan/components/optimizer/lr_scheduler.py, 0.3.0)."""
    from planner.emit.schedule import training_schedule

    sch = training_schedule(r, opts)
    return (f'LRSchedulersContainer.Config(warmup_steps={sch.warmup_steps}, decay_type="cosine", '
            f"min_lr_factor={sch.min_lr / sch.peak_lr:.6g})")


def fp8_converter(r: PlanResult) -> str | None:
    """The Float8LinearConverter.Config expression for a plan in FP8, or None."""
    fp8 = r.setup.precision_spec.fp8
    if fp8 is None:
        return None
    return f"Float8LinearConverter.Config(recipe_name={fp8.name!r}, filter_fqns={FP8_HEAD_FILTER!r})"


def _custom_model(m: ModelSpec, converter: str | None = None) -> list[str]:
    arch = architecture(m)
    sc = arch.rope_scaling
    if sc is not None and sc.rope_type == "llama3":
        rope = (f'ComplexRoPE.Config(dim={m.head_dim}, max_seq_len={max(m.max_positions, 1)}, '
                f'theta={arch.rope_theta!r}, scaling="llama", scaling_factor={sc.factor!r}, '
                f'low_freq_factor={sc.low_freq_factor!r}, high_freq_factor={sc.high_freq_factor!r}, '
                f'original_max_position_embeddings={sc.original_max_positions})')
    else:
        rope = (f'ComplexRoPE.Config(dim={m.head_dim}, max_seq_len={max(m.max_positions, 1)}, '
                f'theta={arch.rope_theta!r}, scaling="none")')
    return [
        "",
        "",
        "def planner_model() -> ModelSpec:",
        f'    """{label(m.name)} as a torchtitan Llama3Model.Config, built as torchtitan/models/llama3/__init__.py',
        '    builds its flavors (fused QKV, RMSNorm, SwiGLU of hidden_dim, complex RoPE)."""',
        f"    dim, n_layers, n_heads, n_kv_heads, hidden_dim, vocab = "
        f"{m.d_model}, {m.n_layers}, {m.n_heads}, {m.n_kv_heads}, {m.d_ff}, {m.vocab_size}",
        f"    eps = {arch.norm_eps!r}",
        "    linear = {\"weight\": partial(nn.init.trunc_normal_, std=0.02), \"bias\": nn.init.zeros_}",
        "    norm_init = {\"weight\": nn.init.ones_}",
        "    layers = [",
        "        Llama3TransformerBlock.Config(",
        "            attention_norm=RMSNorm.Config(normalized_shape=dim, eps=eps, param_init=norm_init),",
        "            ffn_norm=RMSNorm.Config(normalized_shape=dim, eps=eps, param_init=norm_init),",
        "            attention=make_gqa_config(",
        "                dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, fuse_qkv=True,",
        "                wqkv_param_init=linear, wo_param_init=linear,",
        "                inner_attention=get_attention_config(\"flex\"),",
        f"                rope={rope}),",
        "            feed_forward=make_ffn_config(dim=dim, hidden_dim=hidden_dim, w1_param_init=linear,",
        "                                         w2w3_param_init=linear))",
        "        for _ in range(n_layers)]",
        "    model = Llama3Model.Config(",
        "        dim=dim, vocab_size=vocab,",
        f"        enable_weight_tying={m.tied_embeddings!r},",
        "        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,",
        "                                        param_init={\"weight\": partial(nn.init.normal_, std=1.0)}),",
        "        norm=RMSNorm.Config(normalized_shape=dim, eps=eps, param_init=norm_init),",
        "        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=linear),",
        "        layers=layers)",
        *([f"    model = {converter}.build().convert(model)   # as model_registry(..., converters=[...]) does"]
          if converter else []),
        f'    return replace(model_registry("8B"), flavor={m.name!r}, model=model)',
    ]


def to_torchtitan_job(r: PlanResult, opts: EmitOptions = EmitOptions()) -> str:
    """The text of torchtitan_job.py for the chosen plan (see the module docstring)."""
    from planner.emit.schedule import training_schedule

    cand = chosen(r)
    lay, m = cand.layout, r.model
    fl = flavor(m)
    converter = fp8_converter(r)
    ac = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()", "none": "None"}[lay.recompute]
    head = [
        f'"""torchtitan 0.3.0 job written by planner: {label(m.name)} on {lay.n_gpus} x {label(r.gpu.name)}.',
        "",
        f"Layout: {lay.describe()}.",
        "torchtitan reads it with its own ConfigManager (torchtitan/config/manager.py):",
        f"    PYTHONPATH=<this directory> torchrun ... -m torchtitan.train --module {MODULE} --config {CONFIG}",
        "Command-line overrides still apply (e.g. --training.steps 100 --hf_assets_path ./assets/hf/...).",
        f"Training length and schedule: {training_schedule(r, opts).describe()}.",
        '"""',
        "",
        "from dataclasses import replace",
        "",
        "from torchtitan.components.optimizer import default_adamw",
        "from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer",
        "from torchtitan.config import ParallelismConfig, TrainingConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
        "from torchtitan.models.llama3 import model_registry",
        "from torchtitan.models.llama3.config_registry import llama3_8b",
        "from torchtitan.trainer import Trainer",
    ]
    if converter:
        head += ["from torchtitan.components.quantization import Float8LinearConverter"]
    if fl is None:
        head += [
            "from functools import partial",
            "",
            "import torch.nn as nn",
            "from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm",
            "from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config",
            "from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock",
            "from torchtitan.protocols.model_spec import ModelSpec",
        ]
        head += _custom_model(m, converter)
    if fl:
        model_line = f'model_registry("{fl}", converters=[{converter}])' if converter else f'model_registry("{fl}")'
    else:
        model_line = "planner_model()"
    opt_line = (f"default_adamw(lr={opts.lr!r}, betas={tuple(opts.betas)!r}, eps={opts.eps!r}, "
                f"weight_decay={opts.weight_decay!r})")
    if r.setup.optimizer == "adamw-bf16-states":
        opt_line = f'replace({opt_line}, implementation="fused_opt_states_bf16")'
    par = ", ".join(f"{k}={v!r}" for k, v in parallelism(r).items())
    tr = ", ".join(f"{k}={v!r}" for k, v in training(r, opts).items())
    body = [
        "",
        "",
        f"def {CONFIG}() -> Trainer.Config:",
        '    """torchtitan\'s Llama 3 recipe (llama3_8b: AdamW, chunked loss, data, checkpoints) with the plan."""',
        "    config = llama3_8b()",
        f"    config.model_spec = {model_line}",
        f"    config.loss.loss_fn.global_vocab_size = {m.vocab_size}",
        f"    config.parallelism = replace(config.parallelism, {par})",
        f"    config.training = replace(config.training, {tr})",
        f"    config.activation_checkpoint = {ac}",
        f"    config.optimizer = {opt_line}",
        f"    config.lr_scheduler = {lr_scheduler(r, opts)}",
        "    return config",
        "",
        "",
        "__all__ = [\"ParallelismConfig\", \"TrainingConfig\", \"planner_job\"]",
    ]
    return "\n".join(head + body) + "\n"
