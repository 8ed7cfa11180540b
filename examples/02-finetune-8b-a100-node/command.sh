#!/usr/bin/env bash
# Full fine-tuning of Llama 3.1 8B on one DGX A100 node (8 x A100 80GB): 1B tokens
# (three epochs of a ~330M-token instruction set), 128 sequences of 4,096 tokens per step.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan --model llama3.1-8b --gpus a100 --n-gpus 8 --global-batch 128 --tokens 1B
