"""Figures the docs quote are what the commands print (issue 33: docs said MLA and sliding
windows were not modelled while the code modelled them, '26 rows' where the table had 27).
Each check runs the command the doc names, or reads the file the doc counts; only cheap ones
(a plan is about a second)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from planner.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent


def doc(name: str) -> str:
    return (ROOT / name).read_text()


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args), prog_name="plan", env={"NO_COLOR": "1", "COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    return r.stdout


def test_models_md_gemma3_logits_and_activations():
    text = " ".join(doc("docs/models.md").split())
    m = re.search(r"`plan --model gemma3-1b --gpus h100 --n-gpus 1 --micro-batch 1` puts ([\d.]+) GiB in logits and "
                  r"loss against ([\d.]+) GiB of activations", text)
    assert m, "docs/models.md no longer quotes the Gemma 3 figures"
    out = run("--model", "gemma3-1b", "--gpus", "h100", "--n-gpus", "1", "--micro-batch", "1")
    logits = re.search(r"^logits and loss\s+([\d.]+) GiB", out, re.M)
    acts = re.search(r"^activations\s+([\d.]+) GiB", out, re.M)
    assert logits and acts
    assert (logits[1], acts[1]) == (m[1], m[2])


def test_models_md_no_longer_calls_modelled_architectures_unmodelled():
    text = doc("docs/models.md")
    # the "Not modelled yet" list ends where the family sections begin (the Kimi Linear section
    # below it names MLA as modelled)
    section = text[text.index("Not modelled yet"):text.index("### Hybrid Mamba-2 models")]
    assert "MLA" not in section and "Sliding-window" not in section


def test_tool_comparison_row_counts_are_its_table_rows():
    text = doc("docs/tool-comparison.md")
    table = [line for line in text.splitlines() if re.match(r"\| [a-z]", line) and not line.startswith("| model")]
    rows = {name: int(n) for name, n in re.findall(r"^- ([\w .-]+?): [\d.]+% median, \d+% worst \((\d+) rows\)",
                                                   text, re.M)}
    assert rows["planner"] == len(table)
    assert rows["accelerate estimate-memory"] == len(table)


def test_emit_md_schedule_is_what_the_megatron_args_say():
    """docs/emit.md quotes the schedule's defaults; megatron_args of a 1T-token plan carry them."""
    from planner import api
    from planner.emit.megatron import to_megatron_args
    from planner.hardware.gpus import get_gpu
    from planner.models.spec import load_model
    from planner.training.setup import TrainingSetup

    text = " ".join(doc("docs/emit.md").split())
    assert "`--lr 0.0003 --min-lr 3e-05 --lr-decay-style cosine" in text and "first run of 1,000 steps" in text
    r = api.plan(load_model("8b"), get_gpu("h100"), TrainingSetup(), tokens=1e12)
    r = api.evaluate_layout(r.model, r.gpu, r.setup, r.best.layout, tokens=1e12)
    args = to_megatron_args(r)
    for flag, value in (("--lr", "0.0003"), ("--min-lr", "3e-05"), ("--lr-decay-style", "cosine")):
        assert args[args.index(flag) + 1] == value


def test_calibrate_readme_quotes_the_example_output():
    readme, output = doc("examples/calibrate/README.md"), doc("examples/calibrate/output.txt")
    for line in re.findall(r"^(llama3\.1-\S+: .*)$", readme, re.M):
        assert line in output, line
    for pct in re.findall(r"allocator overhead \(fragmentation\): ([\d.]+%)", readme):
        assert f"allocator overhead (fragmentation): {pct}" in output


def test_readme_zero3_limit_quotes_the_plans():
    """README's known limit on ZeRO-3 at scale quotes the three fixed layouts' TFLOP/s per GPU."""
    import json

    text = " ".join(doc("README.md").split())
    m = re.search(r"on 384, 768 and 1,536 A100s; [^)]*\): (\d+), (\d+) and (\d+) TFLOP/s per GPU", text)
    assert m, "README no longer quotes the ZeRO-3 figures"
    got = []
    for n in (384, 768, 1536):
        out = run("--model", "gpt3-175b", "--gpus", "a100", "--n-gpus", str(n), "--dp", str(n), "--zero", "3",
                  "--seq-len", "2048", "--global-batch", "1536", "--micro-batch", str(1536 // n),
                  "--recompute", "full", "--stack", "deepspeed", "--json")
        got.append(str(round(json.loads(out)["plan"]["tflops_per_gpu"])))
    assert got == [m[1], m[2], m[3]]
