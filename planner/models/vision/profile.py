"""What the planner knows of a vision-language model's image side: plain numbers, so that a
ModelSpec holding it stays frozen and hashable and the profile round-trips through JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Bumped whenever what the probe counts changes: a cached profile of another version is read again.
# 2: saved tensors are those autograd still holds when the forward ends (generic.probe.held_bytes)
VISION_VERSION = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionProfile:
    """The image side of a vision-language model, counted on transformers' model built from
    the whole config.json on the meta device (planner.models.vision.probe).

    ``encoder``: the vision tower's parameters (transformers' ``visual``, ``vision_tower`` or
    ``vision_model``; Qwen3-VL's and Qwen3.5's patch mergers sit inside it); ``projector``:
    everything else outside the text model and its LM head (``multi_modal_projector``).
    Exact: text tower + ``params`` equals transformers' count of the whole model.

    One image at the config's size (``image_size_px`` square: the vision config's
    ``image_size``, else the side of its learned position grid, Qwen3-VL's
    ``num_position_embeddings`` patches), run through transformers' ``get_image_features``
    (encoder and projector) under fake tensors in bf16, eager attention, no recomputation:
    ``tokens_per_image`` image tokens it puts in the text sequence (after the merger or
    pooling); ``saved_bytes_per_image`` bytes autograd saves when the image side trains
    (0 saved when it is frozen: no parameter of it and no input requires a gradient);
    ``fwd_flops_per_image`` and ``bwd_flops_per_image`` (FlopCounterMode). ``image_error``:
    why transformers' model could not run an image at this config (then the four are 0 and
    a plan with images is refused).
    """

    model_type: str                 # the wrapper's model_type (qwen3_vl, gemma3, ...)
    transformers_version: str
    encoder: int
    projector: int
    image_size_px: int = 0
    tokens_per_image: int = 0
    saved_bytes_per_image: float = 0.0
    fwd_flops_per_image: float = 0.0
    bwd_flops_per_image: float = 0.0
    image_error: str = ""
    version: int = VISION_VERSION

    @property
    def params(self) -> int:
        return self.encoder + self.projector

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> VisionProfile:
        return VisionProfile(**d)
