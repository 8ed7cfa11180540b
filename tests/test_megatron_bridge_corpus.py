"""The recipe flags of the Megatron-Bridge corpus (issue 28).

Referees: the corpus's own printed rows (tests/data/megatron_bridge_runs.json, NVIDIA's
performance summary) and Megatron-Core's own config types (megatron-core's TransformerConfig and
CudaGraphScope). The flags were read from NVIDIA-NeMo/Megatron-Bridge's recipe files at the
commits each row names in ``recipe_flags.source``.
"""

from __future__ import annotations

import json
import re
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import megatron_bridge_recipes as recipes  # noqa: E402
from megatron_bridge_rows import CORPUS, load_rows  # noqa: E402

KEYS = {"moe_a2a_overlap", "dispatcher", "cuda_graph_scope", "cuda_graph_impl", "moe_shared_expert_overlap",
        "other", "source", "own_commit", "layout_matches"}
# "[owner/repo ]path@40-hex commit, CONFIG_NAME or recipe function" (no owner/repo: NVIDIA-NeMo/Megatron-Bridge)
SOURCE = re.compile(r"^([\w.-]+/[\w.-]+ )?(scripts/performance|src/megatron/bridge)/\S+\.py@[0-9a-f]{40}, \w+$")


@pytest.fixture(scope="module")
def corpus() -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(CORPUS.read_text())["rows"]}


@pytest.fixture(scope="module")
def latest() -> list[str]:
    return [r.id for r in load_rows(check=False) if r.latest]


def test_every_row_has_recipe_flags_with_a_source(corpus, latest):
    """Every row, the latest release of each configuration first (the step-time study's truth)."""
    assert latest and set(latest) <= set(corpus)
    missing = [rid for rid in corpus if "recipe_flags" not in corpus[rid]]
    assert not missing, f"rows without recipe_flags: {missing}"
    for rid in corpus:
        f = corpus[rid]["recipe_flags"]
        assert KEYS <= set(f), (rid, KEYS - set(f))
        assert SOURCE.match(f["source"]), (rid, f["source"])
        assert isinstance(f["own_commit"], bool) and isinstance(f["layout_matches"], bool)
        assert f["moe_a2a_overlap"] in (True, False, None) and f["moe_shared_expert_overlap"] in (True, False, None)
        assert isinstance(f["cuda_graph_scope"], list) and isinstance(f["other"], dict)
        assert "recipe_flags" in json.loads(CORPUS.read_text())["fields"]


def test_own_commit_means_the_rows_recipe_commit(corpus):
    """own_commit is true exactly where the file's commit starts with the short commit of the row's
    recipe field (the commit the corpus matched the row to)."""
    for rid, r in corpus.items():
        f = r.get("recipe_flags")
        if not f:
            continue
        commit = f["source"].split("@")[1][:40]
        short = (r.get("recipe") or "@").rsplit("@", 1)[1]
        assert f["own_commit"] == bool(short and commit.startswith(short)), rid


def test_a_layout_difference_names_the_printed_column(corpus):
    """Where the file's layout differs from the row, the row's side is the value NVIDIA printed."""
    for rid, r in corpus.items():
        f = r.get("recipe_flags")
        if not f:
            continue
        diffs = f.get("layout_differs", {})
        assert f["layout_matches"] == (not diffs), rid
        s = r["settings"]
        for col, text in diffs.items():
            printed = {"gpus": s["gpus"], "gbs": s["gbs"], "mbs": s["mbs"], "tp": s["tp"], "pp": s["pp"],
                       "cp": s["cp"], "vp": s["vp"], "ep": s["ep"], "fsdp": s["fsdp"]}[col]
            row_side = text.split(",")[0].removeprefix("row ")
            if col == "fsdp":
                assert row_side == str(isinstance(printed, int) and printed > 0), (rid, col, text)
            elif row_side == "None":
                assert printed in ("n/a", "not printed", 1), (rid, col, text)
            else:
                assert row_side == str(printed), (rid, col, text)


def test_flags_are_values_megatron_core_accepts(corpus):
    """Dispatchers and CUDA-graph scopes are members of Megatron-Core's own types (megatron-core's
    TransformerConfig Literals and CudaGraphScope). 'full_iteration' as an implementation is newer
    than the installed megatron-core 0.16.1 (its Literal is none/local/transformer_engine), so it is
    allowed by name."""
    from megatron.core.transformer.enums import CudaGraphScope
    from megatron.core.transformer.transformer_config import TransformerConfig

    hints = typing.get_type_hints(TransformerConfig)
    dispatchers = set(typing.get_args(hints["moe_token_dispatcher_type"])) | set(
        typing.get_args(hints["moe_flex_dispatcher_backend"]))
    impls = set(typing.get_args(hints["cuda_graph_impl"])) | {"full_iteration"}
    scopes = {s.name for s in CudaGraphScope}
    for rid, r in corpus.items():
        f = r.get("recipe_flags")
        if not f:
            continue
        assert f["dispatcher"] is None or f["dispatcher"] in dispatchers, (rid, f["dispatcher"])
        assert f["cuda_graph_impl"] is None or f["cuda_graph_impl"] in impls, (rid, f["cuda_graph_impl"])
        assert set(f["cuda_graph_scope"]) <= scopes, (rid, f["cuda_graph_scope"])
        if f["cuda_graph_impl"] in (None, "none"):
            assert f["cuda_graph_scope"] == [], rid


def test_the_recipes_doc_is_current():
    assert recipes.main(["--check"]) == 0


@pytest.mark.parametrize("rid, expected", [
    # QWEN3_235B_A22B_PRETRAIN_CONFIG_B200_FP8_MX_V2: moe_a2a_overlap=False, no CUDA graph settings
    ("mbridge-26.04.01-qwen3-235b-a22b-b200-mxfp8-256gpu", ("--moe-a2a-overlap", "off")),
    # QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2: moe_a2a_overlap=True, no CUDA graph settings
    ("mbridge-26.04.01-qwen3-235b-a22b-h100-fp8-256gpu", ("--moe-a2a-overlap", "auto")),
    # qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config -> _enable_hybridep_full_iteration_mxfp8:
    # cuda_graph_impl full_iteration, overlap_moe_expert_parallel_comm=True, fp8_dot_product_attention=True,
    # the hybridep backend of the flex dispatcher
    ("mbridge-26.08-qwen3-235b-a22b-gb200-mxfp8-256gpu",
     ("--moe-a2a-overlap", "auto", "--cuda-graphs", "full-iteration", "--moe-dispatcher", "flex", "--fp8-attention")),
    # QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_CS_V1: Transformer Engine graphs of attn, moe_router, moe_preprocess;
    # moe_flex_dispatcher_backend hybridep
    ("mbridge-25.09-qwen3-30b-a3b-tokendrop-gb200-fp8-cs-8gpu",
     ("--moe-a2a-overlap", "off", "--cuda-graphs", "moe", "--moe-dispatcher", "flex")),
    # LLAMA3_8B_PRETRAIN_CONFIG_GB200_FP8_CS_V1: cuda_graph_impl local, scope full_iteration (ep 1: no a2a option)
    ("mbridge-25.11-llama3-8b-gb200-fp8-cs-8gpu", ("--cuda-graphs", "full-iteration")),
    # LLAMA3_70B_PRETRAIN_CONFIG_GB200_NVFP4_V2: cuda_graph_impl "none" (its scope "full_iteration" is inert)
    ("mbridge-26.04.01-llama3-70b-gb200-nvfp4-64gpu", ()),
])
def test_recipe_flags_as_the_studys_plan_options(corpus, rid, expected):
    """The flags reach plan as their recipe files set them (bench/megatron_bridge_rows.runtime_args)."""
    row = next(r for r in load_rows(check=False) if r.id == rid)
    assert recipes.plan_options(corpus[rid], row) == expected
