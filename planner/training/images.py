"""The images of a vision-language model's training data: what they add to a step.

Each sequence holds ``TrainingSetup.images_per_sample`` images of the size the model's vision
profile was measured at (planner.models.vision.profile.VisionProfile), each
``tokens_per_image`` tokens of the sequence (counted within ``seq_len``, as LLaMA-Factory's
``cutoff_len`` counts the image tokens its multimodal plugin expands: ASSUMPTION that the
data is packed or cut to seq_len with the images inside). The image side (encoder and
projector) runs once per image on the first pipeline stage, replicated on every
tensor-parallel rank of it: it is split by data parallelism (each rank its own sequences'
images) and ZeRO/FSDP (its states), never by tp, cp, ep or pipeline stages.

Frozen (FinetuneSpec.freeze_vision, the default): forward only, nothing saved for backward
(no parameter of it and no input requires a gradient, so autograd records nothing); trained:
forward and backward, the saved tensors held until its backward, on the first stage.
"""

from __future__ import annotations

from planner.models.spec import ModelSpec
from planner.training.finetune import FinetuneSpec

MAX_IMAGES_PER_SAMPLE = 4096


def vision_trains(m: ModelSpec, ft: FinetuneSpec) -> bool:
    """Whether the image side of ``m`` trains under ``ft`` (False for a text model)."""
    return m.vision is not None and not ft.freeze_vision


def image_tokens_per_sequence(m: ModelSpec, images_per_sample: int) -> int:
    """Image tokens in each sequence (within seq_len); 0 for a text model or text-only data."""
    return images_per_sample * m.vision.tokens_per_image if m.vision is not None else 0


def image_refusal(m: ModelSpec, images_per_sample: int, seq_len: int, freeze_vision: bool = True) -> str | None:
    """Why the images (or --train-vision) cannot be planned for ``m`` (training.checks'
    rules table reads it), or None: images or a trained image side for a text model, a
    config whose images transformers' model could not run, image tokens that fill the sequence."""
    if not freeze_vision and m.vision is None:
        return f"--train-vision: {m.name} is a text model with no image side to train; leave the option out"
    if images_per_sample == 0:
        return None
    if not 0 < images_per_sample <= MAX_IMAGES_PER_SAMPLE:
        return f"--images-per-sample {images_per_sample!r} must be a whole number from 0 to {MAX_IMAGES_PER_SAMPLE}"
    if m.vision is None:
        return (f"--images-per-sample {images_per_sample}: {m.name} is a text model; give a vision-language "
                f"config.json (qwen3_vl, llama4, mistral3, gemma3, qwen3_5...) or leave the option out")
    if m.vision.image_error:
        return (f"--images-per-sample {images_per_sample}: transformers' {m.vision.model_type} model did not run an "
                f"image at this config ({m.vision.image_error}); check its vision_config, or plan text-only data (0)")
    tokens = image_tokens_per_sequence(m, images_per_sample)
    if tokens >= seq_len:
        return (f"--images-per-sample {images_per_sample}: {tokens:,} image tokens ({m.vision.tokens_per_image:,} "
                f"per {m.vision.image_size_px}px image) fill the sequence of {seq_len:,}; raise --seq-len or give "
                f"fewer images")
    return None


def image_saved_bytes_per_sequence(m: ModelSpec, ft: FinetuneSpec, images_per_sample: int) -> int:
    """Bytes the image side saves for backward per sequence (measured per image, SDPA
    attention, no recomputation); 0 when frozen or without images."""
    if not vision_trains(m, ft) or images_per_sample <= 0 or m.vision is None:
        return 0
    return int(images_per_sample * m.vision.saved_bytes_per_image)


def image_flops_per_sequence(m: ModelSpec, ft: FinetuneSpec, images_per_sample: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of the image side per sequence (FlopCounterMode on
    transformers' model, per image); backward 0 when frozen."""
    if m.vision is None or images_per_sample <= 0:
        return 0.0, 0.0
    fwd = images_per_sample * m.vision.fwd_flops_per_image
    bwd = images_per_sample * m.vision.bwd_flops_per_image if vision_trains(m, ft) else 0.0
    return fwd, bwd
