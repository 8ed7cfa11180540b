"""Megatron-LM arguments, refereed by Megatron's own code.

1. megatron-core 0.16.1's config classes (TransformerConfig, ModelParallelConfig through it,
   OptimizerConfig, DistributedDataParallelConfig) are built from the parsed arguments the
   way Megatron-LM's core_transformer_config_from_args builds them, and validate on CPU.
2. Megatron-LM's validate_args (not in the wheel) as the cited rule table of
   planner/stacks/megatron.py, run under the environment launch.sh exports.
3. The parameter count of the model megatron-core would build from that TransformerConfig
   (its GPT layer spec: fused QKV, output projection, fc1/fc2, norms; padded vocabulary,
   untied output layer) equals the planner's count (itself equal to transformers', see
   tests/test_param_counts.py).
"""

from __future__ import annotations

import argparse
import warnings

import pytest
from conftest import require
from megatron_args import LaunchEnv, env_from_script, megatron_args_errors, padded_vocab_size, parse_args

from planner import api
from planner.emit import EmitOptions, plan_files
from planner.emit.launch import to_launch_script
from planner.emit.megatron import to_megatron_args
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.spec import count_params, load_model
from planner.stacks.megatron import device_arch_major
from planner.training.setup import TrainingSetup

PLANS = [
    # (model, layout, gpu)
    ("llama3.1-8b", dict(dp=2, tp=4, pp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16, recompute="full"),
     "h100"),
    ("llama3.1-70b", dict(dp=1, tp=4, pp=4, zero_stage=0, sp=True, micro_batch=2, grad_accum=16, recompute="full"),
     "h100"),
    ("llama3.1-70b", dict(dp=2, tp=8, pp=3, zero_stage=3, sharding="fsdp-full", sp=True, micro_batch=1,
                          grad_accum=8, recompute="full"), "h100"),                        # FSDP + pp
    ("llama3.1-405b", dict(dp=2, tp=8, pp=16, vp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16,
                           recompute="full"), "b200"),
    ("mixtral-8x7b", dict(dp=2, tp=2, pp=4, ep=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=8,
                          recompute="full"), "h100"),
    ("qwen2.5-0.5b", dict(dp=2, tp=2, cp=2, zero_stage=3, sp=True, micro_batch=1, grad_accum=4, recompute="full"),
     "h100"),
    ("qwen2.5-0.5b", dict(dp=1, tp=1, pp=2, vp=2, zero_stage=0, micro_batch=1, grad_accum=8), "h100"),
    ("llama2-7b", dict(dp=4, tp=2, zero_stage=2, sp=True, micro_batch=1, grad_accum=4, recompute="selective"), "a100"),
    ("gpt2-xl", dict(dp=2, tp=1, pp=2, zero_stage=1, micro_batch=2, grad_accum=4), "a100"),
]


def _plan(name: str, kw: dict, gpu: str, seq_len: int = 2048):
    lay = Layout(seq_len=min(seq_len, load_model(name).max_positions or seq_len), **kw)
    setup = TrainingSetup(seq_len=lay.seq_len, global_batch=lay.global_batch)
    r = api.evaluate_layout(load_model(name), get_gpu(gpu), setup, lay)
    assert r.best is not None and r.best.fits, f"test layout must fit: {name} {lay.describe()}"
    return r


def _env(r, opts: EmitOptions = EmitOptions()) -> LaunchEnv:
    exported = env_from_script(to_launch_script(r, opts, "megatron"))
    return LaunchEnv(world_size=r.best.layout.n_gpus,
                     cuda_device_max_connections=exported.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                     device_arch_major=device_arch_major(r.gpu.name))


def transformer_config(a: argparse.Namespace):
    """megatron-core's TransformerConfig from parsed Megatron-LM arguments, field by field as
    megatron/training/arguments.py core_transformer_config_from_args maps them."""
    import torch
    import torch.nn.functional as F
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if a.bf16 else torch.half if a.fp16 else torch.float32
    kw = dict(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        ffn_hidden_size=a.ffn_hidden_size, kv_channels=a.kv_channels or a.hidden_size // a.num_attention_heads,
        num_query_groups=a.num_query_groups if a.group_query_attention else None,
        tensor_model_parallel_size=a.tensor_model_parallel_size,
        pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        context_parallel_size=a.context_parallel_size,
        expert_model_parallel_size=a.expert_model_parallel_size,
        sequence_parallel=a.sequence_parallel and a.tensor_model_parallel_size > 1,
        normalization=a.normalization, layernorm_epsilon=a.norm_epsilon,
        add_bias_linear=a.add_bias_linear, add_qkv_bias=a.add_qkv_bias or a.add_bias_linear,
        gated_linear_unit=a.swiglu, activation_func=F.silu if a.swiglu else F.gelu,
        hidden_dropout=a.hidden_dropout, attention_dropout=a.attention_dropout,
        num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk or 2,
        recompute_granularity=a.recompute_granularity, recompute_method=a.recompute_method,
        recompute_num_layers=a.recompute_num_layers,
        bf16=a.bf16, fp16=a.fp16, params_dtype=dtype, pipeline_dtype=dtype,
        gradient_accumulation_fusion=False,     # needs APEX/TE kernels, absent on CPU (a flag only)
        moe_token_dispatcher_type=getattr(a, "moe_token_dispatcher_type", None) or "allgather",
        overlap_moe_expert_parallel_comm=getattr(a, "overlap_moe_expert_parallel_comm", False),
        cuda_graph_impl=getattr(a, "cuda_graph_impl", None) or "none",
        cuda_graph_scope=getattr(a, "cuda_graph_scope", None) or [],
        moe_grouped_gemm=getattr(a, "moe_grouped_gemm", False),
    )
    if a.pipeline_model_parallel_layout:
        kw["pipeline_model_parallel_layout"] = a.pipeline_model_parallel_layout
    elif a.num_layers_per_virtual_pipeline_stage:
        kw["virtual_pipeline_model_parallel_size"] = (
            a.num_layers // a.pipeline_model_parallel_size // a.num_layers_per_virtual_pipeline_stage)
    return TransformerConfig(**kw)


def megatron_param_count(cfg, a: argparse.Namespace) -> int:
    """Parameters of megatron-core's GPTModel for ``cfg`` (gpt_layer_specs: linear_qkv with its
    fused input norm, linear_proj, pre-MLP norm, linear_fc1 (x2 when gated), linear_fc2;
    MoE: a router of hidden x experts and one MLP per expert), the padded word embedding,
    learned positions when used, the final norm and the untied output layer."""
    h, kvc = cfg.hidden_size, cfg.kv_channels
    q, kv = cfg.num_attention_heads * kvc, (cfg.num_query_groups or cfg.num_attention_heads) * kvc
    norm = h * (2 if cfg.normalization == "LayerNorm" else 1)
    qkv_bias = (q + 2 * kv) if cfg.add_qkv_bias else 0
    attention = h * (q + 2 * kv) + qkv_bias + q * h + (h if cfg.add_bias_linear else 0)
    fc1_out = cfg.ffn_hidden_size * (2 if cfg.gated_linear_unit else 1)
    mlp = h * fc1_out + cfg.ffn_hidden_size * h + ((fc1_out + h) if cfg.add_bias_linear else 0)
    if cfg.num_moe_experts:
        mlp = cfg.num_moe_experts * mlp + h * cfg.num_moe_experts
    per_layer = attention + mlp + 2 * norm
    vocab = padded_vocab_size(a.vocab_size, a.tensor_model_parallel_size, a.make_vocab_size_divisible_by)
    total = cfg.num_layers * per_layer + vocab * h + norm
    if a.position_embedding_type == "learned_absolute":
        total += a.max_position_embeddings * h
    if a.untie_embeddings_and_output_weights:
        total += vocab * h
    return total


@pytest.mark.slow
@pytest.mark.parametrize("name, kw, gpu", PLANS)
def test_megatron_core_configs_accept_the_args_and_count_the_planners_params(name, kw, gpu):
    require("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig

    r = _plan(name, kw, gpu)
    argv = to_megatron_args(r)
    a = parse_args(argv)
    cfg = transformer_config(a)          # raises on what megatron-core rejects
    assert cfg.tensor_model_parallel_size == r.best.layout.tp
    OptimizerConfig(optimizer=a.optimizer, lr=a.lr, weight_decay=a.weight_decay, adam_beta1=a.adam_beta1,
                    adam_beta2=a.adam_beta2, adam_eps=a.adam_eps, clip_grad=a.clip_grad, bf16=a.bf16,
                    use_distributed_optimizer=a.use_distributed_optimizer)
    DistributedDataParallelConfig(use_distributed_optimizer=a.use_distributed_optimizer,
                                  overlap_grad_reduce=a.overlap_grad_reduce,
                                  overlap_param_gather=a.overlap_param_gather,
                                  use_megatron_fsdp=a.use_megatron_fsdp,
                                  data_parallel_sharding_strategy=a.data_parallel_sharding_strategy or "no_shard")
    m = r.model
    expected = count_params(m).total
    if m.vocab_size % a.tensor_model_parallel_size:      # Megatron must pad to a multiple of tp
        pad = padded_vocab_size(m.vocab_size, a.tensor_model_parallel_size, 1) - m.vocab_size
        expected += pad * m.d_model * (1 if m.tied_embeddings else 2)
    assert megatron_param_count(cfg, a) == expected


@pytest.mark.parametrize("name, kw, gpu", PLANS)
def test_megatron_args_pass_validate_args_under_the_launch_environment(name, kw, gpu):
    r = _plan(name, kw, gpu)
    assert megatron_args_errors(to_megatron_args(r), _env(r)) == []


@pytest.mark.parametrize("name, theta", [("llama3.1-8b", 500000), ("mixtral-8x7b", 1000000),
                                         ("llama2-7b", 10000), ("qwen2.5-0.5b", 1000000)])
def test_every_architecture_fact_reaches_the_args(name, theta):
    """The rope base (Megatron's default is 10,000), Llama 3.1's rope scaling, the norm and
    its epsilon, SwiGLU, GQA groups, untied embeddings, biases and the vocabulary."""
    kw = dict(dp=1, tp=2, pp=2, zero_stage=0, sp=True, micro_batch=1, grad_accum=8, recompute="full")
    if name == "mixtral-8x7b":
        kw = dict(dp=1, tp=2, pp=4, ep=2, zero_stage=0, sp=True, micro_batch=1, grad_accum=8, recompute="full")
    r = _plan(name, kw, "b200")
    m = r.model
    a = parse_args(to_megatron_args(r))
    assert a.rotary_base == theta
    assert a.use_rope_scaling == name.startswith("llama3")
    if a.use_rope_scaling:
        assert a.rope_scaling_factor == 8.0
    assert a.normalization == "RMSNorm" and a.norm_epsilon == {"llama3.1-8b": 1e-5, "mixtral-8x7b": 1e-5,
                                                               "llama2-7b": 1e-5, "qwen2.5-0.5b": 1e-6}[name]
    assert a.swiglu and a.position_embedding_type == "rope"
    assert (a.num_query_groups or m.n_heads) == m.n_kv_heads
    assert a.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert a.add_qkv_bias == m.qkv_bias and not a.add_bias_linear
    assert a.vocab_size == m.vocab_size
    assert padded_vocab_size(a.vocab_size, 2, a.make_vocab_size_divisible_by) == m.vocab_size
    if m.is_moe:
        assert (a.num_experts, a.moe_router_topk, a.moe_aux_loss_coeff) == (8, 2, 0.02)


def test_the_rules_stop_what_the_old_emitter_wrote():
    """The args of issue 19 as they were: --use-torch-fsdp2 with pp > 1 (gradient-accumulation
    fusion left on), no CUDA_DEVICE_MAX_CONNECTIONS with tp, CPU offload without the
    precision-aware optimizer. validate_args stops at each; the emitter's output does not."""
    r = _plan(*PLANS[2])
    good = to_megatron_args(r)
    env = _env(r)
    assert megatron_args_errors(good, env) == []
    old = [w for w in good if w not in ("--use-megatron-fsdp", "--use-distributed-optimizer",
                                        "--overlap-param-gather", "--overlap-grad-reduce",
                                        "--no-gradient-accumulation-fusion")]
    i = old.index("--data-parallel-sharding-strategy")
    old = old[:i] + old[i + 2:]
    i = old.index("--ckpt-format")
    old = old[:i] + old[i + 2:] + ["--use-torch-fsdp2"]
    assert megatron_args_errors(old, env) == ["--use-torch-fsdp2 is not supported with pipeline parallelism"]
    r70 = _plan(*PLANS[1])
    args70 = to_megatron_args(r70)
    assert _env(r70).cuda_device_max_connections == "1"
    unset = LaunchEnv(world_size=16, cuda_device_max_connections=None, device_arch_major=9)
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in megatron_args_errors(args70, unset)[0]
    blackwell = LaunchEnv(world_size=16, cuda_device_max_connections=None, device_arch_major=10)
    assert megatron_args_errors(args70, blackwell) == []
    no_base = [w for w in args70]
    i = no_base.index("--rotary-base")
    assert parse_args(no_base[:i] + no_base[i + 2:]).rotary_base == 10000   # Megatron's default: wrong for Llama 3
    r1 = _plan(*PLANS[0])
    offload = to_megatron_args(r1, EmitOptions(offload_optimizer="cpu"))
    assert megatron_args_errors(offload, _env(r1)) == []
    stripped = [w for w in offload if w != "--use-precision-aware-optimizer"]
    assert "--use-precision-aware-optimizer" in megatron_args_errors(stripped, _env(r1))[0]


@pytest.mark.slow
def test_70b_default_plan_launch_sets_one_connection_and_rotary_base(tmp_path):
    """`plan --model 70b --gpus h100 --out DIR`: CUDA_DEVICE_MAX_CONNECTIONS=1, the rotary
    base, and no DeepSpeed file (Megatron does not read one)."""
    from click.testing import CliRunner

    from planner.cli.main import cli

    res = CliRunner().invoke(cli, ["--model", "70b", "--gpus", "h100", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert "ds_config.json" not in names and "hostfile" not in names and "megatron_args.txt" in names
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (tmp_path / "o" / "launch.sh").read_text()
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (tmp_path / "o" / "slurm.sbatch").read_text()
    args = (tmp_path / "o" / "megatron_args.txt").read_text().split()
    assert args[args.index("--rotary-base") + 1] == "500000"
    assert "(stack: megatron)" in res.output


def test_megatron_refuses_what_its_arguments_cannot_express():
    r = _plan("qwen2.5-0.5b", dict(dp=2, tp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=4), "h100")
    assert plan_files(r, EmitOptions(stack="megatron", scheduler="none"))
    bloom = load_model("bloom-176b")
    lay = Layout(dp=1, tp=8, pp=14, zero_stage=0, sp=True, micro_batch=1, grad_accum=64, seq_len=2048,
                 recompute="full")
    rb = api.evaluate_layout(bloom, get_gpu("h100"), TrainingSetup(seq_len=2048, global_batch=64), lay)
    if rb.best is not None and rb.best.fits:
        with pytest.raises(UserError, match="cannot express"):
            to_megatron_args(rb)


def test_megatron_refusal_reads_as_a_sentence():
    # the reason follows the model's name in brackets (it read "bloom-176b's a norm after ...")
    falcon = _plan("falcon-40b", dict(dp=1, tp=8, pp=2, zero_stage=0, sp=True, micro_batch=1, grad_accum=64,
                                      recompute="full"), "h100")
    with pytest.raises(UserError, match=r"cannot express falcon-40b \(parallel attention/MLP blocks\);"):
        to_megatron_args(falcon)


FP8_PLANS = [
    # (recipe, optimizer, layout)
    ("delayed", "adamw-bf16-states", dict(dp=2, tp=4, pp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16,
                                          recompute="full")),
    ("tensorwise", "adamw", dict(dp=2, tp=4, pp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16,
                                 recompute="full")),
    ("blockwise", "adamw-bf16-states", dict(dp=2, tp=4, pp=2, zero_stage=1, sp=True, micro_batch=1,
                                            grad_accum=16, recompute="full")),
]


def _fp8_plan(recipe: str, optimizer: str, kw: dict):
    m = load_model("llama3.1-8b")
    lay = Layout(seq_len=2048, **kw)
    setup = TrainingSetup(seq_len=2048, global_batch=lay.global_batch, precision="fp8", fp8_recipe=recipe,
                          optimizer=optimizer)
    r = api.evaluate_layout(m, get_gpu("h100"), setup, lay)
    assert r.best is not None and r.best.fits
    return r


@pytest.mark.parametrize("recipe, optimizer, kw", FP8_PLANS)
def test_fp8_and_bf16_moments_reach_megatron_cores_config_classes(recipe, optimizer, kw, monkeypatch):
    """FP8 flags go into megatron-core 0.16.1's TransformerConfig (fp8, fp8_recipe, amax
    history) and the precision-aware optimizer's dtypes into its OptimizerConfig, whose
    __post_init__ checks them (adam, distributed optimizer) and then wants Transformer
    Engine's FusedAdam with master_weight_dtype / exp_avg_dtype / exp_avg_sq_dtype: a stub
    module with that signature stands in for TE, which has no CPU build."""
    require("megatron.core")
    import dataclasses
    import sys
    import types

    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.optimizer import OptimizerConfig

    r = _fp8_plan(recipe, optimizer, kw)
    argv = to_megatron_args(r)
    assert megatron_args_errors(argv, _env(r)) == []
    a = parse_args(argv)
    assert a.fp8_format == "hybrid" and a.fp8_recipe == recipe and a.bf16
    cfg = transformer_config(a)
    cfg = dataclasses.replace(cfg, fp8=a.fp8_format, fp8_recipe=a.fp8_recipe,
                              fp8_amax_history_len=a.fp8_amax_history_len or 1,
                              fp8_amax_compute_algo=a.fp8_amax_compute_algo or "most_recent")
    assert cfg.fp8 == "hybrid" and cfg.fp8_recipe == recipe
    if optimizer == "adamw-bf16-states":
        assert a.use_precision_aware_optimizer and a.exp_avg_dtype == a.exp_avg_sq_dtype == "bf16"

        class FusedAdam:
            def __init__(self, params, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                         use_decoupled_grad=False):
                pass

        te = types.ModuleType("transformer_engine.pytorch.optimizers")
        te.FusedAdam = FusedAdam
        for name in ("transformer_engine", "transformer_engine.pytorch"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.optimizers", te)
        from megatron.core.optimizer import optimizer_config
        monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda version: True)
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        OptimizerConfig(optimizer=a.optimizer, lr=a.lr, bf16=a.bf16,
                        use_distributed_optimizer=a.use_distributed_optimizer,
                        use_precision_aware_optimizer=a.use_precision_aware_optimizer,
                        exp_avg_dtype=dtypes[a.exp_avg_dtype], exp_avg_sq_dtype=dtypes[a.exp_avg_sq_dtype])


def test_megatron_refuses_rowwise_fp8_and_bf16_moments_without_distributed_optimizer():
    r = _fp8_plan("rowwise", "adamw", FP8_PLANS[0][2])
    with pytest.raises(UserError, match="megatron runs tensorwise, delayed, blockwise"):
        to_megatron_args(r)
    kw = dict(FP8_PLANS[0][2], zero_stage=0)
    with pytest.raises(UserError, match="distributed optimizer"):
        to_megatron_args(_fp8_plan("delayed", "adamw-bf16-states", kw))


@pytest.mark.parametrize("stack, expandable", [("megatron", True), ("torchtitan", True), ("hf", False),
                                               ("deepspeed", False)])
def test_launch_sets_expandable_segments_where_the_stacks_own_launchers_do(stack, expandable):
    """torchtitan's run_train.sh runs torchrun under PYTORCH_ALLOC_CONF="expandable_segments:True";
    Megatron-Bridge's performance scripts set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the
    recipes that fill the GPU (scripts/performance/perf_plugins.py) and in its DGX Cloud executor
    (scripts/performance/utils/executors.py); accelerate and the deepspeed launcher set nothing."""
    from planner.emit.launch import stack_env

    r = api.plan(load_model("llama3-8b"), get_gpu("h100"), TrainingSetup(seq_len=2048, global_batch=64),
                 n_gpus=8)
    env = stack_env(r, stack)
    assert (env.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True") is expandable
