"""The pipeline layout `plan --out megatron` writes for an uneven split, refereed by
megatron-core 0.16.1's own parser and validator of --pipeline-model-parallel-layout
(megatron/core/transformer/pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout:
its parse into layers per pipeline rank and virtual stage, and validate_layer_layout; its
get_num_layers_to_build reads the same table but needs an initialised parallel state): the
layout holds every decoder layer and every MTP module, and each rank builds the layers the
planner's memory and step-time models put on it (layouts.stages.stage_layers; the MTP modules
on the last stage, memory.shapes)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import plan_in_process

from planner.emit.megatron import pipeline_layout
from planner.layouts.stages import stage_layers


def _layout(text: str, pp: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.enums import LayerType
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    return PipelineParallelLayerLayout(text, pp), LayerType


@pytest.mark.referee
@pytest.mark.parametrize("n_layers, pp, vp, mtp", [
    (61, 8, 4, 1),      # DeepSeek-V3 with its MTP module on 8 x 4 virtual stages
    (61, 16, 1, 1),
    (61, 4, 2, 2),
    (24, 5, 1, 0),
    (30, 4, 3, 1),
])
def test_megatron_core_accepts_the_layout_and_builds_the_planners_split(n_layers, pp, vp, mtp):
    layout, kind = _layout(pipeline_layout(n_layers, pp, vp, mtp), pp)
    layout.validate_layer_layout(n_layers, mtp or None)      # raises on a layout megatron-core refuses
    built = [sum(layout.layout[r][c].count(kind.decoder) for c in range(vp)) for r in range(pp)]
    assert built == stage_layers(n_layers, pp)
    mtp_at = [(r, c) for r in range(pp) for c in range(vp)
              if kind.mtp in layout.layout[r][c]]
    assert mtp_at == ([(pp - 1, vp - 1)] if mtp else [])


@pytest.mark.referee
def test_deepseek_v3_with_mtp_writes_a_layout_megatron_core_accepts(tmp_path: Path):
    """Before, the layout of an uneven split held no "m", and megatron-core's validator refused
    it ("Number of mtp layers in layout must match mtp_num_layers")."""
    out = tmp_path / "out"
    r = plan_in_process("--model", "deepseek-v3", "--gpus", "h100", "--n-gpus", "1024", "--stack", "megatron",
                        "--tp", "2", "--pp", "8", "--vp", "4", "--ep", "64", "--mtp", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    argv = (out / "megatron_args.txt").read_text().split()
    text = argv[argv.index("--pipeline-model-parallel-layout") + 1]
    assert argv[argv.index("--mtp-num-layers") + 1] == "1"
    layout, _ = _layout(text, 8)
    layout.validate_layer_layout(61, 1)


CORPUS = Path(__file__).resolve().parent / "data" / "megatron_bridge_runs.json"


@pytest.mark.referee
def test_the_mtp_balance_writes_the_layout_nvidia_trained_deepseek_v3_with(tmp_path: Path):
    """--pp-balance embedding-loss-mtp counts the embedding, the loss and the MTP module as layers
    of the split: on DeepSeek-V3 at pp 8, vp 4 it writes the layout the corpus prints for
    Megatron-Bridge's 25.09 H100 run ("Et|(tt|)*30mL"), as megatron-core parses both, and the
    planner's memory and step time put on each rank the decoder layers that layout builds."""
    import json

    row = next(r for r in json.loads(CORPUS.read_text())["rows"]
               if r["id"] == "mbridge-25.09-deepseekv3-dropless-h100-fp8-cs-1024gpu")
    printed = row["recipe_flags"]["other"]["pp_layout"]
    out = tmp_path / "out"
    r = plan_in_process("--model", "deepseek-v3", "--gpus", "h100", "--n-gpus", "1024", "--stack", "megatron",
                        "--tp", "2", "--pp", "8", "--vp", "4", "--ep", "64", "--etp", "1", "--mtp", "1",
                        "--pp-balance", "embedding-loss-mtp", "--out", str(out))
    assert r.returncode == 0, r.stderr
    argv = (out / "megatron_args.txt").read_text().split()
    written, kind = _layout(argv[argv.index("--pipeline-model-parallel-layout") + 1], 8)
    nvidia, _ = _layout(printed, 8)
    assert written.layout == nvidia.layout
    written.validate_layer_layout(61, 1)
    built = [sum(written.layout[r][c].count(kind.decoder) for c in range(4)) for r in range(8)]
    assert built == stage_layers(61, 8, "embedding-loss-mtp", 1)


@pytest.mark.parametrize("args, needle", [
    (("--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "16", "--stack", "torchtitan", "--pp", "2"),
     "--pp-balance embedding-loss-mtp is megatron-core's split"),
    (("--model", "nemotron-3-nano", "--gpus", "h100", "--n-gpus", "16", "--stack", "megatron", "--pp", "2"),
     "drop --pp-balance embedding-loss-mtp"),
    (("--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "16", "--stack", "deepspeed", "--pp", "4",
      "--zero", "1"), "deepspeed"),
    # 26 layers + embedding + loss + 1 MTP module over 26 stages: no room for the loss and the module
    (("--model", "gemma3-1b", "--gpus", "h100", "--n-gpus", "26", "--stack", "megatron", "--pp", "26", "--mtp", "1"),
     "leaves the last stage less room than its loss and 1 MTP modules take"),
])
def test_the_mtp_balance_is_refused_where_megatron_core_does_not_split_so(args, needle):
    """One line, exit 2: on a stack that splits its own way, a hybrid, and a split that leaves the
    last stage no room; and a degree probe (report.advice.degree_conflict) that counts the MTP
    modules the split counts, so DeepSeek-V3's 64 units at pp 8 x vp 8 are not refused."""
    r = plan_in_process(*args, "--pp-balance", "embedding-loss-mtp")
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_deepseek_v3_fills_64_chunks_with_its_mtp_module():
    r = plan_in_process("--model", "deepseek-v3", "--gpus", "h100", "--n-gpus", "1024", "--stack", "megatron",
                        "--pp", "8", "--vp", "8", "--mtp", "1", "--pp-balance", "embedding-loss-mtp")
    assert r.returncode == 0, r.stderr
