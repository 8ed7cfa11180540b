"""Every class of error a user can make, as the command line answers it: the message names
the input and the way out, the exit status is 2 (1 for an internal error, with a hint to
report it), and no traceback is printed.

Classes (issue #8): unknown model, GPU or topology (the closest names); a config file that
does not parse or lacks a field (the file, the key, what was expected); an impossible
request (the least memory any layout needs, what would make it fit); options that
contradict each other (which); an internal error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli

TOPOLOGIES = Path(__file__).resolve().parents[1] / "planner" / "presets" / "topologies"


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="plan")


def user_error(*args: str, needles: tuple[str, ...]) -> str:
    """Run a command that must fail as a user error: status 2, one line on stderr naming
    every needle, no traceback."""
    r = run(*args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


# ------------------------------------------------------------------------ unknown names

@pytest.mark.parametrize("args, needles", [
    (["--model", "8bb", "--gpus", "h100"], ("unknown model '8bb'", "did you mean 8b", "`plan models`")),
    (["--model", "lama3.1-8b", "--gpus", "h100"], ("unknown model", "llama3.1-8b")),
    (["--model", "8b", "--gpus", "h1000"], ("unknown GPU 'h1000'", "did you mean h100", "`plan gpus`")),
    (["--model", "8b", "--gpus", "h100", "--topology", "dgx-h10"],
     ("unknown topology 'dgx-h10'", "dgx-h100", "`plan topologies`")),
    (["explain", "--model", "8b", "--gpus", "a1000"], ("unknown GPU", "a100")),
    (["--model", "8b", "--gpus", "h100,a1000", "--tokens", "1T"], ("unknown GPU 'a1000'", "a100")),
])
def test_unknown_names_suggest_the_closest(args, needles):
    user_error(*args, needles=needles)


def test_unknown_names_inside_files(tmp_path):
    top = (TOPOLOGIES / "dgx-h100.toml").read_text().replace('gpu = "h100"', 'gpu = "h1000"')
    (tmp_path / "t.toml").write_text(top)
    user_error("--model", "8b", "--gpus", "h100", "--topology", tmp_path / "t.toml",
               needles=("t.toml", "gpu = 'h1000'", "did you mean h100"))
    (tmp_path / "jobs.yaml").write_text("jobs:\n  - {name: a, model: 8bx, tokens: 1T, deadline: 30d}\n")
    user_error("buy", tmp_path / "jobs.yaml", needles=("jobs.yaml", "job 'a'", "model '8bx'", "did you mean 8b"))
    (tmp_path / "gpus.yaml").write_text("gpus: [h100, h1000]\njobs:\n  - {name: a, model: 8b, tokens: 1T, "
                                        "deadline: 30d}\n")
    user_error("buy", tmp_path / "gpus.yaml", needles=("gpus.yaml", "gpus", "unknown GPU 'h1000'"))


# --------------------------------------------------------------------------- bad files

def test_config_json(tmp_path):
    p = tmp_path / "config.json"
    user_error("--model", tmp_path / "none.json", "--gpus", "h100", needles=("none.json", "not found", "plan models"))
    p.write_text('{"hidden_size": 12')
    user_error("--model", p, "--gpus", "h100", needles=("config.json", "not valid JSON", "line 1",
                                                       "Hugging Face config.json"))
    p.write_text("[1, 2]")
    user_error("--model", p, "--gpus", "h100", needles=("config.json", "expected a JSON object"))
    p.write_text('{"hidden_size": 64}')
    user_error("--model", p, "--gpus", "h100", needles=("config.json", "missing key 'model_type'", "llama"))
    p.write_text('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 8,'
                 ' "vocab_size": 100}')
    user_error("--model", p, "--gpus", "h100", needles=("config.json", "missing key 'num_hidden_layers'",
                                                       "model_type 'llama'"))
    p.write_text('{"model_type": "llama", "hidden_size": "x", "num_hidden_layers": 2, "num_attention_heads": 2,'
                 ' "intermediate_size": 8, "vocab_size": 100}')
    user_error("--model", p, "--gpus", "h100", needles=("config.json", "'hidden_size'", "must be an integer", "'x'"))


def test_topology_file(tmp_path):
    good = (TOPOLOGIES / "dgx-h100.toml").read_text()
    p = tmp_path / "cluster.toml"
    p.write_text('name = "x\n')
    user_error("--model", "8b", "--gpus", "h100", "--topology", p,
               needles=("cluster.toml", "not valid TOML", "line 1", "topologies/README.md"))
    p.write_text('name = "x"\ngpu = "h100"\n')
    user_error("--model", "8b", "--gpus", "h100", "--topology", p,
               needles=("cluster.toml", "missing keys", "gpus_per_node", "intra_node"))
    p.write_text(good.replace("gpu_link_gb_per_s = 450", "# removed"))
    user_error("--model", "8b", "--gpus", "h100", "--topology", p,
               needles=("cluster.toml", "[intra_node]", "missing keys ['gpu_link_gb_per_s']"))
    p.write_text(good.replace("gpus_per_node = 8", 'gpus_per_node = "8"'))
    user_error("--model", "8b", "--gpus", "h100", "--topology", p,
               needles=("cluster.toml", "gpus_per_node", "an integer from 1 to 256", "'8'"))
    p.write_text(good.replace('fabric = "nvswitch"', 'fabric = "nvswich"'))
    user_error("--model", "8b", "--gpus", "h100", "--topology", p,
               needles=("cluster.toml", "fabric", "one of", "'nvswich'"))
    user_error("--model", "8b", "--gpus", "h100", "--topology", tmp_path / "none.toml",
               needles=("none.toml", "not found"))


@pytest.mark.parametrize("text, needles", [
    ("jobs:\n - [\n", ("not valid YAML",)),
    ("jobz: []\n", ("a mapping with a `jobs:` list", "examples/jobs.yaml")),
    ("jobs: 5\n", ("`jobs:` must be a non-empty list",)),
    ("jobs:\n  - {name: a, model: 8b, tokens: 1T}\n", ("job 'a'", "missing deadline")),
    ("jobs:\n  - {name: a, model: 8b, tokens: lots, deadline: 30d}\n", ("job 'a'", "tokens 'lots'", "2e12")),
    ("jobs:\n  - {name: a, model: 8b, tokens: 1T, deadline: 30d, seq_len: long}\n",
     ("job 'a'", "seq_len", "whole number", "'long'")),
    ("jobs:\n  - {name: a, model: 8b, tokens: 1T, deadline: 30d, colour: red}\n", ("job 'a'", "unknown keys",
                                                                                  "colour", "allowed")),
])
def test_jobs_file(tmp_path, text, needles):
    p = tmp_path / "jobs.yaml"
    p.write_text(text)
    user_error("buy", p, needles=("jobs.yaml", *needles))


def test_prices_file(tmp_path):
    p = tmp_path / "prices.toml"
    p.write_text('[nope]\nrent_per_gpu_hour = 2\n')
    user_error("gpus", "--prices", p, needles=("prices.toml", "unknown keys ['nope']", "allowed"))


# ------------------------------------------------------------------- impossible requests

def test_405b_on_one_gpu_says_the_least_memory_and_the_ways_out():
    r = run("--model", "405b", "--gpus", "h100", "--max-gpus", "1")
    assert r.exit_code == 2 and "Traceback" not in r.output
    out = " ".join(r.stdout.split())       # the panel wraps lines
    for needle in ("No layout fits on 1 x h100", "6,047.69 GiB", "16 B per parameter", "at least 76 x h100",
                   "It fits from 96 x h100", "--max-gpus"):
        assert needle in out, needle
    # 8.3 TiB per GPU on one GPU: no catalog GPU holds it, so none is offered (issue 20); nor
    # offload or QLoRA, which do not fit on one GPU either (re-planned: tests/test_advice_replans.py)
    assert "A GPU with" not in out and "--offload" not in out and "--method qlora" not in out


@pytest.mark.slow
def test_no_fit_with_a_layout_sized_names_its_memory():
    r = run("--model", "8b", "--gpus", "h100", "--n-gpus", "8", "--seq-len", "1048576", "--global-batch", "8")
    assert r.exit_code == 2
    out = " ".join(r.stdout.split())
    assert "The least memory any layout needs is 124.24 GiB per GPU, on 8 x h100" in out
    # 124 GiB is mostly activations: QLoRA does not fit (re-planned), half the sequence does
    assert "It fits from 16 x h100" in out and "--seq-len 524288 fits on 8 x h100" in out


def test_impossible_json_is_still_parseable():
    r = run("--model", "405b", "--gpus", "h100", "--max-gpus", "1", "--json")
    d = json.loads(r.stdout)
    assert d["plan"] is None and d["min_gpus_for_model_states"] == 76 and d["fits_from_gpus"] == 96
    assert r.exit_code == 2 and any("It fits from 96 x h100" in a for a in d["advice"])


@pytest.mark.parametrize("args, needles", [
    (["--tp", "3"], ("--tp 3", "llama3.1-8b", "32 attention heads")),
    (["--pp", "64"], ("--pp 64", "exceeds the 32 layers")),
    (["--cp", "3"], ("--cp 3", "sequence 4096")),
    (["--ep", "2"], ("--ep 2", "mixture-of-experts", "dense")),
    (["--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3", "--micro-batch", "3",
      "--recompute", "none"], ("--global-batch 1024", "micro-batch 3", "change --global-batch")),
])
def test_layouts_the_model_cannot_run(args, needles):
    user_error("--model", "8b", "--gpus", "h100", *args, needles=needles)


def test_ep_that_does_not_divide_the_experts():
    user_error("--model", "mixtral-8x7b", "--gpus", "h100", "--ep", "3", needles=("--ep 3", "8 experts"))


# ------------------------------------------------------------------ contradicting options

@pytest.mark.parametrize("args, needles", [
    (["--zero", "2", "--fsdp", "full"], ("--zero 2", "--fsdp full", "contradict")),
    (["--vp", "2", "--pp", "1"], ("--vp 2", "--pp 1", "--pp 2 or more")),
    (["--sp", "--tp", "1"], ("--sp", "--tp is 1", "--tp 2 or more")),
    (["--offload-params", "cpu", "--zero", "1"], ("--offload-params cpu", "--zero 1", "--zero 3 or --fsdp full")),
    (["--offload-params", "cpu", "--fsdp", "grad-op"], ("--offload-params cpu", "--fsdp grad-op")),
    (["--offload-params", "nvme", "--fsdp", "full"], ("--offload-params nvme", "--fsdp full", "CPU memory only")),
    (["--offload-params", "cpu", "--zero", "3", "--tp", "2"], ("--offload-params cpu", "--tp 2")),
    (["--offload-optimizer", "cpu", "--zero", "0"], ("--offload-optimizer cpu", "--zero is 0", "ZeRO-1")),
    (["--offload-optimizer", "cpu", "--fsdp", "full"], ("--offload-optimizer cpu", "--fsdp full",
                                                        "--offload-params cpu")),
    (["--offload-optimizer", "nvme", "--zero", "2"], ("--offload-optimizer nvme", "--zero 3", "--zero 2")),
    (["--zero", "2", "--pp", "2"], ("--zero 2", "--pp 2", "ZeRO stage 0 or 1")),
    (["--method", "lora", "--quant", "int4", "--tp", "2"], ("--quant int4", "--tp 2", "data parallelism")),
    (["--n-gpus", "8", "--dp", "16"], ("--n-gpus 8", "--dp 16")),
    (["--n-gpus", "12", "--dp", "2", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1", "--micro-batch", "1",
      "--recompute", "none"], ("--n-gpus 12", "dp x tp x pp x cp x ep = 2")),
    (["--grad-accum", "4", "--micro-batch", "1", "--dp", "8", "--global-batch", "64"],
     ("--global-batch 64", "--grad-accum", "= 32")),
    (["--grad-accum", "4"], ("--grad-accum needs --micro-batch and --dp",)),
    (["--lora-rank", "8"], ("--lora-rank needs --method lora",)),
    (["--trainable-layers", "2", "--method", "lora"], ("--trainable-layers needs --method freeze",)),
    (["--method", "qlora", "--quant", "int8"], ("--method qlora", "--method lora --quant int8")),
    (["--deadline", "30d"], ("--deadline needs --tokens",)),
    (["--budget", "1M"], ("--budget needs --tokens",)),
    (["--force"], ("--force needs --out",)),
    (["--task", "load", "--dp", "2"], ("--dp is a training option", "--task load")),
    (["--gpus", "h100,a100"], ("--gpus takes one GPU type without --tokens",)),
    (["--quiet", "--json"], ("--quiet", "--json", "give one of them")),
])
def test_contradicting_options_are_named(args, needles):
    base = ["--model", "8b"] + ([] if "--gpus" in args else ["--gpus", "h100"])
    user_error(*base, *args, needles=needles)


def test_explain_and_measure_check_contradictions_too():
    user_error("explain", "--model", "8b", "--gpus", "h100", "--vp", "2", "--pp", "1", needles=("--vp 2", "--pp 1"))
    user_error("explain", "--model", "8b", "--gpus", "h100", "--zero", "1", "--fsdp", "full",
               needles=("--zero 1", "--fsdp full"))


def test_click_usage_errors_exit_2():
    r = run("--model", "8b", "--gpus", "h100", "--zero", "7")
    assert r.exit_code == 2 and "--zero" in r.output and "Traceback" not in r.output
    r = run("--nonesuch")
    assert r.exit_code == 2 and "No such option" in r.output


# ------------------------------------------------------------------------ internal errors

@pytest.mark.parametrize("target, args", [
    ("planner.api.plan", ["--model", "8b", "--gpus", "h100"]),
    ("planner.api.evaluate_layout", ["explain", "--model", "8b", "--gpus", "h100", "--dp", "8", "--tp", "1",
                                     "--pp", "1", "--cp", "1", "--zero", "3", "--micro-batch", "1",
                                     "--recompute", "none"]),
    ("planner.cost.buy.plan_purchase", ["buy", "examples/jobs.yaml"]),
    ("planner.models.spec.count_params", ["models"]),
])
def test_internal_error_exits_1_with_a_hint(monkeypatch, target, args):
    import importlib

    module, name = target.rsplit(".", 1)

    def boom(*a, **k):
        raise RuntimeError("something broke")

    monkeypatch.setattr(importlib.import_module(module), name, boom)
    monkeypatch.delenv("PLANNER_TRACEBACK", raising=False)
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    r = run(*args)
    assert r.exit_code == 1, r.output
    err = r.stderr.strip()
    assert "\n" not in err and "Traceback" not in r.output
    assert err.startswith("internal error: RuntimeError: something broke")
    assert "bug in planner" in err and "report" in err


@pytest.mark.slow
def test_a_user_terminal_sees_no_traceback(tmp_path):
    """The real entry point, for a user error and for an internal one."""
    r = subprocess.run([sys.executable, "-m", "planner", "--model", "8bb", "--gpus", "h100"],
                       capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: unknown model '8bb'")
    code = ("import sys, planner.api as api\n"
            "def boom(*a, **k): raise KeyError('x')\n"
            "api.plan = boom\n"
            "sys.argv = ['plan', '--model', '8b', '--gpus', 'h100']\n"
            "from planner.cli.main import main\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().startswith("internal error: KeyError") and "report" in r.stderr
