"""PyTorch FSDP2 plans: accelerate's config file, the torchrun command, and the FSDP2 settings.

accelerate's keys are the ones ``accelerate launch`` defines (accelerate/commands/launch.py:
``--fsdp_*`` and ``--parallelism_config_*``; a config file's ``fsdp_config`` entries map
onto them one to one) and the ClusterConfig fields of accelerate/commands/config/config_args.py.
FSDP2's own knobs are ``fully_shard(module, mesh=..., reshard_after_forward=...,
mp_policy=MixedPrecisionPolicy(...), offload_policy=CPUOffloadPolicy())`` (PyTorch FSDP2
docs); ``to_fsdp2_settings`` names the values a script passes there.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from planner.emit import EmitOptions, chosen, node_shape
from planner.layouts.layout import Layout

if TYPE_CHECKING:
    from planner.api import PlanResult

# The block FSDP wraps as one unit, per Hugging Face model_type (transformers' modeling_*.py)
DECODER_LAYER_CLASS = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "gpt2": "GPT2Block",
    "bert": "BertLayer",
    "falcon": "FalconDecoderLayer",
    "bloom": "BloomBlock",
    "gpt_neox": "GPTNeoXLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer",
    "llama4_text": "Llama4TextDecoderLayer",     # transformers/models/llama4/modeling_llama4.py
    "gemma3_text": "Gemma3DecoderLayer",         # transformers/models/gemma3/modeling_gemma3.py
    "gpt_oss": "GptOssDecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "olmo2": "Olmo2DecoderLayer",
    "glm4_moe": "Glm4MoeDecoderLayer",          # transformers/models/glm4_moe/modeling_glm4_moe.py
    "minimax_m2": "MiniMaxM2DecoderLayer",      # transformers/models/minimax_m2/modeling_minimax_m2.py
    "deepseek_v32": "DeepseekV32DecoderLayer",  # transformers/models/deepseek_v32/modeling_deepseek_v32.py
    "nemotron_h": "NemotronHBlock",             # transformers/models/nemotron_h/modeling_nemotron_h.py
    "qwen3_next": "Qwen3NextDecoderLayer",      # transformers/models/qwen3_next/modeling_qwen3_next.py
    "qwen3_5_text": "Qwen3_5DecoderLayer",      # transformers/models/qwen3_5/modeling_qwen3_5.py
    "qwen3_5_moe_text": "Qwen3_5MoeDecoderLayer",   # transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py
    "kimi_linear": "KimiLinearDecoderLayer",    # transformers/models/kimi_linear/modeling_kimi_linear.py
}
# accelerate's mixed_precision per planner precision; pure bf16 builds the model in bf16
# (from_pretrained(torch_dtype=torch.bfloat16)) and needs no autocast or cast policy
MIXED_PRECISION = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "no", "fp32": "no"}


def mesh_shape(lay: Layout, gpus_per_node: int) -> dict[str, int]:
    """FSDP2's device mesh, in accelerate's ParallelismConfig axes.

    Full and shard-grad-op shard over every data rank (dp x ep; expert-parallel ranks read
    different data like data-parallel ones, and accelerate has no ep axis). Hybrid shards
    inside a node and replicates across nodes: the shard group is the one
    memory.per_rank_memory sizes, dp_shard x cp ranks, the rest replicate.
    """
    data = lay.data_parallel
    replicate = 1
    if lay.sharding == "fsdp-hybrid":
        replicate = lay.hybrid_replicate(gpus_per_node)
        if data % replicate:
            replicate = 1
    return {"dp_replicate_size": replicate, "dp_shard_size": data // replicate,
            "tp_size": lay.tp, "cp_size": lay.cp}


def to_fsdp2_settings(r: PlanResult, opts: EmitOptions = EmitOptions()) -> dict[str, Any]:
    """What a training script passes to FSDP2 to run the plan, as plain values.

    Mixed precision: 16-bit parameters for compute, fp32 gradient reduction, fp32 sharded
    parameters (the memory model's FSDP accounting, memory.model_state_bytes).
    """
    lay = chosen(r).layout
    mp = MIXED_PRECISION[r.setup.precision]
    return {
        "mesh": mesh_shape(lay, r.gpu.gpus_per_node),
        "reshard_after_forward": lay.sharding != "fsdp-grad-op",
        "mp_policy": None if mp == "no" else {"param_dtype": mp, "reduce_dtype": "fp32"},
        "offload_policy": "CPUOffloadPolicy" if opts.offload_params == "cpu" else None,
        "wrap": DECODER_LAYER_CLASS.get(r.model.model_type, "the transformer block"),
        "activation_checkpointing": lay.recompute,
    }


def to_accelerate_config(r: PlanResult, opts: EmitOptions = EmitOptions()) -> dict[str, Any]:
    """accelerate's config file (``accelerate launch --config_file``) for an FSDP2 plan.

    One process per GPU; ``machine_rank`` is 0 here and each node passes its own
    ``--machine_rank``. Selective recomputation is not an accelerate option: only full
    recomputation turns on fsdp_activation_checkpointing.
    """
    cand = chosen(r)
    lay = cand.layout
    if not lay.is_fsdp:
        raise ValueError(f"accelerate's FSDP config is for FSDP plans; this plan shards with {lay.sharding}")
    n_nodes, _per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": MIXED_PRECISION[r.setup.precision],
        "num_machines": n_nodes,
        "num_processes": lay.n_gpus,
        "machine_rank": 0,
        "main_process_ip": opts.master_addr,
        "main_process_port": opts.master_port,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "debug": False,
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": lay.sharding != "fsdp-grad-op",
            "fsdp_offload_params": opts.offload_params == "cpu",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_transformer_layer_cls_to_wrap": DECODER_LAYER_CLASS.get(r.model.model_type, ""),
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
            "fsdp_activation_checkpointing": lay.recompute == "full",
        },
    }
    mesh = mesh_shape(lay, r.gpu.gpus_per_node)
    if mesh["dp_replicate_size"] > 1 or lay.tp > 1 or lay.cp > 1:
        cfg["parallelism_config"] = {f"parallelism_config_{k}": v for k, v in mesh.items()}
    return cfg


def to_torchrun_command(r: PlanResult, opts: EmitOptions = EmitOptions(),
                        script: str | None = None, script_args: tuple[str, ...] = ()) -> list[str]:
    """torchrun on every node, rendezvous over c10d (torch.distributed.run's flags).

    The endpoint reads $MASTER_ADDR in the launch script; everything else is literal.
    """
    lay = chosen(r).layout
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    cmd = ["torchrun", "--nnodes", str(n_nodes), "--nproc-per-node", str(per_node)]
    if n_nodes > 1:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"${{MASTER_ADDR}}:{opts.master_port}",
                "--rdzv-id", "planner"]
    else:
        cmd += ["--standalone"]
    return cmd + [script or opts.script, *script_args]


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))   # a JSON string is a valid double-quoted YAML scalar


def to_yaml(d: dict[str, Any], indent: int = 0) -> str:
    """A nested dict of scalars as block YAML (no dependency on a YAML library)."""
    lines = []
    for k, v in d.items():
        pad = " " * indent
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(to_yaml(v, indent + 2).rstrip("\n"))
        else:
            lines.append(f"{pad}{k}: {_yaml_scalar(v)}")
    return "\n".join(lines) + "\n"
