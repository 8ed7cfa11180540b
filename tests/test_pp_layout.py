"""--pp-layout: a pipeline split stated in megatron-core's layout syntax, refereed by megatron-core
0.16.1's own parser and validator (transformer/pipeline_parallel_layer_layout.py,
PipelineParallelLayerLayout: parse_str_to_list, the per-rank table ``layout[rank][chunk]`` and
validate_layer_layout) and by the layouts Megatron-Bridge trained DeepSeek-V3 with (the corpus's
printed layouts and the recipe's defaults, bench/megatron_bridge_rows.DEEPSEEK_V3_LAYOUTS)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from conftest import plan_in_process

from planner.layouts.stages import stage_layers
from planner.memory.pipeline import chunk_layers
from planner.training.pp_layout import LayoutError, check, stages

CORPUS = Path(__file__).resolve().parent / "data" / "megatron_bridge_runs.json"
LAYOUTS = [
    "Et*4|(t*4|)*14tmL",            # Megatron-Bridge's DeepSeek-V3 at pp x vp = 16 (26.04.01 B200, printed)
    "Et|(tt|)*30mL",                # its 25.09 H100 run at pp 8, vp 4 (printed)
    "Et*3|(tt|)*29,m|L",            # megatron-core's own example (pp 16, vp 2)
    "Et*16|t*16|t*16|t*13mL",       # the recipe's (4, 1)
    "Et*8|(t*8|)*6t*5mL",           # the recipe's (8, 1) and (4, 2)
    "E(t|)*3L",
]


def _megatron(text: str, pp: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.enums import LayerType
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    return PipelineParallelLayerLayout(text, pp), LayerType


@pytest.mark.referee
@pytest.mark.parametrize("text", LAYOUTS)
def test_the_parse_is_megatron_cores(text):
    _, kind = _megatron(text, 1)
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    letters = {kind.embedding: "E", kind.decoder: "t", kind.mtp: "m", kind.loss: "L"}
    theirs = ["".join(letters[x] for x in stage) for stage in PipelineParallelLayerLayout.parse_str_to_list(text)]
    assert list(stages(text)) == theirs


@pytest.mark.referee
@pytest.mark.parametrize("text, pp", [(LAYOUTS[0], 8), (LAYOUTS[0], 16), (LAYOUTS[0], 4), (LAYOUTS[1], 8),
                                      (LAYOUTS[3], 4), (LAYOUTS[4], 4)])
def test_each_rank_builds_what_megatron_core_builds(text, pp):
    """Memory, the step time and the emitter read chunk_layers and stage_layers: per rank and
    chunk, the decoder layers megatron-core's table gives that rank."""
    ref, kind = _megatron(text, pp)
    vp = len(stages(text)) // pp
    theirs = tuple(tuple(ref.layout[r][c].count(kind.decoder) for c in range(vp)) for r in range(pp))
    assert chunk_layers(61, pp, vp, text, 1) == theirs
    assert stage_layers(61, pp, text, 1) == [sum(c) for c in theirs]


@pytest.mark.referee
@pytest.mark.parametrize("text, layers, mtp", [
    ("Et*4|(t*4|)*14tmL", 61, 1), ("Et*4|(t*4|)*14tmL", 60, 1), ("Et*4|(t*4|)*14tmL", 61, 0),
    ("t*4|(t*4|)*14tmEL", 61, 1), ("Et*4|(t*4|)*14tLm", 61, 1), ("Et*4|(t*4|)*14mtL", 61, 1),
    ("Et*4|(t*4|)*13t*3m|mL", 61, 2), ("Et*4|(t*4|)*14tmmL", 61, 2), ("EEt*61L", 61, 0),
])
def test_the_planner_refuses_what_megatron_core_refuses(text, layers, mtp):
    ref, _ = _megatron(text, 1)
    try:
        ref.validate_layer_layout(layers, mtp or None)
        theirs = True
    except AssertionError:
        theirs = False
    try:
        check(text, layers, mtp)
        ours = True
    except LayoutError:
        ours = False
    assert ours == theirs


@pytest.mark.referee
def test_deepseek_v3_plans_and_writes_its_layout(tmp_path: Path):
    """The 26.04.01 B200 run's printed layout, planned as stated: --out megatron writes a layout
    megatron-core parses into the same table and accepts for DeepSeek-V3's 61 layers and MTP module."""
    row = next(r for r in json.loads(CORPUS.read_text())["rows"]
               if r["id"] == "mbridge-26.04.01-deepseekv3-b200-mxfp8-256gpu")
    printed = row["recipe_flags"]["other"]["pp_layout"]
    out = tmp_path / "out"
    r = plan_in_process("--model", "deepseek-v3", "--gpus", "b200", "--n-gpus", "256", "--stack", "megatron",
                        "--tp", "1", "--pp", "8", "--ep", "32", "--mtp", "1", "--pp-layout", printed,
                        "--micro-batch", "1", "--global-batch", "4096", "--out", str(out))
    assert r.returncode == 0, r.stderr
    argv = (out / "megatron_args.txt").read_text().split()
    assert argv[argv.index("--pipeline-model-parallel-size") + 1] == "8"
    written, _ = _megatron(argv[argv.index("--pipeline-model-parallel-layout") + 1], 8)
    nvidia, _ = _megatron(printed, 8)
    assert written.layout == nvidia.layout
    written.validate_layer_layout(61, 1)


@pytest.mark.referee
def test_empty_virtual_stages_plan_as_megatron_core_builds_them():
    """More virtual stages than layers, three of them empty: megatron-core's validator accepts the
    layout, and the planner plans it (the rule that refuses more chunks than layers is for the
    split rules' even chunks)."""
    text = "E(t|)*60(|)*3tmL"
    ref, kind = _megatron(text, 8)
    ref.validate_layer_layout(61, 1)
    r = plan_in_process("--model", "deepseek-v3", "--gpus", "b200", "--n-gpus", "256", "--stack", "megatron",
                        "--tp", "1", "--pp", "8", "--ep", "32", "--mtp", "1", "--pp-layout", text,
                        "--micro-batch", "1", "--global-batch", "4096")
    assert r.returncode == 0, r.stderr
    assert chunk_layers(61, 8, 8, text, 1) == tuple(tuple(ref.layout[r][c].count(kind.decoder) for c in range(8))
                                                    for r in range(8))
    assert chunk_layers(61, 8, 8, text, 1)[4][-1] == 0


def test_a_stated_layout_equal_to_the_rule_plans_the_same():
    """The 25.09 H100 layout stated with --pp-layout is the one --pp-balance embedding-loss-mtp
    splits by (the test above's sibling in test_emit_megatron_layout.py): the same plan."""
    common = ("--model", "deepseek-v3", "--gpus", "h100", "--n-gpus", "1024", "--stack", "megatron", "--tp", "2",
              "--pp", "8", "--vp", "4", "--ep", "64", "--etp", "1", "--mtp", "1", "--micro-batch", "1",
              "--global-batch", "8192", "--json")
    a = plan_in_process(*common, "--pp-layout", "Et|(tt|)*30mL")
    b = plan_in_process(*common, "--pp-balance", "embedding-loss-mtp")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    ja, jb = json.loads(a.stdout)["plan"], json.loads(b.stdout)["plan"]
    assert ja["step_time_s"] == jb["step_time_s"]
    assert ja["memory_bytes"] == jb["memory_bytes"] and ja["peak"] == jb["peak"]


@pytest.mark.parametrize("extra, needle", [
    (("--pp-layout", "Et*4|(t*4|)*14tmL"), "--pp-layout needs --pp"),
    (("--pp", "8", "--pp-layout", "Et*4|(t*4|)*14txL"), "holds 'x'"),
    (("--pp", "8", "--pp-layout", "t*61mL"), "no embedding 'E'"),
    (("--pp", "8", "--pp-layout", "Et*3|(t*4|)*14tmL"), "holds 60 transformer layers 't'; the model has 61"),
    (("--pp", "8", "--pp-layout", "Et*4|(t*4|)*14tL"), "holds 0 MTP modules 'm'; --mtp is 1"),
    (("--pp", "32", "--pp-layout", "Et*4|(t*4|)*14tmL"), "has 16 virtual stages; pp=32"),
    (("--pp", "8", "--vp", "4", "--pp-layout", "Et*4|(t*4|)*14tmL"), "has 16 virtual stages; pp=8 x vp=4"),
    (("--pp", "16", "--vp", "2", "--pp-layout", "Et*3|(tt|)*29,m|L"), "standalone MTP"),
    (("--pp", "8", "--pp-balance", "embedding-loss", "--pp-layout", "Et*4|(t*4|)*14tmL"), "drop --pp-balance"),
    (("--pp", "8", "--pp-layout", "Et*99999999L"), "unrolls to more than"),
    (("--pp", "8", "--pp-layout", "t" * 5000), "... is 5,000 characters long"),     # quoted, not echoed whole
])
def test_a_layout_that_cannot_run_gets_one_line(extra, needle):
    r = plan_in_process("--model", "deepseek-v3", "--gpus", "b200", "--n-gpus", "256", "--stack", "megatron",
                        "--mtp", "1", *extra)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and len(r.stderr) < 300


def test_a_layout_is_megatron_cores_alone():
    r = plan_in_process("--model", "llama3.1-8b", "--gpus", "h100", "--n-gpus", "16", "--stack", "deepspeed",
                        "--pp", "2", "--zero", "1", "--pp-layout", "Et*16|t*16L")
    assert r.returncode == 2 and "use --stack megatron" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
