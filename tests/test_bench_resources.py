"""bench/resources.py's generated inputs are the files its cases name, each a valid jobs file
(or config, log) of the size the hostile test of issue 32 used, so that a case measures the
input it says and not a refusal."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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
        outputs = (".toml", ".png")     # written by the case
        assert all(Path(f).exists() for f in files if not f.endswith(outputs)), name


@pytest.mark.slow   # 3 s; the fast tier keeps every_case_reads_a_generated_input
def test_jobs_files_have_the_reported_sizes(tmp_path: Path) -> None:
    bench = _bench()
    bench.write_inputs(tmp_path)
    sizes = {"jobs256.yaml": 256, "jobs16.yaml": 16, "big16.yaml": 16, "fat256.yaml": 256, "gb128.yaml": 128,
             "staggered70b.yaml": 32, "same70b.yaml": 32, "gbmix256.yaml": 256, "gbmix128.yaml": 128}
    for f, n in sizes.items():
        jobs = load_jobs(tmp_path / f).jobs
        assert len(jobs) == n, f
    assert load_jobs(tmp_path / "gbmix128.yaml").jobs == load_jobs(tmp_path / "gbmix256.yaml").jobs[:128]  # its cut
    assert {j.start_s for j in load_jobs(tmp_path / "same70b.yaml").jobs} == {0.0}      # identical jobs
    assert len({j.start_s for j in load_jobs(tmp_path / "staggered70b.yaml").jobs}) == 32    # H5: a day apart
    methods = {j.method for j in load_jobs(tmp_path / "jobs256.yaml").jobs}
    assert methods == {"full", "lora", "qlora", "freeze"}


@pytest.mark.slow   # 3 s; the fast tier keeps every_case_reads_a_generated_input
def test_the_gpu_list_case_names_the_most_gpu_types_allowed(tmp_path: Path) -> None:
    """tokens-deepseek-32-types: the 23 catalog types and the GPU files, MAX_GPU_TYPES in all, each
    file a valid GPU of its own name (the H100's entry; the case measures the search, not a refusal)."""
    from planner.hardware.gpus import get_gpu
    from planner.limits import MAX_GPU_TYPES

    bench = _bench()
    bench.write_inputs(tmp_path)
    argv = bench.cases(tmp_path)["tokens-deepseek-32-types"][1]
    names = argv[argv.index("--gpus") + 1].split(",")
    assert len(names) == len(set(names)) == MAX_GPU_TYPES
    own = [get_gpu(n) for n in names if n.endswith(".toml")]
    assert {g.name for g in own} == {f"own{i}" for i in range(bench.OWN_GPUS)}
    assert all(g.memory_bytes == get_gpu("h100").memory_bytes for g in own)


@pytest.mark.slow   # 3 s; the fast tier keeps every_case_reads_a_generated_input
def test_the_large_config_is_within_its_limit(tmp_path: Path) -> None:
    from planner.limits import MAX_CONFIG_BYTES

    _bench().write_inputs(tmp_path)
    assert 15 * 2**20 < (tmp_path / "fat.json").stat().st_size <= MAX_CONFIG_BYTES
