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

import logging
import weakref
from typing import Any

from planner.errors import UserError
from planner.models.generic.cache import transformers_version
from planner.models.generic.probe import held_bytes, hf_config
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
                         encoder=encoder, projector=projector, **measure_image(cfg)), text


# The wrappers whose processors send an image as flattened patches with its (t, h, w) patch grid
# (Qwen2-VL's layout: rows of channels x temporal_patch_size x patch_size^2 values)
GRID_WRAPPERS = frozenset({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"})


def image_size_px(vision_config: Any) -> int:
    """The side of the square image the profile measures: the vision config's ``image_size``,
    else the side of its learned position grid (Qwen3-VL: sqrt(num_position_embeddings)
    patches of patch_size pixels, the size its position embeddings are interpolated from)."""
    size = getattr(vision_config, "image_size", None)
    if isinstance(size, int) and size > 0:
        return size
    grid = int(round(getattr(vision_config, "num_position_embeddings", 0) ** 0.5))
    return grid * int(vision_config.patch_size)


def _image_inputs(model_type: str, vision_config: Any, torch: Any) -> tuple[Any, dict[str, Any]]:
    """(pixel values, the other keyword arguments of get_image_features) for one image.
    The pixel values are made under the fake mode by the caller; the index tensors here are
    real, so the model's data-dependent arithmetic on them (patch counts, split sizes) runs."""
    side = image_size_px(vision_config)
    if model_type in GRID_WRAPPERS:
        p = int(vision_config.patch_size)
        g = side // p
        row = int(vision_config.in_channels) * int(vision_config.temporal_patch_size) * p * p
        return (g * g, row), {"image_grid_thw": torch.tensor([[1, g, g]])}
    shape = (1, int(getattr(vision_config, "num_channels", 3)), side, side)
    if model_type == "mistral3":
        return shape, {"image_sizes": torch.tensor([[side, side]])}
    return shape, {}


def measure_image(cfg: dict[str, Any]) -> dict[str, Any]:
    """One image through the image side of ``cfg`` (see VisionProfile): the model built under
    FakeTensorMode with transformers' weight initialisation skipped (it calls ``.item()``),
    called outside the mode so the real index tensors stay real. The fields of VisionProfile
    it fills, or ``image_error`` when transformers' model refuses."""
    import torch

    config = hf_config(cfg)
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    log = logging.getLogger("torch._subclasses.fake_tensor")    # it logs a refused op's traceback
    old_level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        shape, kwargs = _image_inputs(cfg["model_type"], config.vision_config, torch)    # real
        # saved tensors under PyTorch's SDPA (transformers' default attention: no s x s scores
        # kept); FLOPs under eager attention, whose matmuls FlopCounterMode counts
        saved, n_tokens, _, _ = _one_image(config, "sdpa", shape, kwargs, torch)
        _, _, fwd_flops, bwd_flops = _one_image(config, "eager", shape, kwargs, torch)
    except Exception as e:  # noqa: BLE001 -- transformers' model refuses this config's images: said, not raised
        return {"image_error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else type(e).__name__}
    finally:
        torch.set_default_dtype(old_dtype)
        log.setLevel(old_level)
    return {"image_size_px": image_size_px(config.vision_config), "tokens_per_image": n_tokens,
            "saved_bytes_per_image": saved, "fwd_flops_per_image": fwd_flops, "bwd_flops_per_image": bwd_flops}


def _one_image(config: Any, attention: str, shape: tuple[int, ...], kwargs: dict[str, Any],
               torch: Any) -> tuple[float, int, float, float]:
    """(saved bytes, image tokens, forward FLOPs, backward FLOPs) of one image, every parameter
    of the model trainable."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForImageTextToText
    from transformers.initialization import no_init_weights

    with FakeTensorMode(allow_non_fake_inputs=True), no_init_weights():
        model = AutoModelForImageTextToText.from_config(config, attn_implementation=attention)
        model.train()
        pixels = torch.randn(shape)
    inner = getattr(model, "model", model)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    packed: list[tuple[Any, int]] = []

    def pack(t: Any) -> Any:
        packed.append((weakref.ref(t), 0))
        return t

    fwd, both = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with both:
        with fwd, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = inner.get_image_features(pixels, **kwargs)
        feats = getattr(out, "pooler_output", None)
        feats = getattr(out, "last_hidden_state", out) if feats is None else feats
        feats = list(feats) if isinstance(feats, (list, tuple)) else [feats]
        saved = held_bytes(packed, params, 1)[0]      # what autograd holds when the forward ends
        sum(t.float().mean() for t in feats).backward()
    n_tokens = sum(t.numel() // t.shape[-1] for t in feats)
    fwd_flops = float(fwd.get_total_flops())
    return saved, n_tokens, fwd_flops, float(both.get_total_flops()) - fwd_flops
