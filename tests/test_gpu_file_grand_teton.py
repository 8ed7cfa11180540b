"""The GPU file of torchtitan's published H100 runs (tests/data/gpus/h100-hbm2e-500w.toml), which
the step-time study (bench/out_of_sample.py) now fits those two runs on instead of leaving them out.

Its figures are checked against the source table tests/data/gpu_specs.json (the row transcribed
from torchtitan's own page: 96 GB HBM2e, 2.4 TB/s, 500 W, 400 Gb/s per GPU) and against the
page's one statement on its peak: between the H100 NVL's and the H100 SXM's."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from planner.cli.main import cli
from planner.hardware.gpus import get_gpu, sustained_rate
from planner.units import GB

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "tests" / "data" / "gpus" / "h100-hbm2e-500w.toml"
ROW = next(r for r in json.loads((ROOT / "tests" / "data" / "gpu_specs.json").read_text())["gpus"]
           if "Grand Teton" in r["gpu"])


def test_file_figures_are_the_source_tables() -> None:
    gpu = get_gpu(str(FILE))
    assert gpu.memory_bytes == ROW["memory_GB"] * GB
    assert gpu.hbm_bytes_per_s == ROW["hbm_bandwidth_GBps"] * GB
    assert gpu.tdp_w == ROW["power_limit_w_used"]
    assert gpu.gpus_per_node == ROW["gpus_per_node"]
    assert gpu.inter_node_bytes_per_s == 400 * GB / 8 and "400 Gb/s" in ROW["inter_node"]


def test_peak_lies_between_the_nvl_and_sxm_data_sheets() -> None:
    # torchtitan's footnote: "the actual peak TFLOPs number is between SXM and NVL"
    gpu, nvl, sxm = get_gpu(str(FILE)), get_gpu("h100-nvl"), get_gpu("h100")
    assert "between SXM and NVL" in ROW["bf16_dense_tflops"]
    for rate in ("bf16_flops_per_s", "fp16_flops_per_s", "fp8_flops_per_s", "tf32_flops_per_s", "fp32_flops_per_s"):
        lo, mid, hi = getattr(nvl, rate), getattr(gpu, rate), getattr(sxm, rate)
        assert lo < mid < hi, rate
        # the file's stated rule: linear in board power between the two cards (400 W and 700 W)
        assert abs(mid - (lo + (hi - lo) * (gpu.tdp_w - nvl.tdp_w) / (sxm.tdp_w - nvl.tdp_w))) < 0.001 * hi, rate


def test_it_shares_the_hopper_ceiling_and_plans_from_the_command_line() -> None:
    gpu = get_gpu(str(FILE))
    assert sustained_rate(gpu).mfu == sustained_rate(get_gpu("h100")).mfu
    r = CliRunner().invoke(cli, ["--model", "8b", "--gpus", str(FILE), "--n-gpus", "8", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["gpu"]["name"] == "h100-hbm2e-500w" and out["assumptions"]["sustained_rate"]["from_gpu"] == "h100"
