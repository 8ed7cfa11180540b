"""Issue 32, the writing faults of the hostile test: one exclusive-create writer for every
single output file (B1, B2, B3), --out and --plot together (B6), a full stderr after the
answer (U10).

Each test reproduces the report's input. Exclusive creation is what POSIX gives link(2)
and open(2) with O_CREAT | O_EXCL: both fail with EEXIST when the name exists, so of two
writers one is refused however close they run (the report's check-then-replace was not).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.emit import write
from planner.errors import UserError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
CALIBRATE = ["calibrate", str(REPO / "examples" / "calibrate" / "megatron_llama2-7b_h100x8.log"),
             "--model", "llama2-7b", "--gpus", "h100", "--dp", "4", "--tp", "2", "--pp", "1", "--cp", "1",
             "--zero", "1", "--micro-batch", "1", "--seq-len", "4096", "--recompute", "selective"]


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="plan")


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp")]


# ------------------------------------------------------------------------ B1, B2: no overwrite

def test_a_file_made_after_the_early_check_is_not_replaced(tmp_path):
    """The report's race, made deterministic: the other writer's file appears between the
    check at start-up and the write (then os.replace silently replaced it)."""
    target = tmp_path / "race.png"
    target.write_bytes(b"the other run's plot")
    with pytest.raises(UserError, match="already exists"):
        write.write_file(target, b"mine", what="--plot")
    assert target.read_bytes() == b"the other run's plot"
    assert leftovers(tmp_path) == []
    assert write.write_file(target, b"mine", force=True) == target and target.read_bytes() == b"mine"


RACER = """
import sys, time
from pathlib import Path
from planner.emit.write import write_file
from planner.errors import UserError
start = float(sys.argv[2])
while time.time() < start:
    pass
try:
    write_file(Path(sys.argv[1]), sys.argv[3].encode() * 100000, what="--plot")
    print("wrote")
except UserError as e:
    print("refused", e)
"""


@pytest.mark.slow
def test_eight_concurrent_writers_one_wins(tmp_path):
    target = tmp_path / "race.png"
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(target), str(start), str(i)], env=ENV,
                              stdout=subprocess.PIPE, text=True) for i in range(8)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert sum(o.startswith("wrote") for o in outs) == 1, outs
    assert all(o.startswith("wrote") or "already exists" in o for o in outs), outs
    data = target.read_bytes()
    assert len(set(data)) == 1 and len(data) == 100000           # one writer's whole file
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_plot_refuses_a_file_another_run_wrote_meanwhile(tmp_path, monkeypatch):
    """`plan --plot race.png` twice at once (the report: 7 of 8 pairs both succeeded): the
    second run's start-up check passes, the first run's file appears, the save refuses."""
    from planner.report import plot

    target = tmp_path / "race.png"
    real_save = plot.save

    def first_run_finishes_meanwhile(fig, path, force=False):
        Path(path).write_bytes(b"first run")
        return real_save(fig, path, force)

    monkeypatch.setattr(plot, "save", first_run_finishes_meanwhile)
    r = run("--model", "gpt2", "--gpus", "h100", "--plot", target, "-q")
    assert r.exit_code == 2 and "already exists" in r.stderr, r.output
    assert target.read_bytes() == b"first run"
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_calibrate_refuses_a_file_another_run_wrote_meanwhile(tmp_path, monkeypatch):
    """`plan calibrate --out cal.toml` twice at once (the report: 6 of 6 pairs both wrote)."""
    from planner.cli import calibrate

    target = tmp_path / "cal.toml"
    real = calibrate.write_atomically

    def other_run_finishes_meanwhile(path, text, force=False):
        Path(path).write_text("the other run's calibration")
        return real(path, text, force)

    monkeypatch.setattr(calibrate, "write_atomically", other_run_finishes_meanwhile)
    r = run(*CALIBRATE, "--out", target)
    assert r.exit_code == 2 and "already exists" in r.stderr, r.output
    assert target.read_text() == "the other run's calibration"
    monkeypatch.setattr(calibrate, "write_atomically", real)
    r = run(*CALIBRATE, "--out", target, "--force")
    assert r.exit_code == 0, r.output
    assert target.read_text().startswith("#") or "matmul_fraction" in target.read_text()
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------ B3: signals

SIGNALLED = """
import os, signal, sys
from pathlib import Path
from planner.emit import write
signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a foreground shell, also in a background job
if signal.{sig} != signal.SIGINT:      # nohup starts the suite with SIGHUP ignored: delivered, as in a terminal
    signal.signal(signal.{sig}, signal.SIG_DFL)
real = {{name: getattr(os, name) for name in ("link", "replace")}}
def hit(name):
    def f(*a, **k):
        os.kill(os.getpid(), signal.{sig})       # the signal arrives just before the file is published
        return real[name](*a, **k)
    return f
os.link, os.replace = hit("link"), hit("replace")
write.write_file(Path(sys.argv[1]), b"whole plot", force={force}, what="--plot")
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
@pytest.mark.parametrize("force", [False, True])
def test_a_signal_during_the_plot_write_leaves_no_temporary(tmp_path, sig, force):
    target = tmp_path / "P.png"
    if force:
        target.write_bytes(b"old plot")
    p = subprocess.run([sys.executable, "-c", SIGNALLED.format(sig=sig, force=force), str(target)], env=ENV,
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode != 0, p.stderr           # the signal was delivered, after the write
    assert target.read_bytes() == b"whole plot"
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_sigterm_during_out_and_plot_leaves_no_temporary(tmp_path):
    """The report's loop (30 runs, SIGTERM/SIGHUP at 0.2-2.0 s) left .P.png.*.tmp in 6."""
    for delay in (0.6, 1.2, 1.8):
        p = subprocess.Popen([sys.executable, "-m", "planner", "--model", "gpt2", "--gpus", "h100",
                              "--out", str(tmp_path / "D"), "--force", "--plot", str(tmp_path / "P.png"),
                              "--force", "-q"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.terminate()
        p.wait(timeout=60)
        assert leftovers(tmp_path) == [], (delay, leftovers(tmp_path))


# ------------------------------------------------------------------------ B6, U10

def test_out_is_not_written_when_the_plot_cannot_be(tmp_path):
    """`--out rwdir/o --plot rodir/x.png`: the report got the set written, exit 2 and no word
    of it. A parent that is a file stands for the read-only directory (root ignores modes)."""
    (tmp_path / "afile").write_text("")
    r = run("--model", "gpt2", "--gpus", "h100", "--out", tmp_path / "rw" / "o", "--plot", tmp_path / "afile" / "x.png")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--plot" in r.stderr, r.output
    assert not (tmp_path / "rw").exists()


@pytest.mark.slow
def test_out_is_named_when_the_plot_fails_after_it(tmp_path, monkeypatch):
    from planner.report import plot

    def fails(fig, path, force=False):
        raise UserError(f"cannot write --plot {path}: Operation not permitted")

    monkeypatch.setattr(plot, "save", fails)
    r = run("--model", "gpt2", "--gpus", "h100", "--out", tmp_path / "o", "--plot", tmp_path / "x.png")
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert "\n" not in err and "Operation not permitted" in err and "; wrote " in err, err
    assert f"plan.json to {tmp_path / 'o'}" in err, err


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("--model", "gpt2", "--gpus", "h100", "--plot", "y.png", "--force", "-q"),
                                  ("--model", "gpt2", "--gpus", "h100", "--out", "o", "--json")])
def test_a_full_stderr_after_the_answer_is_no_failure(tmp_path, args):
    """U10: `plan ... --plot y.png --force -q 2>/dev/full` exited 2 after the answer and the
    plot were both written."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "planner", *args], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                           stderr=full, text=True, timeout=120, check=False)
    assert p.returncode == 0 and p.stdout.strip(), p.returncode
    assert (tmp_path / "y.png").exists() or (tmp_path / "o" / "plan.json").exists()


# ------------------------------------------------------------------------ B4, B5, U6: --out DIR

def test_force_over_another_stacks_set_leaves_no_mix(tmp_path):
    """The report: a DeepSpeed set overwritten by a Megatron one kept ds_config.json,
    hostfile and config.json beside the new plan.json."""
    s1 = tmp_path / "s1"
    assert run("--model", "qwen2.5-0.5b", "--gpus", "h100", "--stack", "deepspeed", "--out", s1, "-q").exit_code == 0
    (s1 / "notes.txt").write_text("mine")
    assert {"ds_config.json", "hostfile", "config.json"} <= {p.name for p in s1.iterdir()}
    megatron = ("--model", "qwen2.5-0.5b", "--gpus", "h100", "--stack", "megatron", "--tp", "2", "--out", s1, "-q")
    r = run(*megatron)
    assert r.exit_code == 2 and "already exists" in r.stderr
    r = run(*megatron, "--force")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in s1.iterdir()) == ["launch.sh", "megatron_args.txt", "notes.txt", "plan.json",
                                                    "pytorchjob.yaml", "slurm.sbatch"]
    assert (s1 / "notes.txt").read_text() == "mine"             # not a file the planner writes
    assert leftovers(tmp_path) == []


def test_a_user_directory_without_a_plan_keeps_its_own_config_json(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text("{}")                      # a name the planner writes, but no plan here
    r = run("--model", "qwen2.5-0.5b", "--gpus", "h100", "--stack", "megatron", "--tp", "2", "--out", d, "-q")
    assert r.exit_code == 0, r.output
    assert (d / "config.json").read_text() == "{}"


def test_every_file_a_plan_writes_is_known_by_name():
    """write_files removes another plan's files by name: plan_files writes no other names."""
    from planner import api
    from planner.emit import PLAN_FILE_NAMES, EmitOptions, plan_files
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import Layout
    from planner.models.spec import load_model
    from planner.training.setup import TrainingSetup

    m = load_model("llama2-7b")
    names: set[str] = set()
    for stack, lay in (("deepspeed", Layout(dp=8, zero_stage=3, micro_batch=1, grad_accum=4, seq_len=2048)),
                       ("hf", Layout(dp=8, zero_stage=3, sharding="fsdp-full", micro_batch=1, grad_accum=4,
                                     seq_len=2048)),
                       ("megatron", Layout(dp=4, tp=2, micro_batch=1, grad_accum=8, seq_len=2048)),
                       ("torchtitan", Layout(dp=4, pp=2, zero_stage=3, sharding="fsdp-full", micro_batch=1,
                                             grad_accum=8, seq_len=2048))):
        r = api.evaluate_layout(m, get_gpu("h100"), TrainingSetup(seq_len=2048, global_batch=32), lay)
        names |= set(plan_files(r, EmitOptions(stack=stack), {}))
    assert names == set(PLAN_FILE_NAMES), names ^ set(PLAN_FILE_NAMES)


def test_out_onto_an_existing_empty_directory_keeps_it(tmp_path):
    """The report: mode 0700 became 0755, the owner root, and a shell inside the directory
    was left in a deleted one."""
    e1 = tmp_path / "e1"
    e1.mkdir(mode=0o700)
    os.chmod(e1, 0o700)
    before = e1.stat()
    r = run("--model", "gpt2", "--gpus", "h100", "--out", e1, "-q")
    assert r.exit_code == 0, r.output
    after = e1.stat()
    assert (after.st_ino, after.st_mode, after.st_uid, after.st_gid) == (before.st_ino, before.st_mode, before.st_uid,
                                                                          before.st_gid)
    assert (e1 / "plan.json").is_file()
    r = run("--model", "gpt2", "--gpus", "h100", "--out", e1, "--force", "-q")     # and again, over its own set
    assert r.exit_code == 0 and e1.stat().st_ino == before.st_ino and e1.stat().st_mode == before.st_mode
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_out_onto_the_current_directory_writes_into_it(tmp_path):
    e2 = tmp_path / "e2"
    e2.mkdir()
    p = subprocess.run([sys.executable, "-m", "planner", "--model", "gpt2", "--gpus", "h100", "--out", str(e2), "-q"],
                       cwd=e2, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert (e2 / "plan.json").is_file() and os.path.samefile(e2, tmp_path / "e2")


@pytest.mark.parametrize("args", [("--model", "gpt2", "--gpus", "h100", "--out", ""),
                                  ("--model", "gpt2", "--gpus", "h100", "--plot", ""),
                                  ("buy", str(REPO / "examples" / "jobs.yaml"), "--plot", " "),
                                  (*CALIBRATE, "--out", "")])
def test_an_empty_output_name_is_refused(tmp_path, args, monkeypatch):
    """U6: `--out ""` wrote the set into the current directory."""
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    assert r.exit_code == 2 and "empty name" in r.stderr and r.stderr.count("\n") == 1, r.output
    assert list(tmp_path.iterdir()) == []
