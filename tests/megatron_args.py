"""Megatron-LM's argument parser and the validate_args rules that concern the flags we emit:
a referee for the tests of megatron_args.txt and launch.sh (tests/test_emit*.py, moved here
from planner/stacks/megatron.py, which no command used it from).

megatron-core's wheel (0.16.1) does not ship megatron/training/arguments.py, so its
parser cannot run here. Two cited copies stand in for it, from NVIDIA/Megatron-LM
megatron/training/arguments.py at commit 000c4ac24f61159c138b0975def722c65245983c:

- ARGUMENTS: the name, type and choices of every flag planner emits (functions
  _add_network_size_args, _add_regularization_args, _add_training_args,
  _add_learning_rate_args, _add_checkpointing_args, _add_mixed_precision_args,
  _add_distributed_args, _add_tokenizer_args, _add_moe_args). FLAG = action='store_true';
  NOT_FLAG = action='store_false' with the dest given.
- RULES: each assertion of validate_args that can fire on those flags, as one function
  returning the message Megatron-LM would stop with (its own words), or None.

``megatron_args_errors`` parses an argument list with ARGUMENTS and runs RULES under a
launch environment (CUDA_DEVICE_MAX_CONNECTIONS, world size, GPU architecture); the
model-parallel config classes of megatron-core check the rest (tests/test_emit.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

MEGATRON_COMMIT = "000c4ac24f61159c138b0975def722c65245983c"
SOURCE = f"NVIDIA/Megatron-LM megatron/training/arguments.py @ {MEGATRON_COMMIT}"

FLAG = "flag"


@dataclass(frozen=True, slots=True)
class NotFlag:
    """action='store_false' writing False to ``dest``."""

    dest: str


@dataclass(frozen=True, slots=True)
class Many:
    """nargs='+' with these choices; without choices, nargs='*' of any words."""

    choices: tuple[str, ...]


def moe_freq_type(x: str) -> int | list[int]:
    """Megatron-LM's moe_freq_type (arguments.py, same commit): an integer, or a Python list
    expression of digits, commas, brackets, parentheses, + and * evaluated to a list."""
    import re

    if "[" not in x:
        return int(x)
    if re.search(r"[^,\d\[\]\(\)\+\*]", x):
        raise ValueError(f"Invalid pattern: {x}")
    return list(eval(x))  # noqa: S307 -- Megatron-LM's own evaluation of the checked expression


ARGUMENTS: dict[str, object] = {
    # _add_network_size_args
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int, "--num-attention-heads": int,
    "--kv-channels": int, "--group-query-attention": FLAG, "--num-query-groups": int,
    "--max-position-embeddings": int,
    "--position-embedding-type": ["learned_absolute", "rope", "mrope", "relative", "none"],
    "--rotary-base": int, "--rotary-percent": float, "--use-rope-scaling": FLAG, "--rope-scaling-factor": float,
    "--make-vocab-size-divisible-by": int, "--normalization": ["LayerNorm", "RMSNorm"], "--norm-epsilon": float,
    "--swiglu": FLAG, "--openai-gelu": FLAG, "--untie-embeddings-and-output-weights": FLAG,
    # _add_regularization_args
    "--attention-dropout": float, "--hidden-dropout": float, "--weight-decay": float, "--clip-grad": float,
    "--adam-beta1": float, "--adam-beta2": float, "--adam-eps": float, "--sgd-momentum": float,
    # _add_training_args
    "--micro-batch-size": int, "--global-batch-size": int, "--recompute-activations": FLAG,
    "--recompute-granularity": ["full", "selective"], "--recompute-method": ["uniform", "block"],
    "--recompute-num-layers": int, "--sequence-parallel": FLAG,
    "--no-gradient-accumulation-fusion": NotFlag("gradient_accumulation_fusion"),
    "--optimizer": ["adam", "sgd", "muon", "dist_muon"], "--optimizer-cpu-offload": FLAG,
    "--use-precision-aware-optimizer": FLAG,
    "--disable-bias-linear": NotFlag("add_bias_linear"), "--add-qkv-bias": FLAG, "--use-flash-attn": FLAG,
    "--attention-backend": ["flash", "fused", "unfused", "local", "auto"],
    # _add_learning_rate_args, _add_mixed_precision_args
    "--lr": float, "--fp16": FLAG, "--bf16": FLAG, "--grad-reduce-in-bf16": FLAG,
    "--train-iters": int, "--train-samples": int, "--min-lr": float,
    "--lr-decay-style": ["constant", "linear", "cosine", "inverse-square-root", "WSD"],
    "--lr-warmup-samples": int, "--lr-decay-samples": int, "--lr-warmup-iters": int, "--lr-decay-iters": int,
    # _add_checkpointing_args
    "--ckpt-format": ["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"],
    # _add_distributed_args
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int,
    "--pipeline-model-parallel-layout": str, "--num-layers-per-virtual-pipeline-stage": int,
    "--num-virtual-stages-per-pipeline-rank": int, "--overlap-grad-reduce": FLAG, "--overlap-p2p-comm": FLAG,
    "--overlap-param-gather": FLAG, "--use-distributed-optimizer": FLAG, "--use-megatron-fsdp": FLAG,
    "--data-parallel-sharding-strategy": ["no_shard", "optim", "optim_grads", "optim_grads_params"],
    "--use-torch-fsdp2": FLAG, "--torch-fsdp2-no-reshard-after-forward": FLAG, "--context-parallel-size": int,
    "--num-distributed-optimizer-instances": int,
    # _add_data_args, _add_tokenizer_args
    "--seq-length": int, "--vocab-size": int,
    # _add_moe_args
    "--expert-model-parallel-size": int, "--expert-tensor-parallel-size": int, "--num-experts": int,
    "--moe-router-topk": int,
    "--moe-router-load-balancing-type": ["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"],
    "--moe-aux-loss-coeff": float,
    # FP8 and the precision-aware optimizer's state dtypes. These are not from the commit
    # above: names and choices follow megatron-core 0.16.1's config classes, which Megatron-LM
    # builds its parser from (TransformerConfig: fp8 with argparse name --fp8-format,
    # Literal['e4m3', 'hybrid']; fp8_recipe Literal['tensorwise', 'delayed', 'mxfp8',
    # 'blockwise', 'custom']; fp8_amax_history_len int; fp8_amax_compute_algo
    # Literal['most_recent', 'max']. OptimizerConfig: exp_avg_dtype / exp_avg_sq_dtype, torch
    # dtypes, given on Megatron-LM's command line as fp32, fp16, bf16 or fp8)
    "--fp8-format": ["e4m3", "hybrid"], "--fp8-recipe": ["tensorwise", "delayed", "mxfp8", "blockwise", "custom"],
    "--fp8-amax-history-len": int, "--fp8-amax-compute-algo": ["most_recent", "max"],
    # TransformerConfig fp8_param (--fp8-param-gather); fp4 ('e2m1', --fp4-format) and
    # fp4_recipe ('nvfp4', 'custom'); ModelParallelConfig cpu_offloading and
    # cpu_offloading_num_layers; TransformerConfig mtp_num_layers (megatron-core 0.16.1)
    "--fp8-param-gather": FLAG, "--fp4-format": ["e2m1"], "--fp4-recipe": ["nvfp4", "custom"],
    "--cpu-offloading": FLAG, "--cpu-offloading-num-layers": int, "--mtp-num-layers": int,
    # TransformerConfig first_last_layers_bf16 (bool), num_layers_at_start_in_bf16 and
    # num_layers_at_end_in_bf16 (int) (megatron-core 0.16.1 transformer_config.py)
    "--first-last-layers-bf16": FLAG, "--num-layers-at-start-in-bf16": int, "--num-layers-at-end-in-bf16": int,
    # TransformerConfig recompute_modules (nargs '+', megatron-core 0.16.1) and moe_grouped_gemm
    "--moe-grouped-gemm": FLAG,
    "--recompute-modules": Many(("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                 "shared_experts")),
    "--exp-avg-dtype": ["fp32", "fp16", "bf16", "fp8"], "--exp-avg-sq-dtype": ["fp32", "fp16", "bf16", "fp8"],
    # The pipeline split's embedding and loss (not from the commit above either): megatron-core
    # 0.16.1 TransformerConfig account_for_embedding_in_pipeline_split and
    # account_for_loss_in_pipeline_split, bools (transformer/transformer_config.py lines 96-102)
    "--account-for-embedding-in-pipeline-split": FLAG, "--account-for-loss-in-pipeline-split": FLAG,
    # ModelParallelConfig microbatch_group_size_per_vp_stage, Optional[int], argparse name
    # --microbatch-group-size-per-virtual-pipeline-stage (model_parallel_config.py lines 343-347)
    "--microbatch-group-size-per-virtual-pipeline-stage": int,
    # ModelParallelConfig cross_entropy_loss_fusion (bool) and cross_entropy_fusion_impl
    # (Literal['native', 'te']), model_parallel_config.py lines 241-249
    "--cross-entropy-loss-fusion": FLAG, "--cross-entropy-fusion-impl": ["native", "te"],
    # Not from the commit above either: the MoE dispatcher, the expert-parallel all-to-all overlap
    # and CUDA graphs as Megatron-LM's arguments.py of 2026 names them (_add_moe_args
    # --moe-token-dispatcher-type allgather|alltoall|flex, default allgather;
    # --overlap-moe-expert-parallel-comm; _add_training_args --cuda-graph-impl none|local|
    # transformer_engine and --cuda-graph-scope, nargs '+'), the fields of megatron-core 0.16.1's
    # TransformerConfig (moe_token_dispatcher_type, overlap_moe_expert_parallel_comm,
    # cuda_graph_impl, cuda_graph_scope; transformer/enums.py CudaGraphScope)
    "--moe-token-dispatcher-type": ["allgather", "alltoall", "flex"],
    "--overlap-moe-expert-parallel-comm": FLAG,
    "--cuda-graph-impl": ["none", "local", "transformer_engine"],
    "--cuda-graph-scope": Many(("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration")),
    # Hybrid Mamba models, run by pretrain_mamba.py. From Megatron-LM's arguments.py:
    # --squared-relu (_add_network_size_args, action='store_true'); --spec (nargs='*': the module
    # and the name of the layer spec pretrain_mamba.py builds); --hybrid-attention-ratio and
    # --hybrid-mlp-ratio (float, default 0.0) and --hybrid-override-pattern (str), the arguments
    # MambaModel takes of the same names. Not from the commit: the Mamba mixer's sizes
    # and the hybrid flag as megatron-core 0.16.1's TransformerConfig names them (mamba_state_dim,
    # mamba_head_dim, mamba_num_groups ints, mamba_num_heads Optional[int], is_hybrid_model bool;
    # transformer/transformer_config.py lines 843-857), the MoE expert and shared-expert widths
    # (moe_ffn_hidden_size, moe_shared_expert_intermediate_size, Optional[int]) and the latent
    # MoE width (moe_latent_size, Optional[int], line 719): argparse names --mamba-state-dim, ...,
    # as NVIDIA's Nemotron 3 Megatron-LM scripts and checkpoint loaders pass them
    "--squared-relu": FLAG, "--spec": Many(()), "--hybrid-attention-ratio": float, "--hybrid-mlp-ratio": float,
    "--hybrid-override-pattern": str, "--is-hybrid-model": FLAG, "--mamba-state-dim": int,
    "--mamba-head-dim": int, "--mamba-num-groups": int, "--mamba-num-heads": int,
    "--moe-ffn-hidden-size": int, "--moe-shared-expert-intermediate-size": int, "--moe-latent-size": int,
    # The DeepSeek-V3-style MoE block and attention of GLM-4.5 (not from the commit above): the fields
    # of megatron-core 0.16.1's TransformerConfig under their argparse names (Megatron-LM builds
    # its parser from them): qk_layernorm bool (transformer_config.py line 208), moe_layer_freq
    # Union[int, List[int]] (line 556; Megatron-LM's moe_freq_type evaluates a "([0]*3+[1]*89)"
    # string into the list), moe_router_num_groups / moe_router_group_topk Optional[int] (598,
    # 614), moe_router_topk_scaling_factor Optional[float] (622), moe_router_score_function
    # Literal['softmax', 'sigmoid'] (626), moe_router_enable_expert_bias bool (634)
    "--qk-layernorm": FLAG, "--moe-layer-freq": str, "--moe-router-num-groups": int,
    "--moe-router-group-topk": int, "--moe-router-topk-scaling-factor": float,
    "--moe-router-score-function": ["softmax", "sigmoid"], "--moe-router-enable-expert-bias": FLAG,
    # Multi-latent attention, from the commit above: --multi-latent-attention
    # (_add_network_size_args, action='store_true'), _add_mla_args (--q-lora-rank int default
    # None, --kv-lora-rank 32, --qk-head-dim 128, --qk-pos-emb-head-dim 64, --v-head-dim 128,
    # --rotary-scaling-factor float 1.0, --mscale 1.0, --mscale-all-dim 0.0), --no-rope-fusion
    # (_add_training_args, store_false into apply_rope_fusion) and --rope-type (choices rope,
    # yarn, default None, which core_transformer_config_from_args pops so that
    # MLATransformerConfig's default 'yarn' holds)
    "--multi-latent-attention": FLAG, "--q-lora-rank": int, "--kv-lora-rank": int, "--qk-head-dim": int,
    "--qk-pos-emb-head-dim": int, "--v-head-dim": int, "--rotary-scaling-factor": float, "--mscale": float,
    "--mscale-all-dim": float, "--rope-type": ["rope", "yarn"], "--no-rope-fusion": NotFlag("apply_rope_fusion"),
    # Gated DeltaNet hybrids (Qwen3-Next), run by pretrain_gpt.py. From Megatron-LM's arguments.py:
    # --apply-layernorm-1p (_add_network_size_args, action='store_true'). Not from the commit:
    # megatron-core 0.16.1 TransformerConfig's fields (transformer_config.py: attention_output_gate bool,
    # experimental_attention_variant Literal['gated_delta_net', 'dsa'],
    # linear_attention_freq Optional[Union[int, List[int]]], linear_conv_kernel_dim,
    # linear_key_head_dim, linear_value_head_dim, linear_num_key_heads, linear_num_value_heads
    # Optional[int]; moe_shared_expert_gate bool) under the argparse names Megatron-LM's own
    # scripts give them (examples/mimo/scripts/run_qwen35_vlm_train.sh: --linear-attention-freq 4),
    # --linear-attention-freq read as Megatron-LM reads --moe-layer-freq (moe_freq_type, at the
    # commit above: an integer or a Python list expression such as "[1,0,1]")
    "--apply-layernorm-1p": FLAG, "--attention-output-gate": FLAG,
    "--experimental-attention-variant": ["gated_delta_net", "dsa"], "--linear-attention-freq": moe_freq_type,
    "--linear-conv-kernel-dim": int, "--linear-key-head-dim": int, "--linear-value-head-dim": int,
    "--linear-num-key-heads": int, "--linear-num-value-heads": int, "--moe-shared-expert-gate": FLAG,
}

# Defaults of the flags the rules read, as the parser sets them (same file and commit).
_DEFAULTS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
             "expert_model_parallel_size": 1, "ckpt_format": "torch_dist", "rotary_base": 10000,
             "rope_scaling_factor": 8.0, "norm_epsilon": 1e-5, "make_vocab_size_divisible_by": 128,
             "rotary_percent": 1.0, "position_embedding_type": "learned_absolute", "normalization": "LayerNorm",
             "lr_warmup_samples": 0, "lr_warmup_iters": 0, "hybrid_attention_ratio": 0.0,
             "hybrid_mlp_ratio": 0.0, "mamba_state_dim": 128, "mamba_head_dim": 64, "mamba_num_groups": 8,
             "kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
             "rotary_scaling_factor": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}


def parser() -> argparse.ArgumentParser:
    """An argparse parser with Megatron-LM's names, types and choices for ARGUMENTS."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    for name, kind in ARGUMENTS.items():
        if kind == FLAG:
            p.add_argument(name, action="store_true")
        elif isinstance(kind, NotFlag):
            p.add_argument(name, action="store_false", dest=kind.dest)
        elif isinstance(kind, list):
            p.add_argument(name, choices=kind)
        elif isinstance(kind, Many) and not kind.choices:     # nargs='*', any words
            p.add_argument(name, nargs="*")
        elif isinstance(kind, Many):
            p.add_argument(name, nargs="+", choices=kind.choices)
        else:
            p.add_argument(name, type=kind)  # type: ignore[arg-type]
    p.set_defaults(**_DEFAULTS)
    return p


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchEnv:
    """What validate_args reads besides the flags: the environment and the GPU."""

    world_size: int
    cuda_device_max_connections: str | None      # the variable's value, None when unset
    device_arch_major: int                      # 9 for Hopper, 10 for Blackwell (get_device_arch_version)


Rule = Callable[[argparse.Namespace, LaunchEnv], "str | None"]


def _world(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    model = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    if e.world_size % model:
        return f"world size ({e.world_size}) is not divisible by total_model_size ({model})"
    return None


def _global_batch(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    # megatron/core/num_microbatches_calculator.py: global batch = micro x dp x num micro-batches
    dp = e.world_size // (a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size)
    if a.global_batch_size % (a.micro_batch_size * dp):
        return (f"global batch size ({a.global_batch_size}) is not divisible by micro batch size "
                f"({a.micro_batch_size}) times data parallel size ({dp})")
    return None


def _virtual_pp(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    n = sum(x is not None for x in (a.num_layers_per_virtual_pipeline_stage,
                                     a.num_virtual_stages_per_pipeline_rank, a.pipeline_model_parallel_layout))
    if n > 1:
        return "No more than one of the following arguments can be set at the same time: ..."
    return None


def _layers_divisible(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    # with the embedding and the loss counted as layers, num_layers + 1 for each (megatron-core
    # 0.16.1 TransformerConfig.__post_init__, transformer_config.py lines 1436-1448, which checks
    # that split itself)
    n = a.num_layers + int(a.account_for_embedding_in_pipeline_split) + int(a.account_for_loss_in_pipeline_split)
    if a.pipeline_model_parallel_layout is None and n % a.pipeline_model_parallel_size:
        return "Number of layers should be divisible by the pipeline-model-parallel size"
    return None


def _interleaved_pp(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    vp = a.num_layers_per_virtual_pipeline_stage is not None or a.num_virtual_stages_per_pipeline_rank is not None
    if a.pipeline_model_parallel_layout is not None:
        vp = a.pipeline_model_parallel_layout.count("|") + 1 > a.pipeline_model_parallel_size
    if vp and not a.overlap_p2p_comm and a.pipeline_model_parallel_size <= 2:
        return ("When interleaved schedule is used and p2p communication overlap is disabled, "
                "pipeline-model-parallel size should be greater than 2")
    return None


def _overlap_param_gather(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if a.overlap_param_gather and not (a.use_distributed_optimizer or a.use_megatron_fsdp):
        return "--overlap-param-gather only supported with distributed optimizer or megatron fsdp"
    if a.overlap_param_gather and not a.overlap_grad_reduce:
        return "Must use --overlap-param-gather with --overlap-grad-reduce"
    return None


def _torch_fsdp2(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if not a.use_torch_fsdp2:
        return None
    if a.pipeline_model_parallel_size != 1:
        return "--use-torch-fsdp2 is not supported with pipeline parallelism"
    if a.expert_model_parallel_size != 1:
        return "--use-torch-fsdp2 is not supported with expert parallelism"
    if a.use_distributed_optimizer:
        return "--use-torch-fsdp2 is not supported with MCore's distributed optimizer"
    if a.gradient_accumulation_fusion:
        return "--use-torch-fsdp2 is not supported with gradient accumulation fusion"
    if a.ckpt_format not in ("torch_dist", "torch_dcp"):
        return "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp"
    if not a.untie_embeddings_and_output_weights:
        return "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"
    if a.fp16:
        return "--use-torch-fsdp2 not supported with fp16 yet"
    if e.cuda_device_max_connections == "1":
        return "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"
    return None


def _megatron_fsdp(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if not a.use_megatron_fsdp:
        return None
    if e.cuda_device_max_connections == "1":
        return "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"
    if a.ckpt_format != "fsdp_dtensor":
        return "Megatron FSDP only supports fsdp_dtensor checkpoint format"
    return None


def _cuda_device_max_connections(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    # "CUDA_DEVICE_MAX_CONNECTIONS requirement no longer exists since the Blackwell architecture";
    # with FSDP (torch or Megatron) it is only a warning
    model_split = a.tensor_model_parallel_size > 1 or a.context_parallel_size > 1
    fsdp = a.use_torch_fsdp2 or a.use_megatron_fsdp
    if model_split and e.device_arch_major < 10 and not fsdp and e.cuda_device_max_connections != "1":
        return ("Using tensor model parallelism or context parallelism require setting the environment "
                "variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
    return None


def _seq_length(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if a.context_parallel_size > 1 and a.seq_length % (2 * a.context_parallel_size):
        return "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1."
    if a.max_position_embeddings < a.seq_length:
        return (f"max_position_embeddings ({a.max_position_embeddings}) must be greater than or equal to "
                f"seq_length ({a.seq_length}).")
    return None


def _recompute(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if a.recompute_granularity == "selective" and a.recompute_method is not None:
        return "recompute method is not yet supported for selective recomputing granularity"
    return None


def _experts(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if a.expert_model_parallel_size > 1:
        if a.num_experts is None:
            return "num_experts must be non None to use expert model parallelism"
        if a.num_experts % a.expert_model_parallel_size:
            return "Number of experts should be a multiple of expert model parallel_size."
        if a.fp16:
            return "Expert parallelism is not supported with fp16 training."
    return None


def _cpu_offload(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    if a.optimizer_cpu_offload and not a.use_precision_aware_optimizer:
        return ("The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`, "
                "as the hybrid device optimizer reuses the code path of this flag.")
    return None


def _train_length(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    # megatron/training/training.py, get_optimizer_param_scheduler (same commit): neither given
    if not a.train_iters and not a.train_samples:
        return "either train-iters or train-samples should be provided."
    return None


def _sample_based(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    # validate_args, "Sample-based training": no iteration-based options beside --train-samples
    if a.train_samples:
        if a.train_iters is not None:
            return "expected sample-based training"
        if a.lr_decay_iters is not None:
            return "expected sample-based learning rate decay"
        if a.lr_warmup_iters != 0:
            return "expected sample-based learnig rate warmup"
    if a.train_iters and (a.lr_decay_samples is not None or a.lr_warmup_samples != 0):
        return "expected iteration-based learning rate decay"
    return None


def _warmup_before_decay(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    # megatron/core/optimizer_param_scheduler.py, OptimizerParamScheduler.__init__ asserts
    # lr_decay_steps > 0 and lr_warmup_steps < lr_decay_steps (decay defaults to the length)
    if a.train_samples:
        decay = a.lr_decay_samples if a.lr_decay_samples is not None else a.train_samples
        if not 0 <= a.lr_warmup_samples < decay:
            return "lr_warmup_steps < lr_decay_steps"
    return None


def _required(a: argparse.Namespace, e: LaunchEnv) -> str | None:
    for name in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings", "micro_batch_size"):
        if getattr(a, name) is None:
            return f"{name} argument is None"
    return None


# (rule, what validate_args checks); every message is validate_args' own (SOURCE)
RULES: tuple[tuple[Rule, str], ...] = (
    (_required, "required arguments and micro batch size are given"),
    (_world, "world size divisible by tp x pp x cp"),
    (_global_batch, "global batch = micro batch x data-parallel size x micro-batches"),
    (_virtual_pp, "one way of giving virtual pipeline stages"),
    (_layers_divisible, "layers divide over pp unless a pipeline layout is given"),
    (_interleaved_pp, "interleaved schedules need pp > 2 without --overlap-p2p-comm"),
    (_overlap_param_gather, "--overlap-param-gather needs the distributed optimizer and --overlap-grad-reduce"),
    (_torch_fsdp2, "--use-torch-fsdp2: no pp, no ep, no distributed optimizer, no gradient-accumulation fusion, "
                   "torch_dist checkpoints, untied embeddings, no fp16, CUDA_DEVICE_MAX_CONNECTIONS != 1"),
    (_megatron_fsdp, "--use-megatron-fsdp: fsdp_dtensor checkpoints, CUDA_DEVICE_MAX_CONNECTIONS != 1"),
    (_cuda_device_max_connections, "tp or cp before Blackwell without FSDP: CUDA_DEVICE_MAX_CONNECTIONS=1"),
    (_seq_length, "sequence length vs cp and max_position_embeddings"),
    (_recompute, "selective recomputation takes no --recompute-method"),
    (_experts, "expert parallelism divides the experts, no fp16"),
    (_cpu_offload, "--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    (_train_length, "a training length: --train-iters or --train-samples"),
    (_warmup_before_decay, "the warmup ends before the decay does"),
    (_sample_based, "sample-based training takes sample-based warmup and decay, iteration-based the other"),
)


def parse_args(args: Sequence[str]) -> argparse.Namespace:
    """Parse ``args`` with ARGUMENTS; argparse.ArgumentError for an unknown flag or a bad value."""
    ns, extra = parser().parse_known_args(list(args))
    if extra:
        raise argparse.ArgumentError(None, f"unrecognized arguments: {' '.join(extra)}")
    return ns


def megatron_args_errors(args: Sequence[str], env: LaunchEnv) -> list[str]:
    """The validate_args messages ``args`` would stop at under ``env`` (empty: it starts)."""
    ns = parse_args(args)
    return [msg for rule, _ in RULES if (msg := rule(ns, env)) is not None]


def padded_vocab_size(vocab_size: int, tp: int, divisor: int) -> int:
    """Megatron's _vocab_size_with_padding (megatron/training/tokenizer/tokenizer.py): up to a
    multiple of divisor x tp."""
    multiple = divisor * tp
    return -(-vocab_size // multiple) * multiple


def env_from_script(script: str) -> Mapping[str, str]:
    """The variables a launch script exports (``export NAME=VALUE`` lines)."""
    out = {}
    for line in script.splitlines():
        line = line.strip()
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export "):].partition("=")
            out[name.strip()] = value.strip().strip('"')
    return out
