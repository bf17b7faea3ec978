#!/usr/bin/env bash
# The shipped default head for SmolLM2-135M-Instruct (eagle_jax/heads/smollm2-135m-instruct):
# EAGLE-3.1 (fc_norm + norm_output), trained on this 2-core CPU on the first ShareGPT exchanges,
# answered by SmolLM2 itself (self-distillation, greedy, at most 256 new tokens). Regeneration is
# resumable: a stopped run keeps OUT/regenerated and skips the conversations already answered.
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-runs/default_head}
mkdir -p "$run"
.venv/bin/python scripts/sharegpt_slice.py --start 0 --count 4000 --first-turn --out "$run/sharegpt_train.jsonl"
.venv/bin/eagle-jax train --model smollm2-135m-instruct --data "$run/sharegpt_train.jsonl" --num-conversations 999 \
  --regenerate --regen-max-new-tokens 256 --regen-batch-size 32 \
  --out "$run/run4" --head eagle3 --fc-norm --norm-output --ttt-steps 3 --draft-vocab 8192 \
  --seq-len 512 --long-samples split --offline-features --batch-size 4 --max-steps 480 --lr 6e-4 \
  --eval-every 120 --save-every 60 --log-every 10 --no-progress
mkdir -p results/head_ablation
.venv/bin/python scripts/vocab_coverage.py "$run/run4" --sizes 2048 4096 8192 16384 --out results/head_ablation/vocab_coverage.json
