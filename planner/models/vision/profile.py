"""What the planner knows of a vision-language model's image side: plain numbers, so that a
ModelSpec holding it stays frozen and hashable and the profile round-trips through JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Bumped whenever what the probe counts changes: a cached profile of another version is read again.
VISION_VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionProfile:
    """The image side of a vision-language model, counted on transformers' model built from
    the whole config.json on the meta device (planner.models.vision.probe).

    ``encoder``: the vision tower's parameters (transformers' ``visual``, ``vision_tower`` or
    ``vision_model``; Qwen3-VL's and Qwen3.5's patch mergers sit inside it); ``projector``:
    everything else outside the text model and its LM head (``multi_modal_projector``).
    Exact: text tower + ``params`` equals transformers' count of the whole model.
    """

    model_type: str                 # the wrapper's model_type (qwen3_vl, gemma3, ...)
    transformers_version: str
    encoder: int
    projector: int
    version: int = VISION_VERSION

    @property
    def params(self) -> int:
        return self.encoder + self.projector

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> VisionProfile:
        return VisionProfile(**d)
