"""Loading models: the preset catalog, config.json files, and the Hugging Face cache.

``load_model`` takes a preset name or alias (planner/presets/models.toml), a path to a
config.json (or a directory holding one), or a Hugging Face repository id ``ORG/NAME``,
whose config.json comes from the local Hugging Face cache or, when the machine is
online, from the Hub (huggingface_hub, imported only then).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from planner.errors import UserError, unknown_name
from planner.limits import MAX_CONFIG_BYTES, check_label, not_found
from planner.models.families import spec_from_hf_config
from planner.models.spec import ModelSpec

# ------------------------------------------------------------------------ presets

@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    name: str
    config: str
    source: str
    description: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)


_PRESET_KEYS = {"name", "config", "source", "description", "aliases"}


@cache
def load_presets() -> dict[str, Preset]:
    """The model catalog (planner/presets/models.toml), by name."""
    text = resources.files("planner.presets").joinpath("models.toml").read_text()
    out: dict[str, Preset] = {}
    for row in tomllib.loads(text)["model"]:
        extra = set(row) - _PRESET_KEYS
        if extra:
            raise ValueError(f"models.toml: unknown keys {sorted(extra)} in {row.get('name')}")
        out[row["name"]] = Preset(**{**row, "aliases": tuple(row.get("aliases", ()))})
    return out


def _aliases() -> dict[str, str]:
    return {a: p.name for p in load_presets().values() for a in p.aliases}


def preset_config(name: str) -> dict[str, Any]:
    """The shipped config.json dict of a preset."""
    p = load_presets()[name]
    return json.loads(resources.files("planner.presets").joinpath(p.config).read_text())


@cache
def load_preset(name: str) -> ModelSpec:
    p = load_presets()[name]
    return spec_from_hf_config(preset_config(name), name, f"preset {name}", p.source)


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name or alias, a Hugging Face config.json by path, or a Hugging Face
    repository id (``ORG/NAME``, see hub_config_path).

    Raises UserError naming the closest presets, the file, or the missing key.
    """
    key = name_or_path.strip().lower()
    presets = load_presets()
    if key in presets:
        return load_preset(key)
    aliases = _aliases()
    if key in aliases:
        return load_preset(aliases[key])
    check_label(name_or_path, "--model")       # the name goes into answers and launch files
    path = Path(name_or_path)
    if is_repo_id(name_or_path) and not path.exists():
        repo_id = name_or_path.strip()
        builtin = offline_preset(repo_id)
        if builtin is not None:
            return load_preset(builtin)
        return load_config_file(hub_config_path(repo_id), name=repo_id)
    if path.suffix == ".json" or path.exists() or "/" in name_or_path:
        return load_config_file(path)
    raise unknown_name("model", name_or_path, [*presets, *aliases], "`plan models`")


def load_hf_config(name_or_path: str) -> dict[str, Any]:
    """The config.json dict behind a preset name, alias, path or repository id (for measurement)."""
    key = name_or_path.strip().lower()
    aliases = _aliases()
    if key in load_presets() or key in aliases:
        return preset_config(aliases.get(key, key))
    path = Path(name_or_path)
    if is_repo_id(name_or_path) and not path.exists():
        builtin = offline_preset(name_or_path.strip())
        if builtin is not None:
            return preset_config(builtin)
        path = hub_config_path(name_or_path.strip())
    load_config_file(path)   # the same checks and errors as for planning
    return json.loads((path / "config.json" if path.is_dir() else path).read_text())


# ------------------------------------------------------------------ Hugging Face cache

_REPO_PART = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def is_repo_id(text: str) -> bool:
    """``ORG/NAME`` as the Hub spells repository ids: one slash, letters, digits, ``-_.``,
    neither part starting with a dot nor ending in ``.json`` (huggingface_hub's
    validate_repo_id allows the same characters)."""
    parts = text.strip().split("/")
    return (len(parts) == 2 and all(p and set(p) <= _REPO_PART and not p.startswith(".") for p in parts)
            and not parts[1].endswith(".json") and len(text) <= 96)


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub (huggingface_hub/constants.py), read at each call."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE set to a true value (huggingface_hub's _is_true: 1, ON, YES, TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


_HUB_CONFIG_URL = re.compile(r"https://huggingface\.co/([^/\s]+/[^/\s]+)/blob/main/config\.json(?:$| \()")
_SAID: set[str] = set()


def preset_for_repo(repo_id: str) -> str | None:
    """The preset whose config.json is the repository's own, unchanged (its source is the
    repository's config.json URL, alone or followed by notes in brackets; a source that says
    the file was changed, e.g. a text_config taken out, does not count), or None."""
    for p in load_presets().values():
        m = _HUB_CONFIG_URL.match(p.source)
        if m and "written here" not in p.source and m[1].lower() == repo_id.lower():
            return p.name
    return None


def hub_reachable(timeout_s: float = 1.5) -> bool:
    """Whether a TCP connection to the Hub ($HF_ENDPOINT, else huggingface.co:443) opens
    within ``timeout_s``; True behind a proxy (huggingface_hub goes through it, a direct
    probe would not). Without network this fails at once instead of huggingface_hub's
    retries (24 s and 11 lines of warnings, issue 33)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _cached_config(repo_id: str) -> Path | None:
    """The cached config.json of ``repo_id`` at refs/main (the hub cache's layout, as
    hub_config_path's docstring gives it), read without importing huggingface_hub (about
    0.3 s of the offline answer); None when absent."""
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    try:
        revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = repo / "snapshots" / revision / "config.json"
    return path if revision and "/" not in revision and path.is_file() else None


def offline_preset(repo_id: str) -> str | None:
    """The built-in preset to plan ``repo_id`` with: when the cache has no config.json for it,
    the Hub cannot be read (HF_HUB_OFFLINE, or no connection) and a preset is the repository's
    own config (preset_for_repo). Says so once on stderr. None: read the cache or the Hub."""
    builtin = preset_for_repo(repo_id)
    if builtin is None or _cached_config(repo_id) is not None:
        return None
    offline = hub_offline()
    if not offline and hub_reachable():
        return None
    if repo_id not in _SAID:
        _SAID.add(repo_id)
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub is unreachable"
        sys.stderr.write(f"note: --model {repo_id}: {why} and the cache has no config.json; planning with the "
                         f"built-in {builtin}, the same config ({load_presets()[builtin].source})\n")
    return builtin


def hub_config_path(repo_id: str) -> Path:
    """The config.json of ``repo_id``: from the Hugging Face cache
    (models--ORG--NAME/snapshots/<revision of refs/main>/config.json), else downloaded
    when online. Offline or unreachable: UserError saying where it looked and the ways out."""
    import huggingface_hub

    cache_dir = hub_cache_dir()
    cached = huggingface_hub.try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
    if isinstance(cached, str):
        return Path(cached)
    where = cache_dir / f"models--{repo_id.replace('/', '--')}"
    fix = (f"run `hf download {repo_id} config.json` on a machine with network access (with "
           f"HF_HUB_CACHE={cache_dir}), or pass the config.json path")
    if hub_offline():
        raise UserError(f"--model {repo_id}: no config.json in the Hugging Face cache ({where}) and "
                        f"HF_HUB_OFFLINE is set; unset it to download, {fix}")
    if not hub_reachable():
        raise UserError(f"--model {repo_id}: not in the Hugging Face cache ({where}) and the Hub is unreachable "
                        f"(no connection); {fix}")
    try:
        return Path(huggingface_hub.hf_hub_download(repo_id, "config.json", cache_dir=cache_dir, etag_timeout=10))
    except (huggingface_hub.errors.RepositoryNotFoundError, huggingface_hub.errors.GatedRepoError) as e:
        kind = "gated (log in with `hf auth login`)" if isinstance(e, huggingface_hub.errors.GatedRepoError) \
            else "not found on the Hugging Face Hub (or private)"
        raise UserError(f"--model {repo_id}: repository {kind}; check the name, or pass a config.json path") from None
    except huggingface_hub.errors.LocalEntryNotFoundError as e:    # raised for no network, before the next
        raise UserError(f"--model {repo_id}: not in the Hugging Face cache ({where}) and the Hub is unreachable "
                        f"({type(e).__name__}); {fix}") from None
    except huggingface_hub.errors.EntryNotFoundError:
        raise UserError(f"--model {repo_id}: the repository has no config.json; pass a config.json path") from None
    except Exception as e:  # noqa: BLE001 -- no network: LocalEntryNotFoundError, httpx connection errors, timeouts
        raise UserError(f"--model {repo_id}: not in the Hugging Face cache ({where}) and the Hub is unreachable "
                        f"({type(e).__name__}); {fix}") from None


# The specs of the last config.json files read, by (path, name): the file's bytes and its spec.
# The file is read at every call (a Python API caller may rewrite it between two plans) and
# parsed again only when its bytes differ: a `plan buy` file of 256 jobs naming one 16 MiB
# config.json parsed it 512 times (issue 32's hunt: over 120 s of CPU). At most
# _CONFIG_CACHE_SIZE files of at most MAX_CONFIG_BYTES each (128 MiB at worst).
_CONFIG_CACHE: dict[tuple[str, str], tuple[bytes, ModelSpec]] = {}
_CONFIG_CACHE_SIZE = 8


def load_config_file(path: Path, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face config.json (or a directory holding one); the same bytes at the same
    path give the same spec without a second parse (_CONFIG_CACHE)."""
    check_label(str(path), "model file")
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(not_found("model file", path, "pass a preset name (`plan models`) or a config.json path"))
    if name is None:
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: {path.stat().st_size:,} bytes is too large for a config.json "
                            f"(limit {MAX_CONFIG_BYTES:,}); pass the model's config.json, not its weights")
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    key = (str(path), name)
    kept = _CONFIG_CACHE.get(key)
    if kept is not None and kept[0] == raw:
        return kept[1]
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise UserError(f"{path}: not valid JSON ({why}); expected a Hugging Face config.json") from None
    check_label(name, "model name")
    spec = spec_from_hf_config(cfg, name, str(path), source=str(path))
    _CONFIG_CACHE.pop(key, None)
    while len(_CONFIG_CACHE) >= _CONFIG_CACHE_SIZE:
        del _CONFIG_CACHE[next(iter(_CONFIG_CACHE))]        # the oldest
    _CONFIG_CACHE[key] = (raw, spec)
    return spec
