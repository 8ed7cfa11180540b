"""The 2025-2026 presets `plan models` lists (issue 30): each plans, each counts what
transformers counts, and each total and active count is near what its model card publishes.

Referees: transformers 5.x's causal LM built from the preset's config.json on the meta device
(the total, and the routed experts' share for the active count), and the totals the model
cards publish (cited per row below). The planner's own count is never the expected value.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from planner.models.generic.cache import shipped_profile
from planner.models.load import load_model, preset_config
from planner.models.spec import count_params

torch = require("torch")
transformers = require("transformers")

sys.path.insert(0, str(Path(__file__).parent))
from causal_families import transformers_count  # noqa: E402

# name: (total, active) parameters the model card publishes, in billions, and its source.
# Differences the tests allow, named: transformers builds no multi-token-prediction layer
# (GLM-4.5/4.6 1, MiniMax-M2 3, DeepSeek-V3.2 1: DeepSeek's 685B = 671B + 14B MTP), and the
# Qwen3.5 presets are text models (the cards count the vision encoder too).
PUBLISHED = {
    # GLM-4.5 model card / arXiv:2508.06471: 355B total, 32B active (MTP layer included)
    "glm-4.5": (355, 32),
    # GLM-4.5 model card: GLM-4.5-Air 106B total, 12B active
    "glm-4.5-air": (106, 12),
    # GLM-4.6 model card: the GLM-4.5 architecture, 355B-A32B, 200K context
    "glm-4.6": (355, 32),
    # MiniMax-M2 model card and transformers' model doc: 230B total, 10B active
    "minimax-m2": (230, 10),
    # MoonshotAI/Kimi-Linear README and arXiv:2510.26692: 48B total, 3B activated
    "kimi-linear-48b-a3b": (48, 3),
    # DeepSeek-V3 report (arXiv:2412.19437): 671B main model, 37B activated; V3.2 adds the indexer
    "deepseek-v3.2": (671, 37),
    # Olmo 3 model cards (allenai/Olmo-3-1025-7B, Olmo-3-1125-32B): 7B, 32B dense
    "olmo3-7b": (7, 7),
    "olmo3-32b": (32, 32),
    # SmolLM3 model card and blog: 3B dense
    "smollm3-3b": (3, 3),
    # Qwen3.5 model cards: 397B total, 17B active; 35B, 3B active; 27B dense (with the vision encoder)
    "qwen3.5-397b-a17b": (397, 17),
    "qwen3.5-35b-a3b": (35, 3),
    "qwen3.5-27b": (27, 27),
}
# How far transformers' total may sit from the card's rounded figure: 5% covers the MTP layers
# transformers leaves out and the rounding of a size name. The rows past 1%, named: Olmo 3
# 7B builds 7.30B (+4.3% on "7B", as OLMo 2 7B's 7.30B), Kimi Linear 49.12B (+2.3% on "48B").
TOTAL_TOLERANCE = 0.05
# Active counts are rounded harder on the cards ("A3B", "A10B"): within 10%. The MoE cards count
# a token's active parameters without the input embedding (a lookup, not a matmul): Kimi
# Linear's 3.11B that way, 3.48B with it; DeepSeek-V3's 37B is 37.5B without it. (`plan models`
# counts the embedding in "active", docs/models.md.)
ACTIVE_TOLERANCE = 0.10
# The model_types of PUBLISHED planned by a written translator (tp, cp, ep), not a shipped profile
WRITTEN_FAMILIES = ("qwen3_5_text", "qwen3_5_moe_text", "glm4_moe", "minimax_m2", "deepseek_v32", "kimi_linear")


def _experts_and_topk(cfg: dict) -> tuple[int, int]:
    """(routed experts, experts each token visits) as the config.json names them, 0 for dense."""
    n = next((cfg[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if k in cfg), 0)
    k = next((cfg[k] for k in ("num_experts_per_tok", "num_experts_per_token") if k in cfg), 0)
    return int(n), int(k)


def _transformers_active(cfg: dict) -> float:
    """The parameters one token runs through as the MoE model cards count them, from
    transformers' meta model: the total less the routed experts it does not visit (the tensors
    under an ``experts`` module that is not a shared expert; the router and shared experts
    always run) and less the input embedding; a dense model's total."""
    from transformers import AutoConfig, AutoModelForCausalLM

    rest = dict(cfg)
    rest.pop("architectures", None)
    config = AutoConfig.for_model(rest.pop("model_type"), **rest)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    routed = sum(p.numel() for name, p in model.named_parameters()
                 if ".experts." in name and "shared" not in name)
    n, k = _experts_and_topk(cfg)
    if not n:
        return float(total)
    embedding = model.get_input_embeddings().weight.numel()
    return total - routed * (1 - k / n) - embedding


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_counts_what_transformers_counts_and_the_card_publishes(name):
    cfg = preset_config(name)
    spec = load_model(name)
    if spec.model_type not in WRITTEN_FAMILIES:     # a written family ships no profile (docs/models.md)
        assert shipped_profile(cfg) is not None, f"{name}: run python bench/generic_profiles.py {name}"
    total = count_params(spec).total
    assert total == transformers_count({k: v for k, v in cfg.items() if k != "architectures"})
    card_total, card_active = PUBLISHED[name]
    assert total / 1e9 == pytest.approx(card_total, rel=TOTAL_TOLERANCE), total
    assert _transformers_active(cfg) / 1e9 == pytest.approx(card_active, rel=ACTIVE_TOLERANCE)


@pytest.mark.slow   # the fast tier: test_generic_families.py::test_a_cached_profile_plans_without_torch
def test_presets_plan_on_an_h100_without_torch():
    # each preset's plain plan answers (exit 0) from its shipped profile, torch never imported
    names = sorted(PUBLISHED)
    code = ("import sys\nfrom planner.cli.main import main\n"
            f"for name in {names!r}:\n"
            "    sys.argv = ['plan', '--model', name, '--gpus', 'h100']\n"
            "    try:\n        main()\n    except SystemExit as e:\n"
            "        assert e.code in (0, None), (name, e.code)\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # the Qwen3.5 presets (planner.models.deltanet), GLM-4.5/4.6, MiniMax-M2, DeepSeek-V3.2 and Kimi
    # Linear (planner.models.recent, .dsa, .kimi) are written families; the others generic
    generic = [n for n in names if load_model(n).is_generic]
    assert sorted(set(names) - set(generic)) == ["deepseek-v3.2", "glm-4.5", "glm-4.5-air", "glm-4.6",
                                                 "kimi-linear-48b-a3b", "minimax-m2", "qwen3.5-27b", "qwen3.5-35b-a3b",
                                                 "qwen3.5-397b-a17b"]
    assert out.stdout.count("generic path") >= len(generic)


def test_measuring_a_config_leaves_its_cache_key_unchanged():
    # transformers writes rope_theta and rope_type into a config's rope_scaling dict; before
    # hf_config deep-copied, DeepSeek-V3.2's profile was written under another key than the one
    # a plan looks up (bench/generic_profiles.py shipped it unreachable; a user's cache missed
    # on every plan of a config with rope_scaling and measured again)
    from planner.models.generic.cache import config_key
    from planner.models.generic.probe import hf_config

    cfg = preset_config("deepseek-v3.2")
    key = config_key(cfg)
    hf_config(cfg)
    assert config_key(cfg) == key and "rope_type" not in cfg["rope_scaling"]


def test_the_docs_table_quotes_these_totals():
    # docs/models.md "The 2025-2026 presets": each row's transformers total is what the planner counts
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    rows = dict(re.findall(r"^\| ([a-z0-9.\-]+) \| `\w+` \| [^|]+ \| ([\d,]+) \|", text, re.MULTILINE))
    assert set(rows) == set(PUBLISHED)
    for name, total in rows.items():
        assert count_params(load_model(name)).total == int(total.replace(",", "")), name


def test_plan_models_keeps_its_columns_with_long_names():
    # kimi-linear-48b-a3b (19 characters) and qwen3-next-80b-a3b (18) once pushed their rows'
    # numbers out of the 16-character name column
    from click.testing import CliRunner

    from planner.cli.main import cli

    r = CliRunner().invoke(cli, ["models"], prog_name="plan")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    end = lines[0].index("parameters") + len("parameters")
    rows = [line for line in lines[1:] if line.split()[:1] and line.split()[0] in PUBLISHED]
    assert len(rows) == len(PUBLISHED)
    for line in rows:
        assert line[:end].endswith(line.split()[1]), line


@pytest.mark.parametrize("name,n_gpus", [("olmo2-7b", "1"), pytest.param("glm-4.5", "64", marks=pytest.mark.slow)])
def test_a_plan_that_does_not_fit_advises_instead_of_asking_for_lora_targets(name, n_gpus):
    # the advice re-plans with --method lora / qlora; for a model_type PEFT has no default
    # targets for (olmo2, glm4_moe, every generic family) that re-plan raised UserError, which
    # escaped advice.refit (it caught ValueError only) and replaced the whole answer by
    # "PEFT has no default LoRA targets ..."
    from click.testing import CliRunner

    from planner.cli.main import cli

    r = CliRunner().invoke(cli, ["--model", name, "--gpus", "h100", "--n-gpus", n_gpus], prog_name="plan",
                           env={"NO_COLOR": "1", "COLUMNS": "120"})
    assert "No layout fits" in r.output and "LoRA targets" not in r.output, r.output
