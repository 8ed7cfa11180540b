"""Megatron-LM arguments for gated DeltaNet hybrids (Qwen3-Next, planner.emit.megatron_deltanet),
refereed by Megatron's own code:

1. the project's copy of Megatron-LM's parser and validate_args rules (tests/megatron_args.py)
   parses the written arguments and finds nothing to stop at;
2. megatron-core 0.16.1 validates a TransformerConfig of the parsed arguments at the layout's tp
   (its gated DeltaNet checks: the pattern set, value heads a multiple of key heads, both
   divisible by tp, no cp), then builds its GPTModel on the CPU with the layer specs of its own
   get_transformer_block_with_experimental_attention_variant_spec (a subprocess, parallel_state
   with torch.distributed's group calls stubbed as tests/megatron_groups.py does). That spec
   function asserts Transformer Engine, which does not install without CUDA: its backend is
   megatron-core's LocalSpecProvider with one stand-in, a ColumnParallelLinear holding the
   layer_norm_weight of its input that TE's LayerNormColumnParallelLinear holds (the gated
   DeltaNet's in_proj with the layer's input norm fused, as the spec builds it), and its softmax
   attention is get_gpt_layer_local_spec's (TE's own attention spec imports TE). fla, which
   GatedDeltaNet imports for its forward only, is marked present. Torch's RMSNorm stand-in
   refuses zero-centred gamma and sequence parallelism, so the model is built with both off (the
   config with them on is validated first): they change the norm's formula (1 + w) and where
   activations are split, not a parameter. Its layer kinds are the planner's
   letters and its parameters, layer by layer and in total, the planner's count (itself
   transformers' count, tests/test_deltanet.py); one rank under tp 2 and ep 2 holds the
   planner's rank parameters;
3. what Megatron cannot run as planned is refused in one line, nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_args import megatron_args_errors, moe_freq_type, padded_vocab_size, parse_args
from megatron_groups import GROUP_STUBS
from megatron_plans import PARAM_COUNTS, TINY_LAYOUTS, launch_env, plan_layout

from planner.cli.main import cli
from planner.emit import EmitOptions
from planner.emit.launch import to_launch_script
from planner.emit.megatron import to_megatron_args
from planner.emit.megatron_deltanet import freq_arg
from planner.errors import UserError
from planner.memory.params import rank_params
from planner.models.load import load_model
from planner.models.spec import count_params

# A tiny Qwen3-Next: 8 decoder layers, gated attention on every 4th, MoE with a gated shared
# expert but dense MLPs on layers 1 and 5 (mlp_only_layers), tp 2 dividing every head count
TINY = {
    "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 8, "full_attention_interval": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48, "mlp_only_layers": [1, 5], "vocab_size": 256,
    "rope_theta": 10000000, "partial_rotary_factor": 0.25, "tie_word_embeddings": False,
}


def _tiny(**extra):
    """The tiny model from its config.json file (the Megatron arguments read rope_theta,
    partial_rotary_factor and rms_norm_eps from it: planner.stacks.architecture)."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "tiny-qwen3-next.json"
    path.write_text(json.dumps({**TINY, **extra}))
    return load_model(str(path))


@pytest.mark.parametrize("kw", TINY_LAYOUTS)
def test_written_arguments_parse_and_pass_validate_args(kw):
    r = plan_layout(_tiny(), kw)
    args = to_megatron_args(r)
    assert megatron_args_errors(args, launch_env(r)) == []
    a = parse_args(args)
    # 16 letters, 8 decoder layers; megatron-core's int rule N = 4: layer i is attention where
    # (i + 1) % 4 == 0 (get_linear_attention_pattern), transformers' full_attention_interval
    assert r.model.layer_pattern == "GEG-GE*EGEG-GE*E" and a.num_layers == 8
    assert a.experimental_attention_variant == "gated_delta_net" and a.linear_attention_freq == 4
    assert moe_freq_type(a.moe_layer_freq) == [1, 0, 1, 1, 1, 0, 1, 1]
    assert (a.linear_num_key_heads, a.linear_num_value_heads, a.linear_key_head_dim, a.linear_value_head_dim,
            a.linear_conv_kernel_dim) == (2, 4, 16, 16, 4)
    assert a.attention_output_gate and a.qk_layernorm and a.apply_layernorm_1p and a.moe_shared_expert_gate
    assert (a.rotary_percent, a.rotary_base, a.kv_channels, a.num_query_groups) == (0.25, 10000000, 16, 2)
    assert (a.ffn_hidden_size, a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size) == (96, 32, 48)
    script = to_launch_script(r, EmitOptions(), "megatron")
    assert "pretrain_gpt.py" in script and "pretrain_mamba.py" not in script


def test_frequency_arguments_read_back_as_megatron_cores_patterns():
    # megatron-core 0.16.1 experimental_attention_variant_module_specs.py: an int N gives
    # get_linear_attention_pattern's [0 if (i + 1) % N == 0 else 1] and get_moe_layer_pattern's
    # [1 if i % N == 0 else 0]; anything else is written as the list
    assert freq_arg([1, 1, 1, 0] * 3, every_nth=0) == "4"
    assert freq_arg([1, 1, 0, 1], every_nth=0) == "3"       # (i + 1) % 3 == 0 at i = 2 only
    assert freq_arg([1, 0, 1, 1], every_nth=0) == "[1,0,1,1]"
    assert freq_arg([1, 0] * 4, every_nth=1) == "2"
    assert freq_arg([1, 0, 1, 1], every_nth=1) == "[1,0,1,1]"


# megatron-core's GPTModel from the parsed arguments (as core_transformer_config_from_args maps
# them), on one rank; the stubs stay in the subprocess
_SCRIPT = GROUP_STUBS + PARAM_COUNTS + r'''
import dataclasses
import torch, torch.nn as nn, torch.nn.functional as F
a = json.loads(sys.argv[1])
torch.cuda.current_device = lambda: "cpu"      # GatedDeltaNet allocates conv1d, dt_bias and A_log there
from megatron.core.ssm import gated_delta_net
gated_delta_net.HAVE_FLA = True                # fla runs the forward only
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt import experimental_attention_variant_module_specs as ev
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig


class NormColumnParallelLinear(ColumnParallelLinear):
    """TE's LayerNormColumnParallelLinear's parameters: the column-parallel weight and the
    layer_norm_weight of its input (no bias: add_bias_linear is off)."""
    def __init__(self, input_size, output_size, *, config, tp_comm_buffer_name=None, **kw):
        super().__init__(input_size, output_size, config=config, **kw)
        self.layer_norm_weight = nn.Parameter(torch.ones(input_size))


class Local(LocalSpecProvider):
    def column_parallel_layer_norm_linear(self):
        return NormColumnParallelLinear


def local_attention(config, backend=None):
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm,
                                    normalization=config.normalization).submodules.self_attention
    spec.metainfo["fuse_input_layernorm"] = False        # the layer's own input norm
    return spec


ev._get_backend_spec_provider = lambda config: Local()
ev._get_self_attention_module_spec = local_attention


def config(tp, ep):
    return TransformerConfig(
        num_layers=a["num_layers"], hidden_size=a["hidden_size"], num_attention_heads=a["num_attention_heads"],
        ffn_hidden_size=a["ffn_hidden_size"], kv_channels=a["kv_channels"],
        num_query_groups=a["num_query_groups"] if a["group_query_attention"] else None,
        normalization=a["normalization"], layernorm_epsilon=a["norm_epsilon"],
        layernorm_zero_centered_gamma=a["apply_layernorm_1p"], add_bias_linear=a["add_bias_linear"],
        gated_linear_unit=a["swiglu"], activation_func=F.silu, qk_layernorm=a["qk_layernorm"],
        attention_output_gate=a["attention_output_gate"],
        experimental_attention_variant=a["experimental_attention_variant"],
        linear_attention_freq=a["linear_attention_freq"], linear_conv_kernel_dim=a["linear_conv_kernel_dim"],
        linear_key_head_dim=a["linear_key_head_dim"], linear_value_head_dim=a["linear_value_head_dim"],
        linear_num_key_heads=a["linear_num_key_heads"], linear_num_value_heads=a["linear_num_value_heads"],
        num_moe_experts=a["num_experts"], moe_router_topk=a["moe_router_topk"],
        moe_ffn_hidden_size=a["moe_ffn_hidden_size"], moe_layer_freq=a["moe_layer_freq"],
        moe_shared_expert_intermediate_size=a["moe_shared_expert_intermediate_size"],
        moe_shared_expert_gate=a["moe_shared_expert_gate"], hidden_dropout=a["hidden_dropout"],
        attention_dropout=a["attention_dropout"], use_cpu_initialization=True, perform_initialization=False,
        params_dtype=torch.float32, tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
        sequence_parallel=tp > 1)


def build(tp, ep):
    model_parallel(tp, ep)
    config(tp, ep)                                   # megatron-core's checks with the written flags
    # torch's norm stand-ins take neither zero-centred gamma nor sequence parallelism; neither
    # changes a parameter
    cfg = dataclasses.replace(config(tp, ep), layernorm_zero_centered_gamma=False, sequence_parallel=False)
    spec = ev.get_transformer_block_with_experimental_attention_variant_spec(cfg)
    return GPTModel(cfg, spec, vocab_size=a["padded_vocab"], max_sequence_length=a["max_position_embeddings"],
                    position_embedding_type=a["position_embedding_type"], rotary_percent=a["rotary_percent"],
                    rotary_base=a["rotary_base"],
                    share_embeddings_and_output_weights=not a["untie_embeddings_and_output_weights"])


model = build(1, 1)
layers = model.decoder.layers
rank = build(*a["tp_ep"])        # rank 0 of tp x ep
print(json.dumps({**param_counts(model, rank),
    "mixers": [type(x.self_attention).__name__ for x in layers],
    "mlps": [type(x.mlp).__name__ for x in layers]}))
'''

# the rank built beside the whole model: tp 2 (whole key and value heads, megatron-core's
# TransformerConfig asserts it) and ep 2
RANK_LAYOUT = dict(dp=1, tp=2, ep=2, zero_stage=1, micro_batch=1, grad_accum=4)
_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels", "num_query_groups",
           "group_query_attention", "normalization", "norm_epsilon", "apply_layernorm_1p", "add_bias_linear",
           "swiglu", "qk_layernorm", "attention_output_gate", "experimental_attention_variant",
           "linear_attention_freq", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
           "linear_num_key_heads", "linear_num_value_heads", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
           "moe_layer_freq", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate", "hidden_dropout",
           "attention_dropout", "max_position_embeddings", "position_embedding_type", "rotary_percent",
           "rotary_base", "untie_embeddings_and_output_weights")


def _megatron_model(m) -> dict:
    require("megatron.core")
    r = plan_layout(m, TINY_LAYOUTS[0])
    a = parse_args(to_megatron_args(r))
    fields = {k: getattr(a, k, None) for k in _FIELDS}
    # Megatron-LM's moe_freq_type reads the list; 1 (every layer) is its default
    fields["moe_layer_freq"] = moe_freq_type(fields["moe_layer_freq"]) if fields["moe_layer_freq"] else 1
    fields["padded_vocab"] = padded_vocab_size(a.vocab_size, a.tensor_model_parallel_size,
                                               a.make_vocab_size_divisible_by)
    fields["tp_ep"] = [RANK_LAYOUT["tp"], RANK_LAYOUT["ep"]]
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(fields)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpt_model() -> dict:
    return _megatron_model(_tiny())


def _per_decoder_layer(m) -> list[int]:
    """The planner's parameters of each decoder layer: its two letters' kinds (count_params)."""
    per_kind = {b.kind: b.per_layer for b in count_params(m).blocks}
    kind = {"G": "deltanet", "*": "attention", "-": "dense", "E": "moe"}
    letters = [per_kind[kind[ch]] for ch in m.layer_pattern]
    return [letters[i] + letters[i + 1] for i in range(0, len(letters), 2)]


@pytest.mark.slow
def test_megatron_cores_layers_are_the_planners_letters(gpt_model):
    m = _tiny()
    mixer = {"G": "GatedDeltaNet", "*": "SelfAttention"}
    mlp = {"E": "MoELayer", "-": "MLP"}
    assert gpt_model["mixers"] == [mixer[c] for c in m.layer_pattern[0::2]]
    assert gpt_model["mlps"] == [mlp[c] for c in m.layer_pattern[1::2]]


@pytest.mark.slow
def test_megatron_cores_gpt_model_has_the_planners_parameters(gpt_model):
    m = _tiny()
    assert gpt_model["per_layer"] == _per_decoder_layer(m)
    assert gpt_model["total"] == count_params(m).total       # vocab 256: no padding at tp 2


@pytest.mark.slow
def test_one_ranks_parameters_are_megatron_cores(gpt_model):
    """Under tp 2 and ep 2, rank 0 of megatron-core's GPTModel holds the planner's expert
    parameters (memory.params.rank_params) exactly, and its dense parameters less three small
    tensors megatron-core replicates over tp that the planner's mean layer splits (rank_params
    splits all but the layer norms and the router): the shared expert's gate_weight (1 x h per
    MoE layer, moe/shared_experts.py), GatedDeltaNet's out_norm (dv per layer) and the attention's
    q/k layernorms (head_dim each); the mean letter's ceil adds at most one per letter. Within
    rank_params' stated error (at most d_model per layer)."""
    m = _tiny()
    lay = plan_layout(m, RANK_LAYOUT).best.layout
    rp = rank_params(m, count_params(m), lay, 0, m.n_layers)
    assert rp.expert == gpt_model["rank_expert"]
    tp = lay.tp
    split_replicas = (m.layer_pattern.count("E") * m.d_model + m.n_deltanet_layers * m.gdn_value_dim
                      + m.n_attention_layers * 2 * m.head_dim) * (tp - 1) // tp
    gap = gpt_model["rank_dense"] - rp.dense
    assert split_replicas == 272 and abs(gap - split_replicas) <= m.n_layers, gap    # measured: 264


@pytest.mark.slow
def test_irregular_attention_layers_and_tied_embeddings_build_alike():
    # explicit layer_types off the every-4th rule are written as a list; tied embeddings share
    # the output layer (no --untie-embeddings-and-output-weights)
    types = ["linear_attention", "full_attention", "linear_attention", "linear_attention"] * 2
    m = _tiny(layer_types=types, tie_word_embeddings=True, mlp_only_layers=[])
    a = parse_args(to_megatron_args(plan_layout(m, TINY_LAYOUTS[0])))
    assert a.linear_attention_freq == [1, 0, 1, 1, 1, 0, 1, 1] and a.moe_layer_freq is None
    assert not a.untie_embeddings_and_output_weights
    built = _megatron_model(m)
    assert built["per_layer"] == _per_decoder_layer(m) and built["total"] == count_params(m).total


def test_qwen3_next_preset_writes_megatron_bridges_shape():
    # Megatron-Bridge's Qwen3NextBridge.provider_bridge for Qwen/Qwen3-Next-80B-A3B: 48 layers,
    # linear_attention_freq = full_attention_interval 4, 16 key heads and 32 value heads of 128,
    # conv 4, 512 experts of 512 top-10, a gated shared expert of 512, rotary on a quarter of
    # head_dim 256, base 10,000,000
    m = load_model("qwen3-next-80b-a3b")
    r = plan_layout(m, dict(dp=2, tp=2, sp=True, ep=8, zero_stage=1, micro_batch=1, grad_accum=8), gpu="h200",
              seq_len=4096)
    args = to_megatron_args(r)
    a = parse_args(args)
    assert (a.num_layers, a.hidden_size, a.linear_attention_freq, a.linear_num_key_heads,
            a.linear_num_value_heads, a.linear_key_head_dim, a.linear_value_head_dim,
            a.linear_conv_kernel_dim) == (48, 2048, 4, 16, 32, 128, 128, 4)
    assert (a.num_experts, a.moe_ffn_hidden_size, a.moe_router_topk, a.moe_shared_expert_intermediate_size,
            a.moe_layer_freq) == (512, 512, 10, 512, None)
    assert (a.rotary_percent, a.rotary_base, a.kv_channels, a.num_query_groups) == (0.25, 10000000, 256, 2)
    assert megatron_args_errors(args, launch_env(r)) == []


def test_what_megatron_cannot_build_or_split_is_refused():
    # attention_bias biases q/k/v/o_proj in transformers; Megatron's --add-qkv-bias leaves the
    # output projection without one
    with pytest.raises(UserError, match="attention biases"):
        to_megatron_args(plan_layout(_tiny(attention_bias=True), TINY_LAYOUTS[0]))
    # 10 decoder layers (20 letters) over pp 4: the planner's stages of [5, 5, 5, 5] letters would
    # cut decoder layers in two; Megatron splits whole layers ([3, 3, 2, 2])
    m = _tiny(num_hidden_layers=10, mlp_only_layers=[])
    with pytest.raises(UserError, match="split a decoder layer"):
        to_megatron_args(plan_layout(m, dict(dp=1, tp=1, pp=4, zero_stage=1, micro_batch=1, grad_accum=8)))


def test_cli_writes_the_qwen3_next_files(tmp_path):
    # the command issue 30 names, under --stack megatron: exit 0 and pretrain_gpt.py with gated
    # DeltaNet (it was refused with exit 2 before: "an SSD chunk of 64", the Mamba path's check)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["--model", "qwen3-next-80b-a3b", "--gpus", "h200", "--n-gpus", "16",
                                   "--stack", "megatron", "--out", str(out)], prog_name="plan")
    assert res.exit_code == 0, res.output
    assert "pretrain_gpt.py" in (out / "launch.sh").read_text()
    assert "gated_delta_net" in (out / "megatron_args.txt").read_text()


def test_layouts_left_unwritten_are_refused_for_their_own_reason(tmp_path):
    # the layouts MambaModel cannot run are kept out of --stack megatron for gated DeltaNet
    # hybrids too (the search and --out agree), but the refusal no longer blames MambaModel:
    # Megatron runs Qwen3-Next as a GPTModel, for which the planner writes no such arguments
    res = CliRunner().invoke(cli, ["--model", "qwen3-next-80b-a3b", "--gpus", "h200", "--n-gpus", "16",
                                   "--stack", "megatron", "--recompute", "full"], prog_name="plan")
    assert res.exit_code == 2 and "MambaModel" not in res.output and "gated DeltaNet" in res.output, res.output
