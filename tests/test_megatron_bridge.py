"""Every trained Megatron-Bridge layout can be stated and fits (issue 29).

The referee is NVIDIA's published Megatron-Bridge runs (tests/data/megatron_bridge_runs.json,
172 rows as printed on the Megatron-Bridge performance summary): each row trained, so each
fits on its GPUs. bench/megatron_bridge_rows.py states each row as `plan` options;
bench/megatron_bridge_memory.py sets the predicted peak beside the GPU's memory. The options
the rows need are checked against megatron-core 0.16.1's own TransformerConfig, which
validates them on the CPU.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import megatron_bridge_memory as study  # noqa: E402
import megatron_bridge_rows as rows  # noqa: E402


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_every_row_is_mapped_and_each_configuration_has_one_latest_release():
    all_rows = rows.load_rows()
    assert len(all_rows) == 172                         # the corpus as printed
    latest = Counter(r.config_key for r in all_rows if r.latest)
    assert set(latest.values()) == {1} and len(latest) == len({r.config_key for r in all_rows})
    for r in all_rows:
        assert r.cli_args[:2] == ("--model", r.family or r.model.split(" (")[0])
        assert r.expressible == (r.reason == "")
    # every row of a model the planner knows is expressible (EP folded over tp x cp included: the
    # Qwen3-235B rows on 256 H100 and 64 GB200; Nemotron 3 Ultra's HSDP over 4 distributed-optimizer
    # instances with --optimizer-instances) except one printed layout megatron-core cannot build
    # (etp 1 x ep 64 x pp 8 on 256 GPUs: parallel_state.initialize_model_parallel raises)
    refused = [r for r in all_rows if r.family and not r.expressible]
    assert [r.id for r in refused] == ["mbridge-25.09-deepseekv3-tokendrop-gb200-fp8-mx-256gpu"]
    assert "megatron-core: world size not divisible" in refused[0].reason
    # 144 rows, the 25 of Nemotron 3 Nano, Super and 3.5 Lightning since the hybrid family is
    # written (planner.models.hybrid), and Ultra's; DeepSeek-V4 is not known
    assert sum(r.expressible for r in all_rows) == 170
    assert sorted(r.model for r in all_rows if not r.family) == ["DeepSeekV4 Flash"]


def test_every_planned_row_fits_or_is_named_with_its_term():
    results = study.study()
    assert study.unexplained(results) == []
    planned = [x for x in results if x.row.expressible]
    # none rejected at default settings since the rows' recipe flags are planned (Nemotron 3
    # Ultra's HSDP over its distributed-optimizer instances included)
    assert sum(not x.fits for x in planned) == 0 and any(x.row.id == study.ULTRA for x in planned)
    # the Llama 3.1 405B rows on GB200 (tp 4, pp 16, vp 4/8, FP8/MXFP8/NVFP4) all fit: TE keeps
    # FP8 inputs and, with fp8_param_gather, no 16-bit weight copy
    assert all(x.fits for x in planned if "llama3.1-405b-gb200" in x.row.id)


def test_rows_without_a_recipe_note_plan_their_recipe_flags():
    """Nemotron 3 Ultra's recipe flags (Megatron-Bridge perf_recipes/nemotronh, as the corpus read
    them): Megatron FSDP, recompute_modules ['moe_act'], fine-grained offload (not modelled: an
    approximation), HSDP over 4 distributed-optimizer instances; Nemotron 3 Nano's
    on H100 list megatron-core's 'moe' module, which the planner does not model and leaves out."""
    by_id = {r.id: r for r in rows.load_rows()}
    ultra = by_id[study.ULTRA]
    cmd = " ".join(ultra.cli_args)
    assert "--fsdp full --optimizer-instances 4" in cmd and "--recompute selective --recompute-modules moe_act" in cmd
    assert ultra.expressible
    assert any("fused_group_mlp" in a for a in ultra.approximations)
    nano = by_id["mbridge-26.06-nemotron-3-nano-h100-fp8-16gpu"]
    assert "--recompute-modules layernorm,core_attn,moe_act" in " ".join(nano.cli_args) and nano.expressible
    assert any(a.startswith("recompute module(s) moe ") for a in nano.approximations)
    # one HSDP instance at megatron-core's default outer_dp_sharding_strategy 'no_shard' would not
    # fit: the bound shown beside the row, which runs 'optim'
    total, _opt, _tracked, cap = study.ultra_hsdp_bound(ultra)
    assert total > cap


def test_rows_whose_printed_batch_arithmetic_breaks_are_planned_at_the_recipes_micro_batch():
    """gbs = mbs x dp x ga (dp = GPUs / (tp x pp x cp)) holds for 48 of the 50 rows that print ga;
    the two that break it are planned at their recipe file's micro-batch (recipe_flags.
    layout_differs). The Llama 3 70B row's own printed figures give 128 / (8 x 16) = 1."""
    import json
    data = json.loads(rows.CORPUS.read_text())["rows"]
    changed = {r["id"]: rows.micro_batch_of(r)[0] for r in data if rows.micro_batch_of(r)[1]}
    assert changed == {"mbridge-25.11-gpt-oss-120b-h100-bf16-64gpu": 1,
                       "mbridge-25.09-llama3-70b-gb200-fp8-mx-64gpu": 1}
    assert all(rows.micro_batch_of(r)[0] == r["settings"]["mbs"] for r in data if r["id"] not in changed)


def test_recompute_modules_reach_megatron_core_and_admit_the_recipes_layouts():
    """GPT-OSS 120B on 64 B200 (ep 8, micro-batch 4) trained with recompute_modules ['layernorm',
    'moe_act'] (Megatron-Bridge 26.x recipe, the corpus's notes): planned with them it fits, with
    the core attention only it does not; the written flags are TransformerConfig's."""
    base = ["--model", "gpt-oss-120b", "--gpus", "b200", "--stack", "megatron", "--n-gpus", "64", "--tp", "1",
            "--pp", "1", "--cp", "1", "--ep", "8", "--dp", "8", "--micro-batch", "4", "--global-batch", "1280",
            "--zero", "1",
            "--recompute", "selective", "-q"]
    assert "DOES NOT FIT" in run(*base).output
    assert "DOES NOT FIT" not in run(*base, "--recompute-modules", "layernorm,moe_act").output
    out = run(*base, "--recompute-modules", "moe")
    assert out.exit_code == 2 and "not modelled" in out.output
    out = run(*base[:-3], "--recompute", "full", "--recompute-modules", "layernorm")
    assert out.exit_code == 2 and "--recompute selective" in out.output
    require("megatron.core")
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_args import parse_args

    from planner.emit.megatron import _recompute_args
    a = parse_args(["--num-layers", "4", *_recompute_args("selective", modules=("layernorm", "moe_act"))])
    assert a.recompute_modules == ["layernorm", "moe_act"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=4, num_moe_experts=4, bf16=True,
                          params_dtype=torch.bfloat16, recompute_granularity=a.recompute_granularity,
                          recompute_modules=a.recompute_modules, moe_grouped_gemm=a.moe_grouped_gemm)


def test_the_study_doc_is_current():
    assert study.main(["--check"]) == 0


def test_distributed_optimizer_over_one_rank_is_a_no_op_under_megatron():
    base = ["--model", "llama3-70b", "--gpus", "h100", "--stack", "megatron", "--n-gpus", "8", "--tp", "2",
            "--pp", "4", "--dp", "1", "--vp", "20", "--seq-len", "4096", "--micro-batch", "1", "--global-batch", "32",
            "--recompute", "none", "--method", "lora", "-q"]
    out = run(*base, "--zero", "1")
    assert out.exit_code == 0 and "zero=1" in out.output, out.output
    # other stacks still refuse ZeRO over one rank
    out = run(*base[:4], "hf", *base[6:], "--zero", "1")
    assert out.exit_code == 2


def test_chunks_over_the_layers_name_the_embedding_loss_split():
    out = run("--model", "llama3.1-405b", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "256", "--tp", "4",
              "--pp", "16", "--dp", "4", "--vp", "8", "--micro-batch", "1", "--global-batch", "1536", "--zero", "1")
    assert out.exit_code == 2 and "--pp-balance embedding-loss" in out.output


@pytest.mark.parametrize("args, needle", [
    (["--pp", "2", "--offload-activations", "10"], "pp 1"),
    (["--offload-activations", "80"], "fewer than the 80 layers"),
    (["--offload-activations", "10", "--recompute", "full"], "recomputation"),
])
def test_activation_offload_is_refused_where_megatron_core_refuses_it(args, needle):
    # megatron-core 0.16.1 TransformerConfig.__post_init__: pp 1, no recomputation, N < layers
    out = run("--model", "llama3-70b", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "64",
              "--micro-batch", "1", *args)
    assert out.exit_code == 2 and needle in out.output and "Traceback" not in out.output


def test_activation_offload_moves_layers_to_the_host_line():
    base = ["--model", "llama3-70b", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "64", "--dp", "64",
            "--tp", "1", "--pp", "1", "--cp", "1", "--fsdp", "full", "--seq-len", "8192", "--micro-batch", "1",
            "--global-batch", "256", "--recompute", "none", "--json"]
    import json
    plain = json.loads(run(*base).output)["plan"]
    off = json.loads(run(*base, "--offload-activations", "40").output)["plan"]
    host = off["offload"]["host_bytes_per_rank"]
    assert plain["offload"]["host_bytes_per_rank"] == 0 and host > 0 and off["offload"]["host_fits"]
    # the 40 layers' saved tensors are on the host; 39 of them have left the GPU (one offloaded
    # layer is in flight, TE's offload handler without double buffering)
    saved = plain["memory_bytes"]["activations"] - off["memory_bytes"]["activations"]
    assert saved == pytest.approx(host * 39 / 40, rel=1e-6)


def test_mtp_and_low_precision_reach_megatron_cores_config(tmp_path):
    """The flags --out writes for MTP, NVFP4, MXFP8 with fp8_param_gather and CPU offload are
    megatron-core 0.16.1 TransformerConfig fields it accepts (mtp_num_layers, fp4/fp4_recipe,
    fp8/fp8_recipe/fp8_param, cpu_offloading/cpu_offloading_num_layers)."""
    require("megatron.core")
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_args import parse_args
    cases = [
        (["--model", "qwen3-30b-a3b", "--gpus", "b200", "--n-gpus", "16", "--tp", "1", "--pp", "2", "--ep", "8",
          "--dp", "1", "--micro-batch", "1", "--global-batch", "256", "--zero", "1", "--precision", "fp8",
          "--fp8-recipe", "mxfp8", "--fp8-param-gather", "--mtp", "1", "--recompute", "none"],
         dict(mtp_num_layers=1, fp8="e4m3", fp8_recipe="mxfp8", fp8_param=True)),
        (["--model", "llama3-70b", "--gpus", "gb200", "--n-gpus", "64", "--tp", "2", "--pp", "4", "--vp", "5",
          "--dp", "8", "--micro-batch", "1", "--global-batch", "256", "--zero", "1", "--precision", "nvfp4",
          "--seq-len", "8192", "--recompute", "none"],
         dict(fp4="e2m1", fp4_recipe="nvfp4")),
        (["--model", "llama3-8b", "--gpus", "h100", "--n-gpus", "8", "--dp", "8", "--tp", "1", "--pp", "1",
          "--micro-batch", "1", "--global-batch", "128", "--zero", "1", "--seq-len", "4096", "--recompute", "none",
          "--offload-activations", "16", "--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-param-gather"],
         dict(cpu_offloading=True, cpu_offloading_num_layers=16, fp8="hybrid", fp8_recipe="tensorwise",
              fp8_param=True)),
    ]
    for i, (args, expect) in enumerate(cases):
        out_dir = tmp_path / str(i)
        res = run(*args, "--stack", "megatron", "--out", str(out_dir), "-q")
        assert res.exit_code == 0, res.output
        argv = (out_dir / "megatron_args.txt").read_text().split()
        a = parse_args(argv)
        got = dict(mtp_num_layers=a.mtp_num_layers, fp4=a.fp4_format, fp4_recipe=a.fp4_recipe, fp8=a.fp8_format,
                   fp8_recipe=a.fp8_recipe, fp8_param=a.fp8_param_gather, cpu_offloading=a.cpu_offloading,
                   cpu_offloading_num_layers=a.cpu_offloading_num_layers)
        for k, v in expect.items():
            assert got[k] == v, (k, got[k], v)
        kw = {k: v for k, v in got.items() if v not in (None, False)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformerConfig(num_layers=a.num_layers, hidden_size=a.hidden_size,
                              num_attention_heads=a.num_attention_heads, bf16=True, params_dtype=torch.bfloat16,
                              **kw)
