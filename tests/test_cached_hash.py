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


def test_a_pickle_from_another_hash_seed_hashes_as_here(tmp_path):
    path = tmp_path / "c.pkl"
    code = ("import pickle, sys; from planner.hardware.placement import cluster_for; "
            "from planner.hardware.gpus import get_gpu; "
            "open(sys.argv[1], 'wb').write(pickle.dumps([cluster_for(get_gpu(g)) for g in ('h100', 'l40s')]))")
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env={**os.environ, "PYTHONHASHSEED": seed})
    for c in pickle.loads(path.read_bytes()):
        here = cluster_for(c.gpu)
        assert c == here and hash(c) == hash(here) and hash(c.topology) == hash(here.topology)
        assert {here: 1}[c] == 1
