"""A cost plan over GPUs some of which have no rental price (issue 20): the priced ones are
planned, and each one left out is named in one line of the report, with the way to price
it, and in --json's gpus_left_out; with none priced, one error line (exit 2). h20 and gb300
carry no rental rate in planner/presets/prices.toml."""

import json

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.cost.prices import load_prices

ARGS = ["--model", "8b", "--tokens", "1T", "--max-gpus", "64"]


def run(*args):
    return CliRunner().invoke(cli, [*ARGS, *args])


def test_the_catalog_still_has_no_rent_for_the_gpus_these_tests_leave_out():
    prices = load_prices(None)
    assert prices.for_gpu("h20").rent_usd_per_gpu_hour is None
    assert prices.for_gpu("gb300").rent_usd_per_gpu_hour is None
    assert prices.for_gpu("h100").rent_usd_per_gpu_hour is not None


@pytest.mark.slow
def test_unpriced_gpus_are_left_out_and_named_one_line_each():
    r = run("--gpus", "h100,h20,gb300")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stdout.splitlines() if line.startswith("left out: ")]
    assert [line.split(",")[0] for line in lines] == ["left out: h20", "left out: gb300"]
    assert all("no rental price" in line and "--prices FILE" in line for line in lines)
    assert "Cheapest plan:" in r.stdout and "x h100" in r.stdout
    d = json.loads(run("--gpus", "h100,h20,gb300", "--json").stdout)
    assert d["gpus_considered"] == ["h100"]
    assert [x["gpu"] for x in d["gpus_left_out"]] == ["h20", "gb300"]
    assert d["plan"]["gpu"] == "h100"


@pytest.mark.slow
def test_nothing_priced_is_one_error_line_and_time_needs_no_price():
    r = run("--gpus", "h20")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "h20" in r.stderr
    d = json.loads(run("--gpus", "h100,h20", "--objective", "time", "--json").stdout)
    assert d["gpus_left_out"] == [] and d["gpus_considered"] == ["h100", "h20"]


@pytest.mark.slow
def test_plan_buy_leaves_out_gpus_it_cannot_buy_and_says_so():
    # h20 has neither a node purchase price nor a node power in planner/presets/prices.toml
    p = load_prices(None).for_gpu("h20")
    assert p.node_purchase_usd is None and p.node_power_kw is None
    r = CliRunner().invoke(cli, ["buy", "examples/jobs.yaml", "--gpus", "h100,h20"])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stdout.splitlines() if line.startswith("left out: ")]
    assert len(lines) == 1 and lines[0].startswith("left out: h20, no node price or power"), lines
    d = json.loads(CliRunner().invoke(cli, ["buy", "examples/jobs.yaml", "--gpus", "h100,h20", "--json"]).stdout)
    assert [x["gpu"] for x in d["gpus_left_out"]] == ["h20"] and set(d["nodes"]) == {"h100"}
    r = CliRunner().invoke(cli, ["buy", "examples/jobs.yaml", "--gpus", "h20"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "h20" in r.stderr
