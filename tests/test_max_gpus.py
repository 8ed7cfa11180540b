"""--max-gpus past the 16,384 GPUs the search tries by default (issue 20): searched in full
where the topology describes that many GPUs, refused in one line (exit 2) where it does not,
never silently capped. docs/options.md, "Input limits": --max-gpus 1 to 131,072."""

import pytest
from click.testing import CliRunner

from planner.cli.main import cli


def run(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("extra", [(), ("--tokens", "1T")])
def test_max_gpus_past_the_topology_is_refused_in_one_line(extra):
    # dgx-h100: 64 scalable units of 32 nodes of 8 GPUs = 16,384 GPUs (its [units] table)
    r = run("--model", "8b", "--gpus", "h100", "--max-gpus", "65536", *extra)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-gpus 65,536" in lines[0] and "dgx-h100" in lines[0], r.stderr
    assert "16,384 GPUs" in lines[0] and "--topology PATH" in lines[0]
    assert "Traceback" not in r.output


def test_max_gpus_at_the_limit_and_within_a_larger_topology_are_searched():
    r = run("--model", "8b", "--gpus", "h100", "--max-gpus", "16384", "--quiet")
    assert r.exit_code == 0, r.output
    # aws-p5 describes 2,500 nodes of 8 GPUs: 20,000 GPUs, more than the default search
    r = run("--model", "8b", "--gpus", "h100", "--topology", "aws-p5", "--max-gpus", "20000", "--quiet")
    assert r.exit_code == 0, r.output
    r = run("--model", "8b", "--gpus", "h100", "--topology", "aws-p5", "--max-gpus", "20001", "--quiet")
    assert r.exit_code == 2 and "20,000 GPUs" in r.stderr, r.output
