"""Memory at the option limits never wraps int64 (issue 20): 405B at sequence 4,194,304
with eager attention and one rank per layer stack holds more activation bytes than an
int64 holds, which wrapped to a negative total and gave a plan that "fit" on 128 GPUs
(66 GiB per rank) with a NaN-cast RuntimeWarning on stderr."""

import json
import warnings

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.limits import MAX_MODELLED_BYTES

HUGE = ["--gpus", "h100", "--seq-len", "4194304", "--attention", "eager", "--kernels", "eager"]


def _run(args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # a RuntimeWarning would be an internal error (exit 1)
        return CliRunner().invoke(cli, args)


def test_a_layout_past_int64_never_fits_and_is_shown_saturated():
    # Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, no parallelism, no recompute:
    # s b h (34 + 5 a s / h) bytes per layer; 405B (h 16,384, a 128, 126 layers), s 4,194,304,
    # b 8: 9.0e16 bytes a layer, 1.1e19 for the 126 layers, past int64's 9.2e18
    s, b, h, a, layers = 4194304, 8, 16384, 128, 126
    korthikanti_bytes = layers * s * b * h * (34 + 5 * a * s / h)
    assert korthikanti_bytes > 2**63
    r = _run(["--model", "405b", *HUGE, "--n-gpus", "128", "--dp", "128", "--tp", "1", "--pp", "1",
              "--micro-batch", "8", "--recompute", "none", "--json"])
    assert r.exit_code == 2, r.output
    least = json.loads(r.stdout)["least_memory"]
    assert not least["fits"]
    assert least["memory_bytes"]["activations"] >= MAX_MODELLED_BYTES
    assert all(v >= 0 for v in least["memory_bytes"].values())


@pytest.mark.slow
def test_the_issue_command_says_nothing_fits_without_a_warning():
    for model in ("70b", "405b"):
        # the issue's command said --max-gpus 131072, which was silently capped to the 16,384 GPUs
        # dgx-h100 describes; past 16,384 that is now refused (tests/test_max_gpus.py)
        r = _run(["--model", model, *HUGE, "--max-gpus", "16384", "--quiet"])
        assert r.exit_code == 2, r.output
        assert "Warning" not in r.output and "internal error" not in r.output
        assert r.stderr == ""
        assert len(r.stdout.strip().splitlines()) == 1 and "no layout fits" in r.stdout, r.stdout


def test_a_dropout_too_large_for_a_float_is_refused_in_one_line(tmp_path):
    # bench/fuzz.py found it: "attn_pdrop": 10**400 raised OverflowError in math.isfinite (exit 1)
    from planner.models.spec import preset_config

    cfg = dict(preset_config("gpt2"), attn_pdrop=10**400)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(cli, ["--model", str(tmp_path / "config.json"), "--gpus", "h100", "--max-gpus", "64"])
    assert r.exit_code == 2, r.output
    assert "attn_pdrop" in r.stderr and "probability" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_topology_or_gpu_number_too_large_for_a_float_is_a_message():
    # the same math.isfinite(10**400) in the topology and GPU key checks (callers that skip
    # check_tree's int64 bound would have raised OverflowError)
    from planner.limits import check_topology_types

    assert "gpus_per_node must be" in check_topology_types({"gpus_per_node": 10**400}, "t.toml")
    assert "oversubscription must be" in check_topology_types({"oversubscription": 10**400}, "t.toml")
