"""How Megatron-LM's core_transformer_config_from_args (megatron/training/arguments.py at the
commit tests/megatron_args.py cites) maps the parsed arguments the emit tests write onto
megatron-core 0.16.1's TransformerConfig fields, as source for the subprocesses that build a
GPTModel on the CPU (tests/test_emit_megatron_glm.py, tests/test_emit_megatron_mla.py):
--norm-epsilon to layernorm_epsilon, --swiglu to gated_linear_unit with SiLU, --num-experts to
num_moe_experts, the --moe-layer-freq string evaluated into its list; every other field by its
own name. Query groups and the attention kind stay with each test."""

# the parsed arguments GPT_CONFIG_KW reads
GPT_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "kv_channels", "normalization",
              "norm_epsilon", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "swiglu", "num_experts",
              "moe_router_topk", "moe_ffn_hidden_size", "moe_layer_freq", "moe_shared_expert_intermediate_size",
              "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor")

GPT_CONFIG_KW = r'''
def gpt_config_kw(a):
    import torch
    import torch.nn.functional as F
    return dict(
        num_layers=a["num_layers"], hidden_size=a["hidden_size"], num_attention_heads=a["num_attention_heads"],
        ffn_hidden_size=a["ffn_hidden_size"], kv_channels=a["kv_channels"], normalization=a["normalization"],
        layernorm_epsilon=a["norm_epsilon"], add_bias_linear=a["add_bias_linear"], add_qkv_bias=a["add_qkv_bias"],
        qk_layernorm=a["qk_layernorm"], gated_linear_unit=a["swiglu"], activation_func=F.silu,
        num_moe_experts=a["num_experts"], moe_router_topk=a["moe_router_topk"],
        moe_ffn_hidden_size=a["moe_ffn_hidden_size"], moe_layer_freq=eval(a["moe_layer_freq"]),
        moe_shared_expert_intermediate_size=a["moe_shared_expert_intermediate_size"],
        moe_router_score_function=a["moe_router_score_function"],
        moe_router_enable_expert_bias=a["moe_router_enable_expert_bias"],
        moe_router_topk_scaling_factor=a["moe_router_topk_scaling_factor"],
        use_cpu_initialization=True, perform_initialization=False, params_dtype=torch.float32)
'''


def plan_layout(m, kw: dict, seq_len: int = 1024, **setup_kw):
    """``m`` planned on H100s with the Megatron stack in exactly the layout ``kw`` (and the
    TrainingSetup fields ``setup_kw``)."""
    from planner import api
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import Layout
    from planner.training.setup import TrainingSetup

    lay = Layout(seq_len=seq_len, **kw)
    setup = TrainingSetup(seq_len=seq_len, global_batch=lay.global_batch, stack="megatron", **setup_kw)
    r = api.evaluate_layout(m, get_gpu("h100"), setup, lay)
    assert r.best is not None, f"test layout must be planned: {m.name} {lay.describe()}"
    return r


def run_model_script(script: str, a, names) -> dict:
    """Run ``script`` in a subprocess on the parsed arguments ``a`` (their ``names``, and the
    vocabulary as Megatron pads it); its last line of JSON, with ``pad``, the padded rows."""
    import json
    import subprocess
    import sys

    from megatron_args import padded_vocab_size

    fields = {k: getattr(a, k) for k in names}
    fields["padded_vocab"] = padded_vocab_size(a.vocab_size, a.tensor_model_parallel_size,
                                               a.make_vocab_size_divisible_by)
    done = subprocess.run([sys.executable, "-c", script, json.dumps(fields)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    got["pad"] = fields["padded_vocab"] - a.vocab_size
    return dict(got)
