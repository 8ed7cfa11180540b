"""FP8 training (planner.training.fp8): the recipes' defaults against the stacks' own code,
the predicted FP8 speedups against torchao's torchtitan benchmark, and the CLI end to end."""

import json
import math
from importlib.util import find_spec
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu
from planner.layouts.layout import Layout
from planner.memory.model import CATEGORIES, per_rank_memory
from planner.models.spec import count_params, load_model
from planner.report.explain import explain
from planner.timing.model import cluster_for, step_time
from planner.training.fp8 import RECIPES, STACK_DEFAULT, recipe, resolve_recipe
from planner.training.setup import TrainingSetup


def run(*args: str):
    return CliRunner().invoke(cli, list(args), prog_name="plan")


def _source(package: str, rel: str) -> str:
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return (Path(next(iter(spec.submodule_search_locations))) / rel).read_text()


def test_stack_defaults_are_the_stacks_own():
    """torchtitan 0.3.0's Float8LinearConverter defaults to rowwise; megatron-core 0.16.1's
    TransformerConfig to TE delayed scaling with an amax history of 1 and no fp8 params."""
    titan = _source("torchtitan", "components/quantization/float8.py")
    assert 'recipe_name: Literal["rowwise", "rowwise_with_gw_hp"] = "rowwise"' in titan
    assert STACK_DEFAULT["torchtitan"] == "rowwise"
    mcore = _source("megatron", "core/transformer/transformer_config.py")
    assert "'custom']] = (\n        \"delayed\"\n    )" in mcore
    assert "fp8_amax_history_len: int = 1\n" in mcore and "fp8_param: bool = False\n" in mcore
    assert STACK_DEFAULT["megatron"] == "delayed" and recipe("delayed").amax_history_len == 1
    assert recipe("delayed").gather_bytes == 2      # no --fp8-param-gather by default


def test_recipes_per_their_sources():
    # torchao saves the 16-bit input (float8_linear.py: save_for_backward(input_hp, weight_hp_t));
    # float8 all-gather only for tensorwise scaling (torchao fsdp_utils)
    assert recipe("tensorwise").saved_input_bytes == recipe("rowwise").saved_input_bytes == 2
    assert recipe("tensorwise").gather_bytes == 1 and recipe("rowwise").gather_bytes == 2
    # DeepSeek-V3 Sec. 3.3: FP8 inputs with one fp32 scale per 1x128 tile, fp32 gradients
    bw = recipe("blockwise")
    assert bw.saved_input_bytes == pytest.approx(1 + 4 / 128) and bw.grad_bytes == 4
    # TE fp8_meta: 3 forward + 2 backward tensors, history + scale + scale_inv in fp32
    assert recipe("delayed").amax_bytes_per_linear == 5 * 3 * 4
    assert resolve_recipe("auto", "torchtitan") == "rowwise" and resolve_recipe("blockwise", None) == "blockwise"
    with pytest.raises(ValueError):
        recipe("fp6")
    # Transformer Engine (common/recipe/__init__.py, pytorch/tensor/mxfp8_tensor.py): MXFP8 keeps row-
    # and column-wise E4M3 data, one E8M0 byte per 32 elements each; a saved input keeps one usage
    mx = recipe("mxfp8")
    assert mx.fp8_weight_copy_bytes == pytest.approx(2 * (1 + 1 / 32))
    assert mx.saved_input_bytes == pytest.approx(1 + 1 / 32)
    # tensor/nvfp4_tensor.py: E2M1 packed two per byte, one E4M3 byte per 16 elements; B200 data sheet:
    # FP4 dense 9 PFLOPS = 2 x FP8 4.5 PFLOPS
    fp4 = recipe("nvfp4")
    assert fp4.saved_input_bytes == pytest.approx(0.5 + 1 / 16) and fp4.peak_ratio == 2.0
    # megatron-core fp8_utils: --fp8-recipe tensorwise is TE Float8CurrentScaling, which saves fp8
    # inputs and caches fp8 weights (torchao's tensorwise saves 16-bit inputs)
    te = recipe("tensorwise", "megatron")
    assert te.saved_input_bytes == 1 and te.fp8_weight_copy_bytes == 2 and te.amax_history_len == 0


# torchao's float8 README ("e2e training benchmarks", NVIDIA H100): torchtitan, Llama3-8B,
# 8xH100, batch 1, sequence 8192, torch.compile, FSDP2, per-op SAC: bf16 6150 tokens/s,
# tensorwise with float8 all-gather 7689.5 (+25.03%), rowwise with bf16 all-gather 6768
# (+10.05%); peak memory 47.65, 47.77 and 47.79 GB.
TORCHAO_SPEEDUP = {"tensorwise": 7689.5 / 6150, "rowwise": 6768 / 6150}
TORCHAO_MEMORY = {"bf16-mixed": 47.65, "tensorwise": 47.77, "rowwise": 47.79}
REFEREE = Layout(dp=8, sharding="fsdp-full", zero_stage=3, micro_batch=1, grad_accum=1, seq_len=8192,
                 recompute="selective")


def _setup(r: str | None) -> TrainingSetup:
    return TrainingSetup(seq_len=8192, global_batch=8, kernels="fused",
                         **({"precision": "fp8", "fp8_recipe": r} if r else {}))


def test_speedup_against_torchaos_torchtitan_benchmark():
    """Measured in-sample ratios: the FP8 matmul fraction (0.55 of the FP8 peak) and the
    rowwise penalty (0.85) are ASSUMED, not fitted to this table. The planner predicts
    1.16x for tensorwise (measured 1.25x: -7%) and 1.05x for rowwise (measured 1.10x: -5%)."""
    m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
    cl = cluster_for(gpu)
    bf16 = step_time(m, _setup(None), REFEREE, cl)
    for r, measured in TORCHAO_SPEEDUP.items():
        st = step_time(m, _setup(r), REFEREE, cl)
        assert bf16.step_time_s / st.step_time_s == pytest.approx(measured, rel=0.10), r
        assert st.mfu_fp8 == pytest.approx(st.mfu / 2, rel=1e-3)     # H100: FP8 peak = 2 x BF16 peak
        assert bf16.mfu_fp8 is None


def test_memory_change_against_torchaos_torchtitan_benchmark():
    """torchao's recipes keep the 16-bit input and no fp8 weight copy: their peak is the bf16
    one (measured +0.25% and +0.29%); the planner's change must stay within 1%."""
    m = load_model("llama3.1-8b")
    base = per_rank_memory(m, _setup(None), REFEREE).total
    for r in TORCHAO_SPEEDUP:
        got = per_rank_memory(m, _setup(r), REFEREE).total
        want = TORCHAO_MEMORY[r] / TORCHAO_MEMORY["bf16-mixed"]
        assert got / base == pytest.approx(want, abs=0.01), r


def test_delayed_and_blockwise_memory_terms():
    """Consistency (not a referee): TE's cached fp8 weight and transpose add 2 B per block
    parameter; FP8-saved linear inputs shrink the block's activations."""
    m, pc = load_model("llama3.1-8b"), count_params(load_model("llama3.1-8b"))
    lay = REFEREE
    base = per_rank_memory(m, _setup(None), lay).terms.view(_setup(None))
    block_params = pc.total - (m.vocab_size * m.d_model * 2 + m.d_model)   # untied embedding and head, final norm
    for r in ("delayed", "blockwise"):
        tr = per_rank_memory(m, _setup(r), lay).terms.view(_setup(r))
        assert tr.fp8_weights == pytest.approx(block_params * recipe(r).fp8_weight_copy_bytes, rel=0.01)
        assert tr.layer_act < base.layer_act
    assert per_rank_memory(m, _setup("rowwise"), lay).terms.view(_setup("rowwise")).fp8_weights == 0


@pytest.mark.parametrize("r", RECIPES)
def test_explain_terms_add_up_under_fp8(r):
    m, gpu = load_model("llama3.1-8b"), get_gpu("h100")
    lay = Layout(dp=2, tp=2, pp=2, micro_batch=1, grad_accum=4, seq_len=4096, recompute="selective")
    setup = TrainingSetup(seq_len=4096, global_batch=8, precision="fp8", fp8_recipe=r)
    ex = explain(m, gpu, setup, lay)
    mem = per_rank_memory(m, setup, lay, gpus_per_node=gpu.gpus_per_node)
    terms = [t for t in ex.terms if t.section == "memory" and t.summed]
    for cat in CATEGORIES:
        assert sum(t.value for t in terms if t.category == cat) == getattr(mem.breakdown, cat), cat
    assert not [t.name for t in ex.terms if t.category == "unexplained"]
    assert any(t.name.startswith("FP8 weight copies") for t in terms)
    assert any(t.name == "MFU against the low-precision peak (FP8; FP4 under NVFP4)" for t in ex.terms)
    assert all(math.isfinite(t.value) for t in ex.terms)


@pytest.mark.slow
def test_cli_fp8_end_to_end():
    args = ["--model", "llama3.1-8b", "--gpus", "h100", "--precision", "fp8", "--stack", "torchtitan",
            "--n-gpus", "8"]
    out = run(*args)
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.replace("│", " ").split())      # the terminal wraps lines and boxes
    assert "fp8 recipe rowwise" in text and "of the low-precision peak" in text
    # (--json checks that the stack runs the layout: torchtitan shards with FSDP2)
    j = run(*args, "--fsdp", "full", "--json")
    assert j.exit_code == 0, j.output
    plan = json.loads(j.output)
    assert plan["assumptions"]["fp8_recipe"] == "rowwise"
    assert plan["plan"]["mfu_fp8_peak"] == pytest.approx(plan["plan"]["mfu"] / 2, rel=1e-3)
    bf16 = json.loads(run(*args[:4], "--n-gpus", "8", "--fsdp", "full", "--json").output)
    assert plan["plan"]["step_time_s"] < bf16["plan"]["step_time_s"]
    meg = json.loads(run(*args[:6], "--stack", "megatron", "--n-gpus", "8", "--tp", "2", "--json").output)
    assert meg["assumptions"]["fp8_recipe"] == "delayed"


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "a100", "--precision", "fp8"], "no FP8 tensor cores"),
    (["--gpus", "h100", "--fp8-recipe", "delayed"], "needs --precision fp8"),
    (["--gpus", "h100", "--precision", "fp8", "--method", "qlora"], "full training and LoRA"),
    (["--gpus", "h100", "--precision", "nvfp4"], "no FP4 tensor cores"),
])
def test_cli_fp8_user_errors(args, needle):
    out = run("--model", "llama3.1-8b", "--n-gpus", "8", *args)
    assert out.exit_code == 2 and needle in out.output and "Traceback" not in out.output


def test_out_refuses_fp8_configs_where_the_stack_has_no_setting(tmp_path):
    """--out writes FP8 for torchtitan and Megatron-LM (tests/test_emit_torchtitan.py,
    tests/test_emit_megatron.py) with the recipes each runs; this plan's default stack is
    Megatron-LM (cp 2, fused kernels), which has no rowwise recipe: refused, the way out named."""
    out = run("--model", "llama3.1-8b", "--gpus", "h100", "--precision", "fp8", "--n-gpus", "8", "--fsdp", "full",
              "--out", str(tmp_path / "cfg"))
    assert out.exit_code == 2 and "megatron runs tensorwise" in out.output and "--stack" in out.output
    assert not (tmp_path / "cfg").exists()
