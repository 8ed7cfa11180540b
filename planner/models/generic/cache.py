"""The generic path's cache: one JSON file per config under the user's cache directory, so
torch and transformers are imported only the first time a config is seen.

Where: ``$PLANNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/planner``, else ``~/.cache/planner``
(the XDG base directory convention); files ``generic/<key>.json``. The key hashes the
config.json dict (keys sorted), the installed transformers version (its model code is what
was measured) and PROFILE_VERSION. A cache that cannot be written is skipped, not an error:
the next plan measures again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from planner.models.generic.profile import PROFILE_VERSION, GenericProfile


def cache_dir() -> Path:
    """The planner's cache directory (see the module doc), read at each call."""
    if os.environ.get("PLANNER_CACHE_DIR"):
        return Path(os.environ["PLANNER_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).expanduser() / "planner"


def transformers_version() -> str:
    """The installed transformers version, read from its metadata (no import); "" if absent."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return ""


def config_key(cfg: dict[str, Any], version: str | None = None) -> str:
    """The cache key of a config.json dict: sha256 of the sorted JSON, the transformers
    version (the installed one unless given) and PROFILE_VERSION, first 24 hex digits."""
    text = json.dumps(cfg, sort_keys=True, separators=(",", ":"), default=str)
    payload = f"{text}\n{transformers_version() if version is None else version}\n{PROFILE_VERSION}"
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


# Profiles shipped with the presets planned on the generic path (planner/presets/profiles/,
# written by bench/generic_profiles.py), keyed without a transformers version: a plan of a
# preset never needs torch. Each file names the transformers version it was measured on.
SHIPPED = "shipped"


def shipped_profile(cfg: dict[str, Any]) -> GenericProfile | None:
    """The profile shipped for ``cfg`` (a preset's config.json), or None."""
    from importlib import resources

    name = f"{config_key(cfg, SHIPPED)}.json"
    try:
        text = resources.files("planner.presets").joinpath("profiles", name).read_text()
        profile = GenericProfile.from_json(json.loads(text))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return profile if profile.version == PROFILE_VERSION else None


def cache_path(cfg: dict[str, Any]) -> Path:
    return cache_dir() / "generic" / f"{config_key(cfg)}.json"


def read_cached(cfg: dict[str, Any]) -> GenericProfile | None:
    """The cached profile of ``cfg``, else the one shipped with a preset, or None (absent,
    unreadable, or of another PROFILE_VERSION)."""
    path = cache_path(cfg)
    try:
        data = json.loads(path.read_text())
        profile = GenericProfile.from_json(data)
    except (OSError, ValueError, TypeError, KeyError):
        return shipped_profile(cfg)
    return profile if profile.version == PROFILE_VERSION else shipped_profile(cfg)


def write_cached(cfg: dict[str, Any], profile: GenericProfile) -> Path | None:
    """Write the profile (write_json); None if the directory cannot be written."""
    return write_json(cache_path(cfg), profile.to_json())


def write_json(path: Path, data: dict[str, Any]) -> Path | None:
    """Write ``data`` as JSON atomically (a temporary file renamed into place); None if the
    directory cannot be written (not an error: the next plan measures again)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        return None
    return path
