#!/usr/bin/env bash
# Plain decoding of SmolLM2-135M-Instruct: our JAX generate vs transformers' PyTorch generate, on
# the same prompts and machine, one after the other in one run. Needs .venv (eagle-jax) and
# .venv311 (Python 3.11 with torch==2.13.0, transformers, gguf; see scripts/tools/make_reference_fixtures.py).
#   bash results/plain_vs_transformers/run.sh [PROMPTS.jsonl] [LIMIT_PER_CATEGORY] [MAX_NEW_TOKENS] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
prompts=${1:-data/spec_bench_400.jsonl}
limit=${2:-2}
max_new=${3:-128}
out=${4:-results/plain_vs_transformers}
mkdir -p "$out"
gguf=$(.venv/bin/python -c "from eagle_jax.loading import resolve_model_path as r; print(r('smollm2-135m-instruct'))")
.venv/bin/eagle-jax bench --prompts "$prompts" --ar-only --max-new-tokens "$max_new" --limit "$limit" --out "$out/ours.json"
.venv311/bin/python results/plain_vs_transformers/bench_transformers.py --prompts "$prompts" --gguf "$gguf" --max-new-tokens "$max_new" --limit "$limit" --out "$out/transformers.json"
.venv/bin/python - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
ours = json.load(open(os.path.join(out, "ours.json")))["summary"]
hf = json.load(open(os.path.join(out, "transformers.json")))["summary"]
line = (f"plain decoding, {ours['num_prompts']} prompts: eagle-jax {ours['ar_tokens_per_s']:.1f} tok/s, "
        f"transformers {hf['ar_tokens_per_s']:.1f} tok/s ({ours['ar_tokens_per_s'] / hf['ar_tokens_per_s']:.2f}x), "
        f"transformers prompt lookup {hf['pld_tokens_per_s']:.1f} tok/s")
print(line)
open(os.path.join(out, "summary.txt"), "w").write(line + "\n")
PY
