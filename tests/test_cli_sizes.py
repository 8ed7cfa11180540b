"""--seq-len 8k and --global-batch-tokens 4M (planner/cli/sizes.py).

Binary suffixes: Llama 2 trained with "a global batch-size of 4M tokens" at sequence 4,096
(Touvron et al. 2023, arXiv:2307.09288, Sec. 2.2), which is 1,024 sequences = 4,194,304
tokens; Llama 3.1's "128K" context is max_position_embeddings 131,072 (its config.json).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.cli.sizes import parse_binary_size, sequences_for_tokens
from planner.errors import UserError
from planner.models.spec import load_model


def _json(*args: str) -> dict:
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_llama2_4m_tokens_at_4096_is_1024_sequences() -> None:
    assert parse_binary_size("4M") == 1024 * 4096
    assert sequences_for_tokens(parse_binary_size("4M") or 0, 4096, 1 << 24) == 1024


def test_128k_is_llama31_context() -> None:
    assert parse_binary_size("128k") == load_model("llama3.1-8b").max_positions == 131072


def test_rounding_to_whole_sequences() -> None:
    assert sequences_for_tokens(4e6, 4096, 1 << 24) == 977            # 976.56 -> 977
    assert sequences_for_tokens(10, 4096, 1 << 24) == 1               # at least one
    with pytest.raises(UserError, match="beyond the limit"):
        sequences_for_tokens(2.0**50, 1, 1 << 24)


def test_token_batch_equals_the_same_batch_in_sequences() -> None:
    common = ("--model", "8b", "--gpus", "h100", "--n-gpus", "8", "--zero", "3", "--micro-batch", "1")
    by_tokens = _json(*common, "--seq-len", "8k", "--global-batch-tokens", "4M")
    by_sequences = _json(*common, "--seq-len", "8192", "--global-batch", "512")
    assert by_tokens == by_sequences


@pytest.mark.parametrize("args, needle", [
    (("--global-batch", "4M"), "--global-batch-tokens 4M"),
    (("--global-batch", "512", "--global-batch-tokens", "4M"), "not both"),
    (("--seq-len", "8q"), "sequence length"),
    (("--seq-len", "0.3k"), "sequence length"),     # 307.2 tokens is not whole
    (("--seq-len", "0"), "between 1"),
    (("--seq-len", "inf"), "sequence length"),      # bench/fuzz.py: float('inf') has no int (exit 1 before)
    (("--seq-len", "nan"), "sequence length"),
    (("--seq-len", "1e400"), "sequence length"),
    (("--global-batch-tokens", "lots"), "token count"),
])
def test_size_errors_exit_2_in_one_line(args: tuple[str, ...], needle: str) -> None:
    r = CliRunner().invoke(cli, ["--model", "8b", "--gpus", "h100", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
