"""HSDP over Megatron-Core's distributed-optimizer instances (--optimizer-instances N, megatron-core's
num_distributed_optimizer_instances), refereed by megatron-core's own group arithmetic:

1. megatron-core 0.16.1's parallel_state.initialize_model_parallel, run on CPU with the group calls
   stubbed (tests/megatron_groups.py), builds the instance groups: the planner's instance shard
   group (Layout.hybrid_shard) is its intra-partial data-parallel (x cp) group, the experts' its
   intra-partial expert data-parallel group, the replicas its inter-instance group; a count that
   does not divide is refused by both.
2. The model states of one rank divide the rank's parameters by those megatron-core group sizes:
   the distributed optimizer's states over the instance; Megatron FSDP's model weights and gradients
   over the instance and, with outer_dp_sharding_strategy 'optim', its fp32 main weights and
   optimizer moments over the whole data-parallel group (megatron-core's main-weight buffer group).
3. The CLI: Nemotron 3 Ultra's published row as its recipe ran it plans and fits; bad values exit 2
   with one line; --out megatron writes the count, which Megatron-LM's parser and megatron-core's
   DistributedDataParallelConfig accept.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import require
from megatron_args import LaunchEnv, megatron_args_errors, parse_args
from megatron_groups import GROUP_STUBS

from planner import api
from planner.cli.main import cli
from planner.emit.megatron import to_megatron_args
from planner.hardware.gpus import get_gpu
from planner.layouts.batch import LayoutArrays
from planner.layouts.layout import Layout, reject_reason
from planner.memory.params import optimizer_state_bytes, rank_params
from planner.memory.states import model_state_bytes
from planner.models.spec import count_params, load_model
from planner.stacks.megatron import device_arch_major
from planner.training.setup import TrainingSetup

# (world, tp, ep, etp, instances, model): Nemotron 3 Ultra's published layout (256 GB200s, tp 2,
# ep 64, etp 1, 4 instances: Megatron-Bridge perf_recipes/nemotronh), an MoE and a dense layout
SHAPES = [(256, 2, 64, 1, 4, "nemotron-3-ultra"), (64, 2, 4, 1, 2, "mixtral-8x7b"), (32, 1, 1, 1, 4, "llama3.1-8b")]
BAD = (256, 2, 64, 1, 3)          # 3 divides neither dp x cp = 128 nor edp = 4

_SCRIPT = GROUP_STUBS + r'''
shapes, bad = json.loads(sys.argv[1])
out = {"groups": [], "bad": None}
for w, tp, ep, etp, n in [s[:5] for s in shapes] + [bad]:
    world[0] = w
    ps.destroy_model_parallel()
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=etp, num_distributed_optimizer_instances=n)
    except (AssertionError, RuntimeError) as e:
        out["bad"] = str(e)
        continue
    out["groups"].append([ps.get_data_parallel_world_size(with_context_parallel=True),
                          ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True).size(),
                          ps.get_expert_data_parallel_world_size(),
                          ps.get_expert_data_parallel_group(partial_expert_data_parallel=True).size(),
                          ps.get_inter_distributed_optimizer_instance_group().size()])
print(json.dumps(out))
'''

SETUP = TrainingSetup(stack="megatron", seq_len=2048, global_batch=512)


@pytest.fixture(scope="module")
def megatron() -> dict:
    require("megatron.core")
    arg = json.dumps([SHAPES, list(BAD)])
    done = subprocess.run([sys.executable, "-c", _SCRIPT, arg], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _layout(world: int, tp: int, ep: int, etp: int, n: int, **kw) -> Layout:
    return Layout(dp=world // (tp * ep), tp=tp, ep=ep, etp=etp if ep > 1 else 0, optimizer_instances=n,
                  seq_len=SETUP.seq_len, **kw)


@pytest.mark.slow
def test_instance_groups_are_megatron_cores(megatron):
    """dp x cp, its instance's ranks, edp, the experts' instance ranks and the replicas (megatron-core
    0.16.1 parallel_state.py lines 834-895 and 1263-1300) as the planner derives them."""
    got = []
    for world, tp, ep, etp, n, _ in SHAPES:
        lay = _layout(world, tp, ep, etp, n, zero_stage=1)
        a = LayoutArrays.from_layouts([lay])
        from planner.memory.states import shard_degrees
        _, d_expert = shard_degrees(a, a.hybrid_shard(4))
        got.append([lay.dense_shard_degree, lay.hybrid_shard(4), lay.expert_shard_degree, int(d_expert[0]),
                    lay.hybrid_replicate(4)])
    assert megatron["groups"] == got
    # megatron-core: "Data parallel size should be divisible by partial DistOpt shard factor"
    assert "divisible by partial DistOpt shard factor" in megatron["bad"]
    m = load_model("nemotron-3-ultra")
    why = reject_reason(m, SETUP, _layout(*BAD, zero_stage=3, sharding="fsdp-full"), 4)
    assert why is not None and "does not divide" in why and "partial DistOpt shard factor" in why


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: s[-1])
def test_states_divide_by_megatron_cores_groups(megatron, shape):
    """The rank's optimizer states, gradients and (FSDP) weights over megatron-core's group sizes:
    the distributed optimizer (ZeRO-1) keeps fp32 master + Adam moments over the instance
    (intra-partial groups); Megatron FSDP with the outer strategy 'optim' its gradients and 16-bit
    model weights over the instance, its fp32 main weights and moments over the whole data-parallel
    groups (megatron_fsdp/param_and_grad_buffer.py: the main weight buffer spans the whole group,
    the HSDP model-weight and gradient buffers the instance's)."""
    world, tp, ep, etp, n, name = shape
    dp_cp, part, edp, part_e, _ = megatron["groups"][SHAPES.index(shape)]
    m = load_model(name)
    rp = rank_params(m, count_params(m), _layout(world, tp, ep, etp, n), 0, m.n_layers)
    prec, k = SETUP.precision_spec, optimizer_state_bytes(m, SETUP)
    d, e = np.array([rp.dense]), np.array([rp.expert])

    def states(**kw):
        a = LayoutArrays.from_layouts([_layout(world, tp, ep, etp, n, **kw)])
        return model_state_bytes(d, e, prec, k, a, a.hybrid_shard(4))

    def over(per_param: float, dense_ranks: int, expert_ranks: int) -> int:
        return -(-int(rp.dense * per_param) // dense_ranks) + -(-int(rp.expert * per_param) // expert_ranks)

    zero1 = states(zero_stage=1)
    assert int(zero1.optimizer[0]) == over(prec.master_bytes + k, part, part_e)
    fsdp = states(zero_stage=3, sharding="fsdp-full")
    assert int(fsdp.optimizer[0]) == over(k, dp_cp, edp)
    assert int(fsdp.gradients[0]) == over(4, part, part_e)
    # fp32 main weights over the whole groups, the 16-bit model weights over the instance's
    assert int(fsdp.weights[0]) == over(4, dp_cp, edp) + over(prec.weight_bytes, part, part_e)


# Nemotron 3 Ultra's published 256-GB200 MXFP8 row as Megatron-Bridge's recipe ran it
# (tests/data/megatron_bridge_runs.json, recipe_flags; bench/megatron_bridge_rows.py writes this command)
ULTRA = ["--model", "nemotron-3-ultra", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "256", "--tp", "2",
         "--pp", "1", "--cp", "1", "--ep", "64", "--dp", "2", "--etp", "1", "--seq-len", "8192", "--micro-batch", "1",
         "--global-batch", "256", "--fsdp", "full", "--precision", "fp8", "--fp8-recipe", "mxfp8",
         "--fp8-param-gather", "--recompute", "selective", "--recompute-modules", "moe_act"]


def test_the_ultra_row_plans_and_fits_with_its_four_instances():
    r = CliRunner().invoke(cli, ULTRA + ["--optimizer-instances", "4", "--json"], prog_name="plan")
    assert r.exit_code == 0, r.output[-2000:]
    plan = json.loads(r.output)["plan"]
    assert plan["fits"] and plan["layout"]["optimizer_instances"] == 4, plan


@pytest.mark.parametrize("extra, words", [
    (["--optimizer-instances", "3"], "does not divide the data-parallel x cp ranks 128"),
    (["--optimizer-instances", "0"], "--optimizer-instances"),
])
def test_bad_instance_counts_exit_2_with_one_line(extra, words):
    r = CliRunner().invoke(cli, ULTRA + extra, prog_name="plan")
    assert r.exit_code == 2, r.output[-2000:]
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.output


@pytest.mark.parametrize("stack", [[], ["--stack", "torchtitan"], ["--stack", "deepspeed"]])
def test_instances_are_megatrons_alone(stack):
    r = CliRunner().invoke(cli, ["--model", "mixtral-8x7b", "--gpus", "h100", "--optimizer-instances", "2", *stack],
                           prog_name="plan")
    assert r.exit_code == 2, r.output[-2000:]
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "add --stack megatron" in lines[0] and "Traceback" not in r.output


def test_out_refuses_megatron_fsdp_instances_megatron_lm_cannot_state(tmp_path):
    """The plan sizes Megatron FSDP's instances with outer_dp_sharding_strategy 'optim' (the Ultra
    recipe's); Megatron-LM's arguments cannot set it and its default 'no_shard' holds more, so --out
    writes nothing rather than files that would run another memory."""
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ULTRA + ["--optimizer-instances", "4", "--out", str(out)], prog_name="plan")
    assert r.exit_code == 2, r.output[-2000:]
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "outer_dp_sharding_strategy" in lines[0] and "Traceback" not in r.output
    assert not out.exists()


def test_instances_need_the_distributed_optimizer_or_megatron_fsdp():
    lay = _layout(64, 2, 4, 1, 2, zero_stage=2)
    why = reject_reason(load_model("mixtral-8x7b"), SETUP, lay, 8)
    assert why is not None and "--zero 1" in why and "--fsdp full" in why


@pytest.mark.slow
def test_megatron_args_carry_the_instances_and_megatron_accepts_them():
    require("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
    lay = _layout(64, 2, 4, 1, 2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16)
    r = api.evaluate_layout(load_model("mixtral-8x7b"), get_gpu("h100"),
                            TrainingSetup(stack="megatron", seq_len=lay.seq_len, global_batch=lay.global_batch), lay)
    argv = to_megatron_args(r)
    i = argv.index("--num-distributed-optimizer-instances")
    assert argv[i + 1] == "2"
    env = LaunchEnv(world_size=64, cuda_device_max_connections="1", device_arch_major=device_arch_major("h100"))
    assert megatron_args_errors(argv, env) == []
    a = parse_args(argv)
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=a.use_distributed_optimizer,
                                        num_distributed_optimizer_instances=a.num_distributed_optimizer_instances)
    assert cfg.num_distributed_optimizer_instances == 2


def test_the_distributed_optimizer_updates_one_instances_shard():
    """ZeRO-1 over N instances: each rank updates 1/(dp x cp / N) of the parameters (megatron-core's
    intra-partial group, test_instance_groups_are_megatron_cores), N times the whole group's shard;
    Megatron FSDP's outer 'optim' keeps the update over the whole group."""
    def step(*extra: str) -> dict:
        r = CliRunner().invoke(cli, ["--model", "llama3.1-8b", "--gpus", "h100", "--stack", "megatron",
                                     "--n-gpus", "64", "--tp", "1", "--pp", "1", "--cp", "1", "--dp", "64",
                                     "--micro-batch", "1", "--global-batch", "512", "--seq-len", "4096",
                                     "--recompute", "full", *extra, "--json"], prog_name="plan")
        assert r.exit_code == 0, r.output[-2000:]
        return json.loads(r.output)["plan"]["time"]

    whole, inst = step("--zero", "1"), step("--zero", "1", "--optimizer-instances", "8")
    assert inst["optimizer_s"] == pytest.approx(8 * whole["optimizer_s"], rel=1e-6)
    assert step("--fsdp", "full", "--optimizer-instances", "8")["optimizer_s"] == pytest.approx(
        step("--fsdp", "full")["optimizer_s"], rel=1e-6)
