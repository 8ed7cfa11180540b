"""Configs that launch as planned, checked by the programs that read them.

ds_config.json: DeepSpeed's own DeepSpeedConfig at the plan's data-parallel size.
accelerate's YAML: accelerate's config loader and its launch-argument handling.
torchrun and deepspeed commands: torch.distributed.run's and DeepSpeed's argument parsers.
Megatron-LM arguments: a cited copy of Megatron-LM's parser and of the validate_args rules
that concern our flags (planner/stacks/megatron.py), and megatron-core's own
TransformerConfig, OptimizerConfig and DistributedDataParallelConfig built from the args,
whose parameter count is compared with the planner's.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")   # before deepspeed is imported (docs/facts.md)

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require
from megatron_args import LaunchEnv, megatron_args_errors
from megatron_args import parse_args as megatron_parse

from planner import api
from planner.cli.main import cli
from planner.emit import EmitOptions, check_options, node_shape, plan_files
from planner.emit.deepspeed import largest_module_params, to_deepspeed_config
from planner.emit.fsdp import DECODER_LAYER_CLASS, to_accelerate_config, to_torchrun_command, to_yaml
from planner.emit.launch import to_deepspeed_command, to_hostfile
from planner.emit.megatron import pipeline_layout, to_megatron_args
from planner.emit.write import write_files
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.model import stage_layers
from planner.models.spec import SUPPORTED_MODEL_TYPES, count_params, load_model
from planner.stacks import default_stack
from planner.training.setup import TrainingSetup

H100 = get_gpu("h100")
SMALL = load_model("qwen2.5-0.5b")      # 24 layers, 14 heads, 2 KV heads: everything fits


def evaluate(m, lay: Layout, precision: str = "bf16-mixed", optimizer: str = "adamw", gpu=H100):
    setup = TrainingSetup(seq_len=lay.seq_len, global_batch=lay.global_batch, precision=precision,
                          optimizer=optimizer)
    r = api.evaluate_layout(m, gpu, setup, lay)
    assert r.best is not None and r.best.fits, f"test layout must fit: {lay.describe()}"
    return r


def zero_layout(dp: int, stage: int, mb: int, global_batch: int = 512, **kw) -> Layout:
    return Layout(dp=dp, zero_stage=stage, micro_batch=mb, grad_accum=global_batch // (dp * mb),
                  seq_len=2048, recompute="full", **kw)


# ------------------------------------------------------------------- DeepSpeed

def _dtype(parsed) -> str:
    if parsed.bfloat16_config.enabled:
        return "bf16"
    return "fp16" if parsed.float16_config.enabled else "fp32"


def _device(section) -> str:
    if section is None:
        return "none"
    return getattr(section.device, "value", section.device)


GRID = [(stage, dp, mb, prec, oo, op)
        for stage, dp, mb, prec, oo, op in itertools.product(
            (0, 1, 2, 3), (1, 2, 8, 64), (1, 2, 4), ("bf16-mixed", "fp16-mixed", "fp32", "bf16"),
            ("none", "cpu", "nvme"), ("none", "cpu", "nvme"))
        if not (stage > 0 and dp == 1)]


@pytest.mark.slow
def test_every_ds_config_is_accepted_by_deepspeed_with_the_plans_values():
    require("deepspeed")
    from deepspeed_config import validate_deepspeed_config

    checked = refused = 0
    for stage, dp, mb, prec, oo, op in GRID:
        r = evaluate(SMALL, zero_layout(dp, stage, mb), precision=prec)
        opts = EmitOptions(offload_optimizer=oo, offload_params=op)
        try:
            check_options(r, opts)
        except UserError:
            refused += 1          # e.g. parameter offload below ZeRO-3: the planner says why
            continue
        lay = r.best.layout
        cfg = to_deepspeed_config(r, opts)
        json.loads(json.dumps(cfg))                      # plain JSON data
        parsed = validate_deepspeed_config(cfg, data_parallel=dp)
        assert parsed.world_size == dp
        assert parsed.zero_optimization_stage == stage
        assert parsed.train_batch_size == mb * lay.grad_accum * dp == r.setup.global_batch
        assert parsed.train_micro_batch_size_per_gpu == mb
        assert parsed.gradient_accumulation_steps == lay.grad_accum
        assert _device(parsed.zero_config.offload_optimizer) == oo
        assert _device(parsed.zero_config.offload_param) == op
        assert _dtype(parsed) == r.setup.precision_spec.compute_dtype
        assert parsed.gradient_clipping == 1.0 and parsed.optimizer_name == "adamw"
        bucket = r.setup.buffers.zero_bucket_numel
        if stage in (1, 2):   # double-buffered under overlap_comm: two halves = the counted bucket
            assert parsed.zero_config.overlap_comm and 2 * parsed.zero_config.reduce_bucket_size == bucket
        if stage == 3:
            assert parsed.zero_config.reduce_bucket_size == bucket
            assert parsed.zero_config.prefetch_bucket_size == largest_module_params(r)
        checked += 1
    assert checked > 300 and refused > 0


@pytest.mark.parametrize("optimizer, name", [("sgd", "SGD"), ("adafactor", "Adafactor"), ("adam8bit", None)])
def test_other_optimizers_are_accepted(optimizer, name):
    require("deepspeed")
    from deepspeed_config import validate_deepspeed_config

    r = evaluate(SMALL, zero_layout(8, 2, 1), optimizer=optimizer)
    parsed = validate_deepspeed_config(to_deepspeed_config(r), data_parallel=8)
    assert parsed.optimizer_name == name and parsed.zero_allow_untested_optimizer
    with pytest.raises(UserError, match="cannot be offloaded"):
        check_options(r, EmitOptions(offload_optimizer="cpu"))


def test_deepspeed_rejects_the_config_at_another_data_parallel_size():
    require("deepspeed")
    from deepspeed_config import validate_deepspeed_config

    cfg = to_deepspeed_config(evaluate(SMALL, zero_layout(8, 2, 2)))
    with pytest.raises(AssertionError, match="train_batch_size"):
        validate_deepspeed_config(cfg, data_parallel=16)


MODEL_PARALLEL = [
    # (model, layout); Megatron-LM runs these, ds_config.json serves Megatron-DeepSpeed
    ("qwen2.5-0.5b", dict(dp=2, tp=2, pp=2, zero_stage=1, sp=True, micro_batch=2, grad_accum=8, recompute="selective")),
    ("qwen2.5-0.5b", dict(dp=2, tp=1, pp=5, zero_stage=0, micro_batch=1, grad_accum=16)),          # 24 layers over 5
    ("qwen2.5-0.5b", dict(dp=1, tp=1, pp=5, vp=2, zero_stage=0, micro_batch=1, grad_accum=20)),    # uneven, interleaved
    ("qwen2.5-0.5b", dict(dp=2, tp=1, pp=3, vp=2, zero_stage=1, micro_batch=1, grad_accum=6)),     # 24 = 3 x 2 x 4
    ("qwen2.5-0.5b", dict(dp=2, tp=2, cp=2, zero_stage=3, sp=True, micro_batch=1, grad_accum=4, recompute="full")),
    ("qwen2.5-0.5b", dict(dp=4, tp=2, zero_stage=2, sp=True, micro_batch=1, grad_accum=4)),
    ("mixtral-8x7b", dict(dp=2, tp=2, pp=4, ep=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=8,
                          recompute="full")),
    ("llama3.1-8b", dict(dp=2, tp=4, pp=2, zero_stage=1, sp=True, micro_batch=1, grad_accum=16, recompute="full")),
]


def _mp_plan(name: str, kw: dict):
    m = load_model(name)
    return evaluate(m, Layout(seq_len=2048, **kw), gpu=get_gpu("b200"))


@pytest.mark.parametrize("name, kw", MODEL_PARALLEL)
def test_model_parallel_ds_config_is_accepted_at_dp_times_ep(name, kw):
    require("deepspeed")
    from deepspeed_config import validate_deepspeed_config

    from planner.emit.deepspeed import data_parallel_size

    r = _mp_plan(name, kw)
    lay = r.best.layout
    parsed = validate_deepspeed_config(to_deepspeed_config(r), data_parallel=data_parallel_size(lay),
                                       n_gpus=lay.n_gpus)
    assert parsed.train_batch_size == lay.global_batch
    assert parsed.zero_optimization_stage == lay.zero_stage


# --------------------------------------------------------------------- Megatron

def megatron_parser():
    """Megatron-LM's parser for the flags planner emits (planner/stacks/megatron.py, cited there)."""
    from megatron_args import parser
    return parser()


def parse_pipeline_layout(text: str) -> list[str]:
    """Megatron's layout grammar (pipeline_parallel_layer_layout.py): stages split by '|',
    'x*n' repeats a character, E embedding, t transformer layer, L loss."""
    text = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), text.replace(",", ""))
    return text.split("|")


@pytest.mark.parametrize("name, kw", MODEL_PARALLEL)
def test_megatron_args_are_megatrons_own_and_match_the_plan(name, kw):
    """Megatron-LM is not installable here (it needs CUDA, Apex and Transformer Engine),
    so its parser cannot run: the arguments are checked against the names, types and
    choices Megatron-LM's parser defines, copied above from megatron/training/arguments.py
    with the commit cited. That catches misspelled or removed flags and bad values, not
    Megatron's validate_args; the parts of validate_args that concern the plan (batch
    arithmetic, model-parallel sizes dividing the world, layer splits) are checked here."""
    r = _mp_plan(name, kw)
    lay, m = r.best.layout, r.model
    args = megatron_parser().parse_args(to_megatron_args(r))
    assert args.tensor_model_parallel_size == lay.tp and args.pipeline_model_parallel_size == lay.pp
    assert args.context_parallel_size == lay.cp
    assert (args.expert_model_parallel_size or 1) == lay.ep
    assert args.sequence_parallel == lay.sp
    assert args.num_layers == m.n_layers and args.seq_length == lay.seq_len
    # validate_args: data-parallel size = world / (tp x pp x cp); global batch = micro x dp x micro-batches
    world = lay.n_gpus
    assert world % (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
                    * args.context_parallel_size) == 0
    megatron_dp = world // (lay.tp * lay.pp * lay.cp)
    assert megatron_dp == lay.dp * lay.ep
    assert args.micro_batch_size == lay.micro_batch
    assert args.global_batch_size == lay.micro_batch * megatron_dp * lay.grad_accum
    if args.pipeline_model_parallel_layout:
        stages = parse_pipeline_layout(args.pipeline_model_parallel_layout)
        assert len(stages) == lay.pp * lay.vp
        assert stages[0].startswith("E") and stages[-1].endswith("L")
        assert "".join(stages).count("t") == m.n_layers
        per_rank = [sum(stages[v * lay.pp + s].count("t") for v in range(lay.vp)) for s in range(lay.pp)]
        assert per_rank == stage_layers(m.n_layers, lay.pp)
    elif lay.vp > 1:
        assert args.num_layers_per_virtual_pipeline_stage * lay.pp * lay.vp == m.n_layers
    if lay.recompute == "full":
        assert (args.recompute_granularity, args.recompute_method) == ("full", "uniform")
    elif lay.recompute == "selective":
        assert args.recompute_granularity == "selective"
    else:
        assert args.recompute_granularity is None
    assert args.use_distributed_optimizer == (lay.zero_stage >= 1)
    if lay.zero_stage >= 2:
        assert args.use_megatron_fsdp
    assert args.bf16


def test_fsdp_with_pipeline_parallelism_runs_under_megatron_fsdp_not_torch_fsdp2():
    """Megatron-LM's validate_args: '--use-torch-fsdp2 is not supported with pipeline
    parallelism'. Qwen2.5 (tied, a qwen2 model torchtitan does not build) goes to Megatron,
    which shards it with Megatron FSDP instead."""
    lay = Layout(dp=4, pp=2, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=8,
                 seq_len=2048, recompute="full")
    r = evaluate(SMALL, lay)
    assert default_stack(SMALL, lay) == "megatron"
    assert set(plan_files(r, EmitOptions(scheduler="none"))) == {"megatron_args.txt", "launch.sh"}
    argv = to_megatron_args(r)
    args = megatron_parse(argv)
    assert not args.use_torch_fsdp2 and args.use_megatron_fsdp
    assert args.data_parallel_sharding_strategy == "optim_grads_params"
    assert args.global_batch_size == 32 and args.pipeline_model_parallel_size == 2
    assert megatron_args_errors(argv, LaunchEnv(world_size=8, cuda_device_max_connections=None,
                                                device_arch_major=9)) == []
    with pytest.raises(UserError, match="does not offload parameters"):
        check_options(r, EmitOptions(offload_params="cpu", stack="megatron"))


def test_pipeline_layout_string():
    assert pipeline_layout(24, 5, 1) == "Et*4|t*5|t*5|t*5|t*5L"
    assert pipeline_layout(4, 2, 2) == "Et|t|t|tL"


def test_megatron_refuses_what_it_cannot_run():
    with pytest.raises(UserError, match="does not offload parameters"):
        to_megatron_args(_mp_plan(*MODEL_PARALLEL[4]), EmitOptions(offload_params="cpu"))
    r = _mp_plan(*MODEL_PARALLEL[0])
    with pytest.raises(UserError, match="CPU only"):
        to_megatron_args(r, EmitOptions(offload_optimizer="nvme"))
    assert "--optimizer-cpu-offload" in to_megatron_args(r, EmitOptions(offload_optimizer="cpu"))


# ------------------------------------------------------------------ FSDP, accelerate

FSDP_PLANS = [
    (sharding, offload, prec, tp, cp)
    for sharding in ("fsdp-full", "fsdp-grad-op", "fsdp-hybrid")
    for offload in ("none", "cpu")
    for prec in ("bf16-mixed", "fp16-mixed", "fp32")
    for tp, cp in ((1, 1), (2, 1), (1, 2))
]


def fsdp_plan(sharding: str, prec: str = "bf16-mixed", tp: int = 1, cp: int = 1, n_gpus: int = 16):
    dp = n_gpus // (tp * cp)
    stage = 2 if sharding == "fsdp-grad-op" else 3
    lay = Layout(dp=dp, tp=tp, cp=cp, sp=tp > 1, zero_stage=stage, sharding=sharding, micro_batch=1,
                 grad_accum=64 // dp, seq_len=2048, recompute="full")
    return evaluate(SMALL, lay, precision=prec)


@pytest.mark.slow
def test_accelerate_config_is_read_by_accelerates_own_loader(tmp_path, monkeypatch):
    require("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    parser = launch_command_parser()
    launch_dests = {a.dest for a in parser._actions}
    for i, (sharding, offload, prec, tp, cp) in enumerate(FSDP_PLANS):
        r = fsdp_plan(sharding, prec, tp, cp)
        lay = r.best.layout
        opts = EmitOptions(offload_params=offload)
        cfg = to_accelerate_config(r, opts)
        path = tmp_path / f"accelerate_{i}.yaml"
        path.write_text(to_yaml(cfg))
        loaded = load_config_from_file(str(path))
        assert isinstance(loaded, ClusterConfig) and loaded.distributed_type == DistributedType.FSDP
        assert loaded.num_processes == lay.n_gpus
        assert loaded.num_machines == node_shape(lay.n_gpus, H100.gpus_per_node)[0]
        assert set(loaded.fsdp_config) <= launch_dests      # every key is a flag accelerate defines
        assert {k for k in loaded.parallelism_config} <= launch_dests

        args = parser.parse_args(["--config_file", str(path), "train.py"])
        args, _defaults, _mp = _validate_launch_command(args)
        assert args.use_fsdp and str(args.fsdp_version) == "2"
        env = prepare_multi_gpu_env(args)
        for k in [k for k in __import__("os").environ if k.startswith(("FSDP_", "PARALLELISM_CONFIG_"))]:
            monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2
        assert plugin.reshard_after_forward == (sharding != "fsdp-grad-op")
        assert (type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") == (offload == "cpu")
        assert plugin.activation_checkpointing == (lay.recompute == "full")
        assert env["ACCELERATE_MIXED_PRECISION"] == {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "fp32": "no"}[prec]
        if "parallelism_config" in cfg:
            pc = ParallelismConfig()
            assert pc.total_size == lay.n_gpus and pc.tp_size == tp and pc.cp_size == cp
            if sharding == "fsdp-hybrid":
                assert pc.dp_replicate_size > 1
        else:
            assert sharding != "fsdp-hybrid" and tp == cp == 1


@pytest.mark.slow
def test_decoder_layer_classes_exist_in_transformers():
    require("transformers")
    import importlib

    assert set(DECODER_LAYER_CLASS) == set(SUPPORTED_MODEL_TYPES)
    for mt, cls in DECODER_LAYER_CLASS.items():
        folder = {"llama4_text": "llama4", "gemma3_text": "gemma3", "qwen3_5_text": "qwen3_5",
                  "qwen3_5_moe_text": "qwen3_5_moe"}.get(mt, mt)   # text models of multimodal families
        mod = importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
        assert hasattr(mod, cls), (mt, cls)


def _torchrun_args(cmd: list[str]):
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    assert cmd[0] == "torchrun"
    args = get_args_parser().parse_args(cmd[1:])
    lo, hi = parse_min_max_nnodes(args.nnodes)
    assert lo == hi
    return args, lo


@pytest.mark.parametrize("n_gpus", [8, 16, 64])
def test_torchrun_command_parses_with_torchruns_own_parser(n_gpus):
    require("torch")
    r = fsdp_plan("fsdp-full", n_gpus=n_gpus)
    args, nodes = _torchrun_args(to_torchrun_command(r))
    assert nodes * int(args.nproc_per_node) == n_gpus
    assert args.training_script == "train.py"
    assert (args.standalone, args.rdzv_backend) == ((True, "static") if nodes == 1 else (False, "c10d"))


@pytest.mark.parametrize("name, kw", MODEL_PARALLEL[:3])
def test_megatron_launch_is_torchrun_with_megatron_args(name, kw):
    require("torch")
    from planner.emit.fsdp import to_torchrun_command as tr

    r = _mp_plan(name, kw)
    cmd = tr(r, script="pretrain_gpt.py", script_args=tuple(to_megatron_args(r)))
    args, nodes = _torchrun_args(cmd)
    assert nodes * int(args.nproc_per_node) == r.best.layout.n_gpus
    megatron_parser().parse_args(args.training_script_args)


# ------------------------------------------------------------- DeepSpeed launcher

@pytest.mark.parametrize("dp", [2, 8, 64])
def test_deepspeed_launcher_and_hostfile(dp):
    require("deepspeed")
    from deepspeed.launcher.runner import _parse_hostfile, parse_args

    r = evaluate(SMALL, zero_layout(dp, 2, 1))
    args = parse_args(to_deepspeed_command(r)[1:])
    pool = _parse_hostfile(to_hostfile(r).splitlines())
    assert sum(pool.values()) == dp
    assert args.num_gpus == min(dp, 8) and args.user_script == "train.py"
    if dp > 8:
        assert args.num_nodes == len(pool) == dp // 8
    assert args.user_args[-2:] == ["--deepspeed_config", "ds_config.json"]


# --------------------------------------------------------------- files and writes

SCHEDULER_FILES = {"slurm.sbatch", "pytorchjob.yaml"}


@pytest.mark.parametrize("kind", ["deepspeed", "hf", "megatron"])
def test_plan_files_per_stack_and_launch_scripts_parse(kind, tmp_path):
    """Write only what the stack reads: no ds_config.json for Megatron plans (issue 19)."""
    if kind == "deepspeed":
        r = evaluate(SMALL, zero_layout(8, 3, 1))
        expect = {"ds_config.json", "hostfile", "config.json", "train.py", "launch.sh"}
    elif kind == "hf":
        r = fsdp_plan("fsdp-hybrid")
        expect = {"accelerate_config.yaml", "config.json", "train.py", "launch.sh"}
    else:
        r = _mp_plan(*MODEL_PARALLEL[0])
        expect = {"megatron_args.txt", "launch.sh"}
    assert default_stack(r.model, r.best.layout) == kind
    files = plan_files(r)
    assert set(files) == expect | SCHEDULER_FILES
    from planner.stacks import load_stacks
    assert set(load_stacks()[kind].files) == expect          # the catalog says the same
    paths = write_files(tmp_path, files)
    sh = tmp_path / "launch.sh"
    assert sh in paths and sh.stat().st_mode & 0o111
    out = subprocess.run(["bash", "-n", str(sh)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_write_refuses_to_overwrite_and_writes_nothing(tmp_path):
    (tmp_path / "b.txt").write_text("old")
    with pytest.raises(UserError, match="already exists"):
        write_files(tmp_path, {"a.txt": "new a", "b.txt": "new b"})
    assert not (tmp_path / "a.txt").exists() and (tmp_path / "b.txt").read_text() == "old"
    write_files(tmp_path, {"a.txt": "new a", "b.txt": "new b"}, force=True)
    assert (tmp_path / "b.txt").read_text() == "new b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]   # no temporary files left


def test_failed_write_leaves_no_file_and_no_temporary(tmp_path, monkeypatch):
    import os

    calls = []

    def failing_fsync(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(UserError, match="No space left"):
        write_files(tmp_path / "out", {"a.txt": "a", "b.txt": "b"})
    assert list(tmp_path.iterdir()) == []       # no --out directory, no staging directory left


def test_to_yaml_round_trips():
    yaml = require("yaml")
    d = {"a": 1, "b": True, "c": "x: y", "d": {"e": 0.5, "f": None, "g": "LlamaDecoderLayer"}}
    assert yaml.safe_load(to_yaml(d)) == d


# ------------------------------------------------------------------------- CLI

def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


BASE = ("--model", "qwen2.5-0.5b", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1",
        "--zero", "3", "--micro-batch", "2", "--recompute", "full")


def test_cli_out_writes_configs_atomically_and_refuses_overwrite(tmp_path):
    out = tmp_path / "cfg"
    r = run(*BASE, "--json", "--out", str(out), "--offload-optimizer", "cpu")
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "ds_config.json", "hostfile", "launch.sh",
                                                     "plan.json",
                                                     "pytorchjob.yaml", "slurm.sbatch", "train.py"]
    assert json.loads((out / "plan.json").read_text()) == printed
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["train_batch_size"] == 1024
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    before = (out / "plan.json").stat().st_mtime_ns
    r = run(*BASE, "--out", str(out))
    assert r.exit_code == 2 and "already exists" in r.output and "--force" in r.output
    assert (out / "plan.json").stat().st_mtime_ns == before
    r = run(*BASE, "--out", str(out), "--force", "--micro-batch", "4")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"] == 4


@pytest.mark.parametrize("extra, needle", [
    (("--zero", "2", "--offload-params", "cpu"), "--offload-params cpu needs sharded parameters"),
    (("--zero", "0", "--offload-optimizer", "cpu"), "needs ZeRO-1"),
    (("--force",), "--force needs --out"),
])
def test_cli_offload_and_out_errors(extra, needle, tmp_path):
    r = run(*BASE, *extra)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_cli_out_for_a_plan_that_does_not_fit(tmp_path):
    r = run("--model", "70b", "--gpus", "h100", "--dp", "1", "--tp", "1", "--pp", "1", "--cp", "1",
            "--zero", "0", "--micro-batch", "1", "--recompute", "none", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and "DOES NOT FIT" in r.output             # the report, then one line
    assert r.output.rstrip().splitlines()[-1].startswith("error: no plan fits, so nothing was written")
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_plain_plan_with_out_stays_torch_free(tmp_path):
    code = ("import sys; from planner.cli.main import main; "
            f"sys.argv=['plan','--model','8b','--gpus','h100','--out',{str(tmp_path / 'o')!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules, 'heavy import'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (Path(tmp_path) / "o" / "launch.sh").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3.1-8b", "mixtral-8x7b", "qwen2.5-0.5b", "gpt2-xl", "bert-base"])
def test_hf_config_written_for_deepspeed_and_accelerate_builds_the_planners_model(name, tmp_path):
    """config.json is what a transformers script under DeepSpeed or accelerate reads: built
    on the meta device by transformers, it has the planner's parameter count."""
    require("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    m = load_model(name)
    lay = zero_layout(8, 3, 1)
    lay = Layout(**{**{f: getattr(lay, f) for f in lay.__dataclass_fields__}, "seq_len": min(2048,
                                                                                             m.max_positions or 2048)})
    r = api.evaluate_layout(m, get_gpu("h200"), TrainingSetup(seq_len=lay.seq_len, global_batch=lay.global_batch), lay)
    files = plan_files(r, EmitOptions(scheduler="none"))
    assert {"ds_config.json", "config.json"} <= set(files)
    write_files(tmp_path, files)
    cfg = AutoConfig.from_pretrained(str(tmp_path))
    auto = AutoModelForMaskedLM if m.model_type == "bert" else AutoModelForCausalLM   # as test_param_counts
    with torch.device("meta"):
        model = auto.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n == count_params(m).total


def test_deepspeed_bf16_moments_only_with_bf16_master_weights():
    """--optimizer adamw-bf16-states on DeepSpeed: with --precision bf16 under ZeRO the config
    sets bf16.bf16_optimizer_states and DeepSpeedConfig (0.19.8) accepts it; with fp32 master
    weights (bf16-mixed) DeepSpeed has no such option and --out says so."""
    require("deepspeed")
    from deepspeed_config import validate_deepspeed_config

    r = evaluate(SMALL, zero_layout(8, 2, 1), precision="bf16", optimizer="adamw-bf16-states")
    check_options(r, EmitOptions())
    parsed = validate_deepspeed_config(to_deepspeed_config(r), data_parallel=8)
    assert parsed.bfloat16_config.bf16_optimizer_states and parsed.bfloat16_config.bf16_master_weights_and_grads
    mixed = evaluate(SMALL, zero_layout(8, 2, 1), optimizer="adamw-bf16-states")
    with pytest.raises(UserError, match="DeepSpeed keeps bf16 moments only with bf16 master weights"):
        check_options(mixed, EmitOptions(stack="deepspeed"))
