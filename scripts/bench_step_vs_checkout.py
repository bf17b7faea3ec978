"""One target step of this tree's model code against another checkout's, in one process.

    git worktree add /tmp/baseline <commit>
    .venv/bin/python scripts/bench_step_vs_checkout.py --baseline /tmp/baseline --out results/dense_layout/step_vs_adc7bfb.json

The step: forward over T new tokens (T = 1: a decode step; more: a verify block of that many tree
nodes) with a 512-slot cache holding 300 tokens, then the logits. Both versions load the same model,
are compiled first and timed interleaved (median of --reps calls each); their logits must agree to
2e-3 (float32, products in another order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench_dense import median_ms

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW_TOKENS = (1, 2, 4, 8, 16)
CACHE_SLOTS, CACHE_FILLED = 512, 300


def import_checkout(root: str, *modules: str) -> list:
    """The named eagle_jax modules imported from the checkout under `root` (earlier imports dropped)."""
    import importlib

    for name in [m for m in sys.modules if m == "eagle_jax" or m.startswith("eagle_jax.")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        imported = [importlib.import_module(m) for m in modules]
    finally:
        sys.path.pop(0)
    if not sys.modules["eagle_jax"].__file__.startswith(os.path.abspath(root)):
        raise SystemExit(f"imported eagle_jax from {sys.modules['eagle_jax'].__file__}, not from {root}")
    return imported


def check_checkout(root: str) -> None:
    if not os.path.isfile(os.path.join(root, "eagle_jax", "model.py")):
        raise SystemExit(f"--baseline {root}: not an eagle-jax checkout (no eagle_jax/model.py); "
                         "expected e.g. the directory of `git worktree add DIR <commit>`")


def step_of(root: str, model: str):
    """(jitted step, params, cache) built from the eagle_jax package under `root`."""
    kv_cache, loading, model_code = import_checkout(root, "eagle_jax.kv_cache", "eagle_jax.loading", "eagle_jax.model")
    KVCache, forward, lm_head, make_cache = kv_cache.KVCache, model_code.forward, model_code.lm_head, model_code.make_cache
    target = loading.load_target(model, with_tokenizer=False)
    cfg = target.cfg
    empty = make_cache(cfg, 1, CACHE_SLOTS)
    cache = KVCache(empty.k + 0.01, empty.v + 0.01, jnp.full((1,), CACHE_FILLED, jnp.int32))

    @jax.jit
    def step(params, cache, tokens):  # (1, T) new tokens, causal among themselves
        t = tokens.shape[1]
        out = forward(params, cfg, tokens, cache.lengths[:, None] + jnp.arange(t)[None], cache, jnp.tril(jnp.ones((1, t, t), bool)))
        return lm_head(params, out.hidden)

    return step, target.params, cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="root of another checkout (a git worktree)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    check_checkout(args.baseline)
    os.environ["EAGLE_JAX_CACHE"] = "off"  # each version converts the GGUF in its own layout
    versions = {"baseline": step_of(args.baseline, args.model), "this_tree": step_of(HERE, args.model)}
    from eagle_jax.atomic import write_text_atomic  # this tree's, imported last
    from eagle_jax.infer.bench_report import describe_machine

    results = {}
    for t in NEW_TOKENS:
        tokens = jnp.full((1, t), 100, jnp.int32)
        logits = {name: np.asarray(fn(params, cache, tokens)) for name, (fn, params, cache) in versions.items()}
        assert np.abs(logits["baseline"] - logits["this_tree"]).max() <= 2e-3
        ms = median_ms({name: fn for name, (fn, _, _) in versions.items()},
                       {name: (params, cache, tokens) for name, (_, params, cache) in versions.items()}, args.reps)
        results[t] = ms | {"baseline_over_this_tree": round(ms["baseline"] / ms["this_tree"], 2)}
        print(f"{t:2d} new tokens: {results[t]}", flush=True)
    result = {
        "step_ms_by_new_tokens": results,
        "baseline": os.path.abspath(args.baseline),
        "config": {"model": args.model, "cache_slots": CACHE_SLOTS, "cache_filled": CACHE_FILLED, "reps": args.reps, "dtype": "float32"},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
