"""Megatron-LM's command-line arguments for plans with tensor, pipeline or context parallelism.

Flag names and their choices are Megatron-LM's (megatron/training/arguments.py:
_add_distributed_args, _add_training_args, _add_network_size_args, _add_moe_args, ...);
tests/megatron_args.py holds a cited copy of them and of the validate_args rules that
concern these flags, and tests/test_emit.py runs both and megatron-core's own config
classes (TransformerConfig, OptimizerConfig, DistributedDataParallelConfig) on the output.

Architecture facts that ModelSpec does not carry (rope base and scaling, norm epsilon)
come from the model's config.json (planner/stacks/architecture.py). The vocabulary is
given with --vocab-size and --make-vocab-size-divisible-by chosen so that Megatron's
padding (_vocab_size_with_padding: a multiple of divisible-by x tp) keeps the model's own
size wherever tp allows (see ``vocab_divisor``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.emit import EmitOptions, check_options, chosen
from planner.emit.schedule import Schedule, training_schedule
from planner.errors import UserError
from planner.layouts.layout import AXES
from planner.memory.pipeline import chunk_layers
from planner.stacks.architecture import architecture
from planner.stacks.megatron import device_arch_major, needs_one_connection
from planner.training.moe_runtime import a2a_overlap_written
from planner.training.pp_layout import is_layout

if TYPE_CHECKING:
    from planner.api import PlanResult
    from planner.layouts.layout import Layout
    from planner.models.spec import ModelSpec
    from planner.training.setup import TrainingSetup

POSITION = {"rope": "rope", "learned": "learned_absolute", "alibi": "none"}
# The MoE families whose dense blocks are the first n_dense_layers (first_k_dense_replace), the
# layout --moe-layer-freq's list writes (transformers' DeepseekV3DecoderLayer, Glm4MoeDecoderLayer)
DENSE_FIRST_TYPES = ("deepseek_v3", "glm4_moe")
# ZeRO stage -> Megatron's data-parallel sharding: the distributed optimizer shards
# optimizer states (ZeRO-1); Megatron FSDP shards gradients too, or everything
MEGATRON_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
# Megatron's default --make-vocab-size-divisible-by (_add_network_size_args)
VOCAB_DIVISIBLE_BY = 128
# Megatron's Llama 3.x rope scaling (megatron/core/models/common/embeddings/rope_utils.py,
# apply_rope_scaling defaults): low/high frequency factors 1 and 4, original context 8192
MEGATRON_LLAMA3_SCALING = (1.0, 4.0, 8192)


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """The largest divisor d of 128 with d x tp dividing the vocabulary, so Megatron pads
    nothing; 1 when tp itself does not divide it (Megatron then pads to a multiple of tp)."""
    d = VOCAB_DIVISIBLE_BY
    while d > 1 and vocab_size % (d * tp):
        d //= 2
    return d


def _unsupported(m: ModelSpec) -> str | None:
    """Architectures Megatron-LM's GPT arguments cannot express, or None."""
    if m.is_generic:     # hybrid Mamba, linear attention, ...: measured, not translated into arguments
        return f"model_type {m.model_type!r} is planned on the generic path, whose Megatron arguments are not written"
    if m.parallel_block:
        return "parallel attention/MLP blocks"
    if m.embedding_norm:
        return "a norm after the word embedding"
    if m.norms_per_layer != 2 and m.model_type != "bert":
        return f"{m.norms_per_layer} norms per block"
    if m.position == "alibi":
        return "ALiBi position biases"
    if m.gated_mlp and m.activation not in ("silu", "swish"):
        return f"a gated MLP with {m.activation} (Megatron's gated MLP is SwiGLU)"
    if m.index_n_heads:
        # megatron-core 0.16.1's TransformerConfig has experimental_attention_variant 'dsa' and
        # dsa_indexer_* fields; the arguments here (tests/megatron_args.py's pinned parser) do not
        return "DeepSeek Sparse Attention's indexer, whose Megatron arguments are not written here"
    if m.is_mla and m.position != "rope":
        return f"multi-latent attention with {m.position} positions"
    if m.is_moe and m.n_experts_per_token > 1 and not architecture(m).router_normalised:
        # megatron-core 0.16.1 moe_utils.topk_routing_with_score_function: sigmoid top-k weights
        # are always divided by their sum when top-k > 1
        return "un-normalised top-k router weights (norm_topk_prob false; Megatron's sigmoid router normalises)"
    if m.qk_norm == "full":
        return "a QK RMSNorm over the whole q and k widths (megatron-core's --qk-layernorm normalises each head)"
    if m.n_dense_layers and m.model_type not in DENSE_FIRST_TYPES:
        return "dense blocks placed among the MoE blocks (--moe-layer-freq is written for first-k-dense models)"
    return None


def pipeline_layout(n_layers: int, pp: int, vp: int, mtp: int = 0, balance: str = "none") -> str:
    """Megatron's --pipeline-model-parallel-layout for the planner's uneven split.

    Stages are separated by "|", "E" is the embedding, "t" a transformer layer, "m" an MTP
    module, "L" the loss; with virtual stages the list runs over virtual stage first, then
    pipeline rank (megatron/core/transformer/pipeline_parallel_layer_layout.py). Each rank's
    layers are its chunks' (memory.pipeline.chunk_layers: layouts.stages.stage_layers under
    ``balance``, split evenly over the vp chunks, extra layers first; under
    "embedding-loss-mtp" the first and the last chunk hold fewer). The ``mtp`` MTP modules
    (TrainingSetup.mtp_layers) sit before the loss in the last virtual stage, where the memory
    and step-time models place them: megatron-core 0.16.1's validate_layer_layout wants the
    layout's "m" count to equal mtp_num_layers, every one in the last virtual stage of its
    rank, after every decoder layer."""
    per_rank = chunk_layers(n_layers, pp, vp, balance, mtp)
    chunks = [per_rank[s][v] for v in range(vp) for s in range(pp)]
    parts = []
    for i, c in enumerate(chunks):
        text = ("E" if i == 0 else "") + (f"t*{c}" if c > 1 else "t" * c)
        parts.append(text + ("m" * mtp + "L" if i == len(chunks) - 1 else ""))
    return "|".join(parts)


def _rotary_base_args(m: ModelSpec) -> list[str]:
    theta = architecture(m).rope_theta
    if theta != int(theta):
        raise UserError(f"Megatron-LM's --rotary-base is an integer; {m.name} has rope_theta {theta}")
    return ["--rotary-base", str(int(theta))]


def rope_args(m: ModelSpec) -> list[str]:
    arch = architecture(m)
    args = _rotary_base_args(m)
    if arch.rotary_fraction != 1.0:     # GPTModel(rotary_percent=args.rotary_percent)
        args += ["--rotary-percent", repr(arch.rotary_fraction)]
    sc = arch.rope_scaling
    if sc is not None:
        if sc.rope_type != "llama3" or (sc.low_freq_factor, sc.high_freq_factor,
                                        sc.original_max_positions) != MEGATRON_LLAMA3_SCALING:
            raise UserError(f"Megatron-LM's --use-rope-scaling is Llama 3.x scaling only; {m.name} has "
                            f"rope_scaling {sc.rope_type!r}: no Megatron arguments written")
        args += ["--use-rope-scaling", "--rope-scaling-factor", repr(sc.factor)]
    return args


def _mla_args(m: ModelSpec) -> list[str]:
    """Multi-latent attention (DeepSeek-V2/V3, Kimi K2; arXiv:2412.19437 Sec. 2.1.1) as
    megatron-core 0.16.1 builds it (transformer/multi_latent_attention.py MLASelfAttention;
    MLATransformerConfig, which core_transformer_config_from_args picks under
    --multi-latent-attention): --q-lora-rank only with a query bottleneck (absent, the
    parser's None builds one full linear_q_proj, transformers' q_proj), --kv-lora-rank, the
    non-rotary and rotary query/key widths per head and the value width; --qk-layernorm builds
    the latents' RMSNorms (transformers' q_a_layernorm and kv_a_layernorm); --kv-channels the
    value width (MLA hands its core attention k_channels and v_channels itself). MLA's rotary
    dims are always read interleaved (models/common/embeddings/rope_utils.py), as transformers'
    default rope_interleave stores them."""
    if not architecture(m).mla_rope_interleave:
        raise UserError(f"megatron-core's multi-latent attention reads rotary dims interleaved; {m.name} has "
                        "rope_interleave false: no Megatron arguments written (use --stack hf)")
    args = ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank),
            "--qk-head-dim", str(m.head_dim - m.qk_rope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim),
            "--v-head-dim", str(m.value_head_dim), "--kv-channels", str(m.value_head_dim), "--qk-layernorm"]
    if m.q_lora_rank:
        args += ["--q-lora-rank", str(m.q_lora_rank)]
    return args + _mla_rope_args(m)


# What megatron-core 0.16.1's MLATransformerConfig sets of YaRN that Megatron-LM's arguments
# do not (transformer_config.py: original_max_position_embeddings 4096, beta_fast 32,
# beta_slow 1; YarnRotaryEmbedding's correction_range_round_to_int True): a model whose
# rope_scaling differs is refused rather than written with these
MEGATRON_YARN_FIXED = (4096, 32.0, 1.0)


def _mla_rope_args(m: ModelSpec) -> list[str]:
    """MLA's rotary key: --rope-type yarn, --rotary-scaling-factor, --mscale, --mscale-all-dim
    (Megatron-LM _add_mla_args; megatron-core's YarnRotaryEmbedding scales cos/sin by
    mscale(factor, mscale) / mscale(factor, mscale_all_dim), MLASelfAttention the softmax by
    mscale(factor, mscale_all_dim)^2), as transformers 5.x reads them
    (modeling_rope_utils._compute_yarn_parameters: that ratio when both are set, else
    mscale(factor, 1); DeepseekV3Attention's yarn_apply_mscale: the square when mscale_all_dim
    is set). Without scaling, --rope-type rope --no-rope-fusion (MLATransformerConfig fuses
    MLA's rope for YaRN only)."""
    args = _rotary_base_args(m)
    sc = architecture(m).rope_scaling
    if sc is None:
        return args + ["--rope-type", "rope", "--no-rope-fusion"]
    fixed = (sc.original_max_positions, sc.beta_fast, sc.beta_slow)
    why = ""
    if sc.rope_type != "yarn":
        why = f"rope_scaling {sc.rope_type!r} (Megatron's multi-latent attention takes YaRN or none)"
    elif fixed != MEGATRON_YARN_FIXED or not sc.truncate or sc.attention_factor is not None:
        why = (f"YaRN with original_max_position_embeddings {sc.original_max_positions}, beta_fast {sc.beta_fast:g}, "
               f"beta_slow {sc.beta_slow:g}{'' if sc.truncate else ', truncate false'}"
               f"{'' if sc.attention_factor is None else ', attention_factor'}; Megatron-LM's arguments leave "
               "megatron-core's 4096, 32, 1")
    elif sc.mscale_all_dim and not sc.mscale:
        why = "YaRN with mscale_all_dim but no mscale (transformers then scales cos/sin by mscale(factor) alone)"
    if why:
        raise UserError(f"Megatron-LM's arguments cannot express {m.name}'s rotary embedding ({why}); "
                        "no Megatron files written (use --stack hf)")
    mscale, mscale_all_dim = (sc.mscale, sc.mscale_all_dim) if sc.mscale and sc.mscale_all_dim else (1.0, 0.0)
    return args + ["--rope-type", "yarn", "--rotary-scaling-factor", repr(sc.factor), "--mscale", repr(mscale),
                   "--mscale-all-dim", repr(mscale_all_dim)]


def _model_args(m: ModelSpec, seq_len: int, tp: int = 1) -> list[str]:
    from planner.emit.megatron_deltanet import deltanet_model_args, is_deltanet_model
    from planner.emit.megatron_mamba import hybrid_model_args

    if is_deltanet_model(m):
        return deltanet_model_args(m, seq_len, tp)
    if m.is_hybrid:
        return hybrid_model_args(m, seq_len, tp)
    why = _unsupported(m)
    if why is not None:
        raise UserError(f"Megatron-LM's arguments cannot express {m.name} ({why}); "
                        f"no Megatron files written (plan without tp/pp/cp, or use --stack hf)")
    if m.position == "learned" and m.max_positions and seq_len > m.max_positions:
        raise UserError(f"{m.name} has {m.max_positions} learned positions; a sequence of {seq_len} tokens "
                        f"does not fit them (give --seq-len {m.max_positions} or less)")
    div = vocab_divisor(m.vocab_size, tp)
    dense_ff = (m.dense_d_ff or m.d_ff) if m.n_dense_layers else m.d_ff     # the dense blocks' MLP width
    args = ["--num-layers", str(m.n_layers), "--hidden-size", str(m.d_model),
            "--ffn-hidden-size", str(dense_ff), "--num-attention-heads", str(m.n_heads),
            "--seq-length", str(seq_len),
            "--max-position-embeddings", str(max(m.max_positions, seq_len)),
            "--position-embedding-type", POSITION.get(m.position, "none"),
            "--normalization", "RMSNorm" if m.norm == "rmsnorm" else "LayerNorm",
            "--norm-epsilon", repr(architecture(m).norm_eps),
            "--vocab-size", str(m.vocab_size), "--make-vocab-size-divisible-by", str(div),
            "--attention-dropout", repr(m.attention_dropout), "--hidden-dropout", repr(m.hidden_dropout)]
    if m.is_mla:                # its heads, latents, norms and rotary key
        args += _mla_args(m)
    else:
        if m.position == "rope":
            args += rope_args(m)
        if m.n_kv_heads != m.n_heads:
            args += ["--group-query-attention", "--num-query-groups", str(m.n_kv_heads)]
        if m.head_dim * m.n_heads != m.d_model:
            args += ["--kv-channels", str(m.head_dim)]
        if m.qk_norm == "head":     # TransformerConfig.qk_layernorm: q_layernorm and k_layernorm over each head
            args += ["--qk-layernorm"]
    if m.gated_mlp:
        args += ["--swiglu"]
    elif m.activation in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        args += ["--openai-gelu"]     # tanh-approximated GELU; Megatron's default is exact F.gelu
    if not m.tied_embeddings:
        args += ["--untie-embeddings-and-output-weights"]
    if not (m.out_bias or m.mlp_bias):
        args += ["--disable-bias-linear"]
        if m.qkv_bias:
            args += ["--add-qkv-bias"]
    return args + moe_args(m)


def moe_args(m: ModelSpec) -> list[str]:
    """The experts and the router's load balancing (_add_moe_args); empty for a dense model."""
    if not m.is_moe:
        return []
    args = ["--num-experts", str(m.n_experts), "--moe-router-topk", str(m.n_experts_per_token)]
    arch = architecture(m)
    aux = arch.router_aux_loss_coef
    if aux is not None:
        args += ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", repr(aux)]
    if m.n_dense_layers:
        # TransformerConfig.moe_layer_freq as a list, 0 a dense block and 1 a MoE block; the
        # experts' width apart from --ffn-hidden-size (the dense blocks')
        args += ["--moe-layer-freq", f"([0]*{m.n_dense_layers}+[1]*{m.n_moe_layers})",
                 "--moe-ffn-hidden-size", str(m.d_ff)]
    if m.shared_d_ff:           # SharedExpertMLP beside the routed experts, of the shared experts' total width
        args += ["--moe-shared-expert-intermediate-size", str(m.shared_d_ff)]
    if arch.sigmoid_router:     # TopKRouter: sigmoid scores, expert bias, the top-k weights scaled
        args += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
        if arch.router_scaling != 1.0:
            args += ["--moe-router-topk-scaling-factor", repr(arch.router_scaling)]
    if 0 < m.routing_group_limit < m.routing_groups:    # group-limited routing
        args += ["--moe-router-num-groups", str(m.routing_groups),
                 "--moe-router-group-topk", str(m.routing_group_limit)]
    return args


def megatron_script(m: ModelSpec) -> str:
    """Megatron-LM's training script for ``m``: pretrain_bert.py, pretrain_mamba.py for hybrid
    Mamba models (megatron-core's MambaModel), else pretrain_gpt.py (gated DeltaNet hybrids
    too: a GPTModel, planner.emit.megatron_deltanet)."""
    from planner.emit.megatron_deltanet import is_deltanet_model

    if m.model_type == "bert":
        return "pretrain_bert.py"
    return "pretrain_mamba.py" if m.is_hybrid and not is_deltanet_model(m) else "pretrain_gpt.py"


def _parallel_args(lay: Layout, n_layers: int, balance: str = "none", mtp: int = 0) -> list[str]:
    args = [x for a in AXES if a.megatron is not None and (a.megatron_at_one or getattr(lay, a.name) > 1)
            for x in (a.megatron, str(getattr(lay, a.name)))]
    if lay.expert_tp != lay.tp:   # megatron-core's default is tp (model_parallel_config.py lines 413-414)
        args += ["--expert-tensor-parallel-size", str(lay.expert_tp)]
    if lay.sp:
        args += ["--sequence-parallel"]
    even = n_layers % lay.pp == 0 and (n_layers // lay.pp) % lay.vp == 0
    if (balance == "embedding-loss-mtp" or is_layout(balance)) and lay.pp > 1:
        # the embedding, the loss and the MTP modules counted as layers of the split, or a layout
        # stated with --pp-layout, written back from its chunks (TrainingSetup.pp_balance):
        # megatron-core has no flag for either, only the layout
        args += ["--pipeline-model-parallel-layout", pipeline_layout(n_layers, lay.pp, lay.vp, mtp, balance)]
    elif balance == "embedding-loss" and lay.pp > 1:
        # the Llama 3 balance (TrainingSetup.pp_balance): the embedding and the loss count as one
        # layer each of the split (megatron-core 0.16.1 TransformerConfig
        # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split, which
        # Megatron-LM's parser sets from these flags); the chunks per rank given directly
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        if lay.vp > 1:
            args += ["--num-virtual-stages-per-pipeline-rank", str(lay.vp)]
    elif lay.pp > 1 and not even:
        args += ["--pipeline-model-parallel-layout", pipeline_layout(n_layers, lay.pp, lay.vp, mtp)]
    elif lay.vp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(n_layers // (lay.pp * lay.vp))]
    if lay.vp > 1 and lay.pp <= 2:
        args += ["--overlap-p2p-comm"]   # validate_args: interleaving over pp <= 2 needs it
    return args


def _microbatch_group_args(lay: Layout, group: int) -> list[str]:
    """The interleaved schedule's micro-batch group (TrainingSetup.pp_microbatch_group), where
    megatron-core accepts it: N from pp to the step's micro-batches (0.16.1
    pipeline_parallel/schedules.py lines 995-1003; ModelParallelConfig
    microbatch_group_size_per_vp_stage, argparse --microbatch-group-size-per-virtual-pipeline-stage).
    Fewer than pp is Llama 3's own schedule: no Megatron files rather than a schedule whose
    warm-up holds more than the plan."""
    if lay.vp == 1 or group in (0, lay.pp):
        return []
    if group < lay.pp:
        raise UserError(f"--pp-microbatch-group {group} is below pp={lay.pp}: megatron-core's interleaved schedule "
                        f"takes {lay.pp} to {lay.grad_accum} (Llama 3's schedule is not Megatron's); no Megatron "
                        f"files written (give --pp-microbatch-group {lay.pp} or more)")
    return ["--microbatch-group-size-per-virtual-pipeline-stage", str(group)]


def uses_torch_fsdp2(lay: Layout, m: ModelSpec, precision: str) -> bool:
    """FSDP layouts run under --use-torch-fsdp2 where validate_args allows it (pp = ep = 1,
    untied embeddings, no fp16); elsewhere under Megatron FSDP, which shards the same way."""
    return (lay.is_fsdp and lay.pp == 1 and lay.ep == 1 and not m.tied_embeddings
            and precision != "fp16-mixed" and lay.optimizer_instances == 1)


def uses_fsdp(lay: Layout) -> bool:
    """Torch or Megatron FSDP: either needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1."""
    return lay.is_fsdp or lay.zero_stage >= 2


def _sharding_args(lay: Layout, m: ModelSpec, precision: str) -> list[str]:
    if uses_torch_fsdp2(lay, m, precision):
        # validate_args: no gradient-accumulation fusion, torch_dist/torch_dcp checkpoints
        args = ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format", "torch_dist"]
        if lay.sharding == "fsdp-grad-op":
            args += ["--torch-fsdp2-no-reshard-after-forward"]
        return args
    if lay.zero_stage == 0:
        return []
    args = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if lay.zero_stage >= 2:
        # FSDP layouts Megatron's torch FSDP2 refuses (pp or ep > 1, tied, fp16) shard as
        # ZeRO-2/3 under Megatron FSDP, which wants fsdp_dtensor checkpoints
        stage = 2 if lay.sharding == "fsdp-grad-op" else lay.zero_stage
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", MEGATRON_FSDP_STRATEGY[stage],
                 "--no-gradient-accumulation-fusion", "--ckpt-format", "fsdp_dtensor"]
    if lay.optimizer_instances > 1:
        # DistributedDataParallelConfig.num_distributed_optimizer_instances. Megatron FSDP's outer
        # sharding (outer_dp_sharding_strategy 'optim', which the plan's memory assumes:
        # memory.states.model_state_bytes) has no argument in Megatron-LM at the pinned commit, and
        # its default 'no_shard' keeps the optimizer's states over one instance: files that would
        # run another memory than the plan sized are not written (docs/options.md)
        if lay.zero_stage >= 2:
            raise UserError(f"--optimizer-instances {lay.optimizer_instances} with Megatron FSDP is sized with "
                            "outer_dp_sharding_strategy 'optim', which Megatron-LM's arguments cannot set (its "
                            "default 'no_shard' holds more); no Megatron files written (plan --zero 1, or set "
                            "the strategy in Megatron-Bridge's DDP config)")
        args += ["--num-distributed-optimizer-instances", str(lay.optimizer_instances)]
    return args


def megatron_env(r: PlanResult) -> dict[str, str]:
    """Environment Megatron-LM's validate_args requires of the launch: CUDA_DEVICE_MAX_CONNECTIONS=1
    for tp or cp on GPUs before Blackwell, unless FSDP runs (it needs more connections)."""
    lay = chosen(r).layout
    if needs_one_connection(lay.tp, lay.cp, uses_fsdp(lay), device_arch_major(r.gpu.name)):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def _recompute_args(recompute: str, method: str = "uniform", num_layers: int = 1,
                    modules: tuple[str, ...] = ()) -> list[str]:
    """Full: the plan's --recompute-method and --recompute-num-layers (default uniform over one
    layer: every block keeps only its input; megatron-core 0.16.1 TransformerConfig requires
    both under full granularity); selective: Megatron's default module, the core attention
    (Korthikanti et al. 2022)."""
    if recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", method,
                "--recompute-num-layers", str(num_layers)]
    if recompute == "selective":
        # megatron-core 0.16.1 TransformerConfig: "moe_act in recompute_modules is only supported with
        # moe_grouped_gemm"
        grouped = ["--moe-grouped-gemm"] if "moe_act" in modules else []
        return ["--recompute-granularity", "selective"] + (["--recompute-modules", *modules] if modules else []) \
            + grouped
    return []


def _moe_runtime_args(r: PlanResult) -> list[str]:
    """The token dispatcher, the expert-parallel all-to-all overlap and the CUDA graphs the plan
    was timed with (training.moe_runtime). The step time counts all-to-alls, so the dispatcher is
    megatron-core's alltoall (its default is allgather); the overlap is written where megatron-core
    0.16.1 runs it (transformer_config.py lines 1852-1906: ep > 1, vp with pp, no full
    recomputation, at most one MTP layer, and no CUDA graph but Transformer Engine's)."""
    lay, s, m = chosen(r).layout, r.setup, r.model
    args: list[str] = []
    if m.is_moe and lay.ep > 1:
        # flex: megatron-core's default backend deepep (TransformerConfig.moe_flex_dispatcher_backend)
        args += ["--moe-token-dispatcher-type", s.moe_dispatcher]
        # not for hybrids: the overlap's combined 1F1B schedule calls the model's
        # build_schedule_plan (0.16.1 pipeline_parallel/combined_1f1b.py), which GPTModel has and
        # MambaModel has not
        if not m.is_hybrid and a2a_overlap_written(s.moe_a2a_overlap, lay.recompute, s.mtp_layers, s.cuda_graphs,
                                                   lay.ep, lay.pp, lay.vp):
            args += ["--overlap-moe-expert-parallel-comm"]
    if s.cuda_graphs == "moe":
        args += ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn",
                 *(["moe_router", "moe_preprocess"] if m.is_moe else [])]
    elif s.cuda_graphs == "full-iteration":
        args += ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]
    return args


def to_megatron_args(r: PlanResult, opts: EmitOptions = EmitOptions()) -> list[str]:
    """Megatron-LM arguments for the chosen plan (megatron_script: pretrain_gpt.py, or
    pretrain_mamba.py for hybrid models; data and tokenizer
    arguments are the user's).

    Megatron's data-parallel size is world / (tp x pp x cp), which is the planner's
    dp x ep (dp itself where ep is folded over tp x cp x dp: Layout.data_parallel), so
    --global-batch-size = micro-batch x accumulation x that data-parallel size.
    """
    cand = chosen(r)
    check_options(r, opts)
    lay = cand.layout
    s = r.setup
    m = r.model
    args = _model_args(r.model, lay.seq_len, lay.tp)
    from planner.emit.megatron_mamba import hybrid_layout_refusal

    if m.is_hybrid and (why := hybrid_layout_refusal(lay, m, s)) is not None:
        raise UserError(f"{m.name}: {why}; no Megatron files written")
    from planner.emit.megatron_deltanet import decoder_layers, deltanet_layout_refusal, is_deltanet_model

    n_layers = m.n_layers
    if is_deltanet_model(m):
        if (why := deltanet_layout_refusal(lay, m)) is not None:
            raise UserError(f"{m.name}: {why}; no Megatron files written")
        n_layers = decoder_layers(m)
    if m.is_moe and (m.mlp_bias or m.out_bias) and lay.expert_tp > 1:
        # megatron-core 0.16.1 transformer/transformer_config.py lines 1588-1591: "Bias in Moe
        # is only supported when ETP==1"
        raise UserError(f"Megatron builds {m.name}'s biased experts only with expert tensor-parallel size 1, "
                        f"not {lay.expert_tp}; no Megatron files written (plan with --etp 1)")
    args += _parallel_args(lay, n_layers, s.pp_balance, s.mtp_layers)
    args += _microbatch_group_args(lay, s.pp_microbatch_group)
    args += ["--micro-batch-size", str(lay.micro_batch), "--global-batch-size", str(lay.global_batch)]
    args += _sharding_args(lay, r.model, s.precision)
    args += _recompute_args(lay.recompute, s.recompute_method, s.recompute_num_layers, s.recompute_modules)
    if s.cross_entropy == "te":    # ModelParallelConfig cross_entropy_loss_fusion, cross_entropy_fusion_impl
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    if s.mtp_layers:               # TransformerConfig mtp_num_layers
        args += ["--mtp-num-layers", str(s.mtp_layers)]
    args += _moe_runtime_args(r)
    if s.offload_activations:      # ModelParallelConfig cpu_offloading, cpu_offloading_num_layers
        args += ["--cpu-offloading", "--cpu-offloading-num-layers", str(s.offload_activations)]
    if s.precision in ("bf16-mixed", "fp8", "nvfp4"):    # FP8/FP4 run the rest of the model in bf16
        # gradients kept and reduced in bf16, the 2 bytes per parameter the plan counts (Megatron-Bridge's
        # performance runs set grad_reduce_in_fp32 False, scripts/performance/utils/helpers.py); without
        # it Megatron-LM's --bf16 keeps fp32 main gradients, 2 bytes more per parameter of the rank
        args += ["--bf16", "--grad-reduce-in-bf16"]
    elif s.precision == "fp16-mixed":
        args += ["--fp16"]
    args += ["--attention-backend", "flash" if s.attention == "flash" else "unfused"]
    if s.optimizer == "sgd":
        args += ["--optimizer", "sgd", "--sgd-momentum", repr(opts.sgd_momentum)]
    else:
        args += ["--optimizer", "adam", "--adam-beta1", repr(opts.betas[0]), "--adam-beta2", repr(opts.betas[1]),
                 "--adam-eps", repr(opts.eps)]
    args += ["--weight-decay", repr(opts.weight_decay), "--clip-grad", repr(opts.grad_clip)]
    args += schedule_args(training_schedule(r, opts))
    if opts.offload_optimizer == "cpu":
        # validate_args: the CPU offload runs through the precision-aware optimizer path
        args += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
    if s.optimizer == "adamw-bf16-states":
        if "--use-distributed-optimizer" not in args:
            raise UserError("--optimizer adamw-bf16-states: Megatron-LM's precision-aware optimizer needs its "
                            "distributed optimizer, which this layout's sharding does not use; plan with --zero 1")
        if "--use-precision-aware-optimizer" not in args:
            args += ["--use-precision-aware-optimizer"]
        args += ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    args += fp8_args(s)
    return args


def schedule_args(sch: Schedule) -> list[str]:
    """The run's length and learning-rate schedule (planner.emit.schedule) in Megatron-LM's
    sample-based words (megatron/training/arguments.py, _add_training_args and
    _add_learning_rate_args): --train-samples, then --lr, --min-lr, --lr-decay-style
    cosine, --lr-warmup-samples and --lr-decay-samples (validate_args: sample-based training
    takes sample-based warmup and decay). Without a length Megatron-LM stops in
    get_optimizer_param_scheduler: "either train-iters or train-samples should be provided"."""
    return ["--train-samples", str(sch.samples), "--lr", repr(sch.peak_lr), "--min-lr", repr(sch.min_lr),
            "--lr-decay-style", "cosine", "--lr-warmup-samples", str(sch.warmup_samples),
            "--lr-decay-samples", str(sch.samples)]


def bf16_layer_args(s: TrainingSetup) -> list[str]:
    """The layers kept in BF16 (TrainingSetup.bf16_layers, training.layer_precision): megatron-core
    0.16.1 TransformerConfig first_last_layers_bf16 (bool), num_layers_at_start_in_bf16 and
    num_layers_at_end_in_bf16 (ints, each 1 by default, so both are written), under their
    argparse names. Empty where none are kept."""
    start, end = s.bf16_layers
    if not start and not end:
        return []
    return ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(start),
            "--num-layers-at-end-in-bf16", str(end)]


def fp8_args(s: TrainingSetup) -> list[str]:
    """Megatron-LM's FP8 flags for the plan's recipe (planner.training.fp8): Transformer Engine
    with ``--fp8-format hybrid`` (e4m3 forward, e5m2 gradients: the format the planner's
    recipes assume) and ``--fp8-recipe``; delayed scaling also takes the amax history the
    recipe keeps (``--fp8-amax-history-len``; ``--fp8-amax-compute-algo most_recent`` is the
    default with a history of 1, ``max`` over a longer one, as TE's DelayedScaling does).
    Names and choices: megatron-core 0.16.1 TransformerConfig fields fp8 (argparse name
    --fp8-format), fp8_recipe, fp8_amax_history_len, fp8_amax_compute_algo. Empty without FP8."""
    r = s.precision_spec.fp8
    if r is None:
        return []
    if r.name == "nvfp4":       # TransformerConfig fp4 ('e2m1', --fp4-format) and fp4_recipe 'nvfp4'
        return ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"] + bf16_layer_args(s)
    if r.name == "mxfp8":       # e4m3 throughout, as Megatron-Bridge's bf16_with_mxfp8_mixed sets it
        return ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"] + (["--fp8-param-gather"] if s.fp8_param_gather
                                                                     else []) + bf16_layer_args(s)
    args = ["--fp8-format", "hybrid", "--fp8-recipe", r.name] + bf16_layer_args(s)
    if s.fp8_param_gather:
        args += ["--fp8-param-gather"]
    if r.name == "delayed":
        algo = "most_recent" if r.amax_history_len <= 1 else "max"
        args += ["--fp8-amax-history-len", str(max(r.amax_history_len, 1)), "--fp8-amax-compute-algo", algo]
    return args
