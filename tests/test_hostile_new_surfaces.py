"""Hostile inputs on the ninth stop's new surfaces (issue 32): --ep given with tp or pp left open,
--bf16-layers, and `plan buy` jobs no layout can run. Each case is a command that gave a wrong
reason (a memory limit, a way out that fails) before its fix."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import fast_one

from planner.cli.main import cli


def _plan(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args), prog_name="plan")
    return res.exit_code, res.output


@pytest.mark.parametrize("degrees, product", [(("--ep", "8"), "--ep 8 = 8"),
                                              (("--ep", "8", "--tp", "2"), "--tp 2 x --ep 8 = 16"),
                                              (("--ep", "8", "--pp", "3"), "--pp 3 x --ep 8 = 24")])
def test_an_ep_that_neither_divides_nor_folds_the_gpus_is_refused_as_such(degrees, product):
    """megatron-core 0.16.1 parallel_state.initialize_model_parallel (lines 788-795) needs etp x ep x pp
    to divide the world: on 12 GPUs ep 8 (etp 1 or tp) times any pp dividing 12 does not, and 12 / (tp pp)
    is no multiple of 8 either, so no layout runs. It was answered "No layout fits on 12 x h100 ...
    weights alone take 695.93 GiB ... it fits from 16: raise --max-gpus", a memory limit."""
    code, out = _plan("--model", "mixtral-8x7b", "--gpus", "h100", "--n-gpus", "12", *degrees)
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert f"--n-gpus 12 is not a multiple of {product}" in out and "fits" not in out


def test_a_fold_that_tiles_only_with_etp_1_names_it():
    """Megatron-Bridge's Nemotron 3 Super layout (tests/data/megatron_bridge_runs.json: 64 GPUs, TP 2, EP 64,
    ETP 1) without --etp: megatron-core defaults etp to tp (model_parallel_config.py lines 413-414), and
    etp 2 x ep 64 = 128 does not divide 64 GPUs; with --etp 1 it plans (test_ep_fold). It was answered
    "no layout fits on 64 x h100"."""
    code, out = _plan("--model", "nemotron-3-super", "--gpus", "h100", "--n-gpus", "64", "--tp", "2", "--ep", "64",
                      "-q")
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert "with --etp 1, not the default etp = tp = 2" in out
    code, _ = _plan("--model", "nemotron-3-super", "--gpus", "h100", "--n-gpus", "64", "--tp", "2", "--ep", "64",
                    "--etp", "1", "-q")
    assert code == 0


def test_a_buy_job_no_layout_can_run_is_not_called_a_memory_limit(tmp_path):
    """A QLoRA job of Nemotron 3 Super with global batch 17: `plan` answers "no layout can run ... (not a
    memory limit): global batch 17 is not a multiple of ..." (quantized weights run under data parallelism
    only, training.finetune), while `plan buy` said "no layout fits in memory on up to 4096 GPUs"."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - name: q\n    model: nemotron-3-super\n    method: qlora\n"
                    "    lora_targets: all-linear\n    tokens: 1B\n    deadline: 30d\n    global_batch: 17\n")
    code, out = _plan("buy", str(jobs), "--gpus", "h100", "--max-gpus", "64")
    assert code == 2 and "Traceback" not in out
    assert "no layout fits in memory or can run on up to 64 GPUs of h100" in " ".join(out.split())
    hint = ("`plan --model nemotron-3-super --gpus h100 --method qlora --seq-len 4096 --global-batch 17 "
            "--lora-targets all-linear` says why")
    assert hint in " ".join(out.replace("│", " ").split())
    code, out = _plan("--model", "nemotron-3-super", "--gpus", "h100", "--method", "qlora", "--seq-len", "4096",
                      "--global-batch", "17", "--lora-targets", "all-linear")
    assert code == 2 and "not a memory limit" in out


@pytest.mark.parametrize("value", [[1, 1], {"start": 1}])
def test_a_list_for_bf16_layers_from_the_python_api_is_refused_in_one_line(value):
    """TrainingSetup(bf16_layers=[1, 1]) raised "TypeError: unhashable type: 'list'" from the set-up's hash
    (units.hash_once) before any check; (-1, 0), (1.5, 1), None and the like were already refused as UserError
    by training.layer_precision.bf16_layer_refusal."""
    from planner.errors import UserError
    from planner.training.setup import TrainingSetup

    with pytest.raises(UserError, match="TrainingSetup.bf16_layers .* must be a tuple"):
        TrainingSetup(precision="fp8", bf16_layers=value)


@pytest.mark.parametrize("n", fast_one([48, 120], 48))
def test_the_cost_sweep_times_folded_and_unfolded_layouts_of_one_count_as_the_search_does(n):
    """`plan --model deepseek-v3 --ep 64 --etp 1 --gpus h100 --tokens 1T` exited 1 ("Unsupported: folded and
    unfolded expert parallelism in one batch"): with tp or pp open a count holds both kinds (ep 8 folds over
    tp 2 x dp 4 at pp 15 on 120 GPUs, and runs unfolded at tp 1, pp 15), and the --tokens / `plan buy` sweep
    timed them as one batch. Its three fastest now equal the plain search's on the count (search.size_count,
    whose folded timing tests/test_ep_fold.py referees against megatron-core's groups): on 48 GPUs an
    unfolded layout wins, on 120 a folded one."""
    from planner import api
    from planner.cost.plan import capacity_bytes
    from planner.hardware.gpus import get_gpu
    from planner.layouts.layout import SearchSpace
    from planner.models.spec import load_model
    from planner.search.sweep import count_layouts, sweep
    from planner.timing.model import cluster_for
    from planner.training.setup import TrainingSetup

    m, gpu, setup, space = load_model("qwen3-30b-a3b"), get_gpu("h100"), TrainingSetup(global_batch=512), \
        SearchSpace(ep=8, etp=1)
    folds = count_layouts(m, setup, n, gpu.gpus_per_node, space).ep_fold
    assert folds is not None and folds.any() and not folds.all()
    (cb,) = sweep(m, setup, cluster_for(gpu), [n], capacity_bytes(gpu, setup), space)
    searched = api.plan(m, gpu, setup, space, n_gpus=n).result.fitting[:3]
    assert [(c.layout, c.time.step_time_s) for c in cb.fastest] == [(c.layout, c.time.step_time_s) for c in searched]
    code, out = _plan("--model", "deepseek-v3", "--ep", "64", "--etp", "1", "--gpus", "h100", "--tokens", "1T", "-q")
    assert code == 0, out


@pytest.mark.parametrize("task, precision", [(("--task", "grpo"), ("--precision", "fp8", "--fp8-recipe", "tensorwise",
                                                                 "--bf16-layers", "2,3")),
                                             (("--teacher", "llama3.1-70b"), ("--precision", "fp32"))])
def test_a_trl_config_is_not_written_for_a_plan_at_another_precision(tmp_path, task, precision):
    """TRL's GRPOConfig and DistillationConfig are written with "bf16": true (TrainingArguments' bf16 mixed
    precision); an FP8 plan with BF16 layers (sized and timed at FP8 rates) or an fp32 one was written so,
    silently. Refused in one line, nothing written."""
    out_dir = tmp_path / "o"
    code, out = _plan("--model", "llama3.1-8b", "--gpus", "h100", *task, *precision, "--tp", "1", "--pp", "1",
                      "--cp", "1", "--out", str(out_dir), "-q")
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert f"--precision {precision[1]}: the config --out writes for TRL's" in out and not out_dir.exists()


@pytest.mark.parametrize("args, fold", [(("--model", "mixtral-8x7b", "--n-gpus", "12", "--ep", "8", "--tp", "1", "--pp",
                                          "1"), "etp 1 x ep 8 = 8 does not divide tp x cp x dp = 12"),
                                        (("--model", "qwen3-235b-a22b", "--n-gpus", "256", "--tp", "2", "--pp", "8",
                                          "--ep", "64", "--etp", "1", "--global-batch", "1000"),
                                         "etp 1 x ep 64 = 64 does not divide tp x cp x dp = 32")])
def test_a_batch_way_out_that_runs_nothing_either_is_not_given(args, fold):
    """The global batch rule is checked first (layouts.rules), so these were answered "global batch 1024 (1000) is
    not a multiple of ... x data-parallel 12 (16); global batches that divide: 1020 or 1032 (992 or 1008)", and
    each of those batches met megatron-core's refusal of the fold (parallel_state.initialize_model_parallel,
    lines 788-795: etp x ep x pp must divide the world; 256 GPUs at pp 8 leave 32 per stage, BAD of
    tests/test_ep_fold.py). The fold's reason is given instead."""
    code, out = _plan(*args, "--gpus", "h100", "-q")
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert fold in out and "global batch" not in out


@pytest.mark.parametrize("method, says", [(("--method", "freeze"), "not --method freeze: use --method full or lora"),
                                          (("--method", "qlora"), "not --method qlora: use --method full or lora"),
                                          (("--method", "lora", "--quant", "nf4"), "not --quant nf4: drop --quant")])
def test_low_precision_refusal_names_what_was_given(method, says):
    """`--method freeze --precision fp8` was told to "drop --quant or use --method full or lora": no --quant was
    given. The way out names the method or the --quant the command holds."""
    code, out = _plan("--model", "llama3.1-8b", "--gpus", "h100", "--precision", "fp8", *method, "-q")
    assert code == 2 and len(out.strip().splitlines()) == 1 and says in out


def test_a_buy_job_its_batch_keeps_on_few_gpus_is_not_told_to_raise_max_gpus(tmp_path):
    """A QLoRA job (quantized base weights run under data parallelism only, training.finetune) with global batch
    250: data-parallel counts divide 250 (1, 2, 5, 10, 25, ...), and a node holds 8 H100s, so no count past 2 runs
    it; `plan buy` advised "raise --max-gpus", which runs nothing more."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - name: q\n    model: llama3.1-8b\n    method: qlora\n    tokens: 100B\n"
                    "    deadline: 3d\n    global_batch: 250\n")
    code, out = _plan("buy", str(jobs), "--gpus", "h100", "--max-gpus", "64")
    text = " ".join(out.replace("│", " ").split())
    assert code == 2 and "Traceback" not in out
    assert "no plan exists on more than 2 x h100 (the global batch 250 and the model's degrees split no further)" \
        in text and "raise --max-gpus" not in text
