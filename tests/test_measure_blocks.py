"""plan measure --blocks N (planner.measure.blocks): a large model's first blocks at real width."""

import json

import pytest
from click.testing import CliRunner
from conftest import require

from planner.cli.main import cli
from planner.errors import UserError
from planner.measure.blocks import first_blocks_config
from planner.models.spec import count_params, load_hf_config, spec_from_hf_config


@pytest.mark.slow
def test_cut_config_keeps_the_blocks_in_order_and_counts_like_transformers():
    torch = require("torch")
    transformers = require("transformers")
    hf = first_blocks_config(load_hf_config("gpt-oss-120b"), 3)
    assert hf["num_hidden_layers"] == 3
    assert hf["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    cfg = dict(hf)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    m = spec_from_hf_config(hf, "gpt-oss-120b (first 3 of 36 blocks)", "test")
    assert count_params(m).total == sum(p.numel() for p in model.parameters())
    assert m.n_local_layers == 2


def test_cut_keeps_dense_first_blocks_and_filters_indices():
    ds = first_blocks_config(load_hf_config("deepseek-v3"), 2)
    assert ds["num_hidden_layers"] == 2 and ds["first_k_dense_replace"] == 3     # both blocks dense
    qwen = first_blocks_config({"model_type": "qwen3_moe", "num_hidden_layers": 4, "mlp_only_layers": [1, 3]}, 2)
    assert qwen["mlp_only_layers"] == [1]
    with pytest.raises(UserError, match="give 1 to 61"):
        first_blocks_config(load_hf_config("deepseek-v3"), 0)


@pytest.mark.slow
def test_cli_names_the_cut_model_and_refuses_a_bad_count():
    res = CliRunner().invoke(cli, ["measure", "--model", "deepseek-v3", "--gpus", "h200", "--blocks", "99"])
    assert res.exit_code == 2 and "--blocks 99: give 1 to 61" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["measure", "--model", "bench/configs/tiny-qwen3.json", "--gpus", "h100",
                                   "--seq-len", "128", "--blocks", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["model"]["name"] == "tiny-qwen3 (first 1 of 2 blocks)"
