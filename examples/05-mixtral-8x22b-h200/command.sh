#!/usr/bin/env bash
# Mixtral 8x22B (141B parameters, 39B active per token) on H200s: the fewest GPUs that
# train it, with expert parallelism, 1,024 sequences of 4,096 tokens per step.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan --model mixtral-8x22b --gpus h200
