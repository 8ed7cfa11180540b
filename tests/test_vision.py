"""Vision-language wrappers (planner.models.vision): the text tower by its written family,
the vision encoder and projector counted exactly.

Referee: transformers 5.x's whole model (AutoModelForImageTextToText.from_config on the meta
device), counted here with ``Module.parameters()``; the text tower's share is the written
family's own formula (planner.models.spec.count_params), so the test checks that the family
reads ``text_config`` as transformers does (key names, the wrapper's tie_word_embeddings).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from planner.errors import UserError
from planner.models.families import spec_from_hf_config
from planner.models.spec import count_params
from planner.models.vision.load import VLM_MODEL_TYPES

torch = require("torch")
transformers = require("transformers")


def _default(mt: str) -> dict:
    return json.loads(transformers.AutoConfig.for_model(mt).to_json_string())


def _transformers_total(cfg: dict) -> int:
    config = transformers.AutoConfig.for_model(cfg["model_type"])   # the same defaults as _default
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("mt", VLM_MODEL_TYPES)
def test_total_equals_transformers(mt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers 5.24's defaults, e.g. qwen3_vl 12,616,410,352 = text 12,049,461,248 + vision 566,949,104
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    cfg = _default(mt)
    spec = spec_from_hf_config(cfg, mt, mt)
    assert spec.vision is not None and spec.vision.encoder > 0
    assert count_params(spec).total == _transformers_total(cfg)
    assert list((tmp_path / "vision").glob("*.json"))        # cached for the next plan


def test_cached_plan_imports_no_torch(tmp_path: Path) -> None:
    """Once counted, a config is planned without torch or transformers."""
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(_default("gemma3")))
    env = {**os.environ, "PLANNER_CACHE_DIR": str(tmp_path / "cache")}
    code = ("import sys; from planner.models.load import load_model; from planner.models.spec import count_params; "
            f"m = load_model({str(cfg_path)!r}); print(count_params(m).total, 'torch' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split()[0] == second.stdout.split()[0] == "2723312896"   # transformers' gemma3 default
    assert second.stdout.split()[1] == "False"


def test_text_config_missing_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    with pytest.raises(UserError, match="text_config"):
        spec_from_hf_config({"model_type": "gemma3", "vision_config": {}}, "x", "x.json")


def test_cli_plans_a_vlm(tmp_path: Path) -> None:
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(_default("gemma3")))
    env = {**os.environ, "PLANNER_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "planner", "--model", str(cfg_path), "--gpus", "h100", "--json"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["n_params"] == 2723312896      # transformers' gemma3 default
