"""SmolLM2 decoding on this machine with its layers unrolled (and laid out for CPU) and scanned over.

    python results/scan-layers/smollm2_forms.py --out results/scan-layers/smollm2_forms.json

The default model with its shipped head, float32, greedy, batch 1, 96 new tokens, the head's tuned
tree; the Engine's two layer forms (`Engine(layers=...)`), speculative and plain, timed interleaved
on each of the first --prompts tuning questions (median of --reps runs each, compile excluded and
recorded), with their tokens compared.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.files import write_json_atomic
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.infer.engine import Engine
from eagle_jax.infer.prompts import load_prompts, messages_for_turn
from eagle_jax.infer.settings import choose_tree, tree_fields
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import default_head_dir

MODEL = "smollm2-135m-instruct"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMS = ("unrolled", "scan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    target = load_target(MODEL, dtype="float32")
    head = default_head_dir(MODEL)
    draft = load_draft(head, target.cfg, dtype="float32")
    tree = choose_tree(head, sampled=False).for_batch(1)
    engines = {form: Engine(target, draft, max_new_tokens=args.max_new_tokens, layers=form) for form in FORMS}
    prompts = load_prompts(os.path.join(ROOT, "data", "sharegpt_tune.jsonl"))[: args.prompts]
    rows, compile_s = [], {}
    for prompt in prompts:
        ids = engines["unrolled"].encode_chat(messages_for_turn(prompt, [], 0))
        walls, tokens = {}, {}
        for mode, mode_tree in (("spec", tree), ("plain", None)):
            for form, engine in engines.items():
                compile_s[f"{mode}_{form}"] = compile_s.get(f"{mode}_{form}", 0) + engine.run([ids], tree=mode_tree).compile_s
            runs = {form: [] for form in FORMS}
            for rep in range(args.reps):
                for form in FORMS if rep % 2 == 0 else FORMS[::-1]:
                    result = engines[form].run([ids], tree=mode_tree)
                    runs[form].append(result.wall_s)
                    tokens[f"{mode}_{form}"] = result.tokens[0]
            walls |= {f"{mode}_{form}_s": round(statistics.median(v), 4) for form, v in runs.items()}
        rows.append({"prompt_tokens": len(ids), **walls, "tokens_equal": len({tuple(t) for t in tokens.values()}) == 1})
        print(rows[-1], flush=True)
    totals = {key: round(sum(r[key] for r in rows), 3) for key in rows[0] if key.endswith("_s")}
    write_json_atomic(args.out, {
        "config": {"model": MODEL, "dtype": "float32", "tree": tree_fields(tree), "max_new_tokens": args.max_new_tokens,
                   "prompts": "data/sharegpt_tune.jsonl", "num_prompts": len(rows), "reps": args.reps, "batch": 1,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": describe_machine()},
        "totals_s": totals, "scan_time_over_unrolled": {m: round(totals[f"{m}_scan_s"] / totals[f"{m}_unrolled_s"], 3) for m in ("spec", "plain")},
        "compile_s": {k: round(v, 2) for k, v in compile_s.items()}, "rows": rows,
    })


if __name__ == "__main__":
    main()
