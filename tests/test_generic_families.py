"""The generic path (planner.models.generic): any causal LM transformers builds is planned,
with transformers' own parameter count.

Referees: transformers 5.x's models built on the meta device (parameters), the written
families' FLOP formulas where the same model is also run through the probe (FlopCounterMode
on transformers' model), and transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES for the list of
families. The slow test (``pytest -m slow tests/test_generic_families.py``) builds the default
config of every family in that mapping.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from planner.errors import UserError
from planner.models.families import SUPPORTED_MODEL_TYPES, spec_from_hf_config
from planner.models.spec import count_params

torch = require("torch")
transformers = require("transformers")

sys.path.insert(0, str(Path(__file__).parent))
from causal_families import causal_lm_types, family_row, transformers_count  # noqa: E402

# A tiny Nemotron-H in Megatron's pattern syntax: Mamba-2, MoE, attention, MLP blocks
TINY_NEMOTRON_H = {
    "model_type": "nemotron_h", "hidden_size": 64, "num_hidden_layers": 4, "hybrid_override_pattern": "ME*-",
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
    "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 16, "chunk_size": 32,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32, "vocab_size": 256, "tie_word_embeddings": False,
}
# A tiny Qwen3-Next: gated DeltaNet on 3 of 4 blocks, gated attention on the 4th, MoE MLPs (a
# written family since planner.models.deltanet; _generic still measures it on the generic path)
TINY_QWEN3_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "full_attention_interval": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "vocab_size": 256,
}


# A tiny OLMo 3, a family still planned on the generic path (Qwen3-Next and Qwen3.5 are written)
TINY_GENERIC = {"model_type": "olmo3", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Every test measures into its own cache directory."""
    monkeypatch.setenv("PLANNER_CACHE_DIR", str(tmp_path / "cache"))


def _generic(cfg: dict):
    """The generic path's spec of ``cfg`` even where a family is written (Nemotron-H is, in
    planner.models.hybrid; the probe still measures it, as the referee of tests/test_hybrid.py)."""
    from planner.models.generic.spec import generic_spec

    return generic_spec(dict(cfg), {"name": cfg["model_type"], "model_type": cfg["model_type"], "source": ""},
                        "test", SUPPORTED_MODEL_TYPES)


@pytest.mark.slow   # 3 s; the fast tier keeps the probe's count of a written family
@pytest.mark.parametrize("cfg", [TINY_NEMOTRON_H, TINY_QWEN3_NEXT], ids=["nemotron_h", "qwen3_next"])
def test_generic_count_is_transformers_count_and_blocks_are_told_apart(cfg):
    m = _generic(cfg)
    assert m.is_generic
    assert count_params(m).total == transformers_count(cfg)
    kinds = {tuple(k for k in ("attention", "mixer", "mlp", "experts") if getattr(b, k)) for b in m.profile.blocks}
    if cfg["model_type"] == "nemotron_h":    # "ME*-": one block kind per letter
        assert kinds == {("mixer",), ("mlp", "experts"), ("attention",), ("mlp",)}
    else:                                     # 3 gated DeltaNet blocks, 1 attention block, all MoE
        assert kinds == {("mixer", "mlp", "experts"), ("attention", "mlp", "experts")}
        assert sorted(b.n_layers for b in m.profile.blocks) == [1, 3]


def test_the_probe_counts_a_written_family_as_its_formulas_do():
    # The same tiny Llama run through the probe: its forward FLOPs per token (FlopCounterMode on
    # transformers' model) equal the written family's layer_flops, term by term in s
    from planner.models.generic.probe import profile_config
    from planner.timing.flops import layer_flops

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    written = spec_from_hf_config(dict(cfg), "llama-tiny", "test")
    p = profile_config(cfg, "test")
    assert p.total == count_params(written).total
    (block,) = p.blocks
    s1, s2 = p.seq_lens
    for s in (s1, s2):
        assert block.fwd_flops_per_token + block.fwd_flops_per_token_per_seq * s == layer_flops(written, s).total
    assert block.bwd_flops_per_token == pytest.approx(2 * block.fwd_flops_per_token)
    # eager attention keeps the fp32 softmax and its bf16 copy: 4 heads x (4 + 2) bytes per key
    assert block.saved_bytes_per_token_per_seq == 4 * (4 + 2)


@pytest.mark.slow   # the fast tier: test_deltanet.py::test_expert_flops_follow_top_k
def test_routed_experts_count_their_flops():
    # FlopCounterMode has no formula for aten._grouped_mm (FACTS.md): without the probe's, the
    # routed experts would count 0 FLOPs and top-k would not change the count. Each extra
    # expert a token visits adds its three 64 x 32 matrices: 2 x 3 x 64 x 32 forward FLOPs.
    from planner.models.generic.probe import profile_config

    def moe_fwd(k: int) -> float:
        p = profile_config({**TINY_QWEN3_NEXT, "num_experts_per_tok": k}, "test")
        return sum(b.fwd_flops_per_token * b.n_layers for b in p.blocks)

    assert moe_fwd(2) - moe_fwd(1) == pytest.approx(4 * 2 * 3 * 64 * 32)


def test_a_cached_profile_plans_without_torch(tmp_path):
    path = tmp_path / "tiny-olmo3.json"
    path.write_text(json.dumps(TINY_GENERIC))
    spec_from_hf_config(dict(TINY_GENERIC), "x", "test")     # measures and caches
    code = ("import sys; from planner.cli.main import main; "
            f"sys.argv=['plan','--model',{str(path)!r},'--gpus','h100'];\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "generic path" in out.stdout and "data parallel, ZeRO/FSDP and pipeline stages only" in out.stdout


# A tiny DeepSeek-V4 (transformers 5.24's deepseek_v4: compressed sparse attention, hash-routed
# and top-k experts, hyper-connections), a mixture of experts planned on the generic path
TINY_DEEPSEEK_V4 = {
    "model_type": "deepseek_v4", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 32,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
    "vocab_size": 256, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 8, "sliding_window": 16,
    "hc_mult": 2, "hc_sinkhorn_iters": 2, "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
}


@pytest.mark.slow   # 5-10 s (the probe); the fast tier keeps test_axes' rule-order check on a shipped profile
def test_an_moe_family_on_the_generic_path_is_refused_ep_as_generic_not_dense(tmp_path):
    from click.testing import CliRunner

    from planner.cli.main import cli

    path = tmp_path / "tiny-deepseek-v4.json"
    path.write_text(json.dumps(TINY_DEEPSEEK_V4))
    m = spec_from_hf_config(dict(TINY_DEEPSEEK_V4), "x", "test")
    assert m.is_generic and count_params(m).total == transformers_count(TINY_DEEPSEEK_V4)
    for opts in (["--ep", "2"], ["--etp", "1"]):
        r = CliRunner().invoke(cli, ["--model", str(path), "--gpus", "h100", *opts], prog_name="plan")
        assert r.exit_code == 2 and "generic path" in r.output and "dense" not in r.output, r.output
    r = CliRunner().invoke(cli, ["--model", str(path), "--gpus", "h100"], prog_name="plan")
    assert r.exit_code == 0 and "generic path" in r.output, r.output


@pytest.mark.slow   # a subprocess, 2 s; the fast tier keeps the in-process refusals
def test_generic_layouts_refuse_tp_and_name_the_way_out(tmp_path):
    from click.testing import CliRunner

    from planner.cli.main import cli

    path = tmp_path / "tiny-olmo3.json"
    path.write_text(json.dumps(TINY_GENERIC))
    r = CliRunner().invoke(cli, ["--model", str(path), "--gpus", "h100", "--tp", "2"], prog_name="plan")
    assert r.exit_code == 2 and "generic path" in r.output and "written family" in r.output
    r = CliRunner().invoke(cli, ["--model", str(path), "--gpus", "h100", "--pp", "2", "--n-gpus", "2"],
                           prog_name="plan")
    assert r.exit_code == 0, r.output
    # Megatron-LM's GPT arguments would describe another model: nothing is written
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["--model", str(path), "--gpus", "h100", "--pp", "2", "--n-gpus", "2",
                                 "--out", str(out)], prog_name="plan")
    assert r.exit_code == 2 and "generic path" in r.output and not out.exists(), r.output


def test_a_model_type_transformers_does_not_build_is_still_refused():
    with pytest.raises(UserError, match="unsupported model_type 'gpt5'"):
        spec_from_hf_config({"model_type": "gpt5"}, "x", "test")


def test_presets_on_the_generic_path_ship_their_profiles():
    # nemotron-3-nano and qwen3-next-80b-a3b plan from the profiles shipped in
    # planner/presets/profiles (bench/generic_profiles.py); their totals are transformers'
    # (31,577,937,344: the model card's "31.6B"; 79,674,391,296)
    from planner.models.generic.cache import shipped_profile
    from planner.models.load import load_model, preset_config

    # (both are written families since planner.models.hybrid and planner.models.deltanet; their
    # shipped profiles stay, and both paths give transformers' total)
    for name, total in (("nemotron-3-nano", 31_577_937_344), ("qwen3-next-80b-a3b", 79_674_391_296)):
        assert shipped_profile(preset_config(name)) is not None, name
        assert count_params(load_model(name)).total == total
        assert not load_model(name).is_generic


# ----------------------------------------------------------------- every family (slow)

@pytest.mark.slow
def test_every_causal_lm_family_is_planned_with_transformers_count(request):
    # 196 families, tens of minutes on 2 cores: only when asked for by name (-m slow)
    if "slow" not in (request.config.getoption("-m") or "") or "not slow" in request.config.getoption("-m"):
        pytest.skip("the every-family referee runs only under -m slow (tens of minutes)")
    rows = {mt: family_row(mt) for mt in causal_lm_types()}
    counted = {mt: r for mt, r in rows.items() if r["status"] in ("written", "generic")}
    wrong = {mt: r for mt, r in counted.items() if r["planner"] != r["transformers"] or not r["planned"]}
    assert not wrong, wrong
    # every written family in the mapping is planned on its written path
    assert all(rows[mt]["status"] == "written" for mt in SUPPORTED_MODEL_TYPES if mt in rows)
    summary = {k: sorted(mt for mt, r in rows.items() if r["status"] == k)
               for k in ("written", "generic", "refused", "skipped")}
    print(json.dumps({k: len(v) for k, v in summary.items()}), json.dumps(
        {mt: r["why"] for mt, r in rows.items() if "why" in r}, indent=1))


MEASURED_HYBRIDS = {   # the rows of docs/accuracy-generic.md
    "nemotron_h": {**TINY_NEMOTRON_H, "hidden_size": 512, "num_attention_heads": 8, "head_dim": 64,
                   "intermediate_size": 1024, "mamba_num_heads": 16, "mamba_head_dim": 64, "n_groups": 2,
                   "ssm_state_size": 64, "chunk_size": 128, "n_routed_experts": 8, "moe_intermediate_size": 256,
                   "moe_shared_expert_intermediate_size": 512, "vocab_size": 8192},
    "qwen3_next": {**TINY_QWEN3_NEXT, "hidden_size": 512, "num_attention_heads": 8, "head_dim": 64,
                   "intermediate_size": 1024, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
                   "linear_key_head_dim": 64, "linear_value_head_dim": 64, "num_experts": 8,
                   "moe_intermediate_size": 256, "shared_expert_intermediate_size": 512, "vocab_size": 8192},
}


@pytest.mark.slow   # the fast tier measures under the tracker in test_accuracy.py (a tiny Qwen3, about a second)
@pytest.mark.parametrize("mt", ["nemotron_h", "qwen3_next"])
def test_plan_measure_on_a_tiny_hybrid_is_within_ten_percent(mt, tmp_path):
    # the referee: PyTorch's FSDPMemTracker running transformers' model (8 fake ranks, FSDP full,
    # bf16 mixed precision, sequence 1024) under fake tensors; docs/accuracy-generic.md lists the rows
    import re

    from click.testing import CliRunner

    from planner.cli.main import cli

    path = tmp_path / f"tiny-{mt}.json"
    path.write_text(json.dumps(MEASURED_HYBRIDS[mt]))
    r = CliRunner().invoke(cli, ["measure", "--model", str(path), "--gpus", "h100", "--dp", "8", "--zero", "3",
                                 "--seq-len", "1024", "--micro-batch", "1"], prog_name="plan")
    assert r.exit_code == 0, r.output
    total = re.search(r"total \(less overhead\)\s+([\d.]+) GiB\s+([\d.]+) GiB\s+([+-][\d.]+)%", r.output)
    assert total is not None, r.output
    assert abs(float(total.group(3))) <= 10.0, r.output


def test_kernel_times_run_at_the_measured_work():
    # the step time's GEMMs (models.matmuls.block_matmuls) carry the mean block's measured
    # forward FLOPs, not a dense block guessed from hidden_size and intermediate_size
    from planner.models.matmuls import block_matmuls

    m = _generic(TINY_NEMOTRON_H)
    gemm_flops = sum(mm.flops_per_token() for mm in block_matmuls(m))
    assert gemm_flops == pytest.approx(m.profile.mean_block("fwd_flops_per_token"), rel=1e-3)


# ----------------------------------------------------------------- families once refused

# Tiny configs of three families the every-family run once refused (docs/models.md)
TINY_DEEPSEEK_V2 = {"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 32,
                    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "kv_lora_rank": 16,
                    "q_lora_rank": 32, "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_nope_head_dim": 16,
                    "first_k_dense_replace": 1, "vocab_size": 256}
TINY_JETMOE = {"model_type": "jetmoe", "hidden_size": 64, "num_hidden_layers": 2, "num_key_value_heads": 2,
               "kv_channels": 16, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2,
               "vocab_size": 256}
TINY_GEMMA3N_TEXT = {"model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": [96, 96, 128, 128],
                     "vocab_size": 256, "vocab_size_per_layer_input": 256, "hidden_size_per_layer_input": 8,
                     "laurel_rank": 8, "num_kv_shared_layers": 0, "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0],
                     "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}


def test_a_router_without_top_k_is_refused_naming_the_key():
    # DeepseekV2Config's default num_experts_per_tok is None: transformers' router then stops in
    # torch.topk ("k must be int, not NoneType"); the planner names the key and the way out
    with pytest.raises(UserError, match="num_experts_per_tok is null.*give num_experts_per_tok in config.json"):
        spec_from_hf_config({**TINY_DEEPSEEK_V2, "num_experts_per_tok": None}, "x", "test")
    # given (transformers' own tests run it with 2: tests/causal_lm_tester.py), it plans with
    # transformers' count
    m = spec_from_hf_config(dict(TINY_DEEPSEEK_V2), "x", "test")
    assert m.is_generic and count_params(m).total == transformers_count(TINY_DEEPSEEK_V2)


def test_the_real_copy_measures_what_fake_tensors_measure():
    # The fall-back for data-dependent models (probe._measure_real_copy: real tensors, random
    # weights, a copy cut to the first two blocks of each kind) gives the per-block saved bytes and
    # FLOPs fake tensors give on a model both run: a tiny Llama of two blocks alike (copied whole)
    from planner.models.generic.probe import (
        _block_signature,
        _measure_blocks,
        _measure_real_copy,
        block_list,
        build_meta,
        hf_config,
        probe_kinds,
    )

    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    config = hf_config(cfg)
    path, blocks = block_list(build_meta(config))
    sigs = [_block_signature(b) for b in blocks]
    fake = _measure_blocks(config)
    real = _measure_real_copy(config, path, sigs, probe_kinds(config, sigs), "test", RuntimeError("stand-in"))
    for s in fake:
        for key in ("saved", "fwd", "bwd", "outside_fwd"):
            assert real[s][key] == pytest.approx(fake[s][key], rel=1e-9), (s, key)


def _probe_both_ways(cfg, monkeypatch):
    """(the profile measured on a cut copy, on the whole model, the per-block terms of each fake
    run of both measurements, by its block count)."""
    from planner.models.generic import probe

    runs: list[tuple[int, dict]] = []
    measure = probe._measure_blocks

    def kept(config, from_meta=False, **kw):
        got = measure(config, from_meta, **kw)
        if kw.get("backward", True):        # not the whole model's forward the copy is held to
            runs.append((config.num_hidden_layers, got))
        return got

    monkeypatch.setattr(probe, "_measure_blocks", kept)
    return probe.profile_config(dict(cfg), "test"), probe.profile_config(dict(cfg), "test", whole_model=True), runs


def test_a_copy_keeps_each_kind_twice_and_later_blocks_take_their_kinds_terms():
    # A block's kind is its signature and its entry in each per-layer list of the config; the copy
    # runs to each kind's second block, and a later block takes the mean of its kind's blocks in the
    # copy after the kind's first (which is charged what the kind's blocks share)
    from types import SimpleNamespace

    from planner.models.generic.probe import copy_depth, probe_kinds, spread

    sigs = [("Block",)] * 8
    config = SimpleNamespace(layer_types=["a", "c", "b", "a", "b", "a", "b", "a"], rope=[1, 2, 3], _cache=[0] * 8)
    kinds = probe_kinds(config, sigs)
    assert kinds[0] == kinds[3] != kinds[2] and len(set(kinds)) == 3
    assert copy_depth(kinds) == 5                     # a at 0 and 3, c at 1, b at 2 and 4
    one = {"saved": [10.0, 20.0, 30.0, 11.0, 31.0], "fwd": [1.0] * 5, "bwd": [2.0] * 5, "outside_fwd": [7.0]}
    assert spread(one, kinds, 5)["saved"] == [10.0, 20.0, 30.0, 11.0, 31.0, 11.0, 31.0, 11.0]
    assert spread(one, kinds, 5)["outside_fwd"] == [7.0]


def test_a_copy_cut_to_the_first_blocks_measures_what_the_whole_model_does(monkeypatch):
    # The probe runs a copy with each kind of block twice (here 2 of 6 alike Llama blocks) and
    # gives each later block its kind's terms: the profile equals the whole model's, measured
    # block by block on transformers' model
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 6,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    cut, whole, runs = _probe_both_ways(cfg, monkeypatch)
    assert [n for n, _ in runs] == [2, 6] and cut == whole


@pytest.mark.slow   # 20-40 s (two probes); the fast tier keeps a Llama cut from 6 blocks to 2
def test_deepseek_v4_blocks_of_one_shape_are_kept_apart_and_save_alike_bytes(monkeypatch):
    # DeepSeek-V4's blocks all have one class and one set of shapes, but its config's per-layer
    # lists make four kinds (compressed sparse and heavily compressed attention in turn, hash
    # routing in the first two, learned routing after): the copy keeps each kind twice where the
    # model has it twice (6 of 12 blocks), and the profile equals the whole model's.
    # Its compressed sparse attention computes index scores, keeps their top-k indices and drops
    # the scores' graph, whose saved tensors are freed in the forward and their addresses given to
    # later tensors. Counted at the save by address, blocks of one kind measured different bytes
    # (whichever later tensor took a freed address was missed); counted when the forward ends
    # (probe.held_bytes), every block of a kind after its first holds the same (the first is also
    # charged what its kind's blocks share, saved once)
    kinds = [(a, m) for a, m in zip(["compressed_sparse_attention", "heavily_compressed_attention"] * 6,
                                    ["hash_moe"] * 2 + ["moe"] * 10, strict=True)]
    cfg = {**TINY_DEEPSEEK_V4, "num_hidden_layers": 12, "layer_types": [a for a, _ in kinds],
           "mlp_layer_types": [m for _, m in kinds]}
    cut, whole, runs = _probe_both_ways(cfg, monkeypatch)
    assert [n for n, _ in runs] == [6, 12] and cut == whole
    for s, terms in runs[1][1].items():
        by_kind: dict[tuple[str, str], list[float]] = {}
        for kind, b in zip(kinds, terms["saved"], strict=True):
            by_kind.setdefault(kind, []).append(b)
        assert all(len(set(v[1:])) <= 1 for v in by_kind.values()), (s, by_kind)
        assert len(by_kind[kinds[2]]) == 5 and len(by_kind[kinds[3]]) == 5


@pytest.mark.slow   # 10-20 s (three probes); the fast tier keeps a Llama cut from 6 blocks to 2
def test_a_model_that_loops_over_its_blocks_is_measured_whole(monkeypatch):
    # Dory runs its middle blocks n_recurrent_loops times, which no block's shapes or per-layer
    # entry tells: one forward of the whole model (probe._measure_fake_copy) finds blocks run twice
    # and FLOPs the copy does not spread, so the whole model is measured after the copy
    cfg = {"model_type": "dory", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "num_hidden_layers": 8,
           "n_input_layers": 2, "n_recurrent_layers": 4, "n_output_layers": 2, "n_recurrent_loops": 2,
           "sliding_window": 16, "layer_types": ["sliding_attention", "mlp"] * 4}
    cut, whole, runs = _probe_both_ways(cfg, monkeypatch)
    depths = [n for n, _ in runs]
    assert len(depths) == 3 and depths[0] < depths[1] == depths[2] and cut == whole


@pytest.mark.slow   # 2 s; the fast tier keeps the real copy's measurement
def test_a_data_dependent_family_is_planned_from_a_real_copy(monkeypatch):
    # JetMoE's mixture of attention heads turns routing counts into Python ints (.item()):
    # fake tensors stop there (DataDependentOutputException); the one-block real copy measures it
    from planner.models.generic import probe

    m = spec_from_hf_config(dict(TINY_JETMOE), "x", "test")
    assert m.is_generic and count_params(m).total == transformers_count(TINY_JETMOE)
    assert all(b.fwd_flops_per_token > 0 and b.saved_bytes_per_token > 0 for b in m.profile.blocks)
    # a copy over the cap is refused in one line that says why
    monkeypatch.setattr(probe, "REAL_COPY_MAX_PARAMS", 1000)
    with pytest.raises(UserError, match="data-dependent output.*to measure with real tensors"):
        spec_from_hf_config({**TINY_JETMOE, "hidden_size": 32}, "x", "test")


def test_per_layer_widths_pass_the_generic_checks_not_the_written_ones():
    # Gemma 3n's intermediate_size is a list per layer, which transformers builds; the generic
    # path checks its widest entry and plans with transformers' count. A written family's
    # translator reads one width: a list there is still refused
    m = spec_from_hf_config(dict(TINY_GEMMA3N_TEXT), "x", "test")
    assert m.is_generic and count_params(m).total == transformers_count(TINY_GEMMA3N_TEXT)
    with pytest.raises(UserError, match="intermediate_size"):
        spec_from_hf_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": [96, 96],
                             "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}, "x", "test")


def test_a_model_built_on_meta_then_faked_measures_as_one_built_fake():
    # Models whose __init__ converts a submodule's dtype (hy_v4, inkling_text: "Couldn't swap
    # Conv1d.weight" under the fake mode) are built on the meta device and given fake tensors
    # (probe._fake_from_meta); on a tiny Llama both builds measure the same bytes and FLOPs
    from planner.models.generic.probe import _measure_blocks, hf_config

    config = hf_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128})
    assert _measure_blocks(config, from_meta=True) == _measure_blocks(config)


def test_xmod_runs_its_first_language_adapter():
    # XmodConfig's default_language is None and X-MOD's forward stops without one
    # ("Input language unknown"); its adapters share one shape, so the probe runs the first of
    # `languages` and the count stays transformers'
    from planner.models.generic.probe import hf_config

    cfg = {"model_type": "xmod", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 64, "vocab_size": 128, "languages": ["de_DE", "en_XX"], "is_decoder": True}
    assert hf_config(cfg).default_language == "de_DE"
    m = spec_from_hf_config(dict(cfg), "x", "test")
    assert m.is_generic and count_params(m).total == transformers_count(cfg)


def _bench(name: str):
    """The module bench/<name>.py, loaded from its file (bench/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_every_family_table_is_the_rows_it_names():
    # docs/models.md's table is bench/generic_families.py's rendering of docs/generic-families.json
    # (edited by hand it would drift); and every family planned there has transformers' count
    bench = _bench("generic_families")
    data = json.loads(bench.ROWS.read_text())
    doc = bench.DOC.read_text()
    assert f"{bench.BEGIN}\n{bench.table(data['rows'], data['transformers'])}\n{bench.END}" in doc
    if data["transformers"] == transformers.__version__:     # every family of this transformers
        assert set(data["rows"]) == set(causal_lm_types())
    planned = [r for r in data["rows"].values() if r["status"] in ("written", "generic")]
    assert planned and all(r["planner"] == r["transformers"] and r["planned"] for r in planned)


def test_the_copy_table_is_the_rows_it_names():
    # docs/generic-probe-copy.md is bench/generic_probe_copy.py's rendering of its JSON rows; every
    # row measured there either gives the whole model's profile or is named with the fields that
    # differ
    bench = _bench("generic_probe_copy")
    data = json.loads(bench.ROWS.read_text())
    doc = bench.DOC.read_text()
    assert doc == bench.table(data)
    assert all(r["outcome"] == "equal" or f"`{mt}`" in doc for mt, r in data["rows"].items())
