#!/usr/bin/env bash
# Pretrain Llama 3.1 70B on 1.4T tokens (Chinchilla's 20 tokens per parameter) within
# 30 days on rented H100s: how many GPUs, which layout, what it costs.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan --model llama3.1-70b --gpus h100 --tokens 1.4T --deadline 30d
