"""A vision-language model's measured step (planner.measure.trackers): the whole transformers
model (AutoModelForImageTextToText), its image side frozen or not, and a dummy batch with
``images_per_sample`` images in each sequence, their placeholder tokens where the model's
processor puts them. Real tensors only: the model's forward counts and scatters the image
tokens (``special_image_mask.sum()``, boolean indexing), which fake tensors cannot run.
torch is imported inside the functions."""

from __future__ import annotations

from typing import Any

from planner.errors import UserError
from planner.models.vision.load import VLM_MODEL_TYPES
from planner.models.vision.probe import GRID_WRAPPERS, TEXT_PARTS, image_size_px

# The wrappers whose dummy batch is written here (the processors' layouts: Qwen3-VL's
# <|vision_start|> + image pads + <|vision_end|>, Gemma 3's image tokens with token_type_ids 1)
MEASURED_WRAPPERS = (*sorted(GRID_WRAPPERS), "gemma3")


def is_vlm(hf_config: dict[str, Any]) -> bool:
    return hf_config.get("model_type") in VLM_MODEL_TYPES


def check_measurable(hf_config: dict[str, Any], fake: bool) -> None:
    """UserError unless this wrapper's step can be measured: a dummy batch written here, real tensors."""
    mt = hf_config.get("model_type")
    if mt not in MEASURED_WRAPPERS:
        raise UserError(f"measure: a {mt} step cannot be measured here (its image batch is not written); "
                        f"measurable vision-language models: {', '.join(MEASURED_WRAPPERS)}")
    if fake:
        raise UserError("measure: a vision-language step runs real tensors (its forward counts the image tokens); "
                        "measure a tiny config, with fake false")


def freeze_image_side(model: Any, dtype: Any = None) -> None:
    """requires_grad False on every parameter outside the text model and its LM head (the
    vision encoder and projector: planner.models.vision.probe's split), as LLaMA-Factory's
    freeze_vision_tower and freeze_multi_modal_projector do; stored in ``dtype`` where given
    (LLaMA-Factory loads the model in the compute dtype and upcasts only the trainable
    parameters to fp32: model/model_utils, upcast_trainable_params)."""
    for name, p in model.named_parameters():
        if not set(name.split(".")) & TEXT_PARTS:
            p.requires_grad_(False)
            if dtype is not None:
                p.data = p.data.to(dtype)


def image_batch(model: Any, micro_batch: int, seq_len: int, images_per_sample: int, device: Any) -> dict[str, Any]:
    """model(**batch) keyword arguments: input_ids (random text, then each image's tokens from
    position 1), labels = input_ids, and the images' pixel values at the config's size."""
    import torch

    config = model.config
    mt = config.model_type
    vc = config.vision_config
    side = image_size_px(vc)
    text_vocab = config.get_text_config().vocab_size
    image_id = config.image_token_id if hasattr(config, "image_token_id") else config.image_token_index
    n = micro_batch * images_per_sample
    special = [getattr(config, k) for k in ("image_token_id", "image_token_index", "video_token_id",
                                            "vision_start_token_id", "vision_end_token_id", "boi_token_index",
                                            "eoi_token_index") if isinstance(getattr(config, k, None), int)]
    ids = torch.randint(0, min(text_vocab, 1000, *special), (micro_batch, seq_len), device=device)   # text only
    if not n:
        return {"input_ids": ids, "labels": ids}
    batch: dict[str, Any] = {}
    if mt in GRID_WRAPPERS:
        p, merge = int(vc.patch_size), int(vc.spatial_merge_size)
        g = side // p
        per_image = (g // merge) ** 2
        pos = 1
        for _ in range(images_per_sample):
            ids[:, pos] = config.vision_start_token_id
            ids[:, pos + 1:pos + 1 + per_image] = image_id
            ids[:, pos + 1 + per_image] = config.vision_end_token_id
            pos += per_image + 2
        row = int(vc.in_channels) * int(vc.temporal_patch_size) * p * p
        batch["pixel_values"] = torch.randn(n * g * g, row, device=device, dtype=model.dtype)
        batch["image_grid_thw"] = torch.tensor([[1, g, g]] * n, device=device)
        batch["mm_token_type_ids"] = (ids == image_id).int()    # text 0, image 1 (the processor's)
    else:   # gemma3
        per_image = int(config.mm_tokens_per_image)
        for i in range(images_per_sample):
            ids[:, 1 + i * per_image:1 + (i + 1) * per_image] = image_id
        batch["pixel_values"] = torch.randn(n, int(getattr(vc, "num_channels", 3)), side, side, device=device,
                                            dtype=model.dtype)
        batch["token_type_ids"] = (ids == image_id).long()
    if int(pos if mt in GRID_WRAPPERS else 1 + images_per_sample * per_image) >= seq_len:
        raise UserError(f"measure: {images_per_sample} images of {per_image} tokens do not fit a sequence of {seq_len}")
    return {"input_ids": ids, "labels": ids, **batch}
