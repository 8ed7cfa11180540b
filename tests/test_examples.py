"""Every example of examples/ runs and prints what its committed output.txt holds (issue #8).

A difference fails with a unified diff; when the change is intended (a new report layout,
a corrected formula), regenerate the outputs with `python examples/run.py --write` and
read the diff before committing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from conftest import require

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_run", EXAMPLES / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load_runner()
FOLDERS = run.find_examples()


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_example_prints_its_committed_output(folder: Path) -> None:
    d = run.diff(folder, run.run_example(folder))
    assert not d, (f"examples/{folder.name}: the output differs from output.txt; if the change is "
                   f"intended, run `python examples/run.py --write` and commit the new output\n{d}")


def test_the_issue_scenarios_have_examples() -> None:
    # issue #8: pretraining a 70B on H100s with a token budget and a deadline; full
    # fine-tuning of Llama 3.1 8B on one A100 node; LoRA on one RTX 4090; QLoRA of a 70B on
    # one 48 GB L40S; a Mixtral MoE on H200s; buying a cluster for three jobs; a config.json
    commands = {f.name: [" ".join(c) for c in run.read_commands(f / run.COMMANDS)] for f in FOLDERS}
    flat = "\n".join(" ".join(c) for c in commands.values())
    assert "--model llama3.1-70b --gpus h100 --tokens" in flat and "--deadline" in flat
    assert "--model llama3.1-8b --gpus a100 --n-gpus 8" in flat
    assert "--gpus 4090 --n-gpus 1 --method lora" in flat
    assert "--model llama3.1-70b --gpus l40s --n-gpus 1 --method qlora" in flat
    assert "--model mixtral-8x22b --gpus h200" in flat
    assert "buy examples/jobs.yaml" in flat
    assert "config.json" in flat
    readme = (EXAMPLES / "README.md").read_text()
    for f in FOLDERS:
        assert (f / run.OUTPUT).exists(), f"{f.name}: no output.txt"
        assert f.name in readme, f"{f.name} is missing from examples/README.md"


def test_three_jobs_in_the_buy_example() -> None:
    yaml = require("yaml")
    jobs = yaml.safe_load((EXAMPLES / "jobs.yaml").read_text())["jobs"]
    assert len(jobs) == 3


def test_commands_are_read_like_bash_reads_them(tmp_path: Path) -> None:
    sh = tmp_path / "command.sh"
    sh.write_text('#!/usr/bin/env bash\n# a comment\ncd "$(dirname "$0")/../.." || exit\n\n'
                  "plan --model 8b \\\n  --gpus 'a100'\nplan gpus\n")
    assert run.read_commands(sh) == [["--model", "8b", "--gpus", "a100"], ["gpus"]]
    sh.write_text("python -c 'print(1)'\n")
    with pytest.raises(ValueError, match="only `plan"):
        run.read_commands(sh)


def test_wall_clock_durations_are_masked_wherever_the_line_wraps() -> None:
    a = ("step 7.51 s, MFU 49.5%\n\nSolver\n  HiGHS, status Optimal, optimality\n"
         "proved (gap 1e-06, limit 20 s), 0.018 s; search 9.8 s\n")
    b = ("step 7.51 s, MFU 49.5%  \n\nSolver\n  HiGHS, status Optimal, optimality\n"
         "proved (gap 1e-06, limit 20 s), 0.1234 s; search\n12.5 s\n")
    assert run.mask(a) == run.mask(b)
    assert "step 7.51 s" in run.mask(a) and "limit 20 s" in run.mask(a)
    assert "0.018" not in run.mask(a) and "9.8" not in run.mask(a)
