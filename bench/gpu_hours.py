"""GPU-hours of published pre-training runs, as the planner predicts them (docs/gpu-hours.md).

Each case is the run's own layout where the paper gives it (Llama 3 405B: Dubey et al. 2024,
arXiv:2407.21783, Table 4; DeepSeek-V3: arXiv:2412.19437, Sec. 3.2 and 4.2), timed by
planner.timing.model.step_time exactly as `plan --stack ...` times it (bench/megatron_bridge_rows.py
parses the options), with and without the GPU's sustained-MFU ceiling. The memory model is not
asked: every layout here was trained.

    python bench/gpu_hours.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import megatron_bridge_rows as mbr

from planner.timing.efficiency import NO_MFU_CEILING
from planner.timing.model import step_time

LLAMA = ("--gpus", "h100", "--stack", "megatron", "--seq-len", "8192", "--micro-batch", "1", "--zero", "1",
         "--recompute", "none", "--precision", "bf16-mixed")
DEEPSEEK = ("--model", "deepseek-v3", "--gpus", "h100", "--n-gpus", "2048", "--dp", "2", "--ep", "64", "--pp", "16",
            "--tp", "1", "--cp", "1", "--seq-len", "4096", "--global-batch", "15360", "--micro-batch", "1",
            "--zero", "1", "--recompute", "none", "--precision", "fp8", "--fp8-recipe", "blockwise")
# (label, plan options, tokens, published GPU-hours, what the published figure covers)
CASES = (
    ("Llama 3 405B, 16,384 H100 (Table 4 layout)",
     ("--model", "405b", "--n-gpus", "16384", "--tp", "8", "--pp", "16", "--cp", "1", "--dp", "128",
      "--global-batch", "2048", "--vp", "2", *LLAMA), 15.6e12, 30.84e6),
    ("Llama 3 405B, 8,192 H100 (Table 4 layout)",
     ("--model", "405b", "--n-gpus", "8192", "--tp", "8", "--pp", "16", "--cp", "1", "--dp", "64",
      "--global-batch", "2048", "--vp", "2", *LLAMA), 15.6e12, 30.84e6),
    ("Llama 3 70B, 2,048 H100 (layout not published)",
     ("--model", "70b", "--n-gpus", "2048", "--tp", "8", "--pp", "4", "--cp", "1", "--dp", "64",
      "--global-batch", "1024", *LLAMA), 15e12, 7.0e6),
    ("Llama 3 8B, 1,024 H100 (layout not published)",
     ("--model", "8b", "--n-gpus", "1024", "--tp", "1", "--pp", "1", "--cp", "1", "--dp", "1024",
      "--global-batch", "1024", *LLAMA), 15e12, 1.46e6),
    ("DeepSeek-V3, 2,048 GPUs, FP8, default stack", DEEPSEEK, 14.8e12, 2.788e6),
    ("DeepSeek-V3, 2,048 GPUs, FP8, --stack megatron", (*DEEPSEEK, "--stack", "megatron"), 14.8e12, 2.788e6),
    # DeepSeek's own dispatch sends a token once per node, to at most 4 nodes (arXiv:2412.19437,
    # Sec. 3.2.2), and hides the all-to-alls under DualPipe's computation (Sec. 3.2.1)
    ("DeepSeek-V3, 2,048 GPUs, FP8, --stack megatron --moe-dispatcher flex",
     (*DEEPSEEK, "--stack", "megatron", "--moe-dispatcher", "flex"), 14.8e12, 2.788e6),
)


def main() -> int:
    print("| run | tokens | MFU (ceiling) | GPU-hours | no ceiling: MFU | GPU-hours | published |")
    print("|---|---|---|---|---|---|---|")
    for label, args, tokens, published in CASES:
        m, gpu, setup, lay, kw = mbr.request(args)
        cells = []
        for eff in (kw["efficiency"], dataclasses.replace(kw["efficiency"], mfu_ceiling=NO_MFU_CEILING)):
            st = step_time(m, setup, lay, kw["cluster"], eff)
            cells += [f"{st.mfu:.1%}", f"{tokens / st.tokens_per_s * st.n_gpus / 3600 / 1e6:.2f}M"]
        print(f"| {label} | {tokens / 1e12:g}T | {' | '.join(cells)} | {published / 1e6:.2f}M |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
