"""The report says what a layout line alone would mislead about (issue 20): how Megatron-LM
counts an expert-parallel layout, and why a GPU count that does not divide the global batch
gets an odd layout, with the nearest counts that divide it."""

from click.testing import CliRunner

from planner.cli.main import cli
from planner.layouts.layout import Layout
from planner.report.text import layout_notes


def test_megatron_counts_expert_parallel_inside_data_parallel():
    # megatron-core 0.16.1 parallel_state.initialize_model_parallel: data_parallel_size =
    # world_size // (tp * pp * cp) = 8 // 2 = 4 here; expert_data_parallel_size =
    # world_size // (tp * ep * pp) = 8 // 8 = 1
    notes = layout_notes(Layout(dp=1, tp=1, pp=2, ep=4), 8, 1024)
    assert len(notes) == 1
    assert "data parallel 4 for the dense layers" in notes[0] and "expert data parallel 1" in notes[0]


def test_a_count_that_does_not_divide_the_batch_says_why_and_what_divides():
    assert layout_notes(Layout(dp=8, pp=3), 24, 1024) == [
        "24 GPUs do not divide the global batch of 1,024 sequences, so they cannot all be data-parallel "
        "ranks: dp 8 x pp 3; 16 or 32 GPUs divide it"]
    assert layout_notes(Layout(dp=16), 16, 1024) == []


def test_more_gpus_than_sequences_says_the_batch_limits_data_parallelism():
    """Issue 33: 2,048 GPUs for a batch of 1,024 sequences was reported as 'cannot be
    2,048-way data parallel', as if someone had asked for it."""
    assert layout_notes(Layout(dp=1024, tp=2), 2048, 1024) == [
        "the global batch of 1,024 sequences gives at most 1,024 data-parallel ranks (a whole sequence each), "
        "so 2,048 GPUs run dp 1024 x tp 2"]


def test_the_report_shows_the_note():
    r = CliRunner().invoke(cli, ["--model", "8b", "--gpus", "h100", "--n-gpus", "24"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "cannot all be data-parallel ranks: dp 8 x pp 3; 16 or 32 GPUs divide it" in r.stdout


def test_the_one_line_answer_carries_offloads_host_memory():
    """Issue 33: ZeRO-Infinity 70B on one 4090 'fit' on the one-line answer while the 1.18 TB of
    host memory it needs was in the long report only; --json's host figure is the referee."""
    import json

    args = ["--model", "70b", "--gpus", "4090", "--n-gpus", "1", "--zero", "3", "--offload-params", "cpu",
            "--offload-optimizer", "cpu"]
    line = CliRunner().invoke(cli, [*args, "--quiet"]).stdout
    plan = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)["plan"]
    host_gib = plan["offload"]["host_bytes_per_node"] / 2**30
    assert f"+ {host_gib:.2f} GiB CPU memory per node" in line, (line, host_gib)
