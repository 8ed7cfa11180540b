"""The command line as a user runs it: answers, JSON schema, errors and exit codes."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from planner.cli.main import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


@pytest.mark.slow
def test_main_job_text():
    r = run("--model", "70b", "--gpus", "h100")
    assert r.exit_code == 0, r.output
    assert "llama3.1-70b" in r.output and "Smallest GPU count that fits" in r.output
    assert "Alternatives" in r.output and "Assumptions" in r.output


def test_main_job_json_schema():
    r = run("--model", "70b", "--gpus", "h100", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    # transformers' LlamaForCausalLM from the same config: 70,553,706,496 parameters
    assert {k: d["model"][k] for k in ("name", "n_params", "n_active_params")} == {
        "name": "llama3.1-70b", "n_params": 70_553_706_496, "n_active_params": 70_553_706_496}
    assert d["gpu"]["name"] == "h100" and d["gpu"]["memory_bytes"] > 80 * 10**9
    p = d["plan"]
    assert set(p["layout"]) >= {"dp", "tp", "pp", "cp", "ep", "zero_stage", "sharding", "micro_batch",
                                "grad_accum", "seq_len", "recompute"}
    mem = p["memory_bytes"]
    assert set(mem) == {"weights", "gradients", "optimizer", "activations", "logits", "buffers",
                        "overhead", "total"}
    assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
    assert p["fits"] is True and mem["total"] <= d["gpu"]["memory_bytes"]
    lay = p["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] * lay["ep"] == p["n_gpus"]
    assert isinstance(d["alternatives"], list) and d["alternatives"]
    for alt in d["alternatives"]:
        assert set(alt) >= set(p)
    assert d["assumptions"]["seq_len"] == 4096


def test_moe_reports_active_params():
    r = run("--model", "mixtral-8x7b", "--gpus", "h100", "--json")
    d = json.loads(r.output)
    # transformers: 46,702,792,704 total; 12,879,925,248 active (2 of 8 experts)
    assert d["model"]["n_params"] == 46_702_792_704
    assert d["model"]["n_active_params"] == 12_879_925_248


def test_fixed_layout_is_evaluated_exactly():
    r = run("--model", "8b", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1",
            "--zero", "3", "--micro-batch", "2", "--recompute", "full", "--json")
    d = json.loads(r.output)
    lay = d["plan"]["layout"]
    assert (lay["dp"], lay["zero_stage"], lay["micro_batch"], lay["recompute"]) == (8, 3, 2, "full")
    assert lay["grad_accum"] == 1024 // (8 * 2)
    assert d["alternatives"] == []


def test_fixed_layout_that_cannot_run_says_why():
    r = run("--model", "8b", "--gpus", "h100", "--dp", "1", "--tp", "3", "--pp", "1", "--cp", "1",
            "--zero", "0", "--micro-batch", "1", "--recompute", "none")
    assert r.exit_code == 2
    assert "tp=3 does not divide the 32 attention heads" in r.output


def test_fixed_layout_that_does_not_fit():
    r = run("--model", "70b", "--gpus", "h100", "--dp", "1", "--tp", "1", "--pp", "1", "--cp", "1",
            "--zero", "0", "--micro-batch", "1", "--recompute", "none", "--json")
    d = json.loads(r.output)
    assert d["plan"]["fits"] is False


@pytest.mark.parametrize("args, needle", [
    (("--model", "lama-70b", "--gpus", "h100"), "did you mean"),
    (("--model", "70b", "--gpus", "h10"), "did you mean h100"),
    (("--model", "70b"), "missing --gpus"),
    (("--gpus", "h100", "--model", "no/such/config.json"), "not found"),
    (("--model", "8b", "--gpus", "h100", "--zero", "2", "--fsdp", "full"), "contradict"),
    (("--model", "8b", "--gpus", "h100", "--ep", "2"), "mixture-of-experts"),
])
def test_user_errors_exit_2_with_one_line(args, needle):
    r = run(*args)
    assert r.exit_code == 2
    assert needle in r.output
    assert "Traceback" not in r.output


def test_405b_on_one_small_gpu_says_the_least_memory():
    r = run("--model", "405b", "--gpus", "4090", "--max-gpus", "4")
    assert r.exit_code == 2
    assert "fits from 96 x 4090" in r.output.lower() or "It fits from" in r.output, r.output


def test_config_json_errors_name_file_and_key(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    r = run("--model", str(cfg), "--gpus", "h100")
    assert r.exit_code == 2 and str(cfg) in r.output and "num_attention_heads" in r.output
    cfg.write_text(json.dumps({"model_type": "t5"}))
    r = run("--model", str(cfg), "--gpus", "h100")
    assert r.exit_code == 2 and "unsupported model_type 't5'" in r.output
    cfg.write_text("{not json")
    r = run("--model", str(cfg), "--gpus", "h100")
    assert r.exit_code == 2 and "not valid JSON" in r.output


def test_models_and_gpus_lists():
    r = run("models")
    assert r.exit_code == 0 and "llama3.1-405b" in r.output and "405,853,388,800" in r.output
    r = run("gpus")
    assert r.exit_code == 0 and "mi300x" in r.output


@pytest.mark.slow
def test_python_m_planner_and_no_heavy_imports():
    # `plan --help` and a plain plan must not import torch or deepspeed
    code = ("import sys; from planner.cli.main import main; sys.argv=['plan','--model','8b','--gpus','h100'];\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules, 'heavy import'\n"
            # on a shipped topology links and NVLink domain come from presets/links.json
            "assert 'networkx' not in sys.modules, 'graph built'\n"
            # the terminal report imports what only `plan measure` and `--task load` draw inside those
            # views (docs/performance.md, eighth pass: about 15 ms of a plain plan's start-up)
            "assert 'planner.measure.titan_moments' not in sys.modules, 'plan measure view'\n"
            "assert 'planner.memory.inference' not in sys.modules, '--task load view'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "planner", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--model" in out.stdout
