"""Shell completion through click: `_PLAN_COMPLETE=bash_source plan` (zsh, fish) prints a
script, `plan completion SHELL` prints the same, and model, GPU and topology names complete
from the catalogs without importing the heavy modules."""

import os
import subprocess
import sys

import pytest
from click.shell_completion import ShellComplete
from click.testing import CliRunner

from planner.cli.main import cli


def complete(args: list[str], incomplete: str) -> list[tuple[str, str]]:
    items = ShellComplete(cli, {}, "plan", "_PLAN_COMPLETE").get_completions(args, incomplete)
    return [(i.type, i.value) for i in items]


@pytest.mark.parametrize("shell, marker", [("bash", "_plan_completion()"), ("zsh", "#compdef plan"),
                                           ("fish", "function _plan_completion")])
def test_source_script(shell, marker):
    r = CliRunner().invoke(cli, [], prog_name="plan", env={"_PLAN_COMPLETE": f"{shell}_source"})
    assert r.exit_code == 0 and marker in r.output and "_PLAN_COMPLETE" in r.output
    c = CliRunner().invoke(cli, ["completion", shell], prog_name="plan")
    assert c.exit_code == 0 and c.output.strip() == r.output.strip()


def test_completion_command_rejects_other_shells():
    r = CliRunner().invoke(cli, ["completion", "powershell"], prog_name="plan")
    assert r.exit_code == 2 and "powershell" in r.output


def test_installed_entry_point_prints_the_script():
    env = {**os.environ, "_PLAN_COMPLETE": "bash_source"}
    r = subprocess.run([sys.executable, "-m", "planner"], env=env, capture_output=True, text=True, check=False,
                       timeout=60)
    assert r.returncode == 0 and "complete -o nosort -F _plan_completion plan" in r.stdout


def test_model_gpu_topology_names():
    assert ("plain", "llama3.1-8b") in complete(["--model"], "llama3.1-")
    assert ("plain", "llama3.1-8b") in complete(["explain", "--model"], "llama3.1")
    assert ("plain", "8b") in complete(["--model"], "8")              # aliases too
    assert ("plain", "h100") in complete(["--gpus"], "h1")
    assert all(v.startswith("h1") for _, v in complete(["--gpus"], "h1"))
    assert ("plain", "h100,b200") in complete(["--gpus"], "h100,b2")   # a list: the last item
    assert ("plain", "h200") in complete(["buy", "jobs.yaml", "--gpus"], "h2")
    assert ("plain", "dgx-h100") in complete(["--topology"], "dgx")
    assert complete(["--model"], "./conf") == [("file", "./conf")]     # a path completes as a file
    assert complete(["--topology"], "clusters/my") == [("file", "clusters/my")]
    assert ("plain", "explain") in complete([], "ex")


def test_completion_imports_nothing_heavy():
    code = ("import sys\n"
            "from click.shell_completion import ShellComplete\n"
            "from planner.cli.main import cli\n"
            "sc = ShellComplete(cli, {}, 'plan', '_PLAN_COMPLETE')\n"
            "for a, i in ((['--model'], 'll'), (['--gpus'], 'h'), (['--topology'], 'd')):\n"
            "    assert sc.get_completions(a, i)\n"
            "heavy = [m for m in ('networkx', 'pulp', 'torch', 'deepspeed', 'numpy') if m in sys.modules]\n"
            "print(heavy)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ------------------------------------------------------------------------ issue 32: E4, U12

@pytest.mark.slow
@pytest.mark.parametrize("env", [
    {"_PLAN_COMPLETE": "bash_complete"},               # a stray export: no COMP_WORDS (KeyError in click)
    {"_PLAN_COMPLETE": "zsh_complete"},
    {"_PLAN_COMPLETE": "fish_complete"},
    {"_PLAN_COMPLETE": "bash_complete", "COMP_WORDS": "plan --model", "COMP_CWORD": "x"},   # int('x')
    {"_PLAN_COMPLETE": "bash_complete", "COMP_WORDS": "plan --model", "COMP_CWORD": "99"},
    {"_PLAN_COMPLETE": "bash_complete", "COMP_WORDS": "plan 'unclosed", "COMP_CWORD": "1"},
    {"_PLAN_COMPLETE": "powershell_source"},          # click returned 1 and said nothing
    {"_PLAN_COMPLETE": "bash_sauce"},
])
def test_a_wrong_completion_environment_is_one_line(env):
    """The report: `_PLAN_COMPLETE=bash_complete plan --model 8b --gpus h100` printed
    `KeyError: 'COMP_WORDS'` with a traceback and exit 1."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("COMP_", "_PLAN_COMPLETE"))}
    r = subprocess.run([sys.executable, "-m", "planner", "--model", "8b", "--gpus", "h100"],
                       env={**clean, **env}, capture_output=True, text=True, check=False, timeout=60)
    if r.returncode == 0:                             # click completed something sensible: fine too
        assert "Traceback" not in r.stderr and r.stderr == "", r.stderr
        return
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "_PLAN_COMPLETE" in err, err


def test_gpus_complete_files_and_no_names_with_spaces():
    """U12: `--gpus ./` completed nothing, and `--gpus` offered "AMD Instinct MI300X", which
    bash splits into three words."""
    assert complete(["--gpus"], "./") == [("file", "./")]
    assert complete(["--gpus"], "gpus/my") == [("file", "gpus/my")]
    everything = complete(["--gpus"], "")
    assert everything and not [v for _, v in everything if " " in v]
    assert ("plain", "mi300x") in complete(["--gpus"], "mi3")
    assert not [v for _, v in complete(["--model"], "") if " " in v]
