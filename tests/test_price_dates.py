"""Prices carry the date they were read; every cost shows it, and a price older than a year
on the day a plan runs is named in one warning line and in --json's stale_prices (issue 20)."""

import json
import re
from datetime import date

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.cost.prices import load_prices, price_period_end, stale_line, stale_prices

TODAY = date(2026, 12, 2)


def test_a_date_means_the_end_of_its_period():
    assert price_period_end("2024") == date(2024, 12, 31)
    assert price_period_end("2024-02") == date(2024, 2, 29)
    assert price_period_end("2026-11-09") == date(2026, 11, 9)
    assert price_period_end("") is None and price_period_end("soon") is None and price_period_end("2024-13") is None


def test_every_rent_in_the_catalog_has_a_date_and_its_source_instance_price():
    prices = load_prices()
    for name, p in prices.gpus.items():
        if p.rent_usd_per_gpu_hour is None:
            continue
        assert price_period_end(p.rent_date) is not None, name
        # a rate read off an instance's price ("$55.04/h / 8") is that price over its GPUs
        m = re.search(r"\$([0-9.,]+)/h / (\d+)", p.rent_source)
        if m:
            per_gpu = float(m.group(1).replace(",", "")) / int(m.group(2))
            assert p.rent_usd_per_gpu_hour == pytest.approx(per_gpu, abs=0.006), name
        if p.committed_usd_per_gpu_hour is not None:
            assert p.committed_usd_per_gpu_hour < p.rent_usd_per_gpu_hour, name
            assert price_period_end(p.committed_date) is not None, name


def test_the_refreshed_rents_are_fresh_and_the_old_ones_flagged():
    prices = load_prices()
    fresh = ["h100", "h200", "b200", "a100", "a100-40gb", "h100-pcie", "v100", "mi300x", "gh200", "b300"]
    assert stale_prices(prices, fresh, TODAY) == []
    flagged = stale_prices(prices, ["4090", "l40s"], TODAY)
    assert [(s["gpu"], s["price"], s["date"]) for s in flagged] == [("4090", "rent", "2024-12"),
                                                                     ("l40s", "rent", "2024-12")]
    assert flagged[0]["age_days"] == (TODAY - date(2024, 12, 31)).days
    line = stale_line(flagged)
    assert line is not None and "\n" not in line and "4090 rent (2024-12)" in line
    # issue 20's figure: H100 on demand is no longer the 2024-12 AWS list price of $12.29;
    # issue 33: one basis, GPU clouds: Lambda's 8 x H100 SXM at $3.99 (its list of 2026-09-20)
    assert prices.rent("h100") == pytest.approx(3.99)


def _plan(args, env_today="2026-12-02"):
    return CliRunner().invoke(cli, args, env={"PLANNER_TODAY": env_today, "COLUMNS": "100", "NO_COLOR": "1"})


@pytest.mark.slow
def test_json_and_report_name_a_stale_price(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text('[[gpu]]\nname = "h100"\nrent_usd_per_gpu_hour = 3.0\nrent_date = "2025-06"\n')
    args = ["--model", "8b", "--gpus", "h100", "--tokens", "100B", "--prices", str(old)]
    js = json.loads(_plan(args + ["--json"]).stdout)
    assert js["stale_prices"] == [{"gpu": "h100", "price": "rent", "date": "2025-06",
                                   "age_days": (TODAY - date(2025, 6, 30)).days}]
    assert json.loads(_plan(args + ["--json"], "2026-06-01").stdout)["stale_prices"] == []
    text = _plan(args).stdout
    assert "(price of 2025-06)" in text
    assert sum(line.startswith("warning: prices older than a year") for line in text.splitlines()) == 1
    shipped = json.loads(_plan(["--model", "8b", "--gpus", "h100", "--tokens", "100B", "--json"]).stdout)
    assert shipped["stale_prices"] == []
    assert shipped["prices"]["h100"]["rent_date"] == "2026-09-20"   # Lambda list (issue 33: one price basis)
