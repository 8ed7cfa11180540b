"""Megatron-LM arguments for hybrid Mamba models (Nemotron-H / Nemotron 3, planner.models.hybrid),
refereed by Megatron's own code:

1. the project's copy of Megatron-LM's parser and validate_args rules (tests/megatron_args.py)
   parses the written arguments and finds nothing to stop at;
2. megatron-core 0.16.1 builds its MambaModel on CPU from those parsed arguments (a subprocess,
   parallel_state with torch.distributed's group calls stubbed as tests/megatron_groups.py does;
   local layer specs in place of Transformer Engine's, mamba_ssm's gated RMSNorm stood in for by
   a module of its one weight): its hybrid allocation (ssm/mamba_hybrid_layer_allocation.py
   allocate_layers) reads the written pattern as the planner's layer kinds, and its parameters,
   layer by layer and in total, are the planner's count (itself transformers' count,
   tests/test_hybrid.py);
3. what MambaStack cannot run is refused in one line, nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_args import megatron_args_errors, padded_vocab_size, parse_args
from megatron_groups import GROUP_STUBS
from megatron_plans import PARAM_COUNTS, TINY_LAYOUTS, launch_env, plan_layout

from planner.cli.main import cli
from planner.emit import EmitOptions
from planner.emit.launch import to_launch_script
from planner.emit.megatron import to_megatron_args
from planner.errors import UserError
from planner.memory.params import rank_params
from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.models.spec import count_params

# A tiny Nemotron-H with every letter of Megatron's pattern, at the mixer sizes megatron-core's
# MambaLayer builds (conv kernel 4, chunk 128: NemotronHConfig's defaults too)
TINY = {
    "model_type": "nemotron_h", "hidden_size": 128, "hybrid_override_pattern": "ME*-ME*-",
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48, "intermediate_size": 192,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 96, "vocab_size": 1024, "tie_word_embeddings": False,
}


def _tiny():
    return spec_from_hf_config(dict(TINY), "tiny-nemotron-h", "test")


@pytest.mark.parametrize("kw", TINY_LAYOUTS)
def test_written_arguments_parse_and_pass_validate_args(kw):
    r = plan_layout(_tiny(), kw)
    args = to_megatron_args(r)
    assert megatron_args_errors(args, launch_env(r)) == []
    a = parse_args(args)
    m = r.model
    assert a.is_hybrid_model and a.squared_relu and a.hybrid_override_pattern == m.layer_pattern == "ME*-ME*-"
    assert a.num_layers == len(a.hybrid_override_pattern)
    assert (a.mamba_num_heads, a.mamba_head_dim, a.mamba_state_dim, a.mamba_num_groups) == (8, 16, 16, 2)
    assert a.spec == ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
    assert a.position_embedding_type == "none" and a.kv_channels == 48 and a.num_query_groups == 2
    assert (a.ffn_hidden_size, a.moe_ffn_hidden_size, a.moe_shared_expert_intermediate_size) == (192, 64, 96)
    assert "pretrain_mamba.py" in to_launch_script(r, EmitOptions(), "megatron")


# megatron-core's MambaModel from the parsed arguments (as core_transformer_config_from_args
# maps them), on one rank; the stubs stay in the subprocess
_SCRIPT = GROUP_STUBS + PARAM_COUNTS + r'''
import torch, torch.nn as nn
a = json.loads(sys.argv[1])
torch.cuda.current_device = lambda: "cpu"      # MambaMixer allocates its conv and SSM parameters there
from megatron.core.ssm import mamba_block, mamba_mixer
from megatron.core.transformer.torch_norm import WrappedTorchNorm

class GatedRMSNorm(nn.Module):
    """mamba_ssm ops/triton/layernorm_gated.py RMSNorm's parameters: one weight of hidden_size."""
    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

mamba_mixer.HAVE_MAMBA_SSM = True          # mamba_ssm is imported for the forward only
mamba_mixer.ExtendedRMSNorm = GatedRMSNorm
mamba_block.TENorm = WrappedTorchNorm      # the final norm, without Transformer Engine

class NoRngTracker:                        # the CUDA RNG fork only seeds initial values
    def fork(self):
        import contextlib
        return contextlib.nullcontext()

mamba_mixer.get_cuda_rng_tracker = NoRngTracker
from megatron.core.activations import squared_relu
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.models.mamba import MambaModel
from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules
from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from megatron.core.ssm.mlp_layer import MLPLayer
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import (MoETransformerLayer, TransformerLayer,
                                                          TransformerLayerSubmodules)

# mamba_layer_specs.mamba_stack_spec with megatron-core's local modules for Transformer Engine's
# (the norm fused into in_proj / linear_qkv / linear_fc1 there is the layer's own norm here)
spec = ModuleSpec(module=MambaStack, submodules=MambaStackSubmodules(
    mamba_layer=ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
        norm=WrappedTorchNorm,
        mixer=ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(
            in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)),
        mamba_bda=get_bias_dropout_add)),
    attention_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
        input_layernorm=WrappedTorchNorm,
        self_attention=ModuleSpec(module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                                  submodules=SelfAttentionSubmodules(
                                      linear_qkv=ColumnParallelLinear, core_attention=DotProductAttention,
                                      linear_proj=RowParallelLinear)),
        self_attn_bda=get_bias_dropout_add)),
    mlp_layer=ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                            linear_fc2=RowParallelLinear)),
        mlp_bda=get_bias_dropout_add)),
    moe_layer=ModuleSpec(module=MoETransformerLayer, submodules=TransformerLayerSubmodules(
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=get_moe_module_spec(use_te=False, num_experts=a["num_experts"], moe_grouped_gemm=False),
        mlp_bda=get_bias_dropout_add)),
))


def build(tp, ep):
    model_parallel(tp, ep)
    cfg = TransformerConfig(
        num_layers=a["num_layers"], hidden_size=a["hidden_size"], num_attention_heads=a["num_attention_heads"],
        ffn_hidden_size=a["ffn_hidden_size"], kv_channels=a["kv_channels"],
        num_query_groups=a["num_query_groups"] if a["group_query_attention"] else None,
        normalization=a["normalization"], layernorm_epsilon=a["norm_epsilon"], add_bias_linear=a["add_bias_linear"],
        gated_linear_unit=False, activation_func=squared_relu if a["squared_relu"] else None,
        num_moe_experts=a["num_experts"], moe_router_topk=a["moe_router_topk"],
        moe_ffn_hidden_size=a["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=a["moe_shared_expert_intermediate_size"],
        is_hybrid_model=a["is_hybrid_model"], mamba_state_dim=a["mamba_state_dim"],
        mamba_head_dim=a["mamba_head_dim"], mamba_num_groups=a["mamba_num_groups"],
        mamba_num_heads=a["mamba_num_heads"], hidden_dropout=a["hidden_dropout"],
        attention_dropout=a["attention_dropout"], use_cpu_initialization=True, perform_initialization=False,
        params_dtype=torch.float32, tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    return MambaModel(cfg, spec, vocab_size=a["padded_vocab"], max_sequence_length=a["max_position_embeddings"],
                      hybrid_override_pattern=a["hybrid_override_pattern"],
                      position_embedding_type=a["position_embedding_type"],
                      share_embeddings_and_output_weights=not a["untie_embeddings_and_output_weights"])


model = build(1, 1)
layers = model.decoder.layers
rank = build(*a["tp_ep"])        # rank 0 of tp x ep
print(json.dumps({**param_counts(model, rank),
    "allocated": "".join(allocate_layers(a["num_layers"], 0.0, 0.0, a["hybrid_override_pattern"])),
    "kinds": model.decoder.layer_type_list, "classes": [type(x).__name__ for x in layers]}))
'''


# the rank built beside the whole model: tp 2 (whole Mamba heads and groups, megatron-core's
# MambaMixer asserts it) and ep 2 (megatron-core's DP 2 with ep carved out of it)
RANK_LAYOUT = dict(dp=1, tp=2, ep=2, zero_stage=1, micro_batch=1, grad_accum=4)


@pytest.fixture(scope="module")
def mamba_model() -> dict:
    require("megatron.core")
    require("einops")
    r = plan_layout(_tiny(), TINY_LAYOUTS[0])
    a = parse_args(to_megatron_args(r))
    fields = {k: getattr(a, k) for k in (
        "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels", "num_query_groups",
        "group_query_attention", "normalization", "norm_epsilon", "add_bias_linear", "squared_relu",
        "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
        "is_hybrid_model", "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads",
        "hidden_dropout", "attention_dropout", "max_position_embeddings", "hybrid_override_pattern",
        "position_embedding_type", "untie_embeddings_and_output_weights")}
    # the whole model on one rank: Megatron pads the vocabulary to divisor x tp (tp 2 written)
    fields["padded_vocab"] = padded_vocab_size(a.vocab_size, a.tensor_model_parallel_size,
                                               a.make_vocab_size_divisible_by)
    fields["tp_ep"] = [RANK_LAYOUT["tp"], RANK_LAYOUT["ep"]]
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(fields)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_megatron_cores_allocation_reads_the_planners_layer_kinds(mamba_model):
    m = _tiny()
    assert mamba_model["allocated"] == "".join(mamba_model["kinds"]) == m.layer_pattern
    classes = {"M": "MambaLayer", "*": "TransformerLayer", "-": "MLPLayer", "E": "MoETransformerLayer"}
    assert mamba_model["classes"] == [classes[c] for c in m.layer_pattern]


@pytest.mark.slow
def test_megatron_cores_mamba_model_has_the_planners_parameters(mamba_model):
    m = _tiny()
    c = count_params(m)
    assert m.vocab_size % 256 == 0        # no padding: the totals compare as they stand
    per_kind = {b.kind: b.per_layer for b in c.blocks}
    kind = {"M": "mamba", "*": "attention", "-": "dense", "E": "moe"}
    assert mamba_model["per_layer"] == [per_kind[kind[ch]] for ch in m.layer_pattern]
    assert mamba_model["total"] == c.total


@pytest.mark.slow
def test_one_ranks_parameters_are_megatron_cores(mamba_model):
    """Under tp 2 and ep 2, rank 0 of megatron-core's MambaModel holds the planner's dense and
    expert parameters (memory.params.rank_params): Mamba in_proj/out_proj, conv1d, dt_bias, A_log,
    D and the gated norm split over tp, layer norms and the router replicated, experts over ep."""
    m = _tiny()
    lay = plan_layout(m, RANK_LAYOUT).best.layout
    rp = rank_params(m, count_params(m), lay, 0, m.n_layers)
    assert (rp.dense, rp.expert) == (mamba_model["rank_dense"], mamba_model["rank_expert"])


def test_nemotron_3_presets_write_their_shapes():
    """The shapes NVIDIA's own Megatron-LM scripts give Nemotron 3 Nano (52 layers, pattern
    MEMEM*EMEMEM*..., 64 Mamba heads of 64, 128 experts of 1856, shared 3712) and the latent
    MoE width of Super."""
    # the layout `plan --model nemotron-3-nano --gpus h100 --stack megatron --recompute selective` picks
    nano = plan_layout(load_model("nemotron-3-nano"), dict(dp=1, tp=2, sp=True, ep=4, zero_stage=1, micro_batch=1,
                                                     grad_accum=8, recompute="selective"), seq_len=4096)
    a = parse_args(to_megatron_args(nano))
    assert a.hybrid_override_pattern == "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert (a.mamba_num_heads, a.mamba_head_dim, a.num_experts, a.moe_ffn_hidden_size,
            a.moe_shared_expert_intermediate_size, a.moe_latent_size) == (64, 64, 128, 1856, 3712, None)
    assert megatron_args_errors(to_megatron_args(nano), launch_env(nano)) == []
    # MambaModel has no build_schedule_plan, which the all-to-all overlap's schedule calls
    assert a.moe_token_dispatcher_type == "alltoall" and not a.overlap_moe_expert_parallel_comm
    sup = load_model("nemotron-3-super")
    r = plan_layout(sup, dict(dp=1, tp=8, sp=True, ep=4, zero_stage=1, micro_batch=1, grad_accum=8,
                        recompute="selective"), seq_len=4096)
    a = parse_args(to_megatron_args(r))
    assert a.moe_latent_size == sup.moe_latent > 0


@pytest.mark.parametrize("kw, setup_kw, why", [
    (dict(dp=2, tp=1, zero_stage=1, micro_batch=1, grad_accum=4, recompute="full"), {}, "full recomputation"),
    (dict(dp=1, tp=1, pp=2, vp=2, zero_stage=1, micro_batch=1, grad_accum=8), {}, "virtual pipeline stages"),
    (dict(dp=1, tp=1, pp=3, zero_stage=1, micro_batch=1, grad_accum=8), {}, "unevenly"),
    (dict(dp=1, tp=1, pp=2, zero_stage=1, micro_batch=1, grad_accum=8), {"pp_balance": "embedding-loss"},
     "embedding and loss"),
    (dict(dp=2, tp=1, zero_stage=1, micro_batch=1, grad_accum=4), {"mtp_layers": 1}, "MTP layers"),
])
def test_what_mamba_stack_cannot_run_is_refused(kw, setup_kw, why):
    # megatron-core 0.16.1 ssm/mamba_block.py: forward checkpoints no layer (no full
    # recomputation); _select_layers_for_pipeline_parallel asserts no virtual stages and takes
    # num_layers // pp layers per rank; MambaModel takes no MTP block
    # (a layout the rules table's --stack megatron refusals name is refused when it is planned
    # under --stack megatron; full recomputation and MTP layers, which later megatron-core builds
    # and the plan times, when the Megatron files are written)
    with pytest.raises(UserError, match=why):
        to_megatron_args(plan_layout(_tiny(), kw, **setup_kw))


def test_mamba_mixer_megatron_cannot_build_is_refused():
    # megatron-core 0.16.1 ssm/mamba_mixer.py: "assert not bias"; MambaLayer builds d_conv=4
    for extra, why in (({"use_bias": True}, "biased"), ({"conv_kernel": 3}, "conv kernel"),
                       ({"chunk_size": 64}, "SSD chunk")):
        m = spec_from_hf_config({**TINY, **extra}, "odd", "test")
        r = plan_layout(m, TINY_LAYOUTS[0])
        with pytest.raises(UserError, match=why):
            to_megatron_args(r)


def test_cli_refusal_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["--model", "nemotron-3-nano", "--gpus", "h100", "--n-gpus", "24",
                                   "--pp", "3", "--ep", "8", "--stack", "megatron", "--out", str(out)],
                             prog_name="plan")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "MambaModel" in lines[0] and "unevenly" in lines[0]
    assert not out.exists()


def test_stack_megatron_search_picks_what_mamba_stack_runs(tmp_path):
    # `plan --model nemotron-3-nano --gpus h100 --stack megatron --out DIR` once chose full
    # recomputation, which MambaStack.forward cannot run (megatron-core 0.16.1
    # ssm/mamba_block.py checkpoints no layer), and then refused its own --out: the search now
    # leaves out what the rules table's --stack megatron refusals name, and --recompute full
    # is refused before the search in one line
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["--model", "nemotron-3-nano", "--gpus", "h100", "--stack", "megatron",
                                   "--out", str(out)], prog_name="plan")
    assert res.exit_code == 0, res.output
    assert "pretrain_mamba.py" in (out / "launch.sh").read_text()
    assert "recompute full" not in res.output
    res = CliRunner().invoke(cli, ["--model", "nemotron-3-nano", "--gpus", "h100", "--stack", "megatron",
                                   "--recompute", "full"], prog_name="plan")
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "MambaStack checkpoints no layer" in res.output
    res = CliRunner().invoke(cli, ["--model", "nemotron-3-nano", "--gpus", "h100", "--stack", "megatron",
                                   "--pp", "2", "--vp", "2"], prog_name="plan")
    assert res.exit_code == 2 and "virtual pipeline stages" in res.output, res.output


def test_default_nano_plan_writes_pretrain_mamba_files(tmp_path):
    """The headline: `plan --model nemotron-3-nano --gpus h100 --out DIR` (megatron chosen for tp)
    writes Megatron-LM files that run pretrain_mamba.py with the hybrid's arguments."""
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["--model", "nemotron-3-nano", "--gpus", "h100", "--out", str(out)],
                             prog_name="plan")
    assert res.exit_code == 0, res.output
    args = [ln for ln in (out / "megatron_args.txt").read_text().splitlines() if not ln.startswith("#")]
    a = parse_args(args)
    assert a.is_hybrid_model and a.hybrid_override_pattern == load_model("nemotron-3-nano").layer_pattern
    for name in ("launch.sh", "slurm.sbatch", "pytorchjob.yaml"):
        text = (out / name).read_text()
        assert "pretrain_mamba.py" in text and "pretrain_gpt.py" not in text, name
