"""Measure and ship the profiles of the presets planned on the generic path.

    python bench/generic_profiles.py [PRESET...]

For each preset whose model_type no family translator is written for, measures its profile
on the installed transformers (planner.models.generic.probe) and writes it to
planner/presets/profiles/<key>.json, so that planning the preset never imports torch. Run it
again after changing a preset's config.json or PROFILE_VERSION. A preset of a written family is
measured only when named (nemotron-3-nano and qwen3-next-80b-a3b keep theirs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.models.families import SUPPORTED_MODEL_TYPES
from planner.models.generic.cache import SHIPPED, config_key
from planner.models.generic.probe import profile_config
from planner.models.load import load_presets, preset_config

OUT = Path(__file__).resolve().parents[1] / "planner" / "presets" / "profiles"


def main(names: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names or list(load_presets()):
        cfg = preset_config(name)
        if cfg.get("model_type") in SUPPORTED_MODEL_TYPES and name not in names:
            continue        # a written family's preset ships its profile only when named
        profile = profile_config(cfg, f"preset {name}")
        path = OUT / f"{config_key(cfg, SHIPPED)}.json"
        path.write_text(json.dumps(profile.to_json(), indent=1) + "\n")
        print(f"{name}: {profile.total:,} parameters, {len(profile.blocks)} block kinds -> {path.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
