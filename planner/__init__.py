"""planner: how many GPUs, which layout, how much memory, how long and at what cost, for a
training run.

The Python API (the CLI, ``plan``, is a thin layer over it)::

    import planner

    m = planner.load_model("llama3.1-8b")            # a preset, a config.json path or ORG/NAME
    gpu = planner.get_gpu("h100")
    setup = planner.TrainingSetup(seq_len=4096, global_batch=512)
    r = planner.plan(m, gpu, setup, n_gpus=8)         # the fastest layout that fits on 8 GPUs
    print(r.best.layout.describe(), r.best.memory.total, r.best.time.step_time_s)

    lay = planner.Layout(dp=8, zero_stage=3, sharding="fsdp-full", micro_batch=1,
                         grad_accum=64, seq_len=4096, recompute="full")
    one = planner.evaluate(m, gpu, setup, lay)        # exactly that layout

``plan`` searches GPU counts and layouts (``space``: a SearchSpace pins choices) and returns a
PlanResult: ``best`` (a Candidate with ``layout``, ``memory``, ``time``, ``fits``), the
alternatives, and the search. ``evaluate`` checks one Layout (a layout that cannot run is a
UserError naming the rule). Bytes are ints, times float seconds (planner.units).

Importing planner is light: these names load their modules on first use (PEP 562), so
``import planner`` pulls in neither numpy nor torch. ``planner.__version__`` is the installed
package's version (pyproject.toml is its one source).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> (module, attribute)
_EXPORTS = {
    "plan": ("planner.api", "plan"),
    "evaluate": ("planner.api", "evaluate_layout"),
    "PlanResult": ("planner.api", "PlanResult"),
    "load_model": ("planner.models.load", "load_model"),
    "count_params": ("planner.models.spec", "count_params"),
    "ModelSpec": ("planner.models.spec", "ModelSpec"),
    "get_gpu": ("planner.hardware.gpus", "get_gpu"),
    "GpuSpec": ("planner.hardware.gpus", "GpuSpec"),
    "load_topology": ("planner.hardware.topology", "load_topology"),
    "cluster_for": ("planner.timing.model", "cluster_for"),
    "Efficiency": ("planner.timing.model", "Efficiency"),
    "TrainingSetup": ("planner.training.setup", "TrainingSetup"),
    "FinetuneSpec": ("planner.training.finetune", "FinetuneSpec"),
    "Layout": ("planner.layouts.layout", "Layout"),
    "SearchSpace": ("planner.layouts.layout", "SearchSpace"),
    "UserError": ("planner.errors", "UserError"),
}

__all__ = [
    "__version__",
    "Efficiency",
    "FinetuneSpec",
    "GpuSpec",
    "Layout",
    "ModelSpec",
    "PlanResult",
    "SearchSpace",
    "TrainingSetup",
    "UserError",
    "cluster_for",
    "count_params",
    "evaluate",
    "get_gpu",
    "load_model",
    "load_topology",
    "plan",
]

if TYPE_CHECKING:
    __version__: str
    from planner.api import PlanResult, plan
    from planner.api import evaluate_layout as evaluate
    from planner.errors import UserError
    from planner.hardware.gpus import GpuSpec, get_gpu
    from planner.hardware.topology import load_topology
    from planner.layouts.layout import Layout, SearchSpace
    from planner.models.load import load_model
    from planner.models.spec import ModelSpec, count_params
    from planner.timing.model import Efficiency, cluster_for
    from planner.training.finetune import FinetuneSpec
    from planner.training.setup import TrainingSetup


def _version() -> str:
    """The installed distribution's version: the one version source is pyproject.toml's
    [project] version, which installing writes into the package metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("planner")
    except PackageNotFoundError:        # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562); ``__version__`` from the package
    metadata, read on first use too (importlib.metadata costs tens of milliseconds)."""
    if name == "__version__":
        value: Any = _version()
        globals()[name] = value
        return value
    if name not in _EXPORTS:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(k for k in globals() if k.startswith("__"))})
