"""GLM-4.5 / 4.6 (model_type glm4_moe) and MiniMax-M2 (minimax_m2), written families
(planner.models.recent): tensor, expert and pipeline parallel plans and the step time, checked
against outside code.

Referees: transformers 5.x's Glm4MoeForCausalLM on the meta device (parameter counts; the MTP
module as one more Glm4MoeDecoderLayer), FSDPMemTracker running transformers' model under fake
tensors (`plan measure`, through planner.measure.accuracy.compare). The per-block saved tensors
are checked in tests/test_memory_moe_blocks.py, the FLOPs in tests/test_model_flops.py and the
LoRA counts against PEFT in tests/test_models_recent.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli
from planner.models.families import spec_from_hf_config
from planner.models.load import load_model
from planner.models.spec import count_params

CONFIGS = Path(__file__).resolve().parent.parent / "bench" / "configs"


def _transformers_total(cfg: dict) -> int:
    torch = require("torch")
    transformers = require("transformers")
    rest = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    config = transformers.AutoConfig.for_model(rest.pop("model_type"), **rest)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_glm_presets_are_written_not_generic():
    # GLM-4.5: 92 blocks = 3 dense (intermediate_size 12288) + 89 MoE (160 experts of 1536, top-8,
    # one shared expert of 1536), 96 query / 8 KV heads of 128 with q/k/v bias and QK norm
    # (planner/presets/models/glm-4.5.json; THUDM/slime scripts/models/glm4.5-355B-A32B.sh)
    m = load_model("glm-4.5")
    assert not m.is_generic
    assert (m.n_layers, m.n_dense_layers, m.n_moe_layers, m.dense_d_ff) == (92, 3, 89, 12288)
    assert (m.n_experts, m.n_experts_per_token, m.d_ff, m.shared_d_ff) == (160, 8, 1536, 1536)
    assert (m.n_heads, m.n_kv_heads, m.head_dim, m.qk_norm) == (96, 8, 128, "head")
    assert m.qkv_bias and not m.out_bias
    air = load_model("glm-4.5-air")
    assert (air.n_dense_layers, air.qk_norm) == (1, "")
    # MiniMax-M2: 62 MoE blocks of 256 experts of 1536, top-8, no shared expert, 48 / 8 heads of
    # 128 with QK RMSNorm over the whole q and k widths (planner/presets/models/minimax-m2.json)
    mm = load_model("minimax-m2")
    assert not mm.is_generic
    assert (mm.n_layers, mm.n_moe_layers, mm.n_experts, mm.n_experts_per_token, mm.d_ff) == (62, 62, 256, 8, 1536)
    assert (mm.n_heads, mm.n_kv_heads, mm.head_dim, mm.qk_norm, mm.shared_d_ff) == (48, 8, 128, "full", 0)


@pytest.mark.slow
def test_mtp_module_is_one_more_transformers_block_with_its_projection():
    """GLM-4.5's MTP layer (num_nextn_predict_layers 1; arXiv:2508.06471 Sec. 2.1), which
    transformers does not build, as DeepSeek-V3's (enorm, hnorm, eh_proj 2h x h, one MoE
    block, shared_head.norm; the embedding and head are the main model's): counted with
    mtp=True only. The block is transformers' own: the model with one more MoE layer, less it."""
    cfg = json.loads((CONFIGS / "tiny-glm4-moe.json").read_text())
    plain = count_params(spec_from_hf_config(dict(cfg), "g", "g"))
    with_mtp = count_params(spec_from_hf_config({**cfg, "num_nextn_predict_layers": 1}, "g", "g", mtp=True))
    h = cfg["hidden_size"]
    one_block = (_transformers_total({**cfg, "num_hidden_layers": cfg["num_hidden_layers"] + 1})
                 - _transformers_total(cfg))
    assert plain.total == _transformers_total(cfg)
    assert with_mtp.total - plain.total == one_block + 3 * h + 2 * h * h
    assert count_params(load_model("glm-4.5")).total == 352_797_814_784     # no MTP, as transformers


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-glm4-moe", "tiny-minimax-m2"])
def test_plan_measure_tiny_config_within_ten_percent(name):
    """`plan measure` on a tiny GLM-4.5 (bench/configs/tiny-glm4-moe.json: its QK norm, biases,
    one dense and two MoE blocks at hidden 256) and a tiny MiniMax-M2 (tiny-minimax-m2.json: the
    full-width QK norm, 2 MoE blocks), FSDP over 8 fake ranks, bf16 mixed precision, sequence
    512: the predicted total within 10% of FSDPMemTracker's (seen: GLM -3.1%, activations -3.0%;
    MiniMax -2.5%, activations -2.9%; tiny-deepseek-v3 is -3.4% in docs/accuracy.md)."""
    require("torch")
    require("transformers")
    from planner.layouts.layout import Layout
    from planner.measure.accuracy import compare
    from planner.training.setup import TrainingSetup

    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    m = spec_from_hf_config(dict(cfg), name, name)
    lay = Layout(dp=8, zero_stage=3, sharding="fsdp-full", micro_batch=2, seq_len=512, recompute="none")
    setup = TrainingSetup(seq_len=512, global_batch=16, precision="bf16-mixed")
    rows = {r.category: r for r in compare(m, cfg, setup, lay, in_process=True).rows}
    assert rows["total"].error == pytest.approx(0.0, abs=0.10)
    assert rows["activations"].error == pytest.approx(0.0, abs=0.10)


def _plan(model: str, *args: str):
    return CliRunner().invoke(cli, ["--model", model, "--gpus", "h100", *args], prog_name="plan",
                              env={"NO_COLOR": "1", "COLUMNS": "120"})


@pytest.mark.parametrize("model", ["glm-4.5", "minimax-m2"])
def test_plans_with_tensor_and_expert_parallelism(model):
    # the generic path refused tp and ep; written, both plan them (GLM-4.5's 96 heads and 8 KV
    # heads and MiniMax-M2's 48 and 8 split 8 ways, 160 or 256 experts over 8 ranks)
    r = _plan(model, "--tp", "8", "--ep", "8", "--stack", "megatron")
    assert r.exit_code == 0, r.output
    assert "tp=8" in r.output and "ep=8" in r.output and "generic path" not in r.output
