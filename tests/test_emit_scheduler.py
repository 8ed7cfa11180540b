"""Scheduler files: a Slurm batch script and a Kubeflow PyTorchJob for every stack.

slurm.sbatch: bash -n, and its #SBATCH node and GPU counts and srun's torchrun read back
with torchrun's own parser (torch.distributed.run.get_args_parser). pytorchjob.yaml:
parsed by PyYAML and validated by jsonschema against the schema the project ships
(planner/emit/schemas/pytorchjob-kubeflow-v1.json, written from the training operator's v1
API types); replicas and nvidia.com/gpu read back.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shlex
import subprocess

import pytest
from conftest import require

from planner import api
from planner.emit import EmitOptions, node_shape, plan_files
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

yaml = require("yaml")
jsonschema = require("jsonschema")

PLANS = [
    # (model, layout, gpu, stack)
    ("qwen2.5-0.5b", dict(dp=16, zero_stage=2, micro_batch=1, grad_accum=4), "h100", "deepspeed"),
    ("qwen2.5-0.5b", dict(dp=8, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=8), "h100", "hf"),
    ("llama3.1-8b", dict(dp=2, tp=4, pp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16,
                         recompute="full"), "h100", "megatron"),
    ("llama3.1-8b", dict(dp=4, pp=2, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=8,
                         recompute="full"), "h100", "torchtitan"),
    ("llama3.1-8b", dict(dp=4, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=8,
                         recompute="full"), "mi300x", "hf"),
    ("qwen2.5-0.5b", dict(dp=1, zero_stage=0, micro_batch=1, grad_accum=8, recompute="full"), "h100", "deepspeed"),
]


def _plan(name, kw, gpu):
    lay = Layout(seq_len=2048, **kw)
    r = api.evaluate_layout(load_model(name), get_gpu(gpu), TrainingSetup(seq_len=2048, global_batch=lay.global_batch),
                            lay)
    assert r.best is not None and r.best.fits
    return r


def schema() -> dict:
    text = importlib.resources.files("planner.emit").joinpath("schemas/pytorchjob-kubeflow-v1.json").read_text()
    return json.loads(text)


def _srun_torchrun(script: str) -> list[str]:
    """The srun command of a batch script, joined over its continuation lines, as words."""
    joined = script.replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if ln.startswith("srun "))
    return shlex.split(line)


@pytest.mark.slow
@pytest.mark.parametrize("name, kw, gpu, stack", PLANS)
def test_scheduler_files_parse_and_carry_the_plans_counts(name, kw, gpu, stack, tmp_path):
    from torch.distributed.run import get_args_parser

    r = _plan(name, kw, gpu)
    lay = r.best.layout
    files = plan_files(r, EmitOptions(stack=stack))
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)

    sbatch = files["slurm.sbatch"]
    (tmp_path / "slurm.sbatch").write_text(sbatch)
    out = subprocess.run(["bash", "-n", str(tmp_path / "slurm.sbatch")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    opts = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", sbatch, re.M))
    assert int(opts["nodes"]) == n_nodes and int(opts["gpus-per-node"]) == per_node
    assert opts["ntasks-per-node"] == "1"
    words = _srun_torchrun(sbatch)
    i = words.index("torchrun")
    targs = get_args_parser().parse_args(words[i + 1:])
    assert targs.nnodes == str(n_nodes) and int(targs.nproc_per_node) == per_node
    assert targs.rdzv_backend == "c10d"
    if "CUDA_DEVICE_MAX_CONNECTIONS" in files["launch.sh"]:
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in sbatch

    doc = yaml.safe_load(files["pytorchjob.yaml"])
    jsonschema.validate(doc, schema())
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] + specs.get("Worker", {"replicas": 0})["replicas"] == n_nodes
    resource = "amd.com/gpu" if gpu == "mi300x" else "nvidia.com/gpu"
    for spec in specs.values():
        container = spec["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"][resource] == per_node
        kargs = get_args_parser().parse_args(container["command"][1:])
        assert kargs.nnodes == str(n_nodes) and int(kargs.nproc_per_node) == per_node
        env = {e["name"]: e["value"] for e in container["env"]}
        if "CUDA_DEVICE_MAX_CONNECTIONS" in files["launch.sh"]:
            assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert int(doc["spec"]["nprocPerNode"]) == per_node


def test_the_schema_rejects_a_broken_manifest():
    r = _plan(*PLANS[2][:3])
    doc = yaml.safe_load(plan_files(r)["pytorchjob.yaml"])
    jsonschema.validate(doc, schema())
    bad = json.loads(json.dumps(doc))
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema())
    typo = json.loads(json.dumps(doc))
    typo["spec"]["pytorchReplicaSpec"] = typo["spec"].pop("pytorchReplicaSpecs")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(typo, schema())


@pytest.mark.parametrize("scheduler, expect", [("slurm", {"slurm.sbatch"}), ("kubernetes", {"pytorchjob.yaml"}),
                                               ("none", set()), ("both", {"slurm.sbatch", "pytorchjob.yaml"})])
def test_scheduler_option_picks_the_files(scheduler, expect):
    r = _plan(*PLANS[0][:3])
    names = set(plan_files(r, EmitOptions(scheduler=scheduler)))
    assert names - {"ds_config.json", "hostfile", "config.json", "train.py", "launch.sh"} == expect
    with pytest.raises(UserError, match="--scheduler"):
        plan_files(r, EmitOptions(scheduler="pbs"))
