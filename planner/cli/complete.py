"""Shell completion of catalog names: models, GPUs, topologies (`plan completion SHELL`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def complete_names(load: Callable[[], list[str]], incomplete: str, paths: bool = False,
                   lists: bool = False) -> list[Any]:
    """Shell completion: the catalog names ``load`` gives that start with what was typed (with
    ``lists``, the last item of a comma-separated list); with ``paths``, a path completes as a
    file. A catalog that fails to load completes nothing rather than print into the shell."""
    from click.shell_completion import CompletionItem

    if paths and (incomplete.startswith((".", "/", "~")) or "/" in incomplete):
        return [CompletionItem(incomplete, type="file")]
    head, _, last = incomplete.rpartition(",") if lists else ("", "", incomplete)
    prefix = head + "," if head else ""
    try:
        names = sorted(set(load()))
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []
    # a name with a space would reach the shell as two words (bash splits the candidates):
    # such names (the GPUs' full names, accepted as aliases) are typed, not completed (issue 32, U12)
    return [CompletionItem(prefix + n) for n in names if n.startswith(last.lower()) and not any(c.isspace() for c in n)]


def model_names() -> list[str]:
    from planner.models.spec import load_presets

    return [n for p in load_presets().values() for n in (p.name, *p.aliases)]


def gpu_names() -> list[str]:
    from planner.hardware.gpus import list_gpus

    return [n for g in list_gpus() for n in (g.name, *g.aliases)]


def topology_names() -> list[str]:
    import importlib.resources  # the file names, without topology.py's networkx

    files = importlib.resources.files("planner") / "presets" / "topologies"
    return [f.name[:-5] for f in files.iterdir() if f.name.endswith(".toml")]


def complete_models(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    return complete_names(model_names, incomplete, paths=True)


def complete_gpus(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    """GPU names, a list's last item, or a GPU file (``./my-gpu.toml``) as a path."""
    return complete_names(gpu_names, incomplete, paths="," not in incomplete, lists=True)


def complete_topologies(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    return complete_names(topology_names, incomplete, paths=True)
