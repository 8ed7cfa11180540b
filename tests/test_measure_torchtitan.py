"""torchtitan's own Llama 3 step under FSDPMemTracker (planner.measure.torchtitan).

The referees are outside the planner: transformers' LlamaForCausalLM counts the parameters,
FSDP2's sharding rule (dim 0 split over the dp ranks, padded to a multiple of them) and
torchtitan's tensor-parallel plan (torchtitan 0.3.0, models/llama3/sharding.py: every matrix
split over tp, the RMSNorm weights replicated) give the bytes of this rank's shard, and AdamW
keeps two fp32 states per parameter (Loshchilov & Hutter 2019, Algorithm 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import require

from planner.errors import UserError
from planner.measure import torchtitan as titan  # imports no torch or torchtitan itself


def needs_torchtitan() -> None:
    """Import torchtitan's Llama 3 for a test that builds it (seconds: called in the tests, so
    that collecting the fast tier imports neither torchtitan nor triton)."""
    require("triton", reason="torchtitan's models import triton (pip install triton)")
    require("torchtitan.models.llama3", reason="torchtitan is not installed (pip install torchtitan)")


ROOT = Path(__file__).resolve().parent.parent

# a Llama-architecture config.json small enough to run in a second; every dim is even, so
# FSDP2 (dp 2) and tensor parallelism (tp 2) split every tensor without padding
TINY: dict[str, Any] = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512, "rope_theta": 10000.0,
        "tie_word_embeddings": False}
SEQ = 128


def hf_param_count(cfg: dict) -> int:
    """transformers' own count of the same architecture (built on the meta device)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    return sum(p.numel() for p in model.parameters())


def run(cfg: dict = TINY, **kw: object) -> titan.TitanMeasurement:
    needs_torchtitan()
    return titan.measure(titan.TitanSetup(hf_config=cfg, seq_len=SEQ, **kw))  # type: ignore[arg-type]


@pytest.mark.slow
def test_fsdp2_shards_params_grads_and_adamw_states_over_dp() -> None:
    got = run(dp=2, tp=1, recompute="none")
    m = got.memory
    n = hf_param_count(TINY)
    assert m.n_params == n
    assert not got.scaled and got.measured_layers == (2,)
    # fp32 master weights, split in 2 by FSDP2 (torchtitan: training.dtype float32)
    assert m.raw_max["Sharded Param"] == n * 4 // 2
    # gradients reduce-scattered in fp32 (torchtitan: mixed_precision_reduce float32)
    assert m.raw_max["Sharded Grad"] == n * 4 // 2
    # AdamW exp_avg and exp_avg_sq in fp32 per shard, plus a 4-byte step per parameter tensor;
    # inside the step (foreach=False) one parameter's transients on top, the largest being
    # the embedding's or LM head's shard (512 x 128 / 2 fp32 values)
    shard_bytes = TINY["vocab_size"] * TINY["hidden_size"] * 4 // 2
    assert n * 8 // 2 <= m.max_optimizer_bytes <= n * 8 // 2 + 4 * shard_bytes
    assert m.tracker == "FSDPMemTracker" and m.peak_step == 2


@pytest.mark.slow
def test_tensor_parallel_and_recompute_policies() -> None:
    n = hf_param_count(TINY)
    norms = (2 * TINY["num_hidden_layers"] + 1) * TINY["hidden_size"]   # replicated over tp
    acts = {}
    for rc in ("none", "selective", "full"):
        m = run(dp=2, tp=2, recompute=rc).memory
        assert m.raw_max["Sharded Param"] == (n - norms) * 4 // 4 + norms * 4 // 2
        acts[rc] = m.max_activations_bytes
    # torchtitan's SelectiveAC keeps fewer tensors than no checkpointing, FullAC fewer still
    assert acts["none"] > acts["selective"] > acts["full"] > 0


@pytest.mark.slow
def test_scaling_from_two_depths_matches_the_full_depth() -> None:
    cfg = TINY | {"num_hidden_layers": 6}
    whole = run(cfg, dp=2, recompute="selective", blocks=(6,)).memory
    scaled = run(cfg, dp=2, recompute="selective", blocks=(2, 4))
    assert scaled.scaled and scaled.memory.n_params == whole.n_params == hf_param_count(cfg)
    s = scaled.memory
    assert s.peak_bytes == pytest.approx(whole.peak_bytes, rel=0.01)
    for cat in ("weights", "gradients", "optimizer"):
        assert getattr(s, f"max_{cat}_bytes") == pytest.approx(getattr(whole, f"max_{cat}_bytes"), rel=0.01)


@pytest.mark.slow
def test_the_chunked_loss_leaks_nothing_from_step_to_step() -> None:
    # torchtitan frees each step's loss chunks (bench/loss_peak_tensors.py --leak none); under
    # ModTracker's hooks on the LM head's leaf inputs they stayed, b s h x 2 B more at every
    # step's peak (trap 7). A third step must peak where the second did.
    two = run(dp=2, tp=2, recompute="full", micro_batch=2, n_steps=2).memory
    three = run(dp=2, tp=2, recompute="full", micro_batch=2, n_steps=3).memory
    assert three.peak_bytes == two.peak_bytes


@pytest.mark.slow   # imports torchtitan's models (5 s); the fast tier keeps the refusals and the doc's predictions
def test_llama3_8b_parameter_count_matches_transformers() -> None:
    needs_torchtitan()
    import torch

    from planner.models.spec import load_hf_config

    setup = titan.TitanSetup(hf_config=load_hf_config("llama3.1-8b"), seq_len=2048)
    cfg = titan.trainer_config(setup, 32)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    # docs/facts.md: transformers' Llama-3-8B has 8,030,261,248 parameters
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248


@pytest.mark.parametrize("kw, words", [
    ({"cp": 2}, "--cp cannot be measured"),
    ({"pp": 2}, "--pp cannot be measured"),
    ({"seq_len": 100}, "must be a multiple of 8"),
    ({"recompute": "op"}, "--recompute"),
    ({"hf_config": TINY | {"model_type": "mistral"}}, "model_type 'llama'"),
    ({"hf_config": TINY | {"attention_bias": True}}, "biases"),
])
def test_what_cannot_run_is_refused_with_the_reason(kw: dict, words: str) -> None:
    args = {"hf_config": TINY, "seq_len": SEQ} | kw
    with pytest.raises(UserError, match=words):
        titan.TitanSetup(**args)  # type: ignore[arg-type]


def test_docs_table_predictions_are_current() -> None:
    """Every row's prediction is what the planner predicts today (no torch: seconds)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_titan", ROOT / "bench" / "accuracy_torchtitan.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = json.loads((ROOT / "docs" / "accuracy-torchtitan.json").read_text())
    assert len(rows) == len(bench.GRID)
    for r in rows:
        assert bench.repredict(r)["rows"] == r["rows"], bench.key(r)
    assert (ROOT / "docs" / "accuracy-torchtitan.md").read_text() == bench.table(rows)


@pytest.mark.slow
def test_docs_table_measurement_is_current_for_one_row() -> None:
    """Re-measure the cheapest stored row (Llama 3.2 1B, dp 8, full recomputation)."""
    needs_torchtitan()
    rows = json.loads((ROOT / "docs" / "accuracy-torchtitan.json").read_text())
    r = next(r for r in rows if r["model"] == "llama3.2-1b" and r["tp"] == 1 and r["recompute"] == "full")
    from planner.models.spec import load_hf_config

    got = titan.measure(titan.TitanSetup(hf_config=load_hf_config(str(ROOT / r["source"])), dp=r["dp"],
                                         tp=r["tp"], seq_len=r["seq_len"], micro_batch=r["micro_batch"],
                                         recompute=r["recompute"]))
    assert got.memory.peak_bytes == r["rows"]["total"]["measured"]


@pytest.mark.parametrize("extra, words", [
    (["--pp", "2"], "--pp cannot be measured"),
    (["--cp", "2"], "--cp cannot be measured"),
    (["--recompute", "selective", "--compile"], "--compile cannot be measured under fake tensors"),
    (["--compile", "--real"], "does not compile the model yet"),
    (["--zero", "0"], "torchtitan shards with FSDP2"),
    (["--precision", "fp32"], "bf16-mixed"),
])
def test_plan_measure_stack_torchtitan_refuses_with_exit_2(extra: list[str], words: str) -> None:
    from click.testing import CliRunner

    from planner.cli.main import cli

    args = ["measure", "--stack", "torchtitan", "--model", "llama3.1-8b", "--gpus", "h100", "--dp", "2",
            "--tp", "2", "--seq-len", "2048", *extra]
    got = CliRunner().invoke(cli, args, prog_name="plan")
    assert got.exit_code == 2, got.output
    assert words in got.output and len(got.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_plan_measure_reads_every_category_at_the_trackers_peak_moment(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """Issue 16: the categories are compared at one moment of the step on both sides (the tracker's
    peak bucket and the planner's same moment), the moment is named, every category over 10% apart is
    given a reason, and the moments' totals, each against torchtitan's own step under the tracker,
    agree where the two are the same moment (the loss, the last block's backward, the optimizer step)."""
    needs_torchtitan()
    from click.testing import CliRunner

    from planner.cli.main import cli

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY | {"num_hidden_layers": 4}))   # one run, at full depth
    measured: dict[str, titan.TitanMeasurement] = {}      # measured once, in this process
    def once(setup: titan.TitanSetup, **_: object) -> titan.TitanMeasurement:
        if "m" not in measured:
            measured["m"] = titan.measure(setup)
        return measured["m"]

    monkeypatch.setattr(titan, "run_measurement", once)
    args = ["measure", "--stack", "torchtitan", "--model", str(config), "--gpus", "h100", "--dp", "2", "--tp", "2",
            "--seq-len", "256", "--micro-batch", "1", "--recompute", "selective"]
    got = CliRunner().invoke(cli, [*args, "--json"], prog_name="plan")
    assert got.exit_code == 0, got.output
    out = json.loads(got.output)
    assert out["moment"] in ("backward-start", "block-backward", "backward-end")
    named = " ".join(out["notes"])
    for row in out["rows"][:-1]:
        if row["error"] is not None and abs(row["error"]) > 0.10:
            # a reason covers it (by name), or it is too small to be one (the "small:" note)
            assert row["category"] in named or "small:" in named, (row, out["notes"])
    totals = {t["moment"]: t for t in out["moments"]}
    for moment in ("backward-start", "block-backward", "optimizer-step"):
        t = totals[moment]
        assert t["predicted_bytes"] == pytest.approx(t["measured_bytes"], rel=0.10), moment
    text = CliRunner().invoke(cli, args, prog_name="plan").output
    assert "tracked total by moment" in text and "categories at the tracker's peak moment" in text
