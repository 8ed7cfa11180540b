"""The public API a stranger reads first: `import planner` is light, every exported name
resolves, the version comes from the package metadata (pyproject.toml the one source), and the
example in planner/__init__.py's docstring runs as written."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import planner

ROOT = Path(__file__).resolve().parent.parent


def test_import_planner_loads_no_numpy_and_no_torch() -> None:
    code = "import sys, planner; print(sorted(m for m in ('numpy', 'torch', 'networkx', 'pulp') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_exported_name_resolves_and_has_a_docstring() -> None:
    for name in planner.__all__:
        value = getattr(planner, name)
        if name != "__version__":
            assert value.__doc__, name
    assert planner.evaluate is planner.api.evaluate_layout and planner.plan is planner.api.plan


def test_one_version_source() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert planner.__version__ == version("planner") == pyproject
    assert "__version__ =" not in (ROOT / "planner" / "__init__.py").read_text()


def test_the_docstring_example_runs() -> None:
    m = planner.load_model("llama3.1-8b")
    gpu = planner.get_gpu("h100")
    setup = planner.TrainingSetup(seq_len=4096, global_batch=512)
    r = planner.plan(m, gpu, setup, n_gpus=8)
    assert r.fits and r.best.layout.n_gpus == 8 and r.best.memory.total <= r.capacity_bytes
    lay = planner.Layout(dp=8, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=64, seq_len=4096,
                         recompute="full")
    one = planner.evaluate(m, gpu, setup, lay)
    assert one.fixed and one.best.layout == lay and one.best.time.step_time_s > 0


def test_the_api_refuses_a_precision_the_gpu_cannot_run_as_the_cli_does() -> None:
    # training.checks.precision_refusal: the A100 has no FP8 tensor cores (NVIDIA A100 data
    # sheet: TF32, BF16, FP16, INT8 tensor cores; FP8 came with Hopper)
    import pytest
    from click.testing import CliRunner

    from planner.cli.main import cli
    from planner.errors import UserError

    with pytest.raises(UserError, match="no FP8 tensor cores") as e:
        planner.plan(planner.load_model("8b"), planner.get_gpu("a100"), planner.TrainingSetup(precision="fp8"))
    r = CliRunner().invoke(cli, ["--model", "8b", "--gpus", "a100", "--precision", "fp8"])
    assert r.exit_code == 2 and str(e.value) in r.output
