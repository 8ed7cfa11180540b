#!/usr/bin/env bash
# Buy a cluster for a year of three jobs (examples/jobs.yaml: pretrain an 8B on 1T tokens,
# fine-tune a 70B on 60B tokens, continue the 8B on 200B tokens, each with its own deadline):
# how many H100, H200 and B200 nodes, at the least purchase-plus-power cost.
# Runs from the repository root wherever it is called from: bash examples/<folder>/command.sh
cd "$(dirname "$0")/../.." || exit

plan buy examples/jobs.yaml
