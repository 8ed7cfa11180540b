"""`plan calibrate`: the four stacks' log lines, the joint fit, the calibration file, and
`--calibration` applied to later plans (issue 18, calibration part).

Every log line below is written in the exact format of the code that prints it (the citations
are in planner/measure/logs.py): torchtitan 0.3.0 components/metrics.py, Megatron-LM
training/training.py training_log and training/utils.py report_memory, DeepSpeed 0.19.8
utils/timer.py ThroughputTimer and runtime/utils.py see_memory_usage, transformers 5.24.0
trainer_utils.speed_metrics as ProgressCallback prints it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import os
import shlex
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.errors import UserError
from planner.measure.logs import MAX_LOG_BYTES, WARMUP_RECORDS, parse_log, read_log
from planner.timing.calibrate import Observation, fit, load_calibration, to_toml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SAMPLES = EXAMPLES / "calibrate"

# torchtitan MetricsProcessor.log, with its ANSI colours (Color in torchtitan/tools/utils.py)
TITAN = ("\x1b[31mstep: {step:2}  \x1b[32mloss: {loss:8.5f}  \x1b[33mgrad_norm: {gn:7.4f}  "
         "\x1b[36mmemory: {mem:5.2f}GiB({pct:.2f}%)  \x1b[34mtps: {tps:,}  \x1b[36mtflops: {tf:,.2f}  "
         "\x1b[35mmfu: {mfu:.2f}%\x1b[39m")


def run(*args: str | Path):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="plan")


def test_torchtitan_lines():
    lines = [TITAN.format(step=s, loss=8.0, gn=1.0, mem=44.87, pct=56.72, tps=tps, tf=tps * 5.15e10 / 1e12,
                          mfu=100 * tps * 5.15e10 / 989e12)
             for s, tps in [(1, 1902), (10, 6488), (20, 6611), (30, 6597), (40, 6620), (50, 6604)]]
    lines.insert(3, "\x1b[33mvalidate step: 25  \x1b[32mloss:  7.0000  \x1b[36mmemory: 50.00GiB(60.00%)  "
                    "\x1b[34mtps: 9,999\x1b[39m")        # log_validation: not a training step
    lg = parse_log("\n".join(lines))
    assert lg.stack == "torchtitan" and len(lg.steps) == 6 and lg.warmup_records == WARMUP_RECORDS == 3
    assert [r.tokens_per_s_per_gpu for r in lg.measured] == [6597, 6620, 6604]
    assert lg.measured[0].mfu == pytest.approx(6597 * 5.15e10 / 989e12, abs=1e-4)
    # tps is per GPU: 8 GPUs x 1 sequence of 4096 tokens per step -> 4096 / tps seconds
    assert lg.step_time_s(global_batch=8, seq_len=4096, n_gpus=8) == pytest.approx(
        sum(4096 / t for t in (6597, 6620, 6604)) / 3)
    # memory is max_reserved_gib, GiB = 1024**3 (DeviceMemoryMonitor._to_gib)
    assert lg.max_reserved_bytes == round(44.87 * 2**30)


def test_megatron_lines():
    it = (" [2026-11-30 11:20:07] iteration {i:8d}/{n:8d} | consumed samples: {c:12d} | elapsed time per "
          "iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tf:.1f} | learning rate: 1.500000E-07 | "
          "global batch size: {b:5d} | lm loss: 1.030000E+01 | loss scale: 1.0 | grad norm: 2.050 | "
          "number of skipped iterations:   0 | number of nan iterations:   0 |")
    lines = [it.format(i=i, n=100, c=128 * i, ms=ms, tf=430.0, b=128)
             for i, ms in enumerate([21406.3, 7203.5, 7061.8, 7048.2, 7055.0], start=1)]
    lines.insert(1, "[Rank 0] (after 1 iterations) memory (MB) | allocated: 21873.42 | max allocated: 33961.17 | "
                    "reserved: 36204.00 | max reserved: 36204.00")
    lines.insert(2, "[Rank 1] (after 1 iterations) memory (MB) | allocated: 21873.42 | max allocated: 34100.00 | "
                    "reserved: 36800.00 | max reserved: 36800.00")
    lg = parse_log("\n".join(lines))
    assert lg.stack == "megatron" and lg.global_batch == 128
    assert [r.step_time_s for r in lg.measured] == [7.0482, 7.055]       # iterations 1-3 are warm-up
    assert [r.tflops_per_gpu for r in lg.measured] == [430.0, 430.0]      # the log's TFLOP/s/GPU
    # report_memory divides by 1024 x 1024; the most loaded rank is the one the planner predicts
    assert lg.max_reserved_bytes == 36800 * 2**20 and lg.max_allocated_bytes == round(34100.0 * 2**20)


def test_deepspeed_lines():
    timer = ("[2026-11-30 13:06:{s:02d},004] [INFO] [timer.py:264:stop] epoch=0/micro_step={m}/global_step={g}, "
             "RunningAvgSamplesPerSec={a}, CurrSamplesPerSec={c}, MemAllocated=1.71GB, MaxMemAllocated=17.93GB")
    lines = [timer.format(s=g, m=4 * g, g=g, a=12.3, c=c) for g, c in
             [(10, 9.71), (20, 12.44), (30, 12.38), (40, 12.47), (50, 12.41)]]
    # see_memory_usage: an f-string continued with backslashes, so the fields are spaced out
    lines.append("MA 1.71 GB         Max_MA 17.93 GB         CA 20.06 GB         Max_CA 21 GB ")
    lg = parse_log("\n".join(lines))
    assert lg.stack == "deepspeed" and len(lg.measured) == 2
    # CurrSamplesPerSec = train_batch_size / step time
    assert lg.step_time_s(global_batch=64, seq_len=4096, n_gpus=8) == pytest.approx((64 / 12.47 + 64 / 12.41) / 2)
    assert lg.max_reserved_bytes == 21 * 2**30 and lg.max_allocated_bytes == round(17.93 * 2**30)


@pytest.mark.parametrize("summary", [
    ("{'train_runtime': '312.4', 'train_samples_per_second': '102.4', 'train_steps_per_second': '1.601', "
     "'train_loss': '2.503', 'epoch': '1'}"),                                  # 5.x: f"{v:.4g}" strings
    ("{'train_runtime': 312.4, 'train_samples_per_second': 102.4, 'train_steps_per_second': 1.601, "
     "'train_loss': 2.503, 'epoch': 1.0}"),                                    # 4.x: floats
])
def test_hf_trainer_summary(summary: str):
    text = "{'loss': '2.913', 'grad_norm': '1.204', 'learning_rate': '1.96e-05', 'epoch': '0.02'}\n" + summary
    lg = parse_log(text)
    assert lg.stack == "hf-trainer" and lg.warmup_records == 0        # one figure over the whole run
    assert lg.step_time_s(64, 2048, 8) == pytest.approx(1 / 1.601)
    assert lg.steps[0].step == 500                                      # 312.4 s x 1.601 steps/s


def test_a_log_with_nothing_to_read_is_one_error():
    with pytest.raises(UserError, match="no step line"):
        parse_log("hello\nworld\n", "x.log")
    with pytest.raises(UserError, match="all warm-up"):
        parse_log("\n".join(TITAN.format(step=s, loss=1.0, gn=1.0, mem=1.0, pct=1.0, tps=100, tf=1.0, mfu=1.0)
                            for s in (1, 2)), "x.log")


def _observation(name: str, model: str, lay_kw: dict, global_batch: int, seq_len: int, t_s: float) -> Observation:
    from planner.api import fixed_layout
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import SearchSpace
    from planner.memory.model import per_rank_memory
    from planner.models.spec import load_model
    from planner.timing.model import cluster_for
    from planner.training.setup import TrainingSetup

    m, gpu = load_model(model), get_gpu("h100")
    setup = TrainingSetup(seq_len=seq_len, global_batch=global_batch)
    lay = fixed_layout(SearchSpace(**lay_kw), setup, None)
    assert lay is not None
    tracked = per_rank_memory(m, setup, lay).breakdown.tracked
    return Observation(name=name, stack="megatron", model=m, setup=setup, layout=lay, cluster=cluster_for(gpu),
                       step_time_s=t_s, tracked_bytes=tracked, max_reserved_bytes=int(tracked * 1.2))


LAY_A = {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 3, "micro_batches": (1,), "recomputes": ("full",)}
LAY_B = {"dp": 4, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 1, "micro_batches": (1,),
         "recomputes": ("selective",)}


@pytest.mark.slow
def test_joint_fit_is_the_least_squares_minimum_over_logs_of_different_layouts():
    obs = [_observation("a.log", "llama2-7b", LAY_A, 64, 4096, 5.1),
           _observation("b.log", "llama2-7b", LAY_B, 128, 4096, 7.05)]
    from planner.timing.model import Efficiency, step_time

    c = fit(obs, Efficiency(), "0.1.0", "now")
    assert not c.at_bound and 0.3 < c.matmul_fraction < 0.711
    assert c.rms_after < c.rms_before
    # least squares on log error: moving the fraction either way makes the sum of squares larger

    def sse(x: float) -> float:
        return sum(math.log(step_time(o.model, o.setup, o.layout, o.cluster, Efficiency(matmul_fraction=x))
                            .step_time_s / o.step_time_s) ** 2 for o in obs)
    assert sse(c.matmul_fraction) <= min(sse(c.matmul_fraction - 0.01), sse(c.matmul_fraction + 0.01))
    # reserved = 1.2 x tracked on both logs -> fragmentation 20%
    assert c.fragmentation == pytest.approx(0.2, abs=1e-3)


def test_file_round_trip_and_refusals(tmp_path: Path):
    from planner.timing.model import Efficiency

    c = fit([_observation("a.log", "llama2-7b", LAY_A, 64, 4096, 5.1)], Efficiency(), "0.1.0", "2026-12-02T00:00:00Z")
    path = tmp_path / "cal.toml"
    path.write_text(to_toml(c))
    back = load_calibration(str(path))
    assert (back.gpu, back.matmul_fraction, back.fragmentation) == (c.gpu, c.matmul_fraction, c.fragmentation)
    assert back.logs[0].name == "a.log" and back.planner_version == "0.1.0"
    bad = tmp_path / "bad.toml"
    text = path.read_text()
    for broken, why in ((text.replace(f"matmul_fraction = {c.matmul_fraction}", "matmul_fraction = 7"), "0.05 to 1"),
                        (text.replace("[efficiency]", "[efficiency]\nhbm_fraction = 0.5"), "takes matmul_fraction"),
                        ("gpu = 'h100'\nspeed = 2\n", "unknown key"), ("not toml [", "not valid TOML")):
        bad.write_text(broken)
        r = run("--model", "8b", "--gpus", "h100", "--calibration", bad)
        assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output


def _write_calibration(tmp_path: Path) -> Path:
    out = tmp_path / "h100.toml"
    r = run("calibrate", SAMPLES / "megatron_llama2-7b_h100x8.log", "--model", "llama2-7b", "--gpus", "h100",
            "--dp", "4", "--tp", "2", "--pp", "1", "--cp", "1", "--zero", "1", "--micro-batch", "1",
            "--recompute", "selective", "--out", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.slow
def test_calibration_applies_to_plan_json_and_names_the_file(tmp_path: Path):
    out = _write_calibration(tmp_path)
    cal = load_calibration(str(out))
    args = ("--model", "8b", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "3",
            "--micro-batch", "1", "--recompute", "selective", "--global-batch", "64", "--json")
    before, after = json.loads(run(*args).output), json.loads(run(*args, "--calibration", out).output)
    assert "calibration" not in before["assumptions"]            # no file: the JSON is as it was
    assert after["assumptions"]["calibration"] == str(out)
    assert after["assumptions"]["step_time_model"]["matmul_fraction"] == cal.matmul_fraction
    assert after["assumptions"]["overheads"]["fragmentation"] == cal.fragmentation
    # a slower matmul: a longer step on the same layout
    assert after["plan"]["step_time_s"] > before["plan"]["step_time_s"]
    text = run(*args[:-1], "--calibration", out).output
    assert f"calibration: {out}" in text
    # plan --tokens on the same fixed layout takes it too
    tok = json.loads(run(*args, "--tokens", "1B", "--calibration", out).output)
    assert tok["assumptions"]["calibration"] == str(out)
    r = run("--model", "8b", "--gpus", "a100", "--calibration", out)
    assert r.exit_code == 2 and "fitted on h100" in r.output
    r = run("buy", EXAMPLES / "jobs.yaml", "--gpus", "b200", "--calibration", out)
    assert r.exit_code == 2 and "fitted on h100" in r.output


def test_calibrate_needs_the_layout_and_refuses_bad_logs(tmp_path: Path):
    log = SAMPLES / "deepspeed_llama2-7b_h100x8.log"
    r = run("calibrate", log, "--model", "llama2-7b", "--gpus", "h100", "--out", tmp_path / "x.toml")
    assert r.exit_code == 2 and "needs the layout" in r.output
    lay = ("--model", "llama2-7b", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1",
           "--zero", "3", "--micro-batch", "2", "--global-batch", "64", "--recompute", "full", "--out",
           tmp_path / "x.toml")
    junk = tmp_path / "junk.log"
    junk.write_text("nothing here\n")
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.log"
    with open(huge, "wb") as f:          # sparse: no disk used
        f.truncate(MAX_LOG_BYTES + 1)
    for bad, why in ((junk, "no step line"), (fifo, "not a regular file"), (huge, "more than"),
                     (tmp_path / "missing.log", "no such file"), (tmp_path, "directory")):
        r = run("calibrate", bad, *lay)
        assert r.exit_code == 2 and why in r.output, (bad, r.output)
        assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.toml").exists()
    r = run("calibrate", log, *lay)
    assert r.exit_code == 0, r.output
    r = run("calibrate", log, *lay)
    assert r.exit_code == 2 and "--force" in r.output          # an existing file is kept


def test_read_log_of_each_sample():
    stacks = {read_log(p).stack for p in SAMPLES.glob("*.log")}
    assert stacks == {"torchtitan", "megatron", "deepspeed", "hf-trainer"}


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("examples_run", EXAMPLES / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_calibration_example_prints_its_committed_output():
    # examples/calibrate/commands.sh: four stacks calibrated, plans before and after. Run in this
    # process (in ~2 s rather than ~20 s of interpreter starts) in examples/run.py's environment;
    # regenerate.py runs them as subprocesses, as examples/run.py does, and writes the same text
    r = _runner()
    parts = []
    for args in r.read_commands(SAMPLES / "commands.sh"):
        res = CliRunner(env=r.ENVIRONMENT).invoke(cli, args, prog_name="plan")
        text = f"$ {shlex.join(['plan', *args])}\n{res.stdout}"
        if res.stderr:
            text += f"{'' if text.endswith(chr(10)) else chr(10)}(stderr)\n{res.stderr}"
        if res.exit_code:
            text += f"{'' if text.endswith(chr(10)) else chr(10)}[exit status {res.exit_code}]\n"
        parts.append(text)
    actual = r.mask("\n".join(parts))
    want = r.mask((SAMPLES / "output.txt").read_text(encoding="utf-8"))
    assert actual == want, ("examples/calibrate/output.txt is stale: run `python examples/calibrate/regenerate.py`"
                            + "".join(difflib.unified_diff(want.splitlines(True), actual.splitlines(True))))


@pytest.mark.slow
def test_runs_file_fits_logs_of_three_layouts_jointly(tmp_path: Path):
    out = tmp_path / "h100.toml"
    r = run("calibrate", "--runs", SAMPLES / "runs.toml", "--gpus", "h100", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [lg["stack"] for lg in d["logs"]] == ["megatron", "torchtitan", "deepspeed"]
    assert len({lg["layout"] for lg in d["logs"]}) == 3
    # one fraction for three logs: it lies between the fractions each log alone gives
    alone = []
    for i in range(3):
        single = tmp_path / f"run{i}.toml"
        text = (SAMPLES / "runs.toml").read_text().split("[[run]]")
        single.write_text("[[run]]" + text[i + 1].replace('log = "', f'log = "{SAMPLES}/'))
        one = run("calibrate", "--runs", single, "--gpus", "h100", "--out", tmp_path / f"o{i}.toml", "--json")
        assert one.exit_code == 0, one.output
        alone.append(json.loads(one.output)["matmul_fraction"]["after"])
    assert min(alone) < d["matmul_fraction"]["after"] < max(alone)
    assert d["rms_log_error"]["after"] < d["rms_log_error"]["before"]


@pytest.mark.parametrize("runs, why", [
    ("[[run]]\nlog = 'megatron_llama2-7b_h100x8.log'\n", "exactly log"),
    ("[[run]]\nlog = 'megatron_llama2-7b_h100x8.log'\noptions = '--model llama2-7b --dp nine'\n", "run 1"),
    ("title = 'x'\n", "expected [[run]]"),
])
def test_bad_runs_file_is_one_line(tmp_path: Path, runs: str, why: str):
    f = tmp_path / "runs.toml"
    f.write_text(runs)
    r = run("calibrate", "--runs", f, "--gpus", "h100", "--out", tmp_path / "o.toml")
    assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.slow
def test_explain_applies_and_names_the_calibration(tmp_path: Path):
    out = _write_calibration(tmp_path)
    cal = load_calibration(str(out))
    args = ("explain", "--model", "8b", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1",
            "--zero", "3", "--micro-batch", "1", "--recompute", "selective", "--global-batch", "64")
    text = run(*args, "--calibration", out).output
    assert f"matmul fraction = {cal.matmul_fraction}" in text and f"calibration: {out}" in text
    assert json.loads(run(*args, "--json", "--calibration", out).output)["calibration"] == str(out)
    assert "calibration" not in json.loads(run(*args, "--json").output)


def test_axes_not_given_are_not_split(tmp_path: Path):
    # the DeepSpeed sample ran ZeRO-3 data parallelism alone: --tp/--pp/--cp/--ep may be left out
    r = run("calibrate", SAMPLES / "deepspeed_llama2-7b_h100x8.log", "--model", "llama2-7b", "--gpus", "h100",
            "--dp", "8", "--zero", "3", "--micro-batch", "2", "--global-batch", "64", "--recompute", "full",
            "--out", tmp_path / "ds.toml", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["logs"][0]["layout"].startswith("dp=8, tp=1, pp=1")


def test_a_log_faster_than_any_matmul_fraction_says_so():
    from planner.timing.model import Efficiency

    # 0.5 s for a step the planner needs ~5 s for at the shipped fraction: even 1.0 cannot match
    c = fit([_observation("fast.log", "llama2-7b", LAY_A, 64, 4096, 0.5)], Efficiency(), "0.1.0", "now")
    assert c.at_bound and c.matmul_fraction == 1.0
    assert "at_bound = true" in to_toml(c)


def test_a_fit_above_the_measured_matmul_maximum_is_named():
    # a log a little faster than the planner at the H100's measured sustained rate (MSMF 0.711,
    # ml-engineering) fits a fraction above it; the summary says what that fraction absorbs
    from planner.cli.calibrate import summary_json, summary_text
    from planner.timing.model import Efficiency, step_time

    o = _observation("quick.log", "llama2-7b", LAY_A, 64, 4096, 1.0)
    at_max = step_time(o.model, o.setup, o.layout, o.cluster, Efficiency(matmul_fraction=0.711)).step_time_s
    o = dataclasses.replace(o, step_time_s=0.85 * at_max)
    c = fit([o], Efficiency(), "0.1.0", "now")
    assert c.measured_max == 0.711 and c.matmul_fraction > 0.711 and not c.at_bound
    from planner.measure.logs import TrainingLog

    lg = TrainingLog(path="quick.log", stack="megatron", steps=(), memory=())
    assert "measured to sustain" in summary_text(c, [lg], Path("cal.toml"))
    assert summary_json(c, [lg], Path("cal.toml"))["matmul_fraction"]["measured_max"] == 0.711


def test_a_log_is_sized_under_the_memory_profile_of_the_stack_that_wrote_it(tmp_path):
    """Issue 33: `plan calibrate ... --stack torchtitan` was 'No such option', and a torchtitan
    log was fitted under the hf memory profile. By default the log's own stack now sizes it
    (torchtitan's profile, measured against torchtitan's own step in docs/accuracy-torchtitan.md);
    --stack chooses another."""
    import json as _json

    from click.testing import CliRunner as _Runner

    from planner.cli.main import cli as _cli

    args = ["calibrate", "examples/calibrate/torchtitan_llama3.1-8b_h100x8.log", "--model", "llama3.1-8b",
            "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1", "--fsdp", "full",
            "--micro-batch", "1", "--global-batch", "8", "--seq-len", "4096", "--recompute", "selective", "--json"]

    def tracked(*extra):
        r = _Runner().invoke(_cli, [*args, "--out", str(tmp_path / f"c{'-'.join(extra)}.toml"), *extra])
        assert r.exit_code == 0, r.output
        return _json.loads(r.stdout)["logs"][0]["tracked_bytes"]

    default, titan, hf = tracked(), tracked("--stack", "torchtitan"), tracked("--stack", "hf")
    assert default == titan != hf


def test_logs_past_their_total_are_refused_before_any_is_read(tmp_path: Path):
    """Issue 32's hunt: 64 logs (MAX_LOGS) of 255 MiB each passed both per-log limits and read
    16 GB (4 of them: 19 s of CPU and 1.4 GB on 2 cores). Two sparse logs (no disk used) of
    129 MiB are refused from their sizes, in one line, as are 65 logs that do not exist."""
    from planner.cli.calibrate import MAX_LOGS, MAX_LOGS_TOTAL_BYTES

    lay = ("--model", "llama2-7b", "--gpus", "h100", "--dp", "8", "--tp", "1", "--pp", "1", "--cp", "1",
           "--zero", "3", "--micro-batch", "2", "--global-batch", "64", "--recompute", "full", "--out",
           tmp_path / "x.toml")
    logs = []
    for i in range(2):
        logs.append(tmp_path / f"half{i}.log")
        with open(logs[-1], "wb") as f:
            f.truncate(MAX_LOGS_TOTAL_BYTES // 2 + 2**20)
    r = run("calibrate", *logs, *lay)
    assert r.exit_code == 2 and "258 MiB in all" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = run("calibrate", *(tmp_path / f"missing{i}.log" for i in range(MAX_LOGS + 1)), *lay)
    assert r.exit_code == 2 and f"{MAX_LOGS + 1} logs given" in r.output, r.output
    assert not (tmp_path / "x.toml").exists()
