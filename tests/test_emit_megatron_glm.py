"""Megatron-LM arguments for GLM-4.5 (glm4_moe: dense-first blocks, shared expert, QK norm, q/k/v
bias, half rotary, sigmoid router with expert bias) and the refusals of what they cannot express.

Referees: the cited copy of Megatron-LM's parser and validate_args (tests/megatron_args.py);
megatron-core 0.16.1's TransformerConfig and its GPTModel, built on the CPU from the parsed
arguments with megatron-core's own decoder block spec (get_gpt_decoder_block_spec, local
modules: it reads moe_layer_freq into dense and MoE layers), whose parameter count must equal
transformers' Glm4MoeForCausalLM's (the planner's count, tests/test_models_recent.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import require
from megatron_args import LaunchEnv, env_from_script, megatron_args_errors, parse_args
from megatron_groups import GROUP_STUBS
from megatron_model import GPT_CONFIG_KW, GPT_FIELDS, plan_layout, run_model_script

from planner.emit import EmitOptions
from planner.emit.launch import to_launch_script
from planner.emit.megatron import to_megatron_args
from planner.errors import UserError
from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.models.spec import count_params
from planner.stacks.megatron import device_arch_major

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"
LAYOUT = dict(dp=1, tp=2, pp=1, ep=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=8)


def _plan(m, kw: dict = LAYOUT, seq_len: int = 1024):
    return plan_layout(m, kw, seq_len)


def _tiny_glm():
    cfg = json.loads((CONFIGS / "tiny-glm4-moe.json").read_text())
    return spec_from_hf_config(cfg, "tiny-glm4-moe", str(CONFIGS / "tiny-glm4-moe.json"),
                               source=str(CONFIGS / "tiny-glm4-moe.json"))


def test_glm_45_arguments_carry_its_architecture():
    # GLM-4.5's config.json (planner/presets/models/glm-4.5.json): 3 dense blocks of 12288 then 89
    # MoE blocks of 160 experts of 1536 + 1 shared, QK norm, q/k/v bias, partial_rotary_factor 0.5,
    # routed_scaling_factor 2.5 (transformers' Glm4MoeTopkRouter: sigmoid, e_score_correction_bias)
    r = _plan(load_model("glm-4.5"), dict(dp=1, tp=8, pp=2, ep=8, zero_stage=1, sp=True, micro_batch=1,
                                          grad_accum=64), seq_len=4096)
    args = to_megatron_args(r)
    env = LaunchEnv(world_size=r.best.layout.n_gpus,
                    cuda_device_max_connections=env_from_script(
                        to_launch_script(r, EmitOptions(), "megatron")).get("CUDA_DEVICE_MAX_CONNECTIONS"),
                    device_arch_major=device_arch_major("h100"))
    assert megatron_args_errors(args, env) == []
    a = parse_args(args)
    assert (a.ffn_hidden_size, a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size) == (12288, 1536, 1536)
    assert a.moe_layer_freq == "([0]*3+[1]*89)" and a.num_experts == 160 and a.moe_router_topk == 8
    assert a.qk_layernorm and a.add_qkv_bias and not a.add_bias_linear and a.rotary_percent == 0.5
    assert (a.moe_router_score_function, a.moe_router_enable_expert_bias) == ("sigmoid", True)
    assert a.moe_router_topk_scaling_factor == 2.5 and a.moe_router_num_groups is None   # n_group 1


# megatron-core's GPTModel from the parsed arguments (as core_transformer_config_from_args maps
# them), on one rank, with megatron-core's local decoder block spec; stubs stay in the subprocess
_SCRIPT = GROUP_STUBS + GPT_CONFIG_KW + r'''
import torch
import torch.nn.functional as F
a = json.loads(sys.argv[1])
torch.cuda.current_device = lambda: "cpu"      # TopKRouter puts its expert-bias buffers there
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.transformer_config import TransformerConfig
ps.initialize_model_parallel()
cfg = TransformerConfig(**gpt_config_kw(a),
                        num_query_groups=a["num_query_groups"] if a["group_query_attention"] else None)
spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
model = GPTModel(cfg, spec, vocab_size=a["padded_vocab"], max_sequence_length=a["max_position_embeddings"],
                 position_embedding_type=a["position_embedding_type"], rotary_percent=a["rotary_percent"],
                 share_embeddings_and_output_weights=not a["untie_embeddings_and_output_weights"])
print(json.dumps({"total": sum(p.numel() for p in model.parameters()),
                  "classes": [type(x.mlp).__name__ for x in model.decoder.layers]}))
'''


@pytest.mark.slow
def test_megatron_cores_gpt_model_has_the_planners_parameters():
    require("megatron.core")
    m = _tiny_glm()
    a = parse_args(to_megatron_args(_plan(m)))
    got = run_model_script(_SCRIPT, a, (*GPT_FIELDS, "num_query_groups", "group_query_attention",
                                        "max_position_embeddings", "position_embedding_type", "rotary_percent",
                                        "untie_embeddings_and_output_weights"))
    assert got["classes"] == ["MLP"] + ["MoELayer"] * (m.n_layers - 1)     # first_k_dense_replace 1
    assert got["total"] == count_params(m).total + 2 * got["pad"] * m.d_model     # untied: embedding and head padded


def test_megatron_refuses_what_it_cannot_build():
    # MiniMax-M2's QK norm spans the whole q/k width (MiniMaxM2Attention q_norm over n_heads x
    # head_dim); megatron-core's qk_layernorm normalises each head: refused, nothing written
    r = _plan(load_model("minimax-m2"), dict(dp=1, tp=8, ep=8, zero_stage=1, sp=True, micro_batch=1,
                                             grad_accum=64), seq_len=4096)
    with pytest.raises(UserError, match="whole q and k widths"):
        to_megatron_args(r)
