"""Megatron-LM arguments for multi-latent attention (DeepSeek-V3 shapes: deepseek_v3, Kimi K2,
DeepSeek-V2-Lite's full query projection) and the refusals of what they cannot express.

Referees: the cited copy of Megatron-LM's parser and validate_args (tests/megatron_args.py);
megatron-core 0.16.1's MLATransformerConfig and GPTModel, built on the CPU from the parsed
arguments as Megatron-LM's core_transformer_config_from_args maps them, with megatron-core's
own decoder block spec (get_gpt_decoder_block_spec, local modules: MLASelfAttention under
multi_latent_attention, dense and MoE layers from moe_layer_freq); transformers'
DeepseekV3ForCausalLM built on the meta device counts the parameters they must match.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from causal_families import transformers_count
from conftest import require
from megatron_args import LaunchEnv, env_from_script, megatron_args_errors, parse_args
from megatron_groups import GROUP_STUBS
from megatron_model import GPT_CONFIG_KW, GPT_FIELDS, plan_layout, run_model_script

from planner.emit import EmitOptions
from planner.emit.launch import to_launch_script
from planner.emit.megatron import to_megatron_args
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.hardware.placement import cluster_for
from planner.layouts.layout import Layout
from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.models.spec import count_params
from planner.stacks.megatron import device_arch_major
from planner.timing.flops import mtp_blocks
from planner.timing.model import step_time
from planner.training.setup import TrainingSetup

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"
TINY = dict(dp=1, tp=2, pp=1, ep=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=8)
# the layout of `plan --model deepseek-v3 --gpus h100 --stack megatron --n-gpus 256 --tp 2 --pp 8
# --ep 32 --etp 1`: 16 data-parallel ranks of tp 2 x pp 8, experts over 32 of tp x dp
DEEPSEEK_LAYOUT = dict(dp=16, tp=2, pp=8, ep=32, etp=1, zero_stage=1, sp=True, micro_batch=1,
                       grad_accum=64, recompute="full")


def _plan(m, kw: dict = TINY, seq_len: int = 1024):
    return plan_layout(m, kw, seq_len)


def _tiny_cfg(**changes) -> dict:
    cfg = json.loads((CONFIGS / "tiny-deepseek-v3.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def _spec(cfg: dict, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return spec_from_hf_config(cfg, name, str(path), source=str(path))


def _errors(r, args: list[str]) -> list[str]:
    env = LaunchEnv(world_size=r.best.layout.n_gpus,
                    cuda_device_max_connections=env_from_script(
                        to_launch_script(r, EmitOptions(), "megatron")).get("CUDA_DEVICE_MAX_CONNECTIONS"),
                    device_arch_major=device_arch_major("h100"))
    return megatron_args_errors(args, env)


def test_deepseek_v3_arguments_carry_its_attention_and_router():
    # DeepSeek-V3's config.json (planner/presets/models/deepseek-v3.json): q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; rope_scaling
    # yarn factor 40, mscale 1.0, mscale_all_dim 1.0, original_max_position_embeddings 4096,
    # beta_fast 32, beta_slow 1; first_k_dense_replace 3 of 61 layers (intermediate_size 18432),
    # 256 routed experts of 2048 + 1 shared, top-8, n_group 8, topk_group 4,
    # routed_scaling_factor 2.5, sigmoid scores with e_score_correction_bias (noaux_tc)
    r = _plan(load_model("deepseek-v3"), DEEPSEEK_LAYOUT, seq_len=4096)
    args = to_megatron_args(r)
    assert _errors(r, args) == []
    a = parse_args(args)
    assert a.multi_latent_attention and a.qk_layernorm and not a.group_query_attention
    assert (a.q_lora_rank, a.kv_lora_rank, a.qk_head_dim, a.qk_pos_emb_head_dim, a.v_head_dim, a.kv_channels) == \
        (1536, 512, 128, 64, 128, 128)
    assert (a.rope_type, a.rotary_base, a.rotary_scaling_factor, a.mscale, a.mscale_all_dim) == \
        ("yarn", 10000, 40.0, 1.0, 1.0)
    assert a.apply_rope_fusion          # YaRN keeps megatron-core's fused rope
    assert (a.ffn_hidden_size, a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size) == (18432, 2048, 2048)
    assert a.moe_layer_freq == "([0]*3+[1]*58)" and a.num_experts == 256 and a.moe_router_topk == 8
    assert (a.moe_router_score_function, a.moe_router_enable_expert_bias, a.moe_router_topk_scaling_factor) == \
        ("sigmoid", True, 2.5)
    assert (a.moe_router_num_groups, a.moe_router_group_topk) == (8, 4)
    assert a.mtp_num_layers is None     # MTP modules only under --mtp (transformers builds none)


# megatron-core's GPTModel from the parsed arguments (as core_transformer_config_from_args maps
# them: MLATransformerConfig under --multi-latent-attention, rope_type left to its default when
# the argument is absent), on one rank, with megatron-core's local decoder block spec
_SCRIPT = GROUP_STUBS + GPT_CONFIG_KW + r'''
import torch
import torch.nn.functional as F
a = json.loads(sys.argv[1])
torch.cuda.current_device = lambda: "cpu"      # TopKRouter's expert-bias buffers, YaRN's inv_freq
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.transformer_config import MLATransformerConfig
ps.initialize_model_parallel()
kw = dict(
    gpt_config_kw(a), num_query_groups=None,
    moe_router_num_groups=a["moe_router_num_groups"], moe_router_group_topk=a["moe_router_group_topk"],
    multi_latent_attention=a["multi_latent_attention"], q_lora_rank=a["q_lora_rank"],
    kv_lora_rank=a["kv_lora_rank"], qk_head_dim=a["qk_head_dim"], qk_pos_emb_head_dim=a["qk_pos_emb_head_dim"],
    v_head_dim=a["v_head_dim"], rotary_base=a["rotary_base"], rotary_percent=a["rotary_percent"],
    rotary_scaling_factor=a["rotary_scaling_factor"], mscale=a["mscale"], mscale_all_dim=a["mscale_all_dim"],
    apply_rope_fusion=False)     # the fused kernel is CUDA's; the choice is checked in the parent
if a["rope_type"] is not None:
    kw["rope_type"] = a["rope_type"]
if a["mtp_num_layers"]:
    kw["mtp_num_layers"] = a["mtp_num_layers"]
cfg = MLATransformerConfig(**kw)
spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
# megatron-core 0.16.1's local DotProductAttention does not take the k_channels/v_channels
# MLASelfAttention gives its core attention (Transformer Engine's does); it holds no parameters,
# so a subclass that drops them stands in
from megatron.core.transformer.dot_product_attention import DotProductAttention
class CoreAttention(DotProductAttention):
    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        super().__init__(*args, **kwargs)
for layer in spec.layer_specs:
    layer.submodules.self_attention.submodules.core_attention = CoreAttention
# without Transformer Engine its TELinear is a MagicMock instance, which MLASelfAttention's
# isinstance(self.linear_proj, TELinear) cannot take: a class that nothing is an instance of
import megatron.core.transformer.multi_latent_attention as mla
mla.TELinear = type("TELinear", (), {})
mtp = None
if a["mtp_num_layers"]:     # the MTP block of the last layer's spec (a MoE block here)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
    mtp = get_gpt_mtp_block_spec(cfg, spec.layer_specs[-1], use_transformer_engine=False)
model = GPTModel(cfg, spec, vocab_size=a["padded_vocab"], max_sequence_length=a["max_position_embeddings"],
                 position_embedding_type=a["position_embedding_type"], rotary_percent=a["rotary_percent"],
                 share_embeddings_and_output_weights=not a["untie_embeddings_and_output_weights"],
                 mtp_block_spec=mtp)
att = model.decoder.layers[0].self_attention
print(json.dumps({"total": sum(p.numel() for p in model.parameters()),
                  "classes": [type(x.mlp).__name__ for x in model.decoder.layers],
                  "attention": type(att).__name__, "rope": type(att.rotary_pos_emb).__name__,
                  "q_proj": sorted(n for n in ("linear_q_proj", "linear_q_down_proj", "q_layernorm")
                                   if hasattr(att, n)),
                  "softmax_scale": att.softmax_scale,
                  # the MTP modules' layers that route tokens (an MoE with a token dispatcher: its
                  # all-to-alls), megatron-core's MultiTokenPredictionLayer.transformer_layer
                  "mtp_dispatching": sum(hasattr(getattr(x.transformer_layer, "mlp", None), "token_dispatcher")
                                         for x in (model.mtp.layers if mtp is not None else []))}))
'''

_FIELDS = (*GPT_FIELDS, "moe_router_num_groups", "moe_router_group_topk", "multi_latent_attention", "q_lora_rank",
           "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "rope_type", "rotary_base",
           "rotary_percent", "rotary_scaling_factor", "mscale", "mscale_all_dim", "apply_rope_fusion",
           "max_position_embeddings", "position_embedding_type", "untie_embeddings_and_output_weights",
           "mtp_num_layers")


def _megatron_model(args: list[str]) -> dict:
    return run_model_script(_SCRIPT, parse_args(args), _FIELDS)


# tiny-deepseek-v3.json (bench/configs): 3 layers, first_k_dense_replace 1, q_lora_rank 96,
# kv_lora_rank 64, heads of 32 + 16 rotary, values of 32, YaRN factor 40 with mscale_all_dim 1;
# the V2-Lite shape drops q_lora_rank (DeepSeek-V2-Lite's config.json: "q_lora_rank": null,
# a full q_proj); the third has no rope_scaling (plain rotary key)
@pytest.mark.slow
@pytest.mark.parametrize("name, changes, q_modules, rope", [
    ("tiny-deepseek-v3", {}, ["linear_q_down_proj", "q_layernorm"], "YarnRotaryEmbedding"),
    ("tiny-deepseek-v2-lite-shape", {"q_lora_rank": None}, ["linear_q_proj"], "YarnRotaryEmbedding"),
    ("tiny-deepseek-v3-rope", {"rope_scaling": ...}, ["linear_q_down_proj", "q_layernorm"], "RotaryEmbedding"),
])
def test_megatron_cores_gpt_model_has_transformers_parameters(tmp_path, name, changes, q_modules, rope):
    require("megatron.core")
    require("transformers")
    cfg = _tiny_cfg(**changes)
    m = _spec(cfg, tmp_path, name)
    r = _plan(m)
    args = to_megatron_args(r)
    assert _errors(r, args) == []
    got = _megatron_model(args)
    assert got["attention"] == "MLASelfAttention" and got["rope"] == rope and got["q_proj"] == q_modules
    assert got["classes"] == ["MLP"] + ["MoELayer"] * (m.n_layers - 1)     # first_k_dense_replace 1
    # untied: the embedding and the head each carry Megatron's padded rows
    assert got["total"] == transformers_count(cfg) + 2 * got["pad"] * m.d_model
    a = parse_args(args)
    # MLATransformerConfig.__post_init__: rope fusion for MLA is YaRN's only
    assert a.apply_rope_fusion == (a.rope_type == "yarn")


@pytest.mark.slow
def test_megatron_cores_mtp_module_has_the_planners_parameters():
    # --mtp 1 writes --mtp-num-layers 1; megatron-core's MTP block (enorm, hnorm, eh_proj 2h x h,
    # one layer of the last block's kind, its final norm; embedding and head shared) must hold what
    # the planner counts for one DeepSeek-V3 MTP module (arXiv:2412.19437 Sec. 2.2; ModelSpec
    # n_mtp_modules), which transformers' DeepseekV3ForCausalLM does not build
    require("megatron.core")
    m = load_model(str(CONFIGS / "tiny-deepseek-v3.json"))
    args = to_megatron_args(plan_layout(m, TINY, 1024, mtp_layers=1))
    assert parse_args(args).mtp_num_layers == 1
    got = _megatron_model(args)
    assert got["total"] == count_params(replace(m, n_mtp_modules=1)).total + 2 * got["pad"] * m.d_model
    # the module's layer routes its tokens as the model's MoE blocks do: the step time gives the
    # stage holding it that layer's all-to-alls (timing.flops.mtp_blocks, timing.stage)
    assert got["mtp_dispatching"] == mtp_blocks(m, 1) == 1
    lay = Layout(ep=4, dp=4, micro_batch=1, grad_accum=2, seq_len=1024, zero_stage=1)
    setup = TrainingSetup(seq_len=1024, global_batch=8, stack="megatron")
    cluster = cluster_for(get_gpu("h100"))
    ep = [step_time(m, replace(setup, mtp_layers=k), lay, cluster).comm_s["ep"] for k in (0, 1)]
    assert ep[0] > 0 and ep[1] == pytest.approx(ep[0] * (m.n_layers + 1) / m.n_layers, rel=1e-9)


@pytest.mark.slow
def test_megatron_softmax_scale_is_transformers():
    # DeepseekV3Attention.scaling (transformers 5.x): qk_head_dim^-0.5 x yarn mscale(factor,
    # mscale_all_dim)^2; megatron-core's MLASelfAttention.softmax_scale from the written
    # --rotary-scaling-factor and --mscale-all-dim must be that number
    require("megatron.core")
    require("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = _tiny_cfg()
    rest = dict(cfg)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(rest.pop("model_type"), **rest))
    m = load_model(str(CONFIGS / "tiny-deepseek-v3.json"))
    got = _megatron_model(to_megatron_args(_plan(m)))
    assert got["softmax_scale"] == pytest.approx(hf.model.layers[0].self_attn.scaling, rel=1e-12)


@pytest.mark.parametrize("preset, match", [
    ("kimi-k2", "beta_fast 1"),                 # Kimi K2's YaRN beta_fast 1.0: megatron-core's is 32, no argument
    ("deepseek-v3.2", "Sparse Attention's indexer"),
])
def test_megatron_refuses_what_it_cannot_build(preset, match):
    r = _plan(load_model(preset), DEEPSEEK_LAYOUT, seq_len=4096)
    with pytest.raises(UserError, match=match):
        to_megatron_args(r)


@pytest.mark.parametrize("changes, match", [
    ({"norm_topk_prob": False}, "norm_topk_prob"),    # Megatron's sigmoid top-k is always normalised
    ({"rope_interleave": False}, "rope_interleave"),  # MLA's rotary dims are read interleaved
    ({"rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}},
     "mscale_all_dim but no mscale"),
    ({"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 8192}},
     "original_max_position_embeddings 8192"),
])
def test_megatron_refuses_router_and_rope_it_cannot_set(tmp_path, changes, match):
    m = _spec(_tiny_cfg(**changes), tmp_path, "tiny-deepseek-v3-changed")
    with pytest.raises(UserError, match=match):
        to_megatron_args(_plan(m))
