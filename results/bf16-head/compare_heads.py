"""The shipped head stored in bfloat16 against the float32 head it was cast from, in one process.

    python results/bf16-head/compare_heads.py --fp32 /tmp/head_fp32 --out results/bf16-head/compare_heads.json

Loads the target once and both heads into float32 (the bfloat16 weights upcast, as `--draft` and
the default head load them), then decodes each prompt plainly and speculatively with each head,
greedy, batch 1, with the shipped head's tuned tree (its tree.json), the three modes interleaved
prompt by prompt and their order rotated from prompt to prompt so that the host's drift falls on
all three alike. Per prompt set: tau and tokens/s of each head (bench_report.summarize, each head
against the same plain runs), whether the two heads' answers are identical token for token, and
whether each equals plain decoding. `eagle-jax bench` measures one head per run, hence this script.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys

import jax.numpy as jnp

from eagle_jax.disk_cache import enable_compilation_cache
from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.files import write_json_atomic
from eagle_jax.infer.bench_measure import PromptRecord, run_conversation
from eagle_jax.infer.bench_report import describe_machine, summarize
from eagle_jax.infer.engine import Engine
from eagle_jax.infer.prompts import load_prompts, select_prompts
from eagle_jax.infer.settings import choose_tree, tree_fields
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import default_head_dir

MODEL = "smollm2-135m-instruct"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT_SETS = {  # name: (file, first K of each category, as `eagle-jax bench --limit K` takes them)
    "spec_bench": ("data/spec_bench_400.jsonl", 2),
    "sharegpt_dev": ("data/sharegpt_dev.jsonl", 10),
}
MODES = ("plain", "fp32", "bf16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fp32", required=True, help="the float32 head (a copy outside the repository)")
    parser.add_argument("--bf16", default=default_head_dir(MODEL), help="the bfloat16 head (default: the shipped one)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    enable_compilation_cache()  # the second head's programs are the first's (the weights are arguments)

    target = load_target(MODEL, dtype=jnp.float32)
    heads = {"fp32": load_draft(args.fp32, target.cfg, dtype=jnp.float32), "bf16": load_draft(args.bf16, target.cfg, dtype=jnp.float32)}
    stored = {name: str(next(iter(read_dtypes(path)))) for name, path in (("fp32", args.fp32), ("bf16", args.bf16))}
    tree = choose_tree(args.bf16, sampled=False).for_batch(1)
    assert tree is not None and tree == choose_tree(args.fp32, sampled=False).for_batch(1), "the heads' tuned trees differ"
    engines = {"plain": Engine(target, heads["fp32"], max_new_tokens=args.max_new_tokens)}
    engines["fp32"] = engines["plain"]
    engines["bf16"] = dataclasses.replace(engines["plain"], draft=heads["bf16"], laid_out=None)

    report = {
        "config": {
            "model": MODEL, "model_source": target.source, "dtype": "float32", "stored_dtypes": stored,
            "fp32_head": args.fp32, "bf16_head": os.path.relpath(args.bf16, ROOT), "tree": tree_fields(tree),
            "max_new_tokens": args.max_new_tokens, "sampling": "greedy", "batch": 1,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": describe_machine(),
        },
        "sets": {},
        "per_prompt": [],
    }
    seed = 0
    for name, (path, limit) in PROMPT_SETS.items():
        prompts = select_prompts(load_prompts(os.path.join(ROOT, path)), limit)
        records = {"fp32": [], "bf16": []}
        for index, prompt in enumerate(prompts):
            order = MODES[index % 3:] + MODES[: index % 3]
            runs = {}
            for mode in order:
                runs[mode] = run_conversation(engines[mode], prompt, None if mode == "plain" else tree, seed + index)
            for head in records:
                records[head].append(PromptRecord(prompt, runs[head], runs["plain"], greedy=True))
            same = all(a.tokens == b.tokens for a, b in zip(runs["fp32"].results, runs["bf16"].results))
            row = {"set": name, "question_id": prompt.question_id, "category": prompt.category, "order": list(order),
                   "prompt_tokens": runs["plain"].prompt_tokens, "heads_identical": same}
            for head in records:
                s = summarize([records[head][-1]])
                row[head] = {k: s[k] for k in ("tau", "spec_tokens_per_s", "ar_tokens_per_s", "speedup", "identical_to_ar", "new_tokens", "rounds")}
            report["per_prompt"].append(row)
            print(f"{name} {prompt.question_id}: tau fp32 {row['fp32']['tau']:.3f} bf16 {row['bf16']['tau']:.3f} "
                  f"heads identical {same}, plain-identical {row['fp32']['identical_to_ar']}/{row['bf16']['identical_to_ar']}",
                  file=sys.stderr, flush=True)
        rows = [r for r in report["per_prompt"] if r["set"] == name]
        report["sets"][name] = {
            "prompts": path, "limit_per_category": limit, "num_prompts": len(prompts),
            "heads_identical": all(r["heads_identical"] for r in rows),
            "differing_prompts": [r["question_id"] for r in rows if not r["heads_identical"]],
            **{head: summarize(records[head]) for head in records},
        }
        seed += len(prompts)
    write_json_atomic(args.out, report)
    for name, s in report["sets"].items():
        print(f"{name}: tau fp32 {s['fp32']['tau']:.4f} bf16 {s['bf16']['tau']:.4f}; tokens/s fp32 {s['fp32']['spec_tokens_per_s']:.1f} "
              f"bf16 {s['bf16']['spec_tokens_per_s']:.1f} plain {s['fp32']['ar_tokens_per_s']:.1f}; heads identical {s['heads_identical']} "
              f"({len(s['differing_prompts'])} differ); identical to plain fp32 {s['fp32']['identical_to_ar']} bf16 {s['bf16']['identical_to_ar']}")
    print(f"wrote {args.out}", file=sys.stderr)


def read_dtypes(directory: str) -> set:
    """The float dtypes a head's safetensors store."""
    from safetensors import safe_open

    dtypes = set()
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(directory, name), framework="numpy") as f:
                dtypes |= {f.get_slice(k).get_dtype() for k in f.keys() if k not in ("d2t", "t2d")}
    return dtypes


if __name__ == "__main__":
    main()
