"""Layers kept in BF16 under a low-precision recipe (--bf16-layers, TrainingSetup.bf16_layers),
refereed by megatron-core 0.16.1's own code and by Megatron-Bridge's recipes.

1. Which layers: megatron-core's fp8_utils.is_first_last_bf16_layer, asked layer by layer on a
   TransformerConfig, against the planner's count per pipeline stage (training.layer_precision).
2. What megatron-core refuses (TransformerConfig.__post_init__: delayed scaling; more than
   num_layers // pp at either end) the planner refuses too, in one line.
3. The Megatron-LM arguments written for such a plan parse and build a TransformerConfig with
   first_last_layers_bf16 and the two counts.
4. The corpus rows keep the layers their recipe keeps (Megatron-Bridge
   src/megatron/bridge/training/mixed_precision.py and perf_recipes/_common.py).
5. Properties of the time and memory (not the planner's formula): a plan with some BF16 layers
   lies between the all-low-precision and the all-BF16 plan of the same layout.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
from conftest import plan_in_process, require
from megatron_args import parse_args

from planner import api
from planner.emit.megatron import to_megatron_args
from planner.errors import UserError
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.params import stage_layers
from planner.models.spec import load_model
from planner.training.checks import check_setup
from planner.training.layer_precision import stage_bf16_layers
from planner.training.setup import TrainingSetup

M8B = "llama3.1-8b"
SMALL = "qwen2.5-0.5b"
FP8_CS = dict(precision="fp8", fp8_recipe="tensorwise", stack="megatron")


def _config(**kw):
    """megatron-core's TransformerConfig of a small 32-layer model with ``kw``."""
    require("megatron.core")
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
    base = dict(num_layers=32, hidden_size=256, num_attention_heads=8, bf16=True, params_dtype=torch.bfloat16,
                pipeline_dtype=torch.bfloat16)
    return TransformerConfig(**{**base, **kw})


@pytest.mark.parametrize("pp, start, end", [(1, 1, 2), (1, 0, 14), (2, 1, 1), (4, 3, 2), (8, 4, 4), (1, 16, 16)])
def test_bf16_layers_per_stage_are_megatron_cores(pp, start, end):
    """megatron-core decides layer by layer on global layer numbers (fp8_utils.is_first_last_bf16_layer);
    summed over each stage of an even split, its BF16 layers equal the planner's count."""
    require("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.fp8_utils import is_first_last_bf16_layer
    cfg = _config(fp8="hybrid", fp8_recipe="tensorwise", first_last_layers_bf16=True, pipeline_model_parallel_size=pp,
                  num_layers_at_start_in_bf16=start, num_layers_at_end_in_bf16=end)
    counts = stage_layers(32, pp)
    first = 0
    for s, c in enumerate(counts):
        theirs = sum(is_first_last_bf16_layer(cfg, i) for i in range(first, first + c))
        assert stage_bf16_layers(s, pp, c, (start, end)) == theirs, (s, c)
        first += c


def test_delayed_scaling_refused_as_megatron_core_refuses_it():
    require("megatron.core")
    with pytest.raises(ValueError, match="Delayed scaling does not support first / last layer in BF16"):
        _config(fp8="hybrid", fp8_recipe="delayed", first_last_layers_bf16=True)
    m = load_model(M8B)
    with pytest.raises(UserError, match="delayed scaling: megatron-core refuses"):
        check_setup(m, TrainingSetup(precision="fp8", fp8_recipe="delayed", stack="megatron", bf16_layers=(1, 1)))
    check_setup(m, TrainingSetup(**FP8_CS, bf16_layers=(1, 1)))


def test_more_bf16_layers_than_a_stage_holds_refused_as_megatron_core_refuses_it():
    """32 layers over pp 8: megatron-core allows 4 at either end, not 5; so does the planner's rule."""
    require("megatron.core")
    _config(fp8="hybrid", fp8_recipe="tensorwise", first_last_layers_bf16=True, pipeline_model_parallel_size=8,
            num_layers_at_start_in_bf16=4, num_layers_at_end_in_bf16=4)
    with pytest.raises(ValueError, match=r"num_layers_at_start_in_bf16 \(5\) must be between 0"):
        _config(fp8="hybrid", fp8_recipe="tensorwise", first_last_layers_bf16=True, pipeline_model_parallel_size=8,
                num_layers_at_start_in_bf16=5, num_layers_at_end_in_bf16=4)
    m, gpu = load_model(M8B), get_gpu("h100")
    lay = Layout(pp=8, micro_batch=1, grad_accum=8, seq_len=4096)
    ok = api.evaluate_layout(m, gpu, TrainingSetup(**FP8_CS, global_batch=8, bf16_layers=(4, 4)), lay)
    assert ok.best is not None
    with pytest.raises(UserError, match="pp=8 leaves 4 layers on the first and the last stage"):
        api.evaluate_layout(m, gpu, TrainingSetup(**FP8_CS, global_batch=8, bf16_layers=(5, 4)), lay)


def test_the_stage_rule_over_a_batch_of_pp_refuses_what_megatron_core_refuses():
    """The rule on a batch's view (an array of pp, each answered from layouts.stages.stage_layers
    once per distinct pp) against megatron-core's TransformerConfig, asked per pp that divides its
    32 layers, at num_layers // pp and one more at the end."""
    import numpy as np

    from planner.layouts.rules import RULES, RuleView

    m = load_model(M8B)         # 32 layers, as _config's model
    rule = next(r for r in RULES if r.name == "bf16-layers-stage")
    pps = np.array([1, 2, 4, 8, 16, 32])
    seen = set()
    for extra in (0, 1):
        for pp in pps.tolist():
            end = 32 // pp + extra
            if pp == 1 and extra:
                continue        # (33 layers of 32: the set-up check refuses it first)
            setup = TrainingSetup(**FP8_CS, bf16_layers=(0, end))
            v = RuleView(m=m, setup=setup, gpus_per_node=8, dp=1, tp=1, pp=pps, cp=1, ep=1, zero_stage=0,
                         sharding=0, sp=0, vp=1, micro_batch=1, grad_accum=32)
            try:
                _config(fp8="hybrid", fp8_recipe="tensorwise", first_last_layers_bf16=True,
                        pipeline_model_parallel_size=pp, num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=end)
                refused = False
            except ValueError:
                refused = True
            assert bool(rule.fails(v)[pps.tolist().index(pp)]) == refused, (pp, end)
            seen.add(refused)
    assert seen == {False, True}


@pytest.mark.parametrize("args, says", [
    (["--bf16-layers", "1,1"], "needs --precision fp8 or nvfp4"),
    (["--precision", "fp8", "--bf16-layers", "1"], "is not START,END"),
    (["--precision", "fp8", "--bf16-layers", "-1,2"], "is not START,END"),
    (["--precision", "fp8", "--bf16-layers", "20,20"], "asks for 40 BF16 layers of a model with 32"),
    (["--precision", "fp8", "--stack", "megatron", "--bf16-layers", "1,1"], "delayed scaling"),
])
def test_bad_bf16_layers_exit_2_with_one_line(args, says):
    r = plan_in_process("--model", M8B, "--gpus", "h100", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1


def _plan(bf16_layers=(0, 0), precision="fp8", pp=4, **kw):
    """Qwen2.5-0.5B (24 layers) on H100s at one layout: dp 2, tp 1, pp ``pp``."""
    m, gpu = load_model(SMALL), get_gpu("h100")
    lay = Layout(tp=1, pp=pp, dp=2, zero_stage=1, micro_batch=1, grad_accum=8, seq_len=4096)
    prec = FP8_CS if precision == "fp8" else dict(precision=precision, stack="megatron")
    setup = TrainingSetup(**{**prec, **kw}, global_batch=lay.global_batch, bf16_layers=bf16_layers)
    r = api.evaluate_layout(m, gpu, setup, lay)
    assert r.best is not None
    return r


def test_megatron_args_build_megatron_cores_config():
    """The written arguments parse (Megatron-LM's names) and set TransformerConfig's three fields,
    which its __post_init__ accepts under FP8 current scaling."""
    r = _plan((1, 2))
    argv = to_megatron_args(r)
    a = parse_args(argv)
    assert a.first_last_layers_bf16 and (a.num_layers_at_start_in_bf16, a.num_layers_at_end_in_bf16) == (1, 2)
    cfg = _config(fp8=a.fp8_format, fp8_recipe=a.fp8_recipe, pipeline_model_parallel_size=4,
                  first_last_layers_bf16=a.first_last_layers_bf16,
                  num_layers_at_start_in_bf16=a.num_layers_at_start_in_bf16,
                  num_layers_at_end_in_bf16=a.num_layers_at_end_in_bf16)
    assert cfg.first_last_layers_bf16
    assert "--first-last-layers-bf16" not in to_megatron_args(_plan())


def test_time_between_all_low_precision_and_all_bf16():
    """Property: the step with BF16 layers on the first and last stage is slower than all-FP8 and
    faster than the all-BF16 plan of the same layout, and grows with the layers kept."""
    steps = [_plan(b).best.time.step_time_s for b in ((0, 0), (1, 1), (3, 3), (5, 5))]
    bf16 = _plan(precision="bf16-mixed").best.time.step_time_s
    assert steps == sorted(steps) and len(set(steps)) == 4
    assert steps[-1] < bf16
    # 6 and 6 of 24 over pp 4: the first and the last stage wholly BF16, the slowest stage is the
    # BF16 plan's last stage
    assert abs(_plan((6, 6)).best.time.step_time_s / bf16 - 1) < 0.02
    # one stage of 24: every layer in BF16 times as the BF16 plan's blocks (the casts gone, the
    # GEMMs at the BF16 rate); what differs is outside the blocks (the FP8 all-gathers and the
    # weight copies' bytes), so it lands within 2% of the BF16 plan
    one = _plan((12, 12), pp=1).best.time.step_time_s
    assert abs(one / _plan(precision="bf16-mixed", pp=1).best.time.step_time_s - 1) < 0.02


def test_bf16_layers_keep_no_low_precision_weight_copy():
    """Memory: the layers kept in BF16 hold no FP8 copy (megatron-core runs them in a null context),
    so a stage's FP8 copies shrink by their share; all 24 layers in BF16 on one stage hold none,
    the weights of the BF16 plan."""
    w = [_plan(b, pp=1).best.memory.breakdown.weights for b in ((0, 0), (3, 3), (6, 6))]
    assert w[0] > w[1] > w[2]
    all16 = _plan((12, 12), pp=1).best.memory.breakdown.weights
    assert all16 == _plan(precision="bf16-mixed", pp=1).best.memory.breakdown.weights


def test_explain_names_the_bf16_layers():
    r = plan_in_process("explain", "--model", M8B, "--gpus", "h100", "--precision", "fp8", "--fp8-recipe", "tensorwise",
                        "--stack", "megatron", "--bf16-layers", "1,2", "--n-gpus", "8", "--tp", "1", "--pp", "4",
                        "--dp", "2")
    assert r.returncode == 0, r.stderr
    assert "bf16 blocks on slowest stage = 2" in r.stdout


def test_default_is_none_and_unchanged():
    assert TrainingSetup().bf16_layers == (0, 0)
    base = _plan()
    same = _plan((0, 0))
    assert base.best.time.step_time_s == same.best.time.step_time_s
    assert replace(base.setup, bf16_layers=(0, 0)) == base.setup


def test_bf16_layers_keep_their_linear_inputs_in_16_bits():
    """Memory: the layers kept in BF16 save their linear inputs at 16 bits, not the recipe's size; all
    24 layers in BF16 on one stage hold the activations of the BF16 plan of the same layout."""
    acts = [_plan(b, pp=1).best.memory.breakdown.activations for b in ((0, 0), (3, 3), (12, 12))]
    assert acts[0] < acts[1] < acts[2]
    assert acts[2] == _plan(precision="bf16-mixed", pp=1).best.memory.breakdown.activations


def test_corpus_rows_keep_the_layers_their_recipe_keeps():
    """Megatron-Bridge src/megatron/bridge/training/mixed_precision.py: nemotron_3_super_bf16_with_nvfp4_mixed
    sets first_last_layers_bf16 and num_layers_at_end_in_bf16 = 14 (start at its default, 0); the Llama NVFP4
    recipes take bf16_with_nvfp4_mixed (none); the FP8 current-scaling and MXFP8 perf precisions none."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import megatron_bridge_rows as mbr

    seen = set()
    for r in mbr.load_rows():
        if not r.expressible:
            continue
        args = list(r.cli_args)
        kept = args[args.index("--bf16-layers") + 1] if "--bf16-layers" in args else None
        if r.precision == "NVFP4" and r.family == "nemotron-3-super":
            assert kept == "0,14", r.id
            seen.add(r.id)
        else:
            assert kept is None, r.id
    assert len(seen) == 7


def test_super_nvfp4_args_build_megatron_cores_fp4_config():
    """The Nemotron 3 Super NVFP4 recipe's plan (pretrain_mamba.py arguments): --fp4-format e2m1 with
    the last 14 of 88 layers in BF16, accepted by megatron-core's TransformerConfig, whose own
    is_first_last_bf16_layer then keeps layers 74..87 in BF16."""
    require("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.fp8_utils import is_first_last_bf16_layer
    r = plan_in_process("--model", "nemotron-3-super", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "64",
                        "--tp", "2", "--pp", "1", "--ep", "64", "--etp", "1", "--seq-len", "8192", "--micro-batch", "1",
                        "--global-batch", "512", "--zero", "1", "--precision", "nvfp4", "--bf16-layers", "0,14",
                        "--recompute", "none", "--quiet")
    assert r.returncode == 0, r.stderr
    m, gpu = load_model("nemotron-3-super"), get_gpu("gb200")
    lay = Layout(tp=2, sp=True, pp=1, dp=32, ep=64, etp=1, ep_fold=True, zero_stage=1, micro_batch=1, grad_accum=16,
                 seq_len=8192)
    setup = TrainingSetup(seq_len=8192, global_batch=512, precision="nvfp4", stack="megatron", bf16_layers=(0, 14))
    a = parse_args(to_megatron_args(api.evaluate_layout(m, gpu, setup, lay)))
    assert (a.fp4_format, a.first_last_layers_bf16, a.num_layers_at_start_in_bf16, a.num_layers_at_end_in_bf16) == \
        ("e2m1", True, 0, 14)
    cfg = _config(num_layers=a.num_layers, fp4=a.fp4_format, fp4_recipe=a.fp4_recipe,
                  first_last_layers_bf16=True, num_layers_at_start_in_bf16=0, num_layers_at_end_in_bf16=14)
    assert [i for i in range(88) if is_first_last_bf16_layer(cfg, i)] == list(range(74, 88))
