"""A Kubernetes manifest for a plan: a Kubeflow training-operator PyTorchJob (kubeflow.org/v1).

The resource's fields are the training operator's v1 API (kubeflow/training-operator,
pkg/apis/kubeflow.org/v1/pytorch_types.go and common_types.go: PyTorchJobSpec
{runPolicy, elasticPolicy, pytorchReplicaSpecs, nprocPerNode}, ReplicaSpec {replicas,
template, restartPolicy}); planner/emit/schemas/pytorchjob-kubeflow-v1.json is a JSON
schema of the fields this module writes, made from those types, and the tests validate
the manifest against it. One pod per node: a Master and nodes - 1 Workers, each asking
for the node's GPUs (nvidia.com/gpu, or amd.com/gpu for AMD's device plugin). The
operator sets MASTER_ADDR and MASTER_PORT in every pod (pkg/controller.v1/pytorch/envvar.go);
torchrun's c10d rendezvous joins the pods there. The image must hold the --out directory
at WORKDIR and the stack installed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from planner.emit import EmitOptions, chosen, label, node_shape
from planner.emit.launch import stack_env, worker_command
from planner.emit.slurm import job_name, torchrun_under_scheduler

if TYPE_CHECKING:
    from planner.api import PlanResult

API_VERSION = "kubeflow.org/v1"
WORKDIR = "/workspace/plan"
MEGATRON_DIR = "/workspace/Megatron-LM"
SCHEMA = "pytorchjob-kubeflow-v1.json"


def gpu_resource(gpu_name: str) -> str:
    """The extended resource the GPU's device plugin advertises."""
    return "amd.com/gpu" if gpu_name.startswith("mi") else "nvidia.com/gpu"


def _kube_word(word: str) -> str:
    """Shell ${VAR} references as Kubernetes' $(VAR) expansion of the container's env."""
    return word.replace("${HERE}", WORKDIR).replace("${MEGATRON}", "$(MEGATRON)")


def to_manifest(r: PlanResult, opts: EmitOptions = EmitOptions(), stack: str | None = None) -> dict[str, Any]:
    """The PyTorchJob as plain data."""
    from planner.emit import stack_for
    from planner.emit.megatron import to_megatron_args

    lay = chosen(r).layout
    stack = stack or stack_for(r, opts)
    n_nodes, per_node = node_shape(lay.n_gpus, r.gpu.gpus_per_node)
    name = job_name(r)
    prog, _ = worker_command(r, opts, stack)
    command = torchrun_under_scheduler(r, opts, "$(MASTER_ADDR):$(MASTER_PORT)", name)
    command += [_kube_word(w) for w in prog]
    from planner.stacks import reads_megatron_args, runs_megatron_deepspeed
    if stack == "megatron":
        command += to_megatron_args(r, opts)
    elif runs_megatron_deepspeed(stack, lay):
        from planner.emit.megatron_deepspeed import to_megatron_deepspeed_args
        command += to_megatron_deepspeed_args(r, opts, ds_config=f"{WORKDIR}/ds_config.json")
    env = {**stack_env(r, stack)}
    if reads_megatron_args(stack, lay):
        env["MEGATRON"] = MEGATRON_DIR
    if stack == "torchtitan":
        env["PYTHONPATH"] = WORKDIR
    gpus = gpu_resource(r.gpu.name)

    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {
                "containers": [{
                    "name": "pytorch",          # the container the operator configures
                    "image": opts.image,
                    "workingDir": WORKDIR,
                    "command": command,
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "resources": {"limits": {gpus: per_node}, "requests": {gpus: per_node}},
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                }],
                # NCCL and data loaders need more shared memory than a pod's default 64 MiB
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            }},
        }

    specs = {"Master": replica(1)}
    if n_nodes > 1:
        specs["Worker"] = replica(n_nodes - 1)
    return {
        "apiVersion": API_VERSION,
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "planner"}},
        "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "nprocPerNode": str(per_node),
                 "pytorchReplicaSpecs": specs},
    }


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))        # a JSON string is a valid double-quoted YAML scalar


def to_yaml(obj: Any, indent: int = 0) -> list[str]:
    """Block YAML for nested dicts, lists and scalars (no YAML library needed)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines += to_yaml(v, indent + 2)
            else:
                lines.append(f"{pad}{k}: {_yaml_scalar(v) if not isinstance(v, (dict, list)) else json.dumps(v)}")
    else:
        for item in obj:
            if isinstance(item, (dict, list)) and item:
                sub = to_yaml(item, indent + 2)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines += sub[1:]
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    return lines


def to_manifest_yaml(r: PlanResult, opts: EmitOptions = EmitOptions(), stack: str | None = None) -> str:
    lay = chosen(r).layout
    head = [f"# Written by planner: {label(r.model.name)} on {lay.n_gpus} x {label(r.gpu.name)}; "
            f"layout {lay.describe()}",
            f"# kubectl apply -f pytorchjob.yaml  (Kubeflow training operator, {API_VERSION} PyTorchJob).",
            f"# Set the image: it must hold this directory at {WORKDIR} and the stack installed."]
    return "\n".join(head + to_yaml(to_manifest(r, opts, stack))) + "\n"
