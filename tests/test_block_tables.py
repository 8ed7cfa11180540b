"""The per-block-shape tables (memory.shapes' activation figures, timing.stage's block rows)
and timing.degrees' degree tables (with their slowest stages) are keyed on the set-up without
its global batch (training.setup.block_table_setup), so set-ups that differ only in it share
them (issue 32, H1: 128 jobs of distinct global batches). That is exact only while no memory
or step-time model reads the global batch: the first test holds the source to it, the second
compares a sweep on shared tables with the same sweep in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from planner.training.setup import DEFAULT_SETUP, TrainingSetup, block_table_setup

ROOT = Path(__file__).resolve().parent.parent

SWEEP = """
import json, sys
from planner.hardware.gpus import get_gpu
from planner.models.spec import load_model
from planner.search.sweep import sweep
from planner.timing.model import cluster_for
from planner.training.setup import TrainingSetup

m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
first = [int(b) for b in sys.argv[1].split(",") if b]
for gb in first:      # these sweeps fill the tables the last one reads
    sweep(m, TrainingSetup(global_batch=gb), cluster_for(gpu), [8, 16], 80 * 2**30, keep=3)
out = []
for cb in sweep(m, TrainingSetup(global_batch=int(sys.argv[2])), cluster_for(gpu), [8, 16], 80 * 2**30, keep=3):
    out += [[cb.n_gpus, c.layout.key, c.memory.total, c.time.step_time_s] for c in cb.fastest]
print(json.dumps(out))
"""


def _sweep(first: str, last: int) -> list:
    r = subprocess.run([sys.executable, "-c", SWEEP, first, str(last)], capture_output=True, text=True, cwd=ROOT,
                       check=True)
    return json.loads(r.stdout)


def test_no_memory_or_step_time_model_reads_the_global_batch() -> None:
    # a layout carries its micro-batch and accumulation; were a model to read
    # setup.global_batch, block_table_setup's key would serve one batch's figures to another
    files = [p for d in ("memory", "timing") for p in (ROOT / "planner" / d).rglob("*.py")]
    readers = [p.relative_to(ROOT).as_posix() for p in files if "global_batch" in p.read_text()]
    assert readers == []


def test_the_key_drops_the_global_batch_only() -> None:
    s = TrainingSetup(global_batch=1032, seq_len=2048)
    assert block_table_setup(s) == replace(s, global_batch=DEFAULT_SETUP.global_batch)
    assert block_table_setup(DEFAULT_SETUP) is DEFAULT_SETUP
    assert block_table_setup(s) != block_table_setup(replace(s, seq_len=4096))


def test_a_sweep_on_shared_tables_equals_a_fresh_one() -> None:
    # global batch 1032 after sweeps of 1024 and 1040 (their tables shared), and alone: the same
    # layouts, memory to the byte and step times to the bit
    shared = _sweep("1024,1040", 1032)
    assert shared, "no layout fits: the comparison would check nothing"
    assert shared == _sweep("", 1032)
