"""A vision-language wrapper's config.json: its text tower's config and its image side's
profile, the latter cached like the generic path's profiles (one JSON file per config under
the planner's cache directory, ``vision/<key>.json``; planner.models.generic.cache)."""

from __future__ import annotations

import json
from typing import Any

from planner.errors import UserError
from planner.models.generic.cache import cache_dir, config_key, transformers_version, write_json
from planner.models.vision.profile import VISION_VERSION, VisionProfile

# The wrappers whose text tower is a written family (transformers 5.x model_types).
VLM_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe", "llama4", "mistral3", "gemma3", "qwen3_5", "qwen3_5_moe")

# Text towers whose model_type names no written family although their parameters are one's:
# transformers' Qwen3VLTextModel is Qwen3's decoder with interleaved multimodal rotary
# positions (no parameter of its own), Qwen3VLMoeTextModel Qwen3-MoE's likewise
# (modeling_qwen3_vl.py, modeling_qwen3_vl_moe.py), whose config names the routed experts
# ``num_local_experts`` where Qwen3MoeConfig says ``num_experts`` (configuration_qwen3_vl_moe.py).
# Each: (the written family, {the tower's key: the family's key}); tests/test_vision.py checks the counts.
TEXT_FAMILY: dict[str, tuple[str, dict[str, str]]] = {
    "qwen3_vl_text": ("qwen3", {}),
    "qwen3_vl_moe_text": ("qwen3_moe", {"num_local_experts": "num_experts"}),
}


def text_config(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The text tower's config.json dict: ``text_config``, its model_type mapped to the written
    family (TEXT_FAMILY), and the wrapper's ``tie_word_embeddings`` where it gives one
    (transformers 5 ties the head by the top-level config: Mistral3's default ties although
    its text_config says false)."""
    text = cfg.get("text_config")
    if not isinstance(text, dict) or not isinstance(text.get("model_type"), str):
        raise UserError(f"{where}: a {cfg.get('model_type')} config needs a text_config with its model_type "
                        f"(the text tower's config); pass the model's own config.json")
    family, renames = TEXT_FAMILY.get(text["model_type"], (text["model_type"], {}))
    text = {renames.get(str(k), str(k)): v for k, v in text.items()} | {"model_type": family}
    if isinstance(cfg.get("tie_word_embeddings"), bool):
        text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return text


def _path(cfg: dict[str, Any]) -> Any:
    return cache_dir() / "vision" / f"{config_key({'vision': cfg, 'version': VISION_VERSION})}.json"


def vision_profile(cfg: dict[str, Any], where: str, text_params: int) -> VisionProfile:
    """The cached VisionProfile of ``cfg``, else counted now (torch and transformers imported)
    and cached. ``text_params``: the written family's count of the text tower, checked against
    transformers' on the first count (a mismatch is an internal error: the family's translator
    and transformers' model disagree)."""
    path = _path(cfg)
    try:
        profile = VisionProfile.from_json(json.loads(path.read_text()))
        if profile.version == VISION_VERSION:
            return profile
    except (OSError, ValueError, TypeError, KeyError):
        pass
    if not transformers_version():
        raise UserError(f"{where}: counting the {cfg.get('model_type')} vision encoder needs transformers "
                        f"(pip install '.[measure]'), once per config")
    from planner.models.vision.probe import profile_vlm

    profile, hf_text = profile_vlm(cfg, where)
    if hf_text != text_params:
        raise RuntimeError(f"{where}: the text tower counts {text_params:,} parameters by its family but "
                           f"{hf_text:,} in transformers' {cfg.get('model_type')} model")
    write_json(path, profile.to_json())
    return profile
