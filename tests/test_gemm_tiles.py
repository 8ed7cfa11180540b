"""The GEMM tile model (Efficiency.gemm_tile_model, timing.kernels.gemm_tile_share), measured as a
row of bench/ceiling_alternatives.py and off in every shipped engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.hardware.gpus import get_gpu
from planner.hardware.topology import load_topology
from planner.layouts.layout import Layout
from planner.models.spec import count_params, load_preset
from planner.timing.efficiency import GEMM_TILE
from planner.timing.kernels import Tiles, gemm_tile_share, gemm_tiles, gemm_time_s
from planner.timing.model import Cluster, Efficiency, step_time
from planner.training.setup import TrainingSetup

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("gpu,clock_hz,flops_per_sm_clock", [
    ("h100", 1.83e9, 4096),     # H100 whitepaper: 989.4 TFLOP/s dense BF16 = 132 SMs x 1,830 MHz x 4,096
    ("a100", 1.41e9, 2048),     # A100 whitepaper: 312 TFLOP/s dense BF16 = 108 SMs x 1,410 MHz x 2,048
])
def test_sm_counts_give_the_data_sheet_peaks(gpu, clock_hz, flops_per_sm_clock):
    sms = get_gpu(gpu).sms      # presets/gpus.toml's `sms`
    assert sms is not None
    assert sms * clock_hz * flops_per_sm_clock == pytest.approx(get_gpu(gpu).peak_flops_per_s("bf16"), rel=0.002)


def test_every_gpu_with_a_gemm_tile_has_its_sms_in_the_catalog():
    # the tile model needs both: a GPU of GEMM_TILE without `sms` would silently lose it
    for name in GEMM_TILE:
        tiles = gemm_tiles(get_gpu(name), Efficiency(gemm_tile_model="waves"))
        assert tiles is not None and tiles.sms == get_gpu(name).sms, name


def test_a_gpu_file_may_give_sms_or_leave_them_out(tmp_path):
    # a user's GPU: no GEMM_TILE entry for its name, so no tile model either way (as before the
    # SM counts moved into the catalog); `sms` is read, typed and bounded like every key
    import re

    from planner.errors import UserError

    block = (ROOT / "planner" / "presets" / "gpus.toml").read_text().split("\n[[gpu]]")[1]
    block = re.sub(r'\naliases = .*|\ndefault_topology = .*', "", block).replace('name = "h100"', 'name = "mine"', 1)
    f = tmp_path / "mine.toml"
    f.write_text("[[gpu]]" + block)
    assert get_gpu(str(f)).sms == 132
    assert gemm_tiles(get_gpu(str(f)), Efficiency(gemm_tile_model="waves")) is None
    f.write_text("[[gpu]]" + re.sub(r"\nsms = .*", "", block))
    assert get_gpu(str(f)).sms is None
    f.write_text("[[gpu]]" + block.replace("sms = 132", "sms = 13.2"))
    with pytest.raises(UserError, match="sms must be an integer"):
        get_gpu(str(f))


def test_one_tile_past_a_full_wave_runs_a_second_wave():
    # NVIDIA, "Matrix Multiplication Background User's Guide", wave quantization: tiles beyond a
    # multiple of the SM count run as one more wave. 132 output tiles of 128 x 256 on H100's 132 SMs
    # fill one wave; one more row of tiles (11 more) needs a second, nearly empty one
    tiles = Tiles(sms=132, tile=GEMM_TILE["h100"], fill=False)
    full = gemm_tile_share(128 * 12, 256 * 11, 4096, 1.0, tiles)
    over = gemm_tile_share(128 * 13, 256 * 11, 4096, 1.0, tiles)
    assert full == pytest.approx(1.0)
    assert over == pytest.approx(143 / 264)
    # the time of the bigger GEMM's math is two waves': (143 / 132) of the work at 143 / 264 of the rate
    t_full = gemm_time_s(128 * 12, 256 * 11, 4096, 1e15, float("inf"), 2, tiles=tiles)
    t_over = gemm_time_s(128 * 13, 256 * 11, 4096, 1e15, float("inf"), 2, tiles=tiles)
    assert t_over == pytest.approx(2 * t_full)


def test_pipeline_fill_costs_stages_minus_one_slices_of_each_tile():
    # CUTLASS's multistage main loop loads stages - 1 K slices before its first multiply: with the
    # Ampere default (3 stages, 64-wide slices) a K of 4,096 (64 slices) runs 64 of 66 slice times
    tiles = Tiles(sms=108, tile=GEMM_TILE["a100"])
    assert gemm_tile_share(128 * 108, 256, 4096, 1.0, tiles) == pytest.approx(64 / 66)


def test_off_by_default_and_slower_when_on():
    gpu = get_gpu("h100")
    cluster = Cluster(gpu=gpu, topology=load_topology(gpu.default_topology or ""))
    m = load_preset("llama3.1-8b")
    setup = TrainingSetup(seq_len=4096, global_batch=64)
    lay = Layout(dp=8, micro_batch=1, grad_accum=8, seq_len=4096)
    eff = Efficiency(mfu_ceiling=100.0)
    assert eff.gemm_tile_model == ""
    base = step_time(m, setup, lay, cluster, eff, count_params(m)).step_time_s
    waves = step_time(m, setup, lay, cluster, replace(eff, gemm_tile_model="waves"), count_params(m)).step_time_s
    fill = step_time(m, setup, lay, cluster, replace(eff, gemm_tile_model="waves+fill"), count_params(m)).step_time_s
    assert base < waves < fill
