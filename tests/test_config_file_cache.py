"""A config.json named again is not parsed again unless its bytes changed (issue 32's hunt: a
`plan buy` file of 256 jobs naming one 15.5 MiB config.json parsed it 512 times, over 120 s of
CPU). The referee for the spec is the file itself: a rewritten file gives the rewritten model
(transformers' LlamaConfig field num_hidden_layers, read from the JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner.models.load as load
from planner.cost.jobs import load_jobs
from planner.models.load import load_config_file, preset_config


def _write(path: Path, layers: int) -> None:
    path.write_text(json.dumps(preset_config("llama3.1-8b") | {"num_hidden_layers": layers}))


def test_the_same_bytes_give_the_same_spec_and_new_bytes_a_new_one(tmp_path: Path) -> None:
    f = tmp_path / "mine.json"
    _write(f, 32)
    first = load_config_file(f)
    assert first.n_layers == 32 and load_config_file(f) is first
    _write(f, 40)                       # rewritten between two calls, as an API caller may
    assert load_config_file(f).n_layers == 40


def test_a_jobs_file_parses_each_config_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "mine.json"
    _write(f, 16)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n" + "".join(f"  - {{name: j{i}, model: mine.json, tokens: 10B, deadline: 30d}}\n"
                                         for i in range(64)))
    parses = []
    real = load.spec_from_hf_config
    monkeypatch.setattr(load, "spec_from_hf_config", lambda *a, **k: parses.append(1) or real(*a, **k))
    monkeypatch.setattr(load, "_CONFIG_CACHE", {})
    assert len(load_jobs(jobs).jobs) == 64
    assert len(parses) == 1
    assert load_config_file(f).n_layers == 16 and len(parses) == 1      # plan buy's second look: no parse


def test_the_cache_holds_a_bounded_number_of_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load, "_CONFIG_CACHE", {})
    for i in range(load._CONFIG_CACHE_SIZE + 3):
        _write(tmp_path / f"m{i}.json", 8 + i)
        assert load_config_file(tmp_path / f"m{i}.json").n_layers == 8 + i
    assert len(load._CONFIG_CACHE) == load._CONFIG_CACHE_SIZE
