"""Megatron-DeepSpeed as --stack deepspeed with tp and pp (issue 29): BLOOM 176B planned as it
trained (Le Scao et al. 2022, arXiv:2211.05100, Sec. 3.4: 384 A100 80GB on Jean Zay, TP 4 x PP 12
x DP 8, ZeRO stage 1, bf16, global batch 2048, sequence 2048), and the files --out writes
accepted by their own parsers: ds_config.json by DeepSpeed's DeepSpeedConfig (world size and
data-parallel size patched, shared/notes/FACTS.md), megatron_args.txt's model and parallel
sizes by megatron-core 0.16.1's TransformerConfig.
"""

from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli

BLOOM = ["--model", "bloom-176b", "--gpus", "a100", "--topology", "jean-zay-a100", "--n-gpus", "384", "--tp", "4",
         "--pp", "12", "--dp", "8", "--zero", "1", "--stack", "deepspeed", "--seq-len", "2048", "--micro-batch", "2",
         "--global-batch", "2048", "--recompute", "full"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_bloom_plans_as_it_trained_and_its_files_pass_their_parsers(tmp_path):
    res = run(*BLOOM, "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)["plan"]
    assert plan["fits"] and plan["layout"]["tp"] == 4 and plan["layout"]["pp"] == 12
    # Megatron-DeepSpeed's tensor parallelism has no sequence parallelism
    assert not plan["layout"]["sp"]
    out = tmp_path / "bloom"
    res = run(*BLOOM, "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    assert (out / "megatron_args.txt").exists() and (out / "ds_config.json").exists()
    assert not (out / "config.json").exists()      # no Hugging Face model here
    cfg = json.loads((out / "ds_config.json").read_text())
    # BF16_Optimizer with fp32 accumulation, as BLOOM trained (deepspeed 0.19.8 engine.py)
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"} and cfg["zero_optimization"]["stage"] == 1
    require("deepspeed")
    from deepspeed_config import validate_deepspeed_config
    parsed = validate_deepspeed_config(cfg, data_parallel=8, n_gpus=384)
    assert parsed.train_batch_size == 2048 and parsed.gradient_accumulation_steps == 128
    from planner.emit.megatron_deepspeed import parse_args
    a = parse_args((out / "megatron_args.txt").read_text().split())
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.zero_stage) == (4, 12, 1)
    assert a.deepspeed and a.deepspeed_config == "ds_config.json" and a.bf16 and a.checkpoint_activations
    assert a.position_embedding_type == "alibi" and a.embed_layernorm
    assert a.global_batch_size == 2048 and a.micro_batch_size == 2
    launch = (out / "launch.sh").read_text()
    assert "pretrain_gpt.py" in launch and "MEGATRON_ARGS" in launch
    require("megatron.core")
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
    TransformerConfig(num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
                      ffn_hidden_size=a.ffn_hidden_size, tensor_model_parallel_size=a.tensor_model_parallel_size,
                      pipeline_model_parallel_size=a.pipeline_model_parallel_size, bf16=True,
                      params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)


def test_sequence_parallelism_is_refused_for_its_files(tmp_path):
    res = run(*BLOOM, "--sp", "--out", str(tmp_path / "sp"), "-q")
    assert res.exit_code == 2 and "--no-sp" in res.output and not (tmp_path / "sp").exists()


def test_bf16_optimizer_keeps_fp32_gradients():
    # deepspeed 0.19.8 bf16_optimizer.py: a full fp32 gradient buffer (not partitioned): 4 B per
    # parameter of the rank, against 2 B for the same layout at --zero 1 under Megatron-LM
    ds = json.loads(run(*BLOOM, "--json").output)["plan"]["memory_bytes"]["gradients"]
    meg = json.loads(run(*[a if a != "deepspeed" else "megatron" for a in BLOOM], "--no-sp", "--json").output)
    assert ds == 2 * meg["plan"]["memory_bytes"]["gradients"]


@pytest.mark.parametrize("args, needle", [
    (["--zero", "2"], "ZeRO stage 0 or 1"),
    (["--cp", "2"], "no FSDP, cp"),
])
def test_megatron_deepspeed_refuses_what_its_engine_cannot_run(args, needle):
    base = [a for a in BLOOM if a not in ("--zero", "1")]
    if "--cp" in args:
        base = ["--model", "bloom-176b", "--gpus", "a100", "--topology", "jean-zay-a100", "--n-gpus", "384",
                "--tp", "4", "--pp", "6", "--cp", "2", "--dp", "8", "--zero", "1", "--stack", "deepspeed",
                "--seq-len", "2048", "--micro-batch", "2", "--global-batch", "2048"]
        args = []
    out = run(*base, *args)
    assert out.exit_code == 2 and needle in out.output and "Traceback" not in out.output, out.output


def test_megatron_deepspeed_args_carry_the_runs_length_and_ds_config_no_scheduler(tmp_path):
    """Issue 33: a --tokens plan's files carry its length. BLOOM's own scripts give
    --train-samples, --lr-decay-style cosine, --lr-warmup-samples and --lr-decay-samples
    (bigscience-workshop/bigscience train/tr11-176B-ml); Megatron's scheduler then steps the
    learning rate, so ds_config.json has none (DeepSpeed's would replace it)."""
    out = tmp_path / "bloom"
    res = run(*BLOOM, "--tokens", "366B", "--out", str(out), "-q")
    assert res.exit_code == 0, res.output
    from planner.emit.megatron_deepspeed import parse_args
    a = parse_args((out / "megatron_args.txt").read_text().split())
    assert a.train_samples * 2048 >= 366e9 > (a.train_samples - 2048) * 2048
    assert a.lr_decay_style == "cosine" and 0 < a.lr_warmup_samples < a.lr_decay_samples == a.train_samples
    assert "scheduler" not in json.loads((out / "ds_config.json").read_text())
