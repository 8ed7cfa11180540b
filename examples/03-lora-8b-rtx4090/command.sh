#!/usr/bin/env bash
# LoRA (PEFT's default: r = 8 on q_proj and v_proj) of Llama 3.1 8B on one RTX 4090 24GB:
# 50M tokens of 2,048-token sequences, 16 sequences per step.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan --model llama3.1-8b --gpus 4090 --n-gpus 1 --method lora --seq-len 2048 --global-batch 16 --tokens 50M
