"""`plan --plot` and `plan buy --plot`: the figures have the panels, units and bars they
should, the files are valid PNG/SVG written atomically, and bad names or existing files
are refused before any search."""

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner import api
from planner.cli.main import cli
from planner.cost.buy import plan_purchase
from planner.cost.jobs import load_jobs
from planner.cost.plan import plan_cost
from planner.cost.prices import load_prices
from planner.cost.solve import Limits
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import SearchSpace
from planner.memory.model import CATEGORIES
from planner.models.spec import load_model
from planner.report import plot
from planner.training.setup import TrainingSetup

require("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SPACE = SearchSpace(ep=1)

JOBS = """\
start: 2026-01-05
horizon: 90d
gpus: [h100, a100]
jobs:
  - name: small
    model: gpt2
    tokens: 10B
    deadline: 10d
  - name: later
    model: qwen2.5-0.5b
    tokens: 5B
    start: 5d
    deadline: 10d
"""


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


@pytest.fixture(scope="module")
def plain():
    r = api.plan(load_model("gpt2"), get_gpu("h100"), TrainingSetup(seq_len=1024), SPACE, max_gpus=64)
    return r, api.scaling(r, SPACE, max_gpus=64)


@pytest.fixture(scope="module")
def costed():
    return plan_cost(load_model("gpt2"), [get_gpu("h100"), get_gpu("a100")], TrainingSetup(seq_len=1024), 1e9,
                     load_prices(None), SPACE, limits=Limits(max_gpus=64))


@pytest.fixture(scope="module")
def bought(tmp_path_factory):
    path = tmp_path_factory.mktemp("jobs") / "jobs.yaml"
    path.write_text(JOBS)
    jobs = load_jobs(path)
    return plan_purchase(jobs, list(jobs.gpus), load_prices(None), jobs.horizon_s, max_gpus=64)


def titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes]


def texts_of_svg(path: Path) -> str:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    return " ".join("".join(el.itertext()) for el in root.iter() if el.tag.endswith("text"))


# ------------------------------------------------------------------ pure figures

def test_plan_figure_panels_units_and_bars(plain):
    r, scaling = plain
    fig = plot.plan_figure(r, scaling)
    mem, step, tput = fig.axes
    assert len(fig.axes) == 3
    assert mem.get_title().startswith("Memory per rank")
    assert step.get_title() == "Step time vs GPU count"
    assert tput.get_title() == "Throughput vs GPU count"
    assert "GiB" in mem.get_ylabel()
    assert "(s" in step.get_ylabel() and "tokens/s" in tput.get_ylabel()
    assert step.get_xlabel().startswith("GPUs") and tput.get_xlabel().startswith("GPUs")
    # one stacked bar per layout (chosen + alternatives), one layer per memory category
    n_bars = 1 + len(r.alternatives)
    assert len(mem.containers) == len(CATEGORIES)
    assert all(len(c) == n_bars for c in mem.containers)
    assert mem.get_xticklabels()[0].get_text().split("\n")[0] == "chosen"
    # the stacks add up to each layout's total
    tops = [sum(c[i].get_height() for c in mem.containers) for i in range(n_bars)]
    totals = [c.memory.total / 2**30 for c in (r.best, *r.alternatives)]
    assert tops == pytest.approx(totals)
    # the GPU's capacity is a horizontal line at its GiB
    assert any(line.get_ydata()[0] == pytest.approx(r.gpu.memory_bytes / 2**30) for line in mem.get_lines())
    # step time against every count the scaling sweep found: the chosen count first
    xs = step.get_lines()[0].get_xdata()
    assert list(xs) == [c.n_gpus for c in scaling] and xs[0] == r.best.n_gpus and len(xs) > 1


def test_plan_figure_when_nothing_fits():
    r = api.plan(load_model("405b"), get_gpu("h100"), TrainingSetup(), SPACE, max_gpus=8)
    assert not r.fits
    fig = plot.plan_figure(r, api.scaling(r, SPACE, 8))
    assert len(fig.axes) == 3
    assert "nothing fits" in fig.get_suptitle()


def test_cost_figure_panels(costed):
    fig = plot.cost_figure(costed)
    mem, when, cost = fig.axes
    assert mem.get_title().startswith("Memory per rank")
    assert when.get_title().startswith("Time to train on 1B tokens")
    assert cost.get_title() == "Rental cost vs GPU count"
    assert "days" in when.get_ylabel() and "USD" in cost.get_ylabel()
    # a line per GPU type, then the chosen plan's star
    labels = [line.get_label() for line in when.get_lines()]
    assert labels[:2] == ["h100", "a100"] and labels[2].startswith("chosen")
    assert costed.chosen.gpu.name in fig.get_suptitle()


def test_buy_figure_panels(bought):
    assert bought.feasible
    fig = plot.buy_figure(bought)
    gpus, dollars, jobs = fig.axes
    assert titles(fig) == ["GPUs bought per type", "Cost per GPU type", "Jobs: run time and deadline"]
    assert gpus.get_ylabel() == "GPUs bought" and "USD" in dollars.get_ylabel()
    assert jobs.get_xlabel().startswith("days from 2026-01-05")
    assert len(gpus.patches) == len(bought.pools)                  # one bar per GPU type
    assert len(dollars.containers) == 2                            # purchase and power, stacked
    assert len(jobs.patches) == len(bought.plans)                  # one run per job
    assert [gpus.patches[i].get_height() for i in range(len(bought.pools))] == [
        bought.nodes[p.gpu] * p.gpus_per_node for p in bought.pools]


def test_buy_figure_labels_at_most_labelled_jobs_rows(bought):
    """Every job's run is drawn; past plot.LABELLED_JOBS jobs one row in ceil(jobs / LABELLED_JOBS)
    is labelled, the first job's (the top row) among them (issue 32's hunt: the labels of 256 jobs
    overlapped on the panel and took about 3 s of CPU to draw)."""
    from dataclasses import replace

    many = replace(bought, plans=tuple(bought.plans) * 14)
    n = len(many.plans)
    assert n > plot.LABELLED_JOBS
    jobs = plot.buy_figure(many).axes[2]
    every = -(-n // plot.LABELLED_JOBS)
    assert len(jobs.patches) == n
    ticks = list(jobs.get_yticks())
    assert len(ticks) == len(range(0, n, every)) <= plot.LABELLED_JOBS and n - 1 in ticks
    assert len(jobs.texts) == len(ticks)
    few = plot.buy_figure(bought).axes[2]         # up to LABELLED_JOBS: every row labelled
    assert len(few.get_yticks()) == len(few.texts) == len(bought.plans)


# ------------------------------------------------------------------------ files

@pytest.mark.slow
def test_save_png_and_svg_atomically(plain, tmp_path):
    import matplotlib.image

    fig = plot.plan_figure(*plain)
    png = plot.save(fig, tmp_path / "plan.png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[1] == round(fig.get_figwidth() * plot.DPI)
    svg = plot.save(fig, tmp_path / "plan.svg")
    text = texts_of_svg(svg)
    for title in titles(fig):
        assert title in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.png", "plan.svg"]   # no temporary left
    with pytest.raises(UserError, match="already exists"):
        plot.save(fig, png)
    assert plot.save(fig, png, force=True) == png


@pytest.mark.parametrize("name", ["plan.jpg", "plan", "plan.png.txt"])
def test_plot_format_refuses_other_suffixes(name):
    with pytest.raises(UserError, match=r"\.png or \.svg"):
        plot.plot_format(Path(name))


# -------------------------------------------------------------------------- CLI

@pytest.mark.slow
def test_cli_plot_png(tmp_path):
    out = tmp_path / "plan.png"
    res = run("--model", "gpt2", "--gpus", "h100", "--max-gpus", "16", "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert f"wrote the plot to {out}" in res.output


@pytest.mark.slow
def test_cli_plot_svg_with_tokens(tmp_path):
    out = tmp_path / "cost.svg"
    res = run("--model", "gpt2", "--gpus", "h100", "--tokens", "1e9", "--max-gpus", "16", "--plot", str(out))
    assert res.exit_code == 0, res.output
    text = texts_of_svg(out)
    assert "Rental cost vs GPU count" in text and "Memory per rank" in text


@pytest.mark.parametrize("extra", [(), ("--tokens", "1e9")])
def test_cli_bad_suffix_exits_2_before_the_search(tmp_path, extra):
    out = tmp_path / "plan.jpg"
    res = run("--model", "405b", "--gpus", "h100", "--plot", str(out), *extra)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and ".png" in lines[0] and ".svg" in lines[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_cli_existing_plot_needs_force(tmp_path):
    out = tmp_path / "plan.png"
    out.write_bytes(b"keep")
    res = run("--model", "gpt2", "--gpus", "h100", "--max-gpus", "8", "--plot", str(out))
    assert res.exit_code == 2
    assert "already exists" in res.output and "--force" in res.output
    assert out.read_bytes() == b"keep"
    res = run("--model", "gpt2", "--gpus", "h100", "--max-gpus", "8", "--plot", str(out), "--force")
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]


@pytest.mark.slow
def test_cli_buy_plot(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    assert run("buy", str(jobs), "--plot", str(tmp_path / "buy.gif")).exit_code == 2
    out = tmp_path / "buy.svg"
    res = run("buy", str(jobs), "--max-gpus", "64", "--plot", str(out))
    assert res.exit_code == 0, res.output
    assert "GPUs bought per type" in texts_of_svg(out)
    res = run("buy", str(jobs), "--max-gpus", "64", "--plot", str(out))
    assert res.exit_code == 2 and "already exists" in res.output


@pytest.mark.slow
def test_plain_plan_does_not_import_matplotlib():
    code = ("import sys; from planner.cli.main import main; sys.argv=['plan','--model','gpt2','--gpus','h100'];\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'")
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
