"""Issue 20, "Bad input and hostile conditions": each bullet as a test. Whatever the input,
`plan` answers with status 0, or 2 and one line on stderr, never a traceback; --out leaves
the old set of files or the whole new one, no temporary file and no empty directory.

The limits come from outside the planner: NAME_MAX = 255 bytes per path component and
PATH_MAX = 4096 (<linux/limits.h>); Python's 4,300-digit limit on int(str) (the
int_max_str_digits default, Python 3.11 docs "Integer string conversion length
limitation"); float's range (IEEE 754 double, max about 1.8e308).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
TOPOLOGIES = REPO / "planner" / "presets" / "topologies"
JOB = "jobs:\n  - name: j\n    model: {model}\n    tokens: {tokens}\n    deadline: 30d\n"


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="plan")


def one_line_error(r, *needles: str) -> str:
    """Status 2, one line on stderr starting with 'error: ', naming every needle."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in r.output, err
    for n in needles:
        assert n in err, (n, err)
    return err


# ------------------------------------------------------------------------ long names

@pytest.mark.parametrize("args", [
    ("--model", "x" * 300, "--gpus", "h100"),
    ("--model", "8b", "--gpus", "h100", "--topology", "x" * 300),
    ("--model", "8b", "--gpus", "h100", "--tokens", "1T", "--prices", "p" * 300 + ".toml"),
    ("--model", "8b", "--gpus", "h100", "--task", "load", "--model", "m" * 300),
])
def test_a_name_longer_than_name_max_is_one_line(args):
    one_line_error(run(*args), "too long for a name or a path", "255 bytes")


def test_a_jobs_model_longer_than_name_max(tmp_path):
    f = tmp_path / "jobs.yaml"
    f.write_text(JOB.format(model="x" * 300, tokens="1e9"))
    one_line_error(run("buy", f), "job 'j': model", "too long")


# ------------------------------------------------------------------------ numbers

BIG = "1" + "0" * 400            # 1e400: float() of it overflows
HUGE = "1" + "0" * 5000          # more than Python's 4,300 digits for int(str)


def shipped_topology(**over: str) -> str:
    text = (TOPOLOGIES / "dgx-h100.toml").read_text()
    for key, value in over.items():
        text = "\n".join(f"{key} = {value}" if line.startswith(f"{key} =") else line for line in text.splitlines())
    return text


@pytest.mark.parametrize("digits, needle", [(BIG, "401 digits"), (HUGE, "more than 4,300 digits")])
def test_huge_integers_in_every_file_kind(tmp_path, digits, needle):
    prices = tmp_path / "prices.toml"
    prices.write_text(f"pue = {digits}\n")
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--prices", prices), needle)
    topo = tmp_path / "topo.toml"
    topo.write_text(shipped_topology(max_nodes=digits))
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--topology", topo), str(topo))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOB.format(model="gpt2", tokens=digits))
    one_line_error(run("buy", jobs), str(jobs))
    cfg = json.loads((REPO / "planner" / "presets" / "models" / "gpt2.json").read_text())
    text = json.dumps(cfg).replace(str(cfg["n_embd"]), digits, 1)
    config = tmp_path / "config.json"
    config.write_text(text)
    one_line_error(run("--model", config, "--gpus", "h100"), str(config))


@pytest.mark.parametrize("tokens", ["0.5", "1e-300", "0", "2e18"])
def test_tokens_outside_1_to_1e18(tmp_path, tokens):
    r = run("--model", "gpt2", "--gpus", "h100", "--tokens", tokens)
    one_line_error(r, "between 1 and 1e18")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOB.format(model="gpt2", tokens=tokens))
    one_line_error(run("buy", jobs), "between 1 and 1e18")


def test_a_token_count_of_5000_digits_is_refused_at_once():
    t0 = time.perf_counter()
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--tokens", HUGE), "--tokens")
    assert time.perf_counter() - t0 < 5


# ------------------------------------------------------------------------ structure

def test_toml_nested_1000_levels(tmp_path):
    f = tmp_path / "deep.toml"
    f.write_text("a = " + "[" * 1000 + "]" * 1000 + "\n")
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--topology", f), "nested too deeply")
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--prices", f), "nested too deeply")
    one_line_error(run("buy", f), "nested too deeply")


def test_toml_nested_past_the_limit_but_parseable(tmp_path):
    f = tmp_path / "deep.toml"
    f.write_text("a = " + "[" * 40 + "]" * 40 + "\n")
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--prices", f),
                   "nested more than 32 levels")


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path):
    levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefg", "bcdefgh"):
        levels.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(levels) + "\njobs:\n  - name: *h\n    model: gpt2\n    tokens: 1e9\n    deadline: 30d\n")
    assert f.stat().st_size < 1024
    t0 = time.perf_counter()
    one_line_error(run("buy", f), "aliases", "not allowed")
    assert time.perf_counter() - t0 < 5


def test_a_12_mb_jobs_list_is_refused_before_parsing(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("jobs:\n" + "".join(f"  - name: j{i}\n    model: gpt2\n    tokens: 1e9\n    deadline: 30d\n"
                                     for i in range(200_000)))
    assert f.stat().st_size > 12 * 10**6
    t0 = time.perf_counter()
    one_line_error(run("buy", f), "bytes, more than the 1,048,576")
    assert time.perf_counter() - t0 < 2


@pytest.mark.parametrize("kind", ["jobs", "prices"])
def test_devices_and_fifos_are_refused_not_read(tmp_path, kind):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo, tmp_path):
        args = ("buy", path) if kind == "jobs" else ("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9",
                                                      "--prices", path)
        t0 = time.perf_counter()
        err = one_line_error(run(*args))
        assert "not a regular file" in err or "is a directory" in err, err
        assert time.perf_counter() - t0 < 5


def test_prices_file_size_cap(tmp_path):
    f = tmp_path / "prices.toml"
    f.write_text("# " + "x" * (2 * 2**20) + "\n")
    one_line_error(run("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--prices", f), "bytes, more than")


# ------------------------------------------------------------------------ output

@pytest.mark.slow
@pytest.mark.parametrize("args", [("--help",), ("--version",), ("models", "--help"), ("completion", "bash"),
                                  ("--model", "gpt2", "--gpus", "h100", "--json")])
def test_a_full_stdout_is_one_line_not_a_traceback(args):
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "planner", *args], check=False, stdout=full, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().startswith("error: cannot write the output") and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("args", [("buy", "examples/jobs.yaml", "-q", "--gpus", "h100"),
                                  ("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--json")])
def test_a_closed_stdout_is_one_line(args):
    code = ("import os, sys; os.close(1); sys.stdout = None; sys.argv = ['plan', *sys.argv[1:]]\n"
            "from planner.cli.main import main; main()")
    p = subprocess.run([sys.executable, "-c", code, *args], check=False, stderr=subprocess.PIPE, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode == 2 and "stdout is closed" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_the_solvers_quiet_wrapper_survives_a_missing_stdout(monkeypatch):
    from planner.cost.quiet import solver_output_silenced

    monkeypatch.setattr(sys, "stdout", None)
    with solver_output_silenced():           # was: AttributeError: 'NoneType' object has no attribute 'flush'
        pass


@pytest.mark.parametrize("args", [("--json",), ("--quiet",), ("--seq-len", "2048"), ("--tokens", "1T")])
def test_options_without_model_and_gpus_are_an_error_not_help(args):
    r = run(*args)
    one_line_error(r, "needs --model and --gpus")
    assert "Usage" not in r.output


def test_bare_plan_still_prints_help():
    r = run()
    assert r.exit_code == 0 and r.output.startswith("Usage: plan")


def test_click_usage_errors_are_one_line():
    err = one_line_error(run("--model", "gpt2", "--gpus", "h100", "--zero", "9"), "Invalid value for '--zero'")
    assert err.endswith("`plan --help` lists the options")
    one_line_error(run("explain", "--bogus"), "No such option", "`plan explain --help`")


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ("--model", "405b", "--gpus", "4090", "--n-gpus", "1"),       # the floor skips the only count
    ("--model", "405b", "--gpus", "h100", "--max-gpus", "4"),
    ("--model", "70b", "--gpus", "l40s", "--method", "qlora", "--n-gpus", "1", "--seq-len", "512",
     "--global-batch", "16"),
])
def test_json_has_least_memory_when_nothing_fits(args):
    r = run(*args, "--json")
    assert r.exit_code == 2
    d = json.loads(r.stdout)
    assert d["plan"] is None and d["least_memory"] is not None
    lm = d["least_memory"]
    assert not lm["fits"] and sum(lm["memory_bytes"].values()) > lm["capacity_bytes"]


def test_non_utf8_out_name(tmp_path):
    name = os.fsdecode(b"out-\xff")
    r = run("--model", "gpt2", "--gpus", "h100", "--out", tmp_path / name)
    one_line_error(r, "not a UTF-8 name")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ --out safety

PLAN = ("--model", "gpt2", "--gpus", "h100", "--dp", "1", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "0",
        "--micro-batch", "1", "--recompute", "none", "-q")


def no_temporaries(parent: Path) -> None:
    left = [p.name for p in parent.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert left == [], left


@pytest.mark.slow
def test_two_concurrent_writers_do_not_both_succeed(tmp_path):
    out = tmp_path / "cfg"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "planner", *PLAN, "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    assert any("already exists" in err for _, err in results)
    # one complete set, the winner's: the files its stack reads, launch.sh and plan.json
    names = sorted(p.name for p in out.iterdir())
    assert {"launch.sh", "plan.json"} <= set(names), names
    assert json.loads((out / "plan.json").read_text())["plan"] is not None
    no_temporaries(tmp_path)


WRITER = """
import os, signal, sys
from pathlib import Path
from planner.emit import write
# Python installs its KeyboardInterrupt handler only where SIGINT is not ignored; in a background
# job (`cmd &` in a script, nohup, some CI runners) it is ignored and children inherit that
# (issue 32): the disposition of an interactive shell's foreground job, so the test holds in both
signal.signal(signal.SIGINT, signal.default_int_handler)
real_rename, real_replace = os.rename, os.replace
def rename(a, b):                      # a signal arrives just before the set moves in
    os.kill(os.getpid(), signal.{sig})
    real_rename(a, b)
def replace(a, b):
    os.kill(os.getpid(), signal.{sig})
    real_replace(a, b)
os.rename, os.replace = rename, replace
write.write_files(Path(sys.argv[1]), {{"a.txt": "new a", "b.txt": "new b", "plan.json": "{{}}"}}, force=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("before", [None, {"a.txt": "old a", "b.txt": "old b", "plan.json": "old"},
                                    {"a.txt": "old a", "notes.txt": "mine"}])
def test_a_signal_during_the_renames_leaves_all_old_or_all_new(tmp_path, sig, before):
    out = tmp_path / "out"
    if before is not None:
        out.mkdir()
        for name, text in before.items():
            (out / name).write_text(text)
    p = subprocess.run([sys.executable, "-c", WRITER.format(sig=sig), str(out)], check=False, capture_output=True,
                       text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert p.returncode != 0                  # the signal was delivered, after the renames
    texts = {f.name: f.read_text() for f in out.iterdir()}
    assert {k: texts[k] for k in ("a.txt", "b.txt", "plan.json")} == {"a.txt": "new a", "b.txt": "new b",
                                                                         "plan.json": "{}"}
    if before and "notes.txt" in before:
        assert texts["notes.txt"] == "mine"
    no_temporaries(tmp_path)


def test_a_failure_between_renames_restores_the_old_set(tmp_path, monkeypatch):
    from planner.emit import write
    from planner.errors import UserError

    out = tmp_path / "out"
    out.mkdir()
    old = {"a.txt": "old a", "b.txt": "old b", "notes.txt": "mine"}
    for name, text in old.items():
        (out / name).write_text(text)
    calls = []
    real = os.replace

    def failing(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError(13, "Permission denied")
        real(a, b)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(UserError, match="Permission denied"):
        write.write_files(out, {"a.txt": "new a", "b.txt": "new b", "c.txt": "new c"}, force=True)
    monkeypatch.setattr(os, "replace", real)
    assert {f.name: f.read_text() for f in out.iterdir()} == old
    no_temporaries(tmp_path)


def test_a_failed_write_leaves_no_directory(tmp_path, monkeypatch):
    from planner.emit import write
    from planner.errors import UserError

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UserError, match="No space left"):
        write.write_files(tmp_path / "new" / "deeper" / "out", {"a.txt": "a"})
    assert list(tmp_path.iterdir()) == []      # neither out nor the parents it created


def test_a_sigterm_mid_plan_leaves_nothing(tmp_path):
    out = tmp_path / "cfg"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "planner", *PLAN, "--out", str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    if out.exists():                           # it finished first: then the whole set
        assert {"launch.sh", "plan.json"} <= {f.name for f in out.iterdir()}    # a whole set
    no_temporaries(tmp_path)
