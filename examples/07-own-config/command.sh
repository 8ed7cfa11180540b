#!/usr/bin/env bash
# A model of your own: a Hugging Face config.json (my-3b/config.json, a made-up 3B
# Llama-like architecture: 26 layers, d_model 3072, GQA 24/8 heads, 64K vocabulary).
# Pretrain it on 100B tokens within a week on at most 64 GPUs, H100 or A100, whichever is cheaper.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan --model examples/07-own-config/my-3b/config.json --gpus h100,a100 --tokens 100B --deadline 7d --max-gpus 64
