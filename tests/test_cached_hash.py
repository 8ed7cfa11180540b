"""Cluster and ClusterTopology work out their hash once (issue 32: the link caches looked a
topology up 227,000 times in one `--tokens` plan, each hashing every nested field). The
referee is Python's own rule for hashable objects: equal objects hash equal, also after
dataclasses.replace, copy.deepcopy and a pickle from a process with another hash seed."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from dataclasses import replace
from typing import Any

from planner.hardware.gpus import get_gpu
from planner.hardware.placement import Cluster, cluster_for


def test_equal_clusters_hash_equal():
    a, b = cluster_for(get_gpu("h100")), cluster_for(get_gpu("h100"))
    assert a == b and hash(a) == hash(b) and hash(a.topology) == hash(b.topology)
    bare = replace(a, topology=None)
    assert bare == Cluster(gpu=a.gpu) and hash(bare) == hash(Cluster(gpu=a.gpu))
    edited = replace(a.topology, max_nodes=a.topology.max_nodes + 1)
    assert edited != a.topology and hash(replace(edited, max_nodes=a.topology.max_nodes)) == hash(a.topology)
    assert hash(copy.deepcopy(a)) == hash(a) and {a: 1}[copy.deepcopy(a)] == 1


def _pickled_under_another_seed(tmp_path, imports: str, objects: str) -> Any:
    """``objects`` (an expression after ``imports``) pickled in a process with another hash
    seed, and loaded here."""
    path = tmp_path / "o.pkl"
    code = f"import pickle, sys; {imports}; open(sys.argv[1], 'wb').write(pickle.dumps({objects}))"
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env={**os.environ, "PYTHONHASHSEED": seed})
    return pickle.loads(path.read_bytes())


def test_a_pickle_from_another_hash_seed_hashes_as_here(tmp_path):
    clusters = _pickled_under_another_seed(
        tmp_path, "from planner.hardware.placement import cluster_for; from planner.hardware.gpus import get_gpu",
        "[cluster_for(get_gpu(g)) for g in ('h100', 'l40s')]")
    for c in clusters:
        here = cluster_for(c.gpu)
        assert c == here and hash(c) == hash(here) and hash(c.topology) == hash(here.topology)
        assert {here: 1}[c] == 1


def test_models_and_setups_hash_as_equal_objects_do():
    # ModelSpec and TrainingSetup keep their hash too (issue 32, fifth pass: the per-shape
    # caches of the memory and step-time models look them up hundreds of thousands of times)
    from planner.models.spec import load_model
    from planner.training.finetune import FinetuneSpec
    from planner.training.setup import TrainingSetup

    for name in ("llama3.1-8b", "deepseek-v3", "qwen3-next-80b-a3b"):
        m = load_model(name)
        assert m == load_model(name) and hash(m) == hash(load_model(name))
        wider = replace(m, d_ff=m.d_ff + 1)
        assert wider != m and replace(wider, d_ff=m.d_ff) == m and hash(replace(wider, d_ff=m.d_ff)) == hash(m)
        assert hash(copy.deepcopy(m)) == hash(m) and {m: 1}[pickle.loads(pickle.dumps(m))] == 1
    s = TrainingSetup(finetune=FinetuneSpec.named("qlora"), seq_len=2048)
    assert hash(s) == hash(TrainingSetup(finetune=FinetuneSpec.named("qlora"), seq_len=2048))
    assert hash(replace(replace(s, global_batch=7), global_batch=s.global_batch)) == hash(s)
    assert {s: 1}[copy.deepcopy(s)] == 1 and "_hash" not in s.as_dict() and "_hash" not in repr(s)


def test_a_model_pickled_under_another_hash_seed_hashes_as_here(tmp_path):
    from planner.models.spec import load_model
    from planner.training.setup import TrainingSetup

    m, s = _pickled_under_another_seed(
        tmp_path, "from planner.models.spec import load_model; from planner.training.setup import TrainingSetup",
        "(load_model('mixtral-8x7b'), TrainingSetup(precision='fp8'))")
    assert {load_model("mixtral-8x7b"): 1}[m] == 1 and {TrainingSetup(precision="fp8"): 1}[s] == 1
