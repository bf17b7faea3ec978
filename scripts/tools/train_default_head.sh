#!/usr/bin/env bash
# The shipped default head for SmolLM2-135M-Instruct (eagle_jax/heads/smollm2-135m-instruct):
# EAGLE-3.1 (fc_norm + norm_output), trained on this 2-core CPU in eleven stages (docs/default-head-training.md
# gives each stage's command, data, logs and curves). Usage: bash scripts/tools/train_default_head.sh [RUN_DIR]
# Stage 1: the first ShareGPT exchanges answered by SmolLM2 itself (self-distillation, greedy, at
#   most 256 new tokens), 480 steps from scratch. Regeneration is resumable: a stopped run keeps
#   OUT/regenerated and skips the conversations already answered.
# Stage 2: continued from stage 1's head (--init-head: same weights, same draft vocabulary) on whole
#   ShareGPT conversations 1000-2500 as they are (no regeneration: the target's soft labels on other
#   text, and prompts up to 1024 tokens), 270 steps, target features online.
# Stage 3: continued from stage 2's head the same way on the next 1500 conversations (2500-3999), 240 steps.
# Stage 4: continued from stage 3's head on the first exchanges of the next 1600 conversations (4000 on),
#   answered by SmolLM2 itself again (greedy, at most 192 new tokens), 600 steps, offline features.
# Stages 5 to 8: each continued from the stage before the same way on the first exchanges of the next
#   1600 conversations (5600 on, 7200 on, 8800 on, then 10400 on: the last ends where the tuning
#   questions begin, at 12000).
# Stage 9: the same on the 2200 conversations from 12100 on (past the tuning questions at
#   12000-12012, before the dev questions at 16000).
# Stage 10: the same on the rest of the file from 14300 on (3000 asked for; 3002 remain once the
#   44 conversations that are, or repeat word for word, the dev and tuning questions are left out).
# Stage 11: a second pass over stage 10's answers (the same slice, the answers copied), 900 steps from
#   stage 10's head.
# Stages 7 to 10's answers were committed and are kept in the history (data/regenerated/README.md):
#   git restore --source=65e69b5 --worktree -- 'data/regenerated/*.jsonl'
#   then copy them to "$run/stageN/regenerated/" first to skip regenerating.
set -euo pipefail
cd "$(dirname "$0")/../.."
run=${1:-runs/default_head}
mkdir -p "$run"
.venv/bin/python scripts/tools/sharegpt_slice.py --start 0 --count 4000 --first-turn --out "$run/sharegpt_train.jsonl"
.venv/bin/eagle-jax train --model smollm2-135m-instruct --data "$run/sharegpt_train.jsonl" --num-conversations 999 \
  --regenerate --regen-max-new-tokens 256 --regen-batch-size 32 \
  --out "$run/run4" --head eagle3 --fc-norm --norm-output --ttt-steps 3 --draft-vocab 8192 \
  --seq-len 512 --long-samples split --offline-features --batch-size 4 --grad-accum 1 --max-steps 480 --lr 6e-4 \
  --eval-every 120 --save-every 60 --log-every 10 --no-progress
.venv/bin/python scripts/tools/sharegpt_slice.py --start 1000 --count 3000 --out "$run/sharegpt_1000_4000.jsonl"
.venv/bin/eagle-jax train --model smollm2-135m-instruct --data "$run/sharegpt_1000_4000.jsonl" --num-conversations 1500 \
  --init-head "$run/run4/draft" --out "$run/stage2" --ttt-steps 3 --seq-len 1024 --long-samples split \
  --dev-fraction 0.006 --batch-size 2 --grad-accum 1 --max-steps 270 --lr 3e-4 --warmup-steps 15 --schedule cosine \
  --eval-every 90 --save-every 30 --log-every 5 --tau-prompts 4 --no-progress
.venv/bin/python scripts/tools/sharegpt_slice.py --start 2500 --count 1500 --out "$run/sharegpt_2500_4000.jsonl"
.venv/bin/eagle-jax train --model smollm2-135m-instruct --data "$run/sharegpt_2500_4000.jsonl" --num-conversations 1500 \
  --init-head "$run/stage2/draft" --out "$run/stage3" --ttt-steps 3 --seq-len 1024 --long-samples split \
  --dev-fraction 0.006 --batch-size 2 --grad-accum 1 --max-steps 240 --lr 3e-4 --warmup-steps 15 --schedule cosine \
  --eval-every 80 --save-every 20 --log-every 5 --tau-prompts 4 --no-progress
self_distilled_stage() {  # START INIT_HEAD OUT [COUNT=1600 [SLICE_ARGS...]], steps=600: stages 4 to 11 (the shipped stages 4-7 wrote --count 3000: the same first 1600)
  local start=$1 init=$2 out=$3 count=${4:-1600} steps=${steps:-600}
  shift $(($# < 4 ? $# : 4))
  .venv/bin/python scripts/tools/sharegpt_slice.py --start "$start" --count "$count" --first-turn "$@" --out "$run/sharegpt_$start.jsonl"
  .venv/bin/eagle-jax train --model smollm2-135m-instruct --data "$run/sharegpt_$start.jsonl" --num-conversations "$count" \
    --regenerate --regen-max-new-tokens 192 --regen-batch-size 32 \
    --init-head "$init" --out "$out" --ttt-steps 3 --seq-len 512 --long-samples split --offline-features \
    --batch-size 4 --grad-accum 1 --max-steps "$steps" --lr 3e-4 --warmup-steps 20 --schedule cosine \
    --eval-every 150 --save-every 50 --log-every 10 --tau-prompts 2 --no-progress
}
self_distilled_stage 4000 "$run/stage3/draft" "$run/stage4"
self_distilled_stage 5600 "$run/stage4/draft" "$run/stage5"
self_distilled_stage 7200 "$run/stage5/draft" "$run/stage6"
self_distilled_stage 8800 "$run/stage6/draft" "$run/stage7"
self_distilled_stage 10400 "$run/stage7/draft" "$run/stage8"
self_distilled_stage 12100 "$run/stage8/draft" "$run/stage9" 2200
self_distilled_stage 14300 "$run/stage9/draft" "$run/stage10" 3000 --exclude data/sharegpt_dev.jsonl data/sharegpt_tune.jsonl
mkdir -p "$run/stage11" && cp -r "$run/stage10/regenerated" "$run/stage11/"
steps=900 self_distilled_stage 14300 "$run/stage10/draft" "$run/stage11" 3000 --exclude data/sharegpt_dev.jsonl data/sharegpt_tune.jsonl
mkdir -p results/head_ablation
.venv/bin/python scripts/tools/vocab_coverage.py "$run/run4" --sizes 2048 4096 8192 16384 --out results/head_ablation/vocab_coverage.json
