#!/usr/bin/env bash
# The default head's figures in README.md: greedy on a Spec-Bench subset (the first 2 prompts of
# each of the 5 categories) and on 10 held-out ShareGPT questions (data/sharegpt_dev.jsonl, taken
# far past the training slice), then temperature 1 on the Spec-Bench subset.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/default_head}
tree=(--top-k 2 --depth 3 --num-nodes 6)
mkdir -p "$out"
.venv/bin/eagle-jax bench --prompts ../shared/data/spec_bench_400.jsonl --limit 2 --max-new-tokens 96 "${tree[@]}" \
  --out "$out/spec_bench.json" --plots "$out/plots_spec_bench"
.venv/bin/eagle-jax bench --prompts data/sharegpt_dev.jsonl --limit 10 --max-new-tokens 96 "${tree[@]}" \
  --out "$out/sharegpt_dev.json" --plots "$out/plots_sharegpt_dev"
.venv/bin/eagle-jax bench --prompts ../shared/data/spec_bench_400.jsonl --limit 1 --max-new-tokens 96 "${tree[@]}" \
  --temperature 1 --out "$out/spec_bench_t1.json"
