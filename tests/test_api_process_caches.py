"""Caches that live as long as the process must not carry one Python API call's inputs into
another's answer (issue 32's review): a GPU file rewritten between two plans, and two plans on
GPUs, efficiencies and fragmentations of the same name but other values. The expected answers
come from a fresh interpreter that never saw the first inputs (a subprocess), and the GPU's
figures from the file itself."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from planner import api
from planner.hardware.gpus import get_gpu, load_gpus
from planner.models.load import load_preset
from planner.timing.efficiency import Efficiency
from planner.training.setup import Overheads, TrainingSetup


def _gpu_toml(memory_mib: int, bf16_tflops: float) -> str:
    h100 = load_gpus()["h100"]
    return f"""[[gpu]]
name = "mine"
architecture = "hopper"
full_name = "my GPU"
memory_mib = {memory_mib}
bf16_tflops = {bf16_tflops}
fp16_tflops = {bf16_tflops}
fp8_tflops = {2 * bf16_tflops}
tf32_tflops = {bf16_tflops / 2}
fp32_tflops = 60.0
hbm_gb_per_s = 3350
gpus_per_node = {h100.gpus_per_node}
intra_node_link = "nvlink4-nvswitch"
intra_node_gb_per_s = 450
inter_node_gbit_per_s = 400
tdp_w = 700
source = "a test's GPU"
"""


def test_a_rewritten_gpu_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(_gpu_toml(81559, 989.4))
    assert get_gpu(str(path)).memory_bytes == 81559 * 2**20      # the file's memory_mib, in bytes
    path.write_text(_gpu_toml(40960, 400.0))
    assert get_gpu(str(path)).memory_bytes == 40960 * 2**20
    assert get_gpu(str(path)) is get_gpu(str(path))              # the same text: the same object


# the second plan of one process against the same plan alone in a fresh interpreter
_PLAN = """
import json, sys
from dataclasses import replace
from planner import api
from planner.hardware.gpus import get_gpu
from planner.models.load import load_preset
from planner.timing.efficiency import Efficiency
from planner.training.setup import Overheads, TrainingSetup
gpu_path, mem, matmul, frag = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
gpu = replace(get_gpu(gpu_path), memory_bytes=mem)
r = api.plan(load_preset("llama3.1-8b"), gpu, TrainingSetup(seq_len=4096, overheads=Overheads(fragmentation=frag)),
             efficiency=Efficiency(matmul_fraction=matmul))
print(json.dumps([repr(r.best.layout), r.best.time.step_time_s, r.best.memory.total]))
"""


def _answer(r: api.PlanResult) -> list:
    assert r.best is not None
    return [repr(r.best.layout), r.best.time.step_time_s, r.best.memory.total]


def test_a_second_plan_in_one_process_is_the_plan_alone(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(_gpu_toml(81559, 989.4))
    m = load_preset("llama3.1-8b")
    answers = []
    for mem, matmul, frag in ((81559 * 2**20, 0.7, 0.10), (24 * 2**30, 0.5, 0.30)):
        gpu = replace(get_gpu(str(path)), memory_bytes=mem)       # the same name, other values
        setup = TrainingSetup(seq_len=4096, overheads=Overheads(fragmentation=frag))
        answers.append(_answer(api.plan(m, gpu, setup, efficiency=Efficiency(matmul_fraction=matmul))))
    alone = subprocess.run([sys.executable, "-c", _PLAN, str(path), str(24 * 2**30), "0.5", "0.30"],
                           capture_output=True, text=True, check=True, timeout=300)
    assert answers[1] == json.loads(alone.stdout)
    assert answers[0] != answers[1]


def test_a_rewritten_calibration_file_is_the_file_alone(tmp_path: Path) -> None:
    # `plan calibrate` on the Megatron sample log, then the plan with its file and with the file
    # rewritten to other values (the same path), in one process; the second against a fresh one
    from click.testing import CliRunner

    from planner.cli.main import cli

    examples = Path(__file__).resolve().parent.parent / "examples" / "calibrate"
    first, path = tmp_path / "first.toml", tmp_path / "cal.toml"
    made = CliRunner().invoke(cli, ["calibrate", str(examples / "megatron_llama2-7b_h100x8.log"), "--model",
                                    "llama2-7b", "--gpus", "h100", "--dp", "4", "--tp", "2", "--pp", "1", "--cp", "1",
                                    "--zero", "1", "--micro-batch", "1", "--seq-len", "4096", "--recompute",
                                    "selective", "--out", str(first), "--force"])
    assert made.exit_code == 0, made.output
    text = first.read_text()
    other = "\n".join("matmul_fraction = 0.31" if line.startswith("matmul_fraction =") else
                      "fragmentation = 0.45" if line.startswith("fragmentation =") else line
                      for line in text.splitlines()) + "\n"
    args = ["--model", "llama2-7b", "--gpus", "h100", "--json", "--calibration", str(path)]
    answers = []
    for t in (text, other):
        path.write_text(t)
        r = CliRunner().invoke(cli, args, prog_name="plan")
        assert r.exit_code == 0, r.output
        answers.append({k: v for k, v in json.loads(r.output).items() if k != "search_s"})
    alone = subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, check=True,
                           timeout=300)
    assert answers[1] == {k: v for k, v in json.loads(alone.stdout).items() if k != "search_s"}
    assert answers[0] != answers[1]
