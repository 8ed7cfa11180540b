"""Count a vision-language model's image-side parameters on transformers' own model (torch
and transformers imported here only, the first time a config is seen; load.py caches the answer).

The whole model (``AutoModelForImageTextToText.from_config``) is built on the meta device
(no memory, no weights, as generic.probe.build_meta does for causal LMs) and each parameter
tensor counted once (a tied head once, as ``Module.parameters()`` does), placed by its path:
the text model (``language_model``) and the LM head (``lm_head``) are the text tower, which
the planner counts by its written family; the vision tower (``visual``, ``vision_tower``,
``vision_model``) is the encoder; the rest (``multi_modal_projector``) the projector.
"""

from __future__ import annotations

from typing import Any

from planner.errors import UserError
from planner.models.generic.cache import transformers_version
from planner.models.generic.probe import hf_config
from planner.models.vision.profile import VisionProfile

TEXT_PARTS = frozenset({"language_model", "lm_head"})
ENCODER_PARTS = frozenset({"visual", "vision_tower", "vision_model"})


def split_params(named: list[tuple[str, int]]) -> tuple[int, int, int]:
    """(text, encoder, projector) parameters from (path, numel) pairs, each tensor once."""
    text = encoder = projector = 0
    for path, n in named:
        parts = set(path.split("."))
        if parts & TEXT_PARTS:
            text += n
        elif parts & ENCODER_PARTS:
            encoder += n
        else:
            projector += n
    return text, encoder, projector


def build_meta_vlm(cfg: dict[str, Any], where: str) -> Any:
    """transformers' whole vision-language model of ``cfg`` on the meta device."""
    import torch
    from transformers import AutoModelForImageTextToText

    try:
        config = hf_config(cfg)
        with torch.device("meta"):
            return AutoModelForImageTextToText.from_config(config)
    except Exception as e:  # noqa: BLE001 -- transformers' own refusal, said in one line
        raise UserError(f"{where}: transformers {transformers_version()} cannot build this "
                        f"{cfg.get('model_type')} model ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                        f"check the config's vision_config and text_config") from None


def profile_vlm(cfg: dict[str, Any], where: str) -> tuple[VisionProfile, int]:
    """The VisionProfile of ``cfg`` and transformers' count of its text tower (text model and
    LM head; the caller checks it against the written family's count)."""
    model = build_meta_vlm(cfg, where)
    named = [(n, p.numel()) for n, p in model.named_parameters()]   # each tensor once (tied: once)
    text, encoder, projector = split_params(named)
    if encoder == 0:
        raise UserError(f"{where}: transformers' {cfg.get('model_type')} model has no vision tower "
                        f"({', '.join(sorted(ENCODER_PARTS))}) to count")
    return VisionProfile(model_type=str(cfg["model_type"]), transformers_version=transformers_version(),
                         encoder=encoder, projector=projector), text
