#!/usr/bin/env bash
# QLoRA of Llama 3.1 70B on one L40S 48GB, 512-token sequences (as in the QLoRA paper).
# First with QLoRA's defaults (r = 64 on all linear layers), then with r = 16.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan --model llama3.1-70b --gpus l40s --n-gpus 1 --method qlora --seq-len 512 --global-batch 16
plan --model llama3.1-70b --gpus l40s --n-gpus 1 --method qlora --lora-rank 16 --seq-len 512 --global-batch 16
