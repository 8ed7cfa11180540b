"""Issue 32, W1: a name (a model file's, a GPU file's ``name``, a topology's) is data in every
written file, never code.

The hostile test (issue 32's report) wrote a model file named ``$'x\\ntouch PWNED1\\n.json'``
and a GPU file with ``name = "mygpu\\ntouch PWNED4\\n"``: launch.sh ran the injected line, and
a name holding ``\"\"\"`` injected Python into torchtitan_job.py. Two defences, each tested:

- the loaders refuse names with control characters (one line, status 2);
- every emitted file quotes a name by one rule (planner.emit.label), checked here by each
  target's own parser: ``bash -n`` for launch.sh and slurm.sbatch, PyYAML's safe_load for
  pytorchjob.yaml and accelerate_config.yaml, Python's ast for torchtitan_job.py, json for
  the JSON files, with names given through the Python API (which has no loader to refuse
  them): the name's marker may appear only inside a comment or a string constant.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import require

from planner import api
from planner.cli.main import cli
from planner.emit import EmitOptions, label, plan_files
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.models.spec import load_model
from planner.training.setup import TrainingSetup

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "planner" / "presets" / "models" / "llama3.1-8b.json"
MY_3B = REPO / "examples" / "07-own-config" / "my-3b" / "config.json"
MARK = "PWNED"
HOSTILE = [
    f"x\ntouch {MARK}1\n",                               # the report's model file name
    f'z"""\nimport os; os.system("touch {MARK}3")\n"""',   # the report's torchtitan break-out
    f'z"""; import os; os.system("touch {MARK}5"); """',   # the same on one line (no control character)
    f"$(touch {MARK}6) `touch {MARK}7` '\"\\",               # shell expansions, quotes, a backslash
    f"a\rb\x1b[2J\x00\x85\u2028\u2029{MARK}8\\N",          # CR, ESC, NUL, NEL, line/paragraph separators
    f"\udcff{MARK}9",                                      # a file name byte that is not UTF-8 (surrogateescape)
]


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="plan")


def one_line_error(r, *needles: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in r.output, err
    for n in needles:
        assert n in err, (n, err)
    return err


# ------------------------------------------------------------------------ refused at load

@pytest.mark.parametrize("stem", ["x\ntouch PWNED1\n", "tab\there", "esc\x1b[31m", "sep\u2028x"])
def test_a_model_file_name_with_a_control_character_is_refused(tmp_path, stem):
    f = tmp_path / f"{stem}.json"
    shutil.copy(PRESET, f)
    one_line_error(run("--model", f, "--gpus", "h100", "--out", tmp_path / "o1"), "control character")
    assert not (tmp_path / "o1").exists()


def test_a_config_directory_with_a_control_character_is_refused(tmp_path):
    d = tmp_path / "evil\nname"
    d.mkdir()
    shutil.copy(PRESET, d / "config.json")
    one_line_error(run("--model", d, "--gpus", "h100", "-q"), "control character")


def test_a_gpu_file_name_with_a_newline_is_refused(tmp_path):
    # the report's GPU file: the catalog's h100 entry with name = "mygpu\ntouch PWNED4\n"
    text = (REPO / "planner" / "presets" / "gpus.toml").read_text()
    start = text.index('[[gpu]]\nname = "h100"')
    entry = text[start:text.index("[[gpu]]", start + 1)].replace('name = "h100"', 'name = "mygpu\\ntouch PWNED4\\n"')
    f = tmp_path / "evilgpu.toml"
    f.write_text(entry)
    one_line_error(run("--model", "8b", "--gpus", f, "--out", tmp_path / "o4"), "name", "control character")
    assert not (tmp_path / "o4").exists()
    f.write_text(entry.replace('"mygpu\\ntouch PWNED4\\n"', '"mygpu"').replace('aliases = [', 'aliases = ["a\\tb", '))
    one_line_error(run("--model", "8b", "--gpus", f), "aliases", "control character")


def test_a_topology_name_with_a_newline_is_refused(tmp_path):
    text = (REPO / "planner" / "presets" / "topologies" / "dgx-h100.toml").read_text()
    f = tmp_path / "t.toml"
    f.write_text(text.replace('name = "dgx-h100"', 'name = "dgx\\ntouch PWNED"', 1))
    one_line_error(run("--model", "8b", "--gpus", "h100", "--topology", f), "name", "control character")


def test_a_quoted_name_is_planned_and_the_quiet_answer_is_one_line(tmp_path):
    # no control character: accepted, and the -q answer stays one line
    f = tmp_path / 'z"""; $(touch PWNED) `x`.json'
    shutil.copy(PRESET, f)
    r = run("--model", f, "--gpus", "h100", "-q", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.strip().splitlines()) == 1, r.stdout
    check_set({p.name: p.read_text() for p in (tmp_path / "o").iterdir()})


# ------------------------------------------------------------------------ quoted when written

def check_bash(text: str, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text(text)
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    for line in text.splitlines():             # the name only in comments
        assert MARK not in line or line.lstrip().startswith("#"), line


def check_python(text: str) -> None:
    tree = ast.parse(text)                     # raises on a break-out that does not parse
    for node in ast.walk(tree):                # the name only inside string constants
        if isinstance(node, ast.Name | ast.Attribute):
            assert MARK not in ast.unparse(node)
        if isinstance(node, ast.Call):
            assert "system" not in ast.unparse(node.func), ast.unparse(node)


def check_yaml(text: str) -> None:
    data = yaml.safe_load(text)
    assert MARK not in json.dumps(data)          # the name only in the comments


def check_set(files: dict[str, str], tmp_path: Path | None = None) -> None:
    for name, text in files.items():
        if name.endswith((".sh", ".sbatch")):
            check_bash(text, tmp_path or Path(os.environ.get("TMPDIR", "/tmp")))
        elif name.endswith(".py"):
            check_python(text)
        elif name.endswith(".yaml"):
            check_yaml(text)
        elif name.endswith(".json"):
            json.loads(text)
        else:                                   # hostfile, megatron_args.txt: names only in comments
            assert all(MARK not in line or line.startswith("#") for line in text.splitlines()), text
        if name == "hostfile":                  # and DeepSpeed's own parser reads the hosts alone
            from deepspeed.launcher.runner import _parse_hostfile

            assert all(host.startswith("node-") for host in _parse_hostfile(text.splitlines()))


STACK_CASES = [
    # (model, stack, layout): each stack's files
    ("llama3.1-8b", "megatron", Layout(tp=2, micro_batch=1, grad_accum=8, seq_len=2048, recompute="full")),
    ("my-3b", "torchtitan", Layout(dp=2, pp=2, sharding="fsdp-full", zero_stage=3, micro_batch=1,
                                         grad_accum=8, seq_len=2048, recompute="full")),
    ("qwen2.5-0.5b", "deepspeed", Layout(dp=2, zero_stage=2, micro_batch=1, grad_accum=8, seq_len=2048,
                                         recompute="full")),
    ("qwen2.5-0.5b", "hf", Layout(dp=2, sharding="fsdp-full", zero_stage=3, micro_batch=1, grad_accum=8,
                                  seq_len=2048, recompute="full")),
]


@pytest.mark.slow
@pytest.mark.parametrize("model, stack, lay", STACK_CASES, ids=[c[1] for c in STACK_CASES])
@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_every_written_file_parses_with_a_hostile_name(tmp_path, model, stack, lay, hostile):
    # from its file (the emitters read the file's config.json); my-3b is no torchtitan flavour,
    # so its job also gets the planner_model() docstring
    path = MY_3B if stack == "torchtitan" else REPO / "planner" / "presets" / "models" / f"{model}.json"
    m = replace(load_model(str(path)), name=hostile)
    gpu = replace(get_gpu("h100"), name=hostile, default_topology=None)   # no topology names the GPU
    setup = TrainingSetup(seq_len=lay.seq_len, global_batch=lay.global_batch)
    r = api.evaluate_layout(m, gpu, setup, lay)
    assert r.best is not None and r.best.fits, lay.describe()
    files = plan_files(r, EmitOptions(stack=stack), {"model": m.name})
    assert {"launch.sh", "slurm.sbatch", "pytorchjob.yaml"} <= set(files)
    check_set(files, tmp_path)


def test_the_quoting_rule_keeps_plain_names_and_escapes_the_rest():
    assert label("llama3.1-8b") == "llama3.1-8b"         # every shipped name is written as before
    assert label("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert label('a"b') == '"a\\"b"' and label("a\nb") == '"a\\nb"' and label("a\\b") == '"a\\\\b"'
    assert all(label(h).isascii() and label(h).isprintable() for h in HOSTILE if not h.isprintable())


def test_the_python_api_refuses_a_master_address_that_is_code():
    with pytest.raises(UserError, match="not a host name"):
        EmitOptions(master_addr="$(touch PWNED)")
    with pytest.raises(UserError, match="control character"):
        EmitOptions(script="train.py\ntouch PWNED")


def test_a_job_name_with_a_control_character_is_refused(tmp_path):
    f = tmp_path / "jobs.yaml"
    f.write_text('jobs:\n  - name: "a\\nb\\x1b[31m"\n    model: gpt2\n    tokens: 1e9\n    deadline: 30d\n')
    one_line_error(run("buy", f, "--gpus", "h100", "-q"), "job name", "control character")


def test_a_gpu_file_with_a_5001_digit_integer_is_one_line(tmp_path):
    """bench/fuzz.py found it: tomllib's int(str) limit raised ValueError, exit 1."""
    text = (REPO / "planner" / "presets" / "gpus.toml").read_text()
    start = text.index('[[gpu]]\nname = "h100"')
    entry = text[start:text.index("[[gpu]]", start + 1)].replace("tdp_w = 700", "tdp_w = 1" + "0" * 5000)
    f = tmp_path / "gpu.toml"
    f.write_text(entry)
    one_line_error(run("--model", "gpt2", "--gpus", f), "not valid TOML")


@pytest.mark.slow
def test_torchtitan_loads_the_job_of_a_quoted_name_and_runs_nothing(tmp_path, monkeypatch):
    """The report's break-out: a name holding \"\"\" injected Python into torchtitan_job.py.
    torchtitan 0.3.0's own ConfigManager imports the job (as its trainer does); the injected
    os.system is never called, and the model keeps the name as its flavour."""
    require("torchtitan")
    require("triton")
    from test_emit_torchtitan import _load

    f = tmp_path / 'z"""; import os; os.system("touch PWNED3"); """.json'
    shutil.copy(MY_3B, f)
    out = tmp_path / "o3"
    r = run("--model", f, "--gpus", "h100", "--stack", "torchtitan", "--fsdp", "full", "--out", out, "-q")
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(tmp_path)
    config = _load(out)
    assert not (tmp_path / "PWNED3").exists()
    assert config.model_spec.flavor == f.stem
