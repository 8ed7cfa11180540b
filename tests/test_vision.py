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
from conftest import fast_one, plan_in_process, require

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


@pytest.mark.parametrize("mt", fast_one(VLM_MODEL_TYPES, "gemma3"))   # fast tier: one wrapper
def test_total_equals_transformers(mt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # transformers 5.24's defaults, e.g. qwen3_vl 12,616,410,352 = text 12,049,461,248 + vision 566,949,104
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    cfg = _default(mt)
    spec = spec_from_hf_config(cfg, mt, mt)
    assert spec.vision is not None and spec.vision.encoder > 0
    assert count_params(spec).total == _transformers_total(cfg)
    assert list((tmp_path / "vision").glob("*.json"))        # cached for the next plan


@pytest.mark.slow   # the fast tier checks a cached profile in a fresh process in test_generic_families
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
    out = plan_in_process("--model", str(cfg_path), "--gpus", "h100", "--json",
                          env={"PLANNER_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["n_params"] == 2723312896      # transformers' gemma3 default


# Tiny wrappers whose images transformers' models run (the default gemma3 and llama4 configs do
# not: 224 px gives SigLIP 14 x 14 patches, pooled to 16 x 16 tokens with a kernel of 0)
TINY_QWEN3_VL = {
    "model_type": "qwen3_vl", "tie_word_embeddings": False,
    "image_token_id": 500, "video_token_id": 501, "vision_start_token_id": 502, "vision_end_token_id": 503,
    "text_config": {"model_type": "qwen3_vl_text", "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                    "vocab_size": 512,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    "vision_config": {"model_type": "qwen3_vl", "depth": 2, "hidden_size": 64, "num_heads": 4,
                      "intermediate_size": 128, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                      "out_hidden_size": 64, "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
}
TINY_GEMMA3 = {
    "model_type": "gemma3", "mm_tokens_per_image": 4, "tie_word_embeddings": True,
    "image_token_index": 500, "boi_token_index": 501, "eoi_token_index": 502,
    "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
                    "sliding_window": 32},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "intermediate_size": 128, "image_size": 64, "patch_size": 16,
                      "vision_use_head": False},
}


@pytest.mark.parametrize("cfg", fast_one([TINY_QWEN3_VL, TINY_GEMMA3], TINY_GEMMA3), ids=["qwen3_vl", "gemma3"])
def test_image_profile_matches_real_tensors(cfg: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake-tensor profile (real index tensors, fake weights) equals one image through the
    same model with real tensors: image tokens, saved bytes and FLOPs. Tokens per image also
    by the processors' own arithmetic: Qwen3-VL (128 px / 16)^2 patches merged 2 x 2 = 16;
    Gemma 3 mm_tokens_per_image = 4."""
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    from torch.utils.flop_counter import FlopCounterMode

    from planner.models.generic.probe import hf_config

    spec = spec_from_hf_config(cfg, "tiny", "tiny.json")
    v = spec.vision
    assert v is not None and not v.image_error
    assert v.tokens_per_image == {"qwen3_vl": 16, "gemma3": 4}[cfg["model_type"]]
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        torch.manual_seed(0)
        model = transformers.AutoModelForImageTextToText.from_config(hf_config(cfg), attn_implementation="sdpa")
        model.train()
        inner = model.model
        if cfg["model_type"] == "qwen3_vl":
            pixels, kw = torch.randn(64, 3 * 2 * 16 * 16), {"image_grid_thw": torch.tensor([[1, 8, 8]])}
        else:
            pixels, kw = torch.randn(1, 3, 64, 64), {}
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            if st._cdata not in params:
                seen.setdefault(st._cdata, st.nbytes())
            return t

        with FlopCounterMode(display=False) as fwd, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = inner.get_image_features(pixels, **kw)
    finally:
        torch.set_default_dtype(old)
    feats = out.pooler_output
    feats = list(feats) if isinstance(feats, (list, tuple)) else [feats]
    assert sum(f.numel() // f.shape[-1] for f in feats) == v.tokens_per_image
    assert sum(seen.values()) == v.saved_bytes_per_image
    # FLOPs: the profile's are eager attention's (its matmuls counted); SDPA's CPU kernel has
    # no FlopCounterMode formula on every build, so the real SDPA run is at most the profile
    assert 0 < fwd.get_total_flops() <= v.fwd_flops_per_image


def _plan(cfg: dict, tmp_path: Path, *args: str) -> dict:
    path = tmp_path / f"{cfg['model_type']}.json"
    path.write_text(json.dumps(cfg))
    out = plan_in_process("--model", str(path), "--gpus", "h100", "--n-gpus", "1", "--seq-len", "256",
                          "--global-batch", "8", "--micro-batch", "2", "--json", *args,
                          env={"PLANNER_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_images_join_memory_and_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frozen (the default): the image side's weights are held, no gradients; images add
    forward time only. Trained: its gradients, and per sequence images x the measured saved
    bytes on the first stage, and forward + backward time."""
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path / "cache"))
    v = spec_from_hf_config(TINY_QWEN3_VL, "tiny", "tiny.json").vision
    assert v is not None
    text_only = _plan(TINY_QWEN3_VL, tmp_path)
    frozen = _plan(TINY_QWEN3_VL, tmp_path, "--images-per-sample", "3")
    trained = _plan(TINY_QWEN3_VL, tmp_path, "--images-per-sample", "3", "--train-vision")

    def mem(d: dict, key: str) -> int:
        return d["plan"]["memory_bytes"][key]

    assert text_only["model"]["n_trainable_params"] == text_only["model"]["n_params"] - v.params
    assert trained["model"]["n_trainable_params"] == trained["model"]["n_params"]
    assert mem(frozen, "weights") == mem(text_only, "weights")
    assert mem(frozen, "activations") == mem(text_only, "activations")
    assert mem(trained, "activations") - mem(frozen, "activations") == 2 * 3 * v.saved_bytes_per_image
    assert mem(trained, "gradients") > mem(frozen, "gradients")
    t0, t1, t2 = (d["plan"]["time"]["compute_s"] for d in (text_only, frozen, trained))
    # the added compute stands as the measured FLOPs do: (forward + backward) / forward (the
    # trained image side's optimizer update is timed apart, in optimizer_s)
    assert (t2 - t0) / (t1 - t0) == pytest.approx((v.fwd_flops_per_image + v.bwd_flops_per_image)
                                                   / v.fwd_flops_per_image, rel=1e-6)


def test_images_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps(TINY_QWEN3_VL))
    env = {"PLANNER_CACHE_DIR": str(tmp_path / "cache")}
    for args, says in ((["--images-per-sample", "16", "--seq-len", "256"], "fill the sequence"),
                       (["--method", "lora", "--train-vision"], "--method full")):
        out = plan_in_process("--model", str(path), "--gpus", "h100", *args, env=env)
        assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = plan_in_process("--model", "llama3.1-8b", "--gpus", "h100", "--images-per-sample", "1", env=env)
    assert out.returncode == 2 and "text model" in out.stderr


@pytest.mark.slow
def test_measure_runs_a_tiny_vlm_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan measure's comparison on the tiny Qwen3-VL with images: transformers' whole model,
    a dummy image batch, real CPU tensors. Weights and optimizer states equal the tracker's,
    image side frozen (16-bit weights, no states) and trained."""
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    from dataclasses import replace

    from planner.layouts.layout import Layout
    from planner.measure import accuracy
    from planner.training.setup import TrainingSetup

    m = spec_from_hf_config(TINY_QWEN3_VL, "tiny-qwen3-vl", "tiny.json")
    lay = Layout(dp=1, zero_stage=0, sharding="zero", micro_batch=2, grad_accum=1, seq_len=256)
    for trained in (False, True):
        setup = TrainingSetup(seq_len=256, global_batch=2, images_per_sample=2)
        setup = replace(setup, finetune=replace(setup.finetune, freeze_vision=not trained))
        cmp = accuracy.compare(m, TINY_QWEN3_VL, setup, lay, fake=False, in_process=True)
        rows = {r.category: r for r in cmp.rows}
        assert rows["weights"].predicted_bytes == rows["weights"].measured_bytes
        assert abs(rows["optimizer"].predicted_bytes - rows["optimizer"].measured_bytes) < 1024   # AdamW's step scalars


@pytest.mark.slow
def test_measured_rows_within_ten_percent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/accuracy.md's vision-language rows (bench/vision_accuracy.py), re-measured: the
    small Qwen3-VL with two trained images per sequence, total within 10% of the tracker."""
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path))
    import importlib.util

    spec = importlib.util.spec_from_file_location("vision_accuracy", Path(__file__).parent.parent / "bench" /
                                                  "vision_accuracy.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    case = ("bench/configs/small-qwen3-vl.json", 1024, 2, 2, True)
    measured = mod.run_one(case)["measured"]
    predicted = mod.predicted(case)
    assert abs(predicted["total"] - measured["total"]) / measured["total"] < 0.10
