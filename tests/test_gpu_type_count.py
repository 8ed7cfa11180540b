"""The GPU types one `plan --tokens` or `plan buy` compares are bounded (planner.limits.MAX_GPU_TYPES),
like every other input (issue 32: every input within the limits answered within seconds). Each type
is a search of its own; before the bound, a list of 100 GPU files took 8.7 s of CPU for Kimi K2 and
grew without end. The catalog itself (presets/gpus.toml, counted here) stays within the bound."""

from __future__ import annotations

import tomllib
from pathlib import Path

from conftest import plan_in_process

from planner.limits import MAX_GPU_TYPES

ROOT = Path(__file__).resolve().parent.parent


def test_the_whole_catalog_is_within_the_bound() -> None:
    catalog = tomllib.loads((ROOT / "planner" / "presets" / "gpus.toml").read_text())["gpu"]
    assert len(catalog) <= MAX_GPU_TYPES


def test_too_many_gpu_types_are_refused_before_any_search() -> None:
    names = ",".join(f"g{i}.toml" for i in range(MAX_GPU_TYPES + 1))
    out = plan_in_process("--model", "8b", "--gpus", names, "--tokens", "1T")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and f"at most {MAX_GPU_TYPES}" in out.stderr


def test_plan_buy_refuses_too_many_gpu_types(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: a, model: llama3.1-8b, tokens: 10B, deadline: 30d}\n")
    names = ",".join(f"g{i}" for i in range(MAX_GPU_TYPES + 1))
    out = plan_in_process("buy", str(jobs), "--gpus", names)
    assert out.returncode == 2 and f"at most {MAX_GPU_TYPES}" in out.stderr
    jobs.write_text(f"gpus: [{names}]\njobs:\n  - {{name: a, model: llama3.1-8b, tokens: 10B, deadline: 30d}}\n")
    out = plan_in_process("buy", str(jobs))
    assert out.returncode == 2 and "gpus names 33 GPU types" in out.stderr


def test_a_list_of_gpu_files_is_checked_name_by_name(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Three GPU files of the working directory, 90 bytes of name each: the list (272 bytes) was
    refused as one name longer than NAME_MAX (255 bytes, <linux/limits.h>)."""
    import re

    block = (ROOT / "planner" / "presets" / "gpus.toml").read_text().split("\n[[gpu]]")[1]
    block = re.sub(r'\naliases = .*|\ndefault_topology = .*', "", block)
    names = []
    for i in range(3):
        name = f"{'g' * 84}{i}.toml"
        (tmp_path / name).write_text("[[gpu]]" + block.replace('name = "h100"', f'name = "own{i}"', 1))
        names.append(name)
    monkeypatch.chdir(tmp_path)
    out = plan_in_process("--model", "8b", "--gpus", ",".join(names), "--tokens", "1T", "--objective", "time", "-q")
    assert out.returncode == 0, out.stderr
    assert "own" in out.stdout
