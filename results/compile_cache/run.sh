#!/usr/bin/env bash
# Compile time of `eagle-jax generate` with an empty compilation cache, then with the one the first
# run left (the same prompt, so the same shapes): compile_s as the command reports it and the
# wall-clock time of the whole command. Usage: bash results/compile_cache/run.sh [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/compile_cache/cpu.json}
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
mkdir -p "$cache/converted" "$(dirname "$out")"
# the converted model is not what is measured: reuse the user's entry when there is one
if [ -d "${EAGLE_JAX_CACHE:-$HOME/.cache/eagle-jax}/converted" ]; then
  cp -r "${EAGLE_JAX_CACHE:-$HOME/.cache/eagle-jax}/converted/." "$cache/converted/"
fi
runs=()
for run in cold warm; do
  start=$(date +%s.%N)
  report=$(EAGLE_JAX_CACHE="$cache" .venv/bin/eagle-jax generate --json --prompt "What is the capital of France? Answer in two sentences." 2>/dev/null)
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  runs+=("$(echo "$report" | .venv/bin/python -c "import json, sys; r = json.load(sys.stdin); print(json.dumps({'run': '$run', 'command_wall_s': round($wall, 1), 'compile_s': round(r['compile_s'], 1), 'new_tokens': r['new_tokens'], 'text': r['text']}))")")
  echo "${runs[-1]}"
done
.venv/bin/python - "$out" "${runs[@]}" <<'PY'
import json, sys
from eagle_jax.files import write_text_atomic
from eagle_jax.infer.bench_report import describe_machine
runs = [json.loads(r) for r in sys.argv[2:]]
assert runs[0]["text"] == runs[1]["text"]
write_text_atomic(sys.argv[1], json.dumps({"runs": runs, "machine": describe_machine()}, indent=2) + "\n")
print("wrote", sys.argv[1])
PY
