"""Referee test: the planner's parameter count must equal transformers' own count.

For every preset in planner/presets/models.toml and every fixture in
tests/data/hf_configs/, the same config.json is instantiated with transformers on
the meta device (no memory, no weights) and its parameters are summed.  That sum
is the ground truth for ``planner.models.spec.count_params(...).total``.

Causal LMs are built with AutoModelForCausalLM (the LM head is counted once when it
is tied to the input embedding, as ``Module.parameters()`` removes duplicates).
BERT is built with AutoModelForMaskedLM (BertForMaskedLM: the pretraining MLM model,
no pooler, tied decoder, plus the MLM head's transform and output bias).

Totals from transformers 5.24.0 on the meta device, for reference:

    preset / fixture       total                 active (MoE)
    llama2-7b               6,738,415,616
    llama2-13b             13,015,864,320
    llama2-70b             68,976,648,192
    llama-65b              65,285,660,672
    llama3.1-8b             8,030,261,248
    llama3.1-70b           70,553,706,496
    llama3.1-405b         405,853,388,800
    mistral-7b              7,241,732,096
    mixtral-8x7b           46,702,792,704        12,879,925,248
    mixtral-8x22b         140,620,634,112        39,152,031,744
    qwen2.5-0.5b              494,032,768
    qwen2.5-1.5b            1,543,714,304
    qwen2.5-3b              3,085,938,688
    qwen2.5-7b              7,615,616,512
    qwen2.5-72b            72,706,203,648
    gemma2-9b               9,241,705,984
    gemma2-27b             27,227,128,320
    gpt2                      124,439,808
    gpt2-medium               354,823,168
    gpt2-large                774,030,080
    gpt2-xl                 1,557,611,200
    gpt3-175b             174,604,259,328
    bloom-176b            176,247,271,424
    falcon-40b             41,303,293,952
    solar-10.7b            10,731,524,096
    bert-base                 109,514,298
    bert-large                335,174,458
    bert-small                 28,795,194
    qwen3-0.6b                596,049,920
    qwen3-8b                8,190,735,360
    qwen3-32b              32,762,123,264
    qwen3-30b-a3b          30,532,122,624         3,353,032,704
    qwen3-235b-a22b       235,093,634,560        22,190,763,520
    deepseek-v3           671,026,404,352        37,552,282,624
    kimi-k2             1,026,408,209,408        32,861,477,888
    llama4-scout          107,769,861,120        17,172,894,720
    llama4-maverick       400,711,848,960        17,184,691,200
    gemma3-1b                 999,885,952
    gemma3-27b             27,009,346,304
    gpt-oss-20b            20,914,757,184         4,187,440,704
    gpt-oss-120b          116,829,156,672         5,711,982,912
    olmo2-7b                7,298,617,344
    phi-4                  14,659,507,200
    fixture gemma-2b        2,506,172,416
    fixture gemma-7b        8,537,680,896
    fixture llama-tiny-bias     2,597,280
    fixture pythia-160m       162,322,944
    fixture qwen2-0.5b        494,032,768

One expert (summed over all MoE layers): mixtral-8x7b 5,637,144,576;
mixtral-8x22b 16,911,433,728.  active = total - (num_local_experts -
num_experts_per_tok) * one_expert.
"""

from __future__ import annotations

import functools
import json
import tomllib
from pathlib import Path

import pytest
from conftest import require

torch = require("torch")
transformers = require("transformers")

from planner.models.spec import count_params, load_model  # noqa: E402 (after the require() guards)

ROOT = Path(__file__).resolve().parents[1]
PRESETS_DIR = ROOT / "planner" / "presets"
CATALOG = PRESETS_DIR / "models.toml"
FIXTURES_DIR = Path(__file__).resolve().parent / "data" / "hf_configs"

with CATALOG.open("rb") as _f:
    PRESETS = tomllib.load(_f)["model"]

PRESET_NAMES = [p["name"] for p in PRESETS]
PRESET_PATHS = {p["name"]: PRESETS_DIR / p["config"] for p in PRESETS}
FIXTURES = sorted(FIXTURES_DIR.glob("*.json"))
ALIASES = [(alias, p["name"]) for p in PRESETS for alias in p.get("aliases", [])]
MOE_PRESETS = ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "kimi-k2",
               "llama4-scout", "llama4-maverick", "gpt-oss-20b", "gpt-oss-120b"]


def _read_config(path: Path) -> dict:
    return json.loads(path.read_text())


@functools.cache
def _hf_model(path: Path):
    """Build the transformers model for ``path`` on the meta device."""
    cfg = _read_config(path)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    if model_type == "bert":
        auto = transformers.AutoModelForMaskedLM
    else:
        auto = transformers.AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


@functools.cache
def _hf_total(path: Path) -> int:
    # parameters() de-duplicates shared (tied) tensors, so a tied head counts once.
    return sum(p.numel() for p in _hf_model(path).parameters())


def _hf_one_expert(path: Path, num_experts: int) -> int:
    """Parameters of one expert, summed over every MoE layer.

    transformers 5 stores a layer's experts fused into 3-D tensors of shape
    (num_experts, ...); older versions keep an nn.ModuleList of experts.
    """
    one = 0
    found = False
    for name, module in _hf_model(path).named_modules():
        if name.rsplit(".", 1)[-1] != "experts":     # routed experts, not DeepSeek's shared_experts
            continue
        found = True
        if isinstance(module, torch.nn.ModuleList):
            assert len(module) == num_experts
            one += sum(p.numel() for p in module[0].parameters())
        else:
            for p in module.parameters(recurse=False):
                assert p.shape[0] == num_experts, (name, tuple(p.shape))
                one += p.numel() // num_experts
    assert found, "no expert modules found"
    return one


def test_catalog_is_complete():
    assert len(PRESET_NAMES) == len(set(PRESET_NAMES))
    for name, path in PRESET_PATHS.items():
        assert path.is_file(), f"{name}: missing {path}"
        assert path.stem == name
    assert FIXTURES, "no fixtures in tests/data/hf_configs"


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_total_matches_transformers(name):
    expected = _hf_total(PRESET_PATHS[name])
    assert count_params(load_model(name)).total == expected


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_total_matches_transformers(path):
    expected = _hf_total(path)
    assert count_params(load_model(str(path))).total == expected


@pytest.mark.slow
@pytest.mark.parametrize("alias,name", ALIASES, ids=[a for a, _ in ALIASES])
def test_alias_resolves_to_preset(alias, name):
    assert count_params(load_model(alias)).total == _hf_total(PRESET_PATHS[name])


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_active_matches_transformers(name):
    path = PRESET_PATHS[name]
    counts = count_params(load_model(name))
    # experts per block and top-k: num_local_experts (Mixtral, Llama 4, gpt-oss), num_experts
    # (Qwen3-MoE) or n_routed_experts (DeepSeek-V3); the config's own numbers, not the planner's
    cfg = _read_config(path)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg["n_routed_experts"]
    top_k = cfg["num_experts_per_tok"]
    expected = _hf_total(path) - (experts - top_k) * _hf_one_expert(path, experts)
    assert counts.total == _hf_total(path)
    assert counts.active == expected
