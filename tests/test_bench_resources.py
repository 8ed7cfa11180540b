"""bench/resources.py's generated inputs are the files its cases name, each a valid jobs file
(or config, log) of the size the hostile test of issue 32 used, so that a case measures the
input it says and not a refusal."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from planner.cost.jobs import load_jobs

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_resources", ROOT / "bench" / "resources.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_case_reads_a_generated_input(tmp_path: Path) -> None:
    bench = _bench()
    bench.write_inputs(tmp_path)
    for name, (_, argv) in bench.cases(tmp_path).items():
        files = [a for a in argv if a.startswith(str(tmp_path))]
        assert all(Path(f).exists() for f in files if not f.endswith(".toml")), name   # .toml: written by it


def test_jobs_files_have_the_reported_sizes(tmp_path: Path) -> None:
    bench = _bench()
    bench.write_inputs(tmp_path)
    sizes = {"jobs256.yaml": 256, "jobs16.yaml": 16, "gb128.yaml": 128, "staggered70b.yaml": 32, "same70b.yaml": 32,
             "gbmix256.yaml": 256, "gbmix128.yaml": 128}
    for f, n in sizes.items():
        jobs = load_jobs(tmp_path / f).jobs
        assert len(jobs) == n, f
    assert load_jobs(tmp_path / "gbmix128.yaml").jobs == load_jobs(tmp_path / "gbmix256.yaml").jobs[:128]  # its cut
    assert {j.start_s for j in load_jobs(tmp_path / "same70b.yaml").jobs} == {0.0}      # identical jobs
    assert len({j.start_s for j in load_jobs(tmp_path / "staggered70b.yaml").jobs}) == 32    # H5: a day apart
    methods = {j.method for j in load_jobs(tmp_path / "jobs256.yaml").jobs}
    assert methods == {"full", "lora", "qlora", "freeze"}
