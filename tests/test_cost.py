"""Prices, durations, the jobs file, and the cost commands as a user runs them:
`plan --tokens` (one job), `plan buy` (a cluster purchase), `plan gpus` (the prices)."""

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.cost.jobs import load_jobs, parse_duration_s, parse_tokens, parse_when_s
from planner.cost.plan import cost_counts
from planner.cost.prices import load_prices, node_cost, node_energy_usd, rental_cost_usd
from planner.errors import UserError
from planner.hardware.gpus import list_gpus

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "jobs.yaml"


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


# ------------------------------------------------------------------------ prices

# GPUs added to the catalog (models branch, issue 17) before anyone found sourced market
# prices for them: `--objective time` plans them, `--tokens` cost plans skip them. A price
# added to presets/prices.toml must take its GPU off this list.
UNPRICED_GPUS = {"h20", "gb300", "mi355x", "5090", "l4", "rtx6000-ada"}
# GPUs with a dated 2026 rental price (issue 20) but no sourced node purchase price yet:
# `plan --tokens` costs them, `plan buy` cannot buy them.
RENT_ONLY_GPUS = {"h100-nvl", "gh200", "b300", "mi325x", "rtx-pro-6000", "a6000"}


def test_every_gpu_has_sourced_prices():
    prices = load_prices()
    for g in list_gpus():
        p = prices.for_gpu(g.name)
        if g.name in UNPRICED_GPUS:
            assert p.rent_usd_per_gpu_hour is None and p.node_purchase_usd is None, g.name
            continue
        assert p.rent_usd_per_gpu_hour and p.rent_source and p.rent_date, g.name
        if g.name in RENT_ONLY_GPUS:
            assert p.node_purchase_usd is None, g.name
            continue
        assert p.node_purchase_usd and p.purchase_source and p.purchase_date, g.name
        assert p.node_power_kw and p.power_source, g.name
    assert prices.electricity_source and prices.pue_source and 1 <= prices.pue < 3


def test_price_arithmetic():
    # AWS p5.48xlarge: $98.32/h for 8 GPUs = $12.29 per GPU-hour; 16 GPUs for 10 h
    assert rental_cost_usd(16, 10 * 3600, 12.29) == pytest.approx(16 * 10 * 12.29)
    prices = load_prices()
    # one DGX H100 for a year: 10.2 kW x 1.56 PUE x 8760 h x $0.082/kWh = $11,430
    assert node_energy_usd(10.2, 365 * 86400, prices) == pytest.approx(10.2 * 1.56 * 8760 * 0.082)
    nc = node_cost("h100", 365 * 86400, prices)
    assert nc.capex_usd == 270_000 and nc.tco_usd == pytest.approx(270_000 + 11_430, rel=1e-3)


def test_prices_override(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('pue = 1.2\n[[gpu]]\nname = "H100-SXM"\nrent_usd_per_gpu_hour = 2.5\n')
    p = load_prices(path)
    assert p.for_gpu("h100").rent_usd_per_gpu_hour == 2.5 and p.for_gpu("h100").rent_source == str(path)
    assert p.for_gpu("h100").node_purchase_usd == 270_000            # untouched entries stay
    assert p.pue == 1.2 and p.pue_source == str(path) and p.overrides == str(path)


@pytest.mark.parametrize("text, match", [
    ('[[gpu]]\nname = "h100"\nrent = 2\n', "unknown keys"),
    ('[[gpu]]\nname = "h9000"\nrent_usd_per_gpu_hour = 2\n', "unknown GPU"),
    ('[[gpu]]\nname = "h100"\nrent_usd_per_gpu_hour = -2\n', "number >= 0"),
    ("pue = 0.5\n", "pue must be >= 1"),
    ("pue = [\n", "not valid TOML"),
])
def test_bad_prices_files(tmp_path, text, match):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        load_prices(path)


# ----------------------------------------------------------------- durations, jobs

@pytest.mark.parametrize("text, seconds", [("30d", 30 * 86400), ("12h", 43200), ("2w", 14 * 86400),
                                           ("90min", 5400), ("1.5d", 1.5 * 86400), ("45s", 45)])
def test_durations(text, seconds):
    assert parse_duration_s(text, "--deadline") == seconds


@pytest.mark.parametrize("text", ["30", "soon", "3 fortnights", "-2d", "0d", ""])
def test_bad_durations(text):
    with pytest.raises(UserError, match="--deadline"):
        parse_duration_s(text, "--deadline")


def test_dates_and_tokens():
    anchor = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_when_s("2026-01-31", "deadline", anchor) == (30 * 86400, True)
    assert parse_when_s("10d", "deadline", anchor) == (10 * 86400, False)
    assert parse_tokens("2T", "tokens") == 2e12 and parse_tokens(3e11, "tokens") == 3e11
    for bad in ("-5", "lots", 0, True):
        with pytest.raises(UserError, match="token count"):
            parse_tokens(bad, "tokens")


def test_example_jobs_file():
    f = load_jobs(EXAMPLE)
    assert [j.name for j in f.jobs] == ["pretrain-8b", "finetune-70b", "continued-8b"]
    assert f.start.date().isoformat() == "2026-01-05" and f.horizon_s == 365 * 86400
    assert f.gpus == ("h100", "h200", "b200")
    ft = f.jobs[1]
    # start 14 days in; deadline 2026-02-20 is 46 days after the cluster's start
    assert ft.start_s == 14 * 86400 and ft.deadline_s == 46 * 86400 and ft.tokens == 60e9
    assert f.jobs[2].deadline_s == (60 + 21) * 86400


@pytest.mark.parametrize("body, match", [
    ("jobs:\n  - name: a\n    model: 8b\n    tokens: 1T\n", "missing deadline"),
    ("jobs:\n  - name: a\n    model: 8b\n    tokens: 1T\n    deadline: 3d\n    colour: red\n", "unknown keys"),
    ("jobs:\n  - name: a\n    model: 8b\n    tokens: -1T\n    deadline: 3d\n", "token count"),
    ("jobs:\n  - name: a\n    model: 8b\n    tokens: 1T\n    deadline: soon\n", "neither a duration"),
    ("jobs:\n  - name: a\n    model: 8b\n    tokens: 1T\n    deadline: 3d\n    method: magic\n", "method"),
    ("jobs: []\n", "non-empty list"),
    ("jobs:\n  - {name: a, model: 8b, tokens: 1T, deadline: 3d}\n  - {name: a, model: 8b, tokens: 1T, deadline: 3d}\n",
     "unique"),
    ("jobs: [\n", "not valid YAML"),
])
def test_bad_jobs_files(tmp_path, body, match):
    path = tmp_path / "jobs.yaml"
    path.write_text(body)
    with pytest.raises(UserError, match=match):
        load_jobs(path)


def test_cost_counts():
    assert cost_counts(8, 1024) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024]
    assert cost_counts(8, 40)[-2:] == [32, 40]          # the cap itself, a whole number of nodes


# ------------------------------------------------------------------- plan --tokens

@pytest.mark.slow
def test_issue_command_70b_h100_a100():
    r = run("--model", "70b", "--gpus", "h100,a100", "--tokens", "1e12", "--deadline", "60d")
    assert r.exit_code == 0, r.output
    assert "Cheapest plan:" in r.output and "The fastest layout at each GPU count" in r.output
    assert "optimality proved" in r.output and "(over deadline)" in r.output
    rows = [line for line in r.output.splitlines() if line.startswith("* ")]   # the chosen row of the table
    assert len(rows) == 1


@pytest.mark.slow
def test_cost_json_schema_and_the_choice_is_cheapest():
    r = run("--model", "8b", "--gpus", "h100,a100", "--tokens", "300B", "--deadline", "20d",
            "--max-gpus", "256", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    p = d["plan"]
    for plan in [p, *d["alternatives"], *d["by_gpu_count"]]:
        assert {"cost_usd", "train_time_s", "gpu_hours"} <= set(plan)
        assert plan["gpu_hours"] == pytest.approx(plan["train_time_s"] * (plan["n_gpus"]) / 3600)
    assert d["solver"]["optimal"] is True and d["solver"]["status"] == "Optimal"
    assert {"name", "status", "optimal"} <= set(d["solver"])
    assert p["train_time_s"] <= 20 * 86400 and p["n_gpus"] <= 256
    ok = [row for row in d["by_gpu_count"] if not row["breaks"]]
    assert p["cost_usd"] == pytest.approx(min(row["cost_usd"] for row in ok))
    assert sum(row["chosen"] for row in d["by_gpu_count"]) == 1
    assert d["infeasible"] is None and d["constraints"]["deadline_s"] == 20 * 86400
    rate = d["prices"][p["gpu"]]["rent_usd_per_gpu_hour"]
    assert p["cost_usd"] == pytest.approx(p["gpu_hours"] * rate)


def test_objective_time_picks_the_fastest():
    d = json.loads(run("--model", "8b", "--gpus", "h100", "--tokens", "300B", "--objective", "time",
                       "--max-gpus", "64", "--json").output)
    assert d["plan"]["train_time_s"] == pytest.approx(min(r["train_time_s"] for r in d["by_gpu_count"]))


@pytest.mark.slow
def test_infeasible_says_which_constraint_binds():
    r = run("--model", "8b", "--gpus", "h100", "--tokens", "1T", "--deadline", "2d", "--budget", "50k",
            "--max-gpus", "64")
    assert r.exit_code == 2
    assert "No plan satisfies the constraints" in r.output and "fits from" in r.output
    assert "the deadline (2 days) needs" in r.output and "budget ($50k)" in r.output
    d = json.loads(run("--model", "8b", "--gpus", "h100", "--tokens", "1T", "--deadline", "2d",
                       "--max-gpus", "64", "--json").output)
    assert d["plan"] is None and "deadline" in d["infeasible"]["binding"] and "max_gpus" in d["infeasible"]["binding"]
    assert d["infeasible"]["deadline_needs_gpus"] > 64 and d["solver"]["status"] == "Infeasible"


def test_plain_plan_is_unchanged_without_tokens():
    r = run("--model", "8b", "--gpus", "h100", "--json")
    d = json.loads(r.output)
    assert "solver" not in d and "cost_usd" not in d["plan"]


@pytest.mark.parametrize("args, match", [
    (["--gpus", "h100,h9000", "--tokens", "1T"], "unknown GPU 'h9000'"),
    (["--gpus", "h100,a100"], "--gpus takes one GPU type without --tokens"),
    (["--gpus", "h100", "--tokens", "1T", "--deadline", "soon"], "--deadline 'soon' is neither a duration"),
    (["--gpus", "h100", "--tokens", "-1T"], "must be between 1 and 1e18 tokens"),
    (["--gpus", "h100", "--deadline", "30d"], "--deadline needs --tokens"),
    (["--gpus", "h100", "--tokens", "1T", "--budget", "lots"], "amount in dollars"),
    (["--gpus", "h100,h100", "--tokens", "1T"], "twice"),
])
def test_bad_cost_input(args, match):
    r = run("--model", "8b", *args)
    assert r.exit_code == 2 and match in r.output, r.output


def test_missing_price(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[[gpu]]\nname = "h100"\nnode_power_kw = 9\n')
    r = run("--model", "8b", "--gpus", "h100", "--tokens", "1T", "--prices", str(path), "--max-gpus", "16")
    assert r.exit_code == 0                                   # the catalog still has the rent
    from planner.cost.prices import load_prices as lp
    prices = lp(path)
    assert prices.for_gpu("h100").node_power_kw == 9


# ------------------------------------------------------------------------ plan buy

@pytest.mark.slow
def test_buy_example():
    r = run("buy", str(EXAMPLE), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["feasible"] and d["solver"]["optimal"] and d["solver"]["status"] == "Optimal"
    assert d["tco_usd"] == pytest.approx(d["capex_usd"] + d["opex_usd"])
    bought = {g: v["gpus"] for g, v in d["nodes"].items()}
    for j in d["jobs"]:
        assert j["finish_s"] <= j["deadline_s"] + 1e-6 and j["n_gpus"] <= bought[j["gpu"]]
    # jobs that overlap on a GPU type fit together in what is bought
    for g, gpus in bought.items():
        for t in [j["start_s"] for j in d["jobs"]]:
            assert sum(j["n_gpus"] for j in d["jobs"] if j["gpu"] == g and j["start_s"] <= t < j["finish_s"]) <= gpus
    text = run("buy", str(EXAMPLE)).output
    assert "Buy:" in text and "capex" in text and "opex" in text and "Jobs:" in text and "optimality proved" in text


def test_buy_infeasible_budget_and_deadline(tmp_path):
    r = run("buy", str(EXAMPLE), "--gpus", "h100", "--budget", "100k")
    assert r.exit_code == 2 and "budget ($100k) is below the cheapest purchase" in r.output
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - {name: huge, model: 70b, tokens: 10T, deadline: 1d}\n")
    r = run("buy", str(path), "--gpus", "h100", "--max-gpus", "64")
    assert r.exit_code == 2 and "cannot meet its deadline" in r.output


def test_buy_bad_input(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - {name: a, model: 8b, tokens: 1T}\n")
    r = run("buy", str(path))
    assert r.exit_code == 2 and "missing deadline" in r.output
    r = run("buy", str(EXAMPLE), "--horizon", "30d")
    assert r.exit_code == 2 and "lengthen --horizon" in r.output
    r = run("buy", str(tmp_path / "nope.yaml"))
    assert r.exit_code == 2 and "no such file" in r.output


# ------------------------------------------------------------------------ plan gpus

def test_gpus_shows_prices(tmp_path):
    r = run("gpus")
    assert r.exit_code == 0 and "$/GPU-h" in r.output and "3.99" in r.output and "Price sources" in r.output
    rows = json.loads(run("gpus", "--json").output)
    h100 = next(row for row in rows if row["name"] == "h100")
    assert h100["prices"]["rent_usd_per_gpu_hour"] == 3.99 and h100["prices"]["rent_source"]
    path = tmp_path / "p.toml"
    path.write_text('[[gpu]]\nname = "h100"\nrent_usd_per_gpu_hour = 2.99\nrent_source = "our contract"\n')
    r = run("gpus", "--prices", str(path))
    assert "2.99" in r.output and "our contract" in r.output
    assert math.isfinite(load_prices(path).for_gpu("h100").rent_usd_per_gpu_hour)


def test_cost_plan_writes_the_chosen_plans_configs(tmp_path):
    out = tmp_path / "out"
    r = run("--model", "8b", "--gpus", "h100", "--tokens", "100B", "--max-gpus", "16", "--out", str(out))
    assert r.exit_code == 0, r.output
    written = json.loads((out / "plan.json").read_text())
    assert written["plan"]["n_gpus"] == int(r.output.split("Cheapest plan: ")[1].split(" x ")[0])


def test_cost_of_a_fixed_layout():
    r = run("--model", "8b", "--gpus", "h100", "--tokens", "100B", "--dp", "8", "--tp", "1", "--pp", "1",
            "--cp", "1", "--zero", "3", "--micro-batch", "1", "--recompute", "full", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["plan"]["n_gpus"] == 8 and d["plan"]["layout"]["zero_stage"] == 3
    assert d["solver"]["n_candidates"] == 1 and d["plan"]["cost_usd"] > 0
    r = run("--model", "8b", "--gpus", "h100", "--tokens", "100B", "--dp", "8", "--tp", "1", "--pp", "1",
            "--cp", "1", "--zero", "1", "--micro-batch", "1", "--recompute", "none")
    assert r.exit_code == 2 and "does not fit on h100" in r.output


# ------------------------------------------------ no deadline: the fastest of the cheapest (issue 33)

def test_no_deadline_takes_the_fastest_plan_within_the_models_noise_of_the_cheapest():
    """Costs along the GPU count are flat within a few percent once every count runs at the
    sustained ceiling; the fewest GPUs took 471 days for 70B on 1T tokens (issue 33). Now the
    fastest plan within the step-time model's noise of the lowest cost is taken: at most a
    few months, costing no more than the noise above the cheapest, and the report says what
    --deadline would change. Expected figures: the 80% interval's 50% half-width read from
    planner/timing/step_intervals.json (out-of-sample residuals, not the planner's formula)."""
    from planner.timing.intervals import interval_data

    r = run("--model", "70b", "--gpus", "h100", "--tokens", "1T", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["plan"]["train_time_s"] <= 90 * 86400
    row = interval_data()["levels"]["0.50"]
    noise = (math.exp(row["log_error_high"]) - math.exp(row["log_error_low"])) / 2
    assert out["cost_tolerance_rel"] == pytest.approx(noise)
    lowest = min(p["cost_usd"] for p in out["by_gpu_count"])
    assert out["plan"]["cost_usd"] <= lowest * (1 + noise) + 1e-6
    assert any("--deadline" in line for line in out["choice"])
    text = run("--model", "70b", "--gpus", "h100", "--tokens", "1T").stdout
    assert "--deadline D: the cheapest plan that finishes by D" in text


def test_a_deadline_still_takes_the_cheapest_then_the_fewest_gpus():
    """With --deadline the tolerance is off: the answer is the lowest cost that meets it."""
    r = run("--model", "70b", "--gpus", "h100", "--tokens", "1T", "--deadline", "60d", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["cost_tolerance_rel"] == 0 and out["choice"] == []
    meets = [p for p in out["by_gpu_count"] if p["train_time_s"] <= 60 * 86400]
    assert out["plan"]["cost_usd"] <= min(p["cost_usd"] for p in meets) * (1 + 1e-9)


def test_a_topology_that_caps_the_count_is_said_in_the_answer():
    """Issue 33: A100 and MI300X stopped short of the header's 'at most 16,384 GPUs' silently.
    Referee: the topology files' own sizes (dgx-a100: 38 units of 20 nodes x 8 GPUs)."""
    from planner.hardware.topology import load_topology, max_covered_gpus

    r = run("--model", "8b", "--gpus", "a100,h100", "--tokens", "10B", "--json")
    assert r.exit_code == 0, r.output
    caps = json.loads(r.stdout)["topology_caps"]
    assert caps == [{"gpu": "a100", "topology": "dgx-a100", "max_gpus": max_covered_gpus(load_topology("dgx-a100"))}]
    text = run("--model", "8b", "--gpus", "a100,h100", "--tokens", "10B").stdout
    assert "capped by topology: a100 at 6,080 GPUs (dgx-a100)" in text


@pytest.mark.slow
def test_gpu_types_priced_by_different_providers_are_said_so(tmp_path):
    """Issue 33: H100 at AWS on-demand ($6.88) beside H200 at Hyperstack ($3.99) made 'the cheapest
    GPU type' the cheaper provider, silently. Every catalog price names its provider; an answer
    comparing types of different providers says so; one provider's quotes (--prices) do not.
    The catalog is now on one kind of provider (GPU clouds): H100 is Lambda's $3.99 (8 x H100
    SXM, Lambda's list of 2026-09-20), H200 still Hyperstack's (Lambda lists no H200)."""
    from planner.cost.prices import load_prices

    shipped = load_prices(None)
    assert all(p.rent_provider for p in shipped.gpus.values() if p.rent_usd_per_gpu_hour is not None)
    r = run("--model", "8b", "--gpus", "h100,h200", "--tokens", "10B", "--json")
    out = json.loads(r.stdout)
    assert out["rent_providers"] == {"h100": "Lambda", "h200": "Hyperstack"}
    assert "prices from different providers: h100 Lambda, h200 Hyperstack" in run(
        "--model", "8b", "--gpus", "h100,h200", "--tokens", "10B").stdout
    quotes = tmp_path / "quotes.toml"
    quotes.write_text('[[gpu]]\nname = "h100"\nrent_usd_per_gpu_hour = 2.5\nrent_provider = "ACME"\n'
                      '[[gpu]]\nname = "h200"\nrent_usd_per_gpu_hour = 3.1\nrent_provider = "ACME"\n')
    same = run("--model", "8b", "--gpus", "h100,h200", "--tokens", "10B", "--prices", str(quotes))
    assert same.exit_code == 0, same.output
    assert "different providers" not in same.stdout


def test_the_default_global_batch_grows_with_the_run_and_is_said():
    """Issue 33: 1,024 x 4,096 tokens was kept for every run. With --tokens and no batch option
    the batch follows DeepSeek LLM's fit (arXiv:2401.02954, Eq. 1). Referees: DeepSeek LLM 67B
    trained on 2T tokens with a batch of 4,608 sequences of 4,096 (18.9M tokens, its Table 2);
    GPT-3 175B on 300B tokens with 3.2M (Brown et al. 2020, Table 2.1). DeepSeek's own run is
    within 1.5x; GPT-3's is 5.2x smaller than the fit gives (16.8M tokens): the fit is
    DeepSeek's, larger than the GPT-3 and Llama choices (planner/training/batch.py says so)."""
    from planner.training.batch import scaled_global_batch

    deepseek = scaled_global_batch(67_000_000_000, 2e12, 4096) * 4096
    assert 18.9e6 / 1.5 <= deepseek <= 18.9e6 * 1.5
    gpt3 = scaled_global_batch(175_000_000_000, 300e9, 2048) * 2048
    assert 3.2e6 <= gpt3 <= 3.2e6 * 6
    out = json.loads(run("--model", "70b", "--gpus", "h100", "--tokens", "1T", "--deadline", "60d", "--json").stdout)
    assert out["assumptions"]["global_batch"] == 4096 and "DeepSeek LLM" in out["global_batch_basis"]
    fixed = json.loads(run("--model", "70b", "--gpus", "h100", "--tokens", "1T", "--deadline", "60d",
                           "--global-batch", "1024", "--json").stdout)
    assert fixed["assumptions"]["global_batch"] == 1024 and fixed["global_batch_basis"] is None


def test_plan_buy_gives_fine_tunes_a_fine_tunes_batch_and_scales_pretraining(tmp_path):
    """Issue 33: every job of `plan buy` without a global_batch ran 1,024 x 4,096 tokens, a LoRA
    fine-tune included. Referee for the fine-tune's 64 sequences: Llama 2-Chat's supervised
    fine-tuning batch (arXiv:2307.09288, Sec. 3.1); a given global_batch is kept."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("start: 2026-01-05\nhorizon: 365d\ngpus: [h100]\njobs:\n"
                    "  - {name: tune, model: llama3.1-8b, tokens: 1B, deadline: 30d, method: lora}\n"
                    "  - {name: given, model: llama3.1-8b, tokens: 1B, deadline: 30d, global_batch: 256}\n")
    r = run("buy", str(jobs), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    batch = {j["name"]: j["layout"]["micro_batch"] * j["layout"]["grad_accum"] * j["layout"]["dp"] * j["layout"]["ep"]
             for j in out["jobs"]}
    assert batch == {"tune": 64, "given": 256}


def test_a_gpu_that_cannot_run_the_precision_is_refused_by_the_clis_one_rule():
    """`plan --tokens` over several GPU types asks training.checks.precision_refusal, as a plan on
    one type does: FP8 on an A100 (no FP8 tensor cores, NVIDIA A100 datasheet) is refused with the
    way out, not planned at the BF16 rate (issue 31)."""
    from click.testing import CliRunner

    from planner.cli.main import cli
    r = CliRunner().invoke(cli, ["--model", "8b", "--gpus", "h100,a100", "--tokens", "1e11", "--precision", "fp8"])
    assert r.exit_code == 2 and "no FP8 tensor cores" in r.output and "drop a100 from --gpus" in r.output
