#!/usr/bin/env bash
# `plan calibrate` on sample logs of four stacks (written in each stack's own format; see
# README.md), each followed by a plan before and after its calibration file is applied.
# Runs from the repository root wherever it is called from: bash examples/calibrate/commands.sh
cd "$(dirname "$0")/../.." || exit

# Megatron-LM: Llama 2 7B, tp 2 x dp 4, distributed optimizer (ZeRO-1), selective recompute
plan calibrate examples/calibrate/megatron_llama2-7b_h100x8.log --model llama2-7b --gpus h100 \
  --dp 4 --tp 2 --pp 1 --cp 1 --zero 1 --micro-batch 1 --seq-len 4096 --recompute selective \
  --out /tmp/planner-calibrate-megatron.toml --force
plan --model 70b --gpus h100 --quiet
plan --model 70b --gpus h100 --quiet --calibration /tmp/planner-calibrate-megatron.toml

# torchtitan: Llama 3.1 8B, FSDP2 on 8 GPUs, selective activation checkpointing
plan calibrate examples/calibrate/torchtitan_llama3.1-8b_h100x8.log --model llama3.1-8b --gpus h100 \
  --dp 8 --tp 1 --pp 1 --cp 1 --fsdp full --micro-batch 1 --global-batch 8 --seq-len 4096 \
  --recompute selective --out /tmp/planner-calibrate-torchtitan.toml --force
plan --model 8b --gpus h100 --n-gpus 8 --fsdp full --global-batch 64 --quiet
plan --model 8b --gpus h100 --n-gpus 8 --fsdp full --global-batch 64 --quiet \
  --calibration /tmp/planner-calibrate-torchtitan.toml

# DeepSpeed: Llama 2 7B, ZeRO-3, full activation checkpointing
plan calibrate examples/calibrate/deepspeed_llama2-7b_h100x8.log --model llama2-7b --gpus h100 \
  --dp 8 --tp 1 --pp 1 --cp 1 --zero 3 --micro-batch 2 --global-batch 64 --seq-len 4096 \
  --recompute full --out /tmp/planner-calibrate-deepspeed.toml --force
plan --model 13b --gpus h100 --n-gpus 8 --zero 3 --quiet
plan --model 13b --gpus h100 --n-gpus 8 --zero 3 --calibration /tmp/planner-calibrate-deepspeed.toml

# Hugging Face Trainer: Qwen2.5-1.5B, DDP on 8 GPUs (the Trainer prints one summary per run;
# no memory line, so no overhead is fitted); --json for scripts
plan calibrate examples/calibrate/hf-trainer_qwen2.5-1.5b_h100x8.log --model qwen2.5-1.5b --gpus h100 \
  --dp 8 --tp 1 --pp 1 --cp 1 --zero 0 --micro-batch 4 --global-batch 64 --seq-len 2048 \
  --recompute none --out /tmp/planner-calibrate-hf.toml --force --json

# the three layouts above fitted jointly (least squares on log error over the three logs)
plan calibrate --runs examples/calibrate/runs.toml --gpus h100 --out /tmp/planner-calibrate-h100.toml --force
plan --model 70b --gpus h100 --quiet --calibration /tmp/planner-calibrate-h100.toml

# (a file fitted on h100 logs is refused for another GPU type, exit 2: tests/test_calibrate.py)
