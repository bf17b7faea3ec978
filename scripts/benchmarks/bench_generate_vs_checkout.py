"""Speculative and plain generate of this tree against another checkout's, in one process, same
model, head, tree and prompts.

    git worktree add /tmp/baseline <commit>
    .venv/bin/python scripts/benchmarks/bench_generate_vs_checkout.py --baseline /tmp/baseline --out generate.json

Each version compiles `generate_spec` for the default model with its shipped head and the drafted
part of the tuned tree (read from this tree; its lookup chain is left out, since checkouts before
it have none) or the --tree given, greedy, and `generate_ar`; the four are timed interleaved on each prompt
(median of --reps calls each, compile excluded). All are lossless, so their tokens must be equal. The prompts are
the tuning questions (data/sharegpt_tune.jsonl), rendered with the chat template.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bench_dense import median_ms
from bench_step_vs_checkout import HERE, engine_params, import_roles, layout_of

MODEL = "smollm2-135m-instruct"
CACHE_LEN = 512


def generate_of(root: str, tree_args: dict, max_new_tokens: int):
    """(speculative generate, plain generate, tokenizer) from the eagle_jax package under `root`;
    each generate(tokens, lengths) returns (tokens (1, max_new_tokens), a count (1,)): the rounds
    for the speculative one, the new tokens for the plain one."""
    modules = import_roles(root, "model", "speculative", "tree", "plain", "layout",
                           same_in_both=("eagle_jax.loading.registry", "eagle_jax.draft.checkpoint"))
    registry, checkpoint = modules["eagle_jax.loading.registry"], modules["eagle_jax.draft.checkpoint"]
    target = modules["loading"].load_target(MODEL)
    dcfg, dparams = checkpoint.load_draft(registry.default_head_dir(MODEL), target.cfg)
    spec_params, plain_params, dparams = engine_params(modules, target.params, dparams)
    tree = modules["tree"].TreeConfig(**tree_args)

    def generate(tokens, lengths):
        out = modules["speculative"].generate_spec_jit(
            spec_params, target.cfg, dparams, dcfg, tokens, lengths, jax.random.key(0),
            max_new_tokens=max_new_tokens, cache_len=CACHE_LEN, tree=tree, stop_ids=target.stop_ids,
        )
        return out.tokens, out.rounds

    def generate_plain(tokens, lengths):
        out = modules["plain"].generate_ar_jit(
            plain_params, target.cfg, tokens, lengths, jax.random.key(0),
            max_new_tokens=max_new_tokens, cache_len=CACHE_LEN, stop_ids=target.stop_ids,
        )
        return out.tokens, out.num_tokens

    return generate, generate_plain, target.tokenizer


def ratios(ms: dict) -> dict:
    """How much faster this tree is (spec, plain), and speculation's speedup in each version."""
    return {
        "spec_baseline_over_this_tree": round(ms["baseline_spec"] / ms["this_tree_spec"], 3),
        "plain_baseline_over_this_tree": round(ms["baseline_plain"] / ms["this_tree_plain"], 3),
        "speedup_baseline": round(ms["baseline_plain"] / ms["baseline_spec"], 3),
        "speedup_this_tree": round(ms["this_tree_plain"] / ms["this_tree_spec"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="root of another checkout (a git worktree)")
    parser.add_argument("--prompts", type=int, default=4, help="how many tuning questions")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tree", help="top_k/depth/num_nodes[/lookup] (default: the tuned tree without its lookup)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    layout_of(args.baseline)
    if args.tree:
        from eagle_jax.errors import EagleError
        from eagle_jax.infer.bench_policy import parse_trees

        try:
            (tree,) = parse_trees(args.tree, "--tree")
        except (EagleError, ValueError) as e:  # a list of several trees unpacks into one with ValueError
            parser.error(str(e))
        tree_args = {"top_k": tree.top_k, "depth": tree.depth, "num_nodes": tree.num_nodes, "lookup": tree.lookup}
    else:
        from eagle_jax.files import read_json

        tuned = read_json(os.path.join(HERE, "eagle_jax", "heads", MODEL, "tree.json"), what="the shipped head's tuned tree")
        tree_args = {k: v for k, v in tuned.items() if k in ("top_k", "depth", "num_nodes")}
    fns, tokenizer = {}, None
    for version, root in (("baseline", args.baseline), ("this_tree", HERE)):
        spec, plain, tokenizer = generate_of(root, tree_args, args.max_new_tokens)
        fns[f"{version}_spec"], fns[f"{version}_plain"] = spec, plain
    from eagle_jax.files import write_text_atomic  # this tree's, imported last
    from eagle_jax.decoding.prompts import pad_prompts
    from eagle_jax.infer.bench_report import describe_machine

    with open(os.path.join(HERE, "data", "sharegpt_tune.jsonl")) as f:
        questions = [json.loads(line)["turns"][0] for line in f][: args.prompts]
    rows, total = [], {name: 0.0 for name in fns}
    for question in questions:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        tokens, lengths = (jnp.asarray(a) for a in pad_prompts([ids]))
        outs = {name: jax.block_until_ready(fn(tokens, lengths)) for name, fn in fns.items()}  # compiles
        for name in fns:
            np.testing.assert_array_equal(np.asarray(outs[name][0]), np.asarray(outs["this_tree_plain"][0]), err_msg=name)
        ms = median_ms(fns, {name: (tokens, lengths) for name in fns}, args.reps)
        for name in fns:
            total[name] += ms[name]
        new_tokens, rounds = int(outs["this_tree_plain"][1][0]), int(outs["this_tree_spec"][1][0])
        rows.append({"prompt_tokens": len(ids), "new_tokens": new_tokens, "rounds": rounds, "wall_ms": ms} | ratios(ms))
        print(rows[-1], flush=True)
    result = {
        "per_prompt": rows,
        "total_wall_ms": total,
        **ratios(total),
        "baseline": os.path.abspath(args.baseline),
        "config": {"model": MODEL, "tree": tree_args, "max_new_tokens": args.max_new_tokens, "reps": args.reps,
                   "greedy": True, "cache_len": CACHE_LEN, "dtype": "float32"},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"{ratios(total)}; wrote {args.out}")


if __name__ == "__main__":
    main()
