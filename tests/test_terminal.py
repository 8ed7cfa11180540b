"""The terminal report (planner.report.terminal): tables and bars, colour only where it belongs,
--quiet's one line, and the progress bar that never reaches stdout."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.report import screen
from planner.report import terminal as term

PLAIN = {"NO_COLOR": None, "FORCE_COLOR": None, "COLUMNS": None, "TERM": "xterm-256color"}
PLAN = ("--model", "70b", "--gpus", "h100")
ESC = "\x1b["


def run(*args: str, **env: str | None):
    return CliRunner().invoke(cli, list(args), prog_name="plan", env={**PLAIN, **env})


@pytest.fixture(scope="module")
def plan_text() -> str:
    r = run(*PLAN)
    assert r.exit_code == 0, r.output
    return r.stdout


# ---------------------------------------------------------------------------- report

def test_report_has_the_answer_the_memory_bars_and_the_tables(plan_text):
    t = plan_text
    assert "\u256d\u2500 Smallest GPU count that fits: " in t            # the answer, in a panel
    assert "MFU" in t and "tokens/s" in t
    assert "Memory per rank" in t and "share of 79.65 GiB" in t
    for label in ("weights", "gradients", "optimizer states", "activations", "overhead (CUDA, NCCL, fragmentation)"):
        row = next(line for line in t.splitlines() if line.startswith(label))
        assert "\u2588" in row or "\u2591" in row, row                  # each category has a bar
    total = next(line for line in t.splitlines() if line.startswith("total"))
    assert total.rstrip().endswith("fits") and "%" in total
    assert "Step time:" in t and "compute" in t and "pipeline bubble" in t
    assert "Alternatives on 16 GPUs" in t and "Assumptions" in t


def test_plain_output_is_fixed_width_and_has_no_trailing_spaces(plan_text):
    lines = plan_text.splitlines()
    assert max(len(line) for line in lines) == screen.DEFAULT_WIDTH      # the panel spans the width
    assert all(line == line.rstrip() for line in lines)


def test_columns_sets_the_width_when_not_a_terminal():
    r = run(*PLAN, COLUMNS="132")
    assert max(len(line) for line in r.stdout.splitlines()) == 132


def test_no_escapes_when_stdout_is_not_a_terminal(plan_text):
    assert ESC not in plan_text


@pytest.mark.parametrize("env", [{"FORCE_COLOR": "1", "NO_COLOR": "1"}, {"FORCE_COLOR": "1", "TERM": "dumb"}])
def test_no_colour_with_no_color_or_a_dumb_terminal(env):
    r = run(*PLAN, **env)
    assert r.exit_code == 0 and ESC not in r.output


def test_colour_when_forced(plan_text):
    r = run(*PLAN, FORCE_COLOR="1")
    assert r.exit_code == 0 and ESC in r.stdout
    # the same text under the styles
    import re
    assert re.sub(r"\x1b\[[0-9;]*m", "", r.stdout).split() == plan_text.split()


def test_screen_for_a_terminal_and_a_pipe(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for name in ("NO_COLOR", "FORCE_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert screen.screen_for(Tty()).colour is True
    assert screen.screen_for(io.StringIO()) == screen.Screen(colour=False, width=100, unicode=True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert screen.screen_for(Tty()).colour is False


def test_ascii_output_where_the_stream_cannot_encode_blocks():
    from planner import api
    from planner.hardware.gpus import get_gpu
    from planner.models.spec import load_model
    from planner.training.setup import TrainingSetup

    r = api.plan(load_model("8b"), get_gpu("h100"), TrainingSetup())
    text = screen.render(term.plan_view(r), screen.Screen(unicode=False))
    assert text.isascii() and "#" in text and "Memory per rank" in text


def test_to_text_is_the_plain_report():
    from planner import api
    from planner.hardware.gpus import get_gpu
    from planner.models.spec import load_model
    from planner.training.setup import TrainingSetup

    text = screen.render(term.plan_view(api.plan(load_model("8b"), get_gpu("h100"), TrainingSetup())))
    assert ESC not in text and "Smallest GPU count that fits: " in text and "Memory per rank" in text


@pytest.mark.slow
def test_cost_buy_and_load_reports_have_tables():
    r = run(*PLAN, "--tokens", "1e12", "--max-gpus", "64")
    assert r.exit_code == 0, r.output
    assert "\u256d\u2500 Cheapest plan: " in r.stdout and "\n* " in r.stdout and "GPU-hours" in r.stdout
    r = run("buy", "examples/jobs.yaml", "--gpus", "h100")
    assert r.exit_code == 0, r.output
    assert "\u256d\u2500 Buy: " in r.stdout and "Jobs:" in r.stdout and "\u2588" in r.stdout
    r = run(*PLAN, "--task", "load")
    assert r.exit_code == 0 and "Memory per GPU" in r.stdout and "KV cache" in r.stdout


# ---------------------------------------------------------------------------- --quiet

def one_line(r) -> str:
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    return lines[0]


def test_quiet_prints_the_answer_on_one_line():
    r = run(*PLAN, "--quiet")
    assert r.exit_code == 0
    line = one_line(r)
    d = json.loads(run(*PLAN, "--json").stdout)
    n = d["plan"]["n_gpus"]
    assert line.startswith(f"llama3.1-70b: {n} x h100, dp=1 tp=4+sp ")
    assert " GiB, " in line and " s/step, MFU " in line


@pytest.mark.parametrize("args", [
    (*PLAN, "-q", "--tokens", "1e12", "--max-gpus", "64"),
    (*PLAN, "-q", "--task", "load"),
    ("buy", "examples/jobs.yaml", "--gpus", "h100", "-q"),
])
def test_quiet_elsewhere(args):
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert one_line(r)


def test_quiet_when_nothing_fits_says_so_and_exits_2():
    r = run("--model", "405b", "--gpus", "h100", "--max-gpus", "8", "-q")
    assert r.exit_code == 2
    assert "no layout fits on 1 to 8 x h100" in one_line(r)


def test_quiet_out_keeps_stdout_to_one_line(tmp_path):
    r = run(*PLAN, "-q", "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    one_line(r)
    assert "wrote " in r.stderr


@pytest.mark.parametrize("args", [PLAN, ("buy", "examples/jobs.yaml"),
                                  ("measure", "--model", "qwen2.5-0.5b", "--gpus", "h100")])
def test_quiet_and_json_is_an_error(args):
    r = run(*args, "--quiet", "--json")
    assert r.exit_code == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "--quiet" in r.stderr and "--json" in r.stderr


# ---------------------------------------------------------------------------- progress

class Drawn:
    """A stand-in for stderr on a terminal: what the progress bar draws."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from rich.console import Console

        self.buf = io.StringIO()
        self.consoles = 0
        console = Console(file=self.buf, force_terminal=True, width=100)

        def make() -> Console:
            self.consoles += 1
            return console

        monkeypatch.setattr(screen, "stderr_can_redraw", lambda: True)
        monkeypatch.setattr(screen, "progress_console", make)
        monkeypatch.setattr(screen, "PROGRESS_DELAY_S", 0.0)


def test_progress_draws_on_a_terminal_and_erases_itself(monkeypatch):
    drawn = Drawn(monkeypatch)
    with screen.progress("working") as update:
        update(1, 4, "step 1 of 4")
        time.sleep(0.3)
    assert drawn.consoles == 1 and "step 1 of 4" in drawn.buf.getvalue()


def test_progress_waits_before_it_appears(monkeypatch):
    drawn = Drawn(monkeypatch)
    monkeypatch.setattr(screen, "PROGRESS_DELAY_S", 5.0)
    with screen.progress("quick") as update:
        update(1, 2)
    assert drawn.consoles == 0 and drawn.buf.getvalue() == ""


def test_no_progress_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(screen, "PROGRESS_DELAY_S", 0.0)
    called = []
    monkeypatch.setattr(screen, "progress_console", lambda: called.append(1))
    with screen.progress("working") as update:   # pytest's stderr is no terminal
        update(1, 2)
        time.sleep(0.1)
    assert called == []


def test_the_search_reports_progress(monkeypatch):
    drawn = Drawn(monkeypatch)
    r = run(*PLAN)
    assert r.exit_code == 0
    assert "searching layouts on" in drawn.buf.getvalue()
    assert "searching" not in r.stdout


@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_no_progress_with_json_or_quiet(monkeypatch, flag):
    drawn = Drawn(monkeypatch)
    r = run(*PLAN, "--tokens", "1e12", "--max-gpus", "64", flag)
    assert r.exit_code == 0, r.output
    if flag == "--json":
        json.loads(r.stdout)
    assert drawn.consoles == 0 and drawn.buf.getvalue() == ""


# ---------------------------------------------------------------------------- imports

@pytest.mark.slow
def test_rich_is_imported_only_to_draw():
    code = """
import sys
from click.testing import CliRunner
import planner.cli.main as c
assert 'rich' not in sys.modules, 'import planner.cli.main imports rich'
for flag in ('--json', '-q'):
    r = CliRunner().invoke(c.cli, ['--model', '8b', '--gpus', 'h100', flag])
    assert r.exit_code == 0, r.output
    assert 'rich' not in sys.modules, f'plan {flag} imports rich'
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
