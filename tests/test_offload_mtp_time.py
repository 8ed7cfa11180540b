"""Megatron-Core's CPU activation offload and MTP modules in the step time (issue 28).

Referees: the memory model's host line (the bytes the offload moves, tests/test_megatron_bridge.py
checks them against the activations it removes), the links' data sheets (PCIe Gen5 x16: 64 GB/s
per direction, PCI-SIG; NVLink-C2C: 900 GB/s bidirectional per Grace, NVIDIA's GB200 NVL72 data
sheet) and NVIDIA's own FLOPs count of DeepSeek-V3 with and without its MTP module (the
published TFLOP/s per GPU over tokens/s per GPU of the Megatron-Bridge rows,
tests/data/megatron_bridge_runs.json).
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from planner.hardware.gpus import get_gpu
from planner.timing.efficiency import MEGATRON_BRIDGE
from planner.timing.host_link import HOST_COPY_BYTES_PER_S, host_copy_bytes_per_s, offload_windows
from planner.timing.model import step_time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import megatron_bridge_rows as mbr  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "megatron_bridge_runs.json"

# the 26.04.01 Llama 3 70B row on 64 GB200 (FSDP, micro-batch 2, 40 of 80 layers offloaded)
LLAMA_70B = ("--model", "llama3-70b", "--stack", "megatron", "--n-gpus", "64", "--tp", "1", "--pp", "1", "--cp", "1",
             "--dp", "64", "--seq-len", "8192", "--micro-batch", "2", "--global-batch", "256", "--fsdp", "full",
             "--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-param-gather", "--recompute", "none",
             "--cross-entropy", "te")


def _step_s(args: tuple[str, ...]) -> float:
    m, _, setup, lay, kw = mbr.request(args)
    return step_time(m, setup, lay, kw["cluster"], MEGATRON_BRIDGE).step_time_s


def test_host_links_follow_their_data_sheets():
    # PCIe hosts keep the pinned-copy rate the RL offload of training states uses (about 50 GB/s
    # of Gen5 x16's 64); a GB200 GPU shares its Grace's 900 GB/s bidirectional C2C with one other
    # GPU: 225 GB/s per direction each, 4.5x Gen5 x16's 50 at the same share
    assert host_copy_bytes_per_s(get_gpu("h100")) == HOST_COPY_BYTES_PER_S == 50e9
    assert host_copy_bytes_per_s(get_gpu("gb200")) / host_copy_bytes_per_s(get_gpu("b200")) == pytest.approx(
        225 / 64)


def test_offload_windows_follow_transformer_engines_schedule():
    # transformer_engine/pytorch/cpu_offload.py, AsyncDoubleBufferGroupOffloadHandler's
    # layer_window_map: 40 of 80 layers synchronise at layers 1, 3, 5, ..., 79 (every copy spans
    # two blocks but the first, which starts after layer 0); 92 of 126 at 1, 3, ..., 67 (the first
    # 126 % 92 = 34 copies span two blocks but the first), then every layer to 125
    assert offload_windows(80, 40) == (1,) + (2,) * 39
    assert offload_windows(126, 92) == (1,) + (2,) * 33 + (1,) * 58
    assert offload_windows(10, 3) == (3, 3, 3)


def test_offload_costs_what_compute_does_not_hide():
    plain = _step_s((*LLAMA_70B, "--gpus", "gb200"))
    assert _step_s((*LLAMA_70B, "--gpus", "gb200", "--offload-activations", "0")) == plain
    # NVIDIA's recipe (40 of 80 layers): each 4.5 GB copy crosses the C2C link in about 26 ms,
    # under two blocks' forward (about 31 ms): only the first layer's copy (one block) shows
    off = {n: _step_s((*LLAMA_70B, "--gpus", "gb200", "--offload-activations", str(n))) - plain
           for n in (20, 40, 79)}
    assert off[20] == 0.0 and 0 < off[40] < 0.005 * plain
    # 79 of 80: every copy has one block to hide under, and shows its excess
    assert off[79] > 30 * off[40]
    # over PCIe Gen5 (B200 on an HGX host) the same 40 layers show far more of their copies
    b200 = (_step_s((*LLAMA_70B, "--gpus", "b200", "--offload-activations", "40"))
            - _step_s((*LLAMA_70B, "--gpus", "b200")))
    assert b200 > 0.05 * plain


def test_offload_hidden_where_each_copy_is_shorter_than_its_window():
    # Llama 3.1 405B at tp 2, micro-batch 1 on GB200 (the 25.09 row, 92 of 126 layers): one
    # block's saved tensors (about 2.1 GB) cross the C2C link in less time than one block's
    # forward, the shortest window, takes: the offload adds nothing
    args = ("--model", "llama3.1-405b", "--gpus", "gb200", "--stack", "megatron", "--n-gpus", "128", "--tp", "2",
            "--pp", "1", "--cp", "1", "--dp", "64", "--seq-len", "8192", "--micro-batch", "1", "--global-batch", "64",
            "--fsdp", "full", "--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-param-gather",
            "--recompute", "none", "--cross-entropy", "te")
    assert _step_s((*args, "--offload-activations", "92")) == _step_s(args)


def test_mtp_flops_match_nvidias_count():
    # NVIDIA counts DeepSeek-V3 at 4,096 tokens with one MTP module at ~260 GFLOP per token and
    # without it at ~249 (published TFLOP/s per GPU over tokens/s per GPU, 25.11 rows "w/ MTP" and
    # "w/o MTP"); its convention halves causal attention, the planner's does not, but the MTP
    # module's increment (one MoE block, eh_proj and the shared head) is the same work
    rows = json.loads(DATA.read_text())["rows"]

    def gflop(r: dict) -> float:
        return r["published"]["tflops_per_gpu"] * 1e3 / r["published"]["tokens_per_s_per_gpu"]
    v3 = [r for r in rows if r["settings"]["model"].startswith("DeepSeekV3") and r["settings"]["seq"] == 4096]
    with_mtp = statistics.median(gflop(r) for r in v3 if "one MTP module" in r["notes"])
    without = statistics.median(gflop(r) for r in v3 if "w-o-mtp" in r["id"])
    row = next(r for r in mbr.load_rows() if r.id == "mbridge-25.11-deepseekv3-w-mtp-b200-fp8-mx-256gpu")
    assert "--mtp" in row.cli_args
    m, _, setup, lay, kw = mbr.request(row.cli_args)
    st = step_time(m, setup, lay, kw["cluster"], MEGATRON_BRIDGE)
    st0 = step_time(m, replace(setup, mtp_layers=0), lay, kw["cluster"], MEGATRON_BRIDGE)
    ours = (st.model_flops - st0.model_flops) / st.tokens_per_step / 1e9
    assert ours == pytest.approx(with_mtp - without, rel=0.05)
