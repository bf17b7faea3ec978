"""How far greedy speculative output agrees with greedy plain output in bfloat16, and why it parts.

    python results/bf16-agreement/agreement.py --limit 20 --out results/bf16-agreement/agreement.json

SmolLM2-135M-Instruct and its shipped head, loaded once in bfloat16 and once in float32, decode the
first turn of each ShareGPT dev prompt (first --limit prompts, greedy, batch 1, the head's tuned
tree) four ways: plain and speculative in each dtype. Per prompt it records where the bfloat16
speculative answer first parts from the bfloat16 plain one (None: identical over all tokens), and
at that position the target's top-2 logit gap given the plain answer so far, in bfloat16 and in
float32: a gap at the size of bfloat16's rounding is a near-tie that either side may take, a large
gap would be a bug. The same for bfloat16 plain against float32 plain, which bfloat16 itself
causes without any speculation.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.files import write_json_atomic
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.infer.engine import Engine
from eagle_jax.infer.prompts import load_prompts, messages_for_turn, select_prompts
from eagle_jax.infer.settings import choose_tree, tree_fields
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import default_head_dir
from eagle_jax.model.transformer import causal_mask, forward, lm_head

MODEL = "smollm2-135m-instruct"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = os.path.join(ROOT, "data", "sharegpt_dev.jsonl")


@jax.jit
def next_logits(params, tokens):
    """Float32 logits (V,) after tokens (1, T), from one forward over the whole context."""
    t = tokens.shape[1]
    out = forward(params, CFG, tokens, jnp.arange(t)[None], None, causal_mask(jnp.ones((1, t), bool)))
    return lm_head(params, out.hidden[0, -1])


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def gap_at(params, context: list[int], tokens: tuple[int, int]) -> dict:
    """The top-2 logits after `context` and the logits of the two tokens the runs chose."""
    logits = np.asarray(next_logits(params, jnp.asarray([context], jnp.int32)))
    top = np.argsort(-logits)[:2]
    return {"top2": [int(t) for t in top], "top2_gap": float(logits[top[0]] - logits[top[1]]),
            "chosen_gap": float(logits[tokens[0]] - logits[tokens[1]]), "top_logit": float(logits[top[0]])}


def divergence(prompt_ids, reference: list[int], other: list[int], params: dict) -> dict | None:
    i = first_difference(reference, other)
    if i is None or i >= min(len(reference), len(other)):
        return None if i is None else {"index": i, "note": "one answer stopped earlier"}
    context = prompt_ids + reference[:i]
    pair = (reference[i], other[i])
    return {"index": i, "tokens": list(pair), "bfloat16": gap_at(params["bfloat16"], context, pair),
            "float32": gap_at(params["float32"], context, pair)}


def main() -> None:
    global CFG
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=20, help="first N ShareGPT dev prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--float32-activations", action="store_true",
                        help="the bfloat16 run keeps its weights in bfloat16 but its embedding, and so every "
                             "activation and the KV caches, in float32")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    targets = {name: load_target(MODEL, dtype=name) for name in ("bfloat16", "float32")}
    if args.float32_activations:
        bf16 = targets["bfloat16"]
        targets["bfloat16"] = dataclasses.replace(bf16, params=bf16.params | {"embed": bf16.params["embed"].astype(jnp.float32)})
    CFG = targets["float32"].cfg
    head = default_head_dir(MODEL)
    tree = choose_tree(head, sampled=False).for_batch(1)
    engines = {name: Engine(t, load_draft(head, t.cfg, dtype=name), max_new_tokens=args.max_new_tokens) for name, t in targets.items()}
    params = {name: t.params for name, t in targets.items()}
    prompts = select_prompts(load_prompts(PROMPTS))[: args.limit]
    rows = []
    for prompt in prompts:
        ids = engines["float32"].encode_chat(messages_for_turn(prompt, [], 0))
        out = {f"{mode}_{name}": engine.run([ids], tree=tree if mode == "spec" else None).tokens[0]
               for name, engine in engines.items() for mode in ("plain", "spec")}
        rows.append({
            "prompt_tokens": len(ids),
            "new_tokens": {key: len(v) for key, v in out.items()},
            "float32_spec_equals_plain": out["spec_float32"] == out["plain_float32"],
            "bfloat16_spec_vs_plain": divergence(ids, out["plain_bfloat16"], out["spec_bfloat16"], params),
            "bfloat16_plain_vs_float32_plain": divergence(ids, out["plain_float32"], out["plain_bfloat16"], params),
        })
        print(len(rows), rows[-1]["bfloat16_spec_vs_plain"], flush=True)

    parted = [r["bfloat16_spec_vs_plain"] for r in rows if r["bfloat16_spec_vs_plain"]]
    drift = [r["bfloat16_plain_vs_float32_plain"] for r in rows if r["bfloat16_plain_vs_float32_plain"]]
    report = {
        "config": {"model": MODEL, "model_source": targets["float32"].source, "prompts": os.path.relpath(PROMPTS, ROOT),
                   "limit": args.limit, "turn": 0, "max_new_tokens": args.max_new_tokens, "tree": tree_fields(tree),
                   "sampling": "greedy", "batch": 1, "attention": "xla (scores, softmax and sums in float32)",
                   "bfloat16_run": "bfloat16 weights, float32 embedding, activations and caches" if args.float32_activations
                   else "bfloat16 weights, activations and caches",
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": describe_machine()},
        "summary": {
            "prompts": len(rows),
            "float32_spec_equals_plain": sum(r["float32_spec_equals_plain"] for r in rows),
            "bfloat16_spec_equals_plain": len(rows) - len(parted),
            "bfloat16_spec_first_difference": sorted(d["index"] for d in parted),
            "bfloat16_spec_top2_gaps_bf16": sorted(round(d["bfloat16"]["top2_gap"], 4) for d in parted if "bfloat16" in d),
            "bfloat16_spec_top2_gaps_f32": sorted(round(d["float32"]["top2_gap"], 4) for d in parted if "float32" in d),
            "bfloat16_plain_equals_float32_plain": len(rows) - len(drift),
            "bfloat16_plain_first_difference": sorted(d["index"] for d in drift),
            "bfloat16_plain_top2_gaps_f32": sorted(round(d["float32"]["top2_gap"], 4) for d in drift if "float32" in d),
        },
        "per_prompt": rows,
    }
    write_json_atomic(args.out, report)
    print(report["summary"])


if __name__ == "__main__":
    main()
