"""Plans of one fixed layout under --stack megatron and the launch environment their files
export, shared by the hybrid emit tests (tests/test_emit_megatron_hybrid.py and
tests/test_emit_megatron_deltanet.py)."""

from __future__ import annotations

from typing import Any

from megatron_args import LaunchEnv, env_from_script

from planner import api
from planner.emit import EmitOptions
from planner.emit.launch import to_launch_script
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.stacks.megatron import device_arch_major
from planner.training.setup import TrainingSetup

# A tensor-parallel layout and a pipeline + expert-parallel one with selective recomputation
TINY_LAYOUTS = [dict(dp=2, tp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=4),
                dict(dp=1, tp=2, pp=2, ep=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=8,
                     recompute="selective")]


def plan_layout(m: Any, kw: dict, gpu: str = "h100", seq_len: int = 1024, **setup_kw: Any) -> Any:
    """``api.evaluate_layout`` of the layout ``kw`` under --stack megatron; it must be planned."""
    lay = Layout(seq_len=seq_len, **kw)
    setup = TrainingSetup(seq_len=seq_len, global_batch=lay.global_batch, stack="megatron", **setup_kw)
    r = api.evaluate_layout(m, get_gpu(gpu), setup, lay)
    assert r.best is not None, f"test layout must be planned: {m.name} {lay.describe()}"
    return r


def launch_env(r: Any) -> LaunchEnv:
    """What validate_args reads besides the flags, from the plan's launch.sh and GPU."""
    exported = env_from_script(to_launch_script(r, EmitOptions(), "megatron"))
    return LaunchEnv(world_size=r.best.layout.n_gpus,
                     cuda_device_max_connections=exported.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                     device_arch_major=device_arch_major(r.gpu.name))


# Appended to GROUP_STUBS in a megatron-core subprocess script: the parallel state, and the
# counts both hybrid emit tests compare
# (the whole model on one rank, and rank 0 of tp x ep, whose expert parameters megatron-core
# marks allreduce = False)
PARAM_COUNTS = r'''
def model_parallel(tp, ep):
    """megatron-core's parallel state for rank 0 of tp x ep (GROUP_STUBS' world)."""
    world[0] = tp * ep
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)


def param_counts(model, rank):
    return {"rank_dense": sum(p.numel() for p in rank.parameters() if getattr(p, "allreduce", True)),
            "rank_expert": sum(p.numel() for p in rank.parameters() if not getattr(p, "allreduce", True)),
            "per_layer": [sum(p.numel() for p in x.parameters()) for x in model.decoder.layers],
            "total": sum(p.numel() for p in model.parameters())}
'''
