"""Where a speculative round's time goes, with the default model and its shipped head.

    .venv/bin/python scripts/benchmarks/profile_round.py --out results/round_cost/pieces.json

Each piece is jitted on its own and timed interleaved with the others (median of --reps calls),
with a 520-slot cache holding 300 tokens, batch 1, float32:
  * the plain decode step (forward of 1 token, cache write, logits, argmax): the baseline's unit;
  * per tree: the phases of generate's round (`eagle_jax.decoding.speculative`): the draft tree (with
    the looked-up chain, if the tree has one), the verify forward of its tokens with their logits,
    greedy acceptance, and the commit (target cache + the draft's pass over the accepted tokens);
  * the verify step alone (forward + logits) over T = --verify-tokens new tokens.
The params are laid out as the Engine lays them out (`backend_layout`).
Pieces timed apart cost more than inside the compiled loop (no buffer reuse across them): read
them as shares of a round, not as its total. The whole round: `eagle-jax bench`.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp

from bench_dense import median_ms
from eagle_jax.decoding.sampling import SamplingConfig
from eagle_jax.decoding.speculative import (
    DraftState,
    SpecConfig,
    SpecModels,
    SpecState,
    accept_phase,
    commit_phase,
    draft_phase,
    verify_phase,
)
from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.draft.model import make_draft_cache
from eagle_jax.errors import EagleError
from eagle_jax.files import write_text_atomic
from eagle_jax.infer.bench_policy import parse_trees
from eagle_jax.infer.settings import load_tuned_tree
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL, default_head_dir
from eagle_jax.model.cpu_layout import backend_layout
from eagle_jax.model.transformer import forward, is_stacked, lm_head, make_cache

CACHE_SLOTS, CACHE_FILLED = 520, 300
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def filled(cache: KVCache) -> KVCache:
    k, v = jax.tree.map(lambda x: x + 0.01, (cache.k, cache.v))
    return KVCache(k, v, jnp.full(cache.lengths.shape, CACHE_FILLED, jnp.int32))


def tree_pieces(tree: TreeConfig, models: SpecModels, cache: KVCache, draft: DraftState, root, reps: int) -> dict:
    """Median ms of each phase of a greedy round of `tree`, each jitted alone."""
    spec = SpecConfig(tree, SamplingConfig(), max_new_tokens=4 * CACHE_SLOTS, cache_len=CACHE_SLOTS)
    b, p = root.shape[0], tree.max_path
    history = jnp.broadcast_to(jnp.arange(CACHE_SLOTS + 2 * p + 1, dtype=jnp.int32) % 50, (b, CACHE_SLOTS + 2 * p + 1)) if tree.lookup else None  # a repeating text
    state = SpecState(cache=cache, draft=draft, root=root, tokens=jnp.zeros((b, spec.max_new_tokens + p), jnp.int32),
                      count=jnp.ones((b,), jnp.int32), done=jnp.zeros((b,), bool), rng=jax.random.key(0),
                      rounds=jnp.zeros((b,), jnp.int32), histogram=jnp.zeros((b, p), jnp.int32), history=history)
    fns = {
        "draft_tree": jax.jit(lambda m, s: draft_phase(m, s, tree)),
        "verify_with_logits": jax.jit(verify_phase),
        "accept_greedy": jax.jit(lambda nodes, logits: accept_phase(None, nodes, logits, spec)),
        "commit_and_draft_context": jax.jit(lambda m, s, nodes, verified, acc: commit_phase(m, s, nodes, verified, acc, spec)),
    }
    nodes = fns["draft_tree"](models, state)
    verified = fns["verify_with_logits"](models, nodes, cache)
    acc = fns["accept_greedy"](nodes, verified.logits)
    args = {
        "draft_tree": (models, state),
        "verify_with_logits": (models, nodes, cache),
        "accept_greedy": (nodes, verified.logits),
        "commit_and_draft_context": (models, state, nodes, verified, acc),
    }
    return median_ms(fns, args, reps)


def round_split(params: dict, cfg, dcfg, dparams: dict, tree: TreeConfig, batch: int, reps: int) -> dict:
    """Median ms of each phase of a greedy round of `tree` at `batch` rows, on caches holding
    CACHE_FILLED of CACHE_SLOTS tokens, in the params' dtype."""
    dtype = params["embed"].dtype
    models = SpecModels(params, dparams, cfg, dcfg)
    cache = filled(make_cache(cfg, batch, CACHE_SLOTS, dtype, is_stacked(params)))
    draft_cache = filled(make_draft_cache(dcfg, batch, CACHE_SLOTS, dtype))
    log_probs = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (batch, dcfg.draft_vocab_size)))
    draft = DraftState(draft_cache, log_probs, jnp.full((batch, dcfg.hidden_size), 0.1, dtype))
    return tree_pieces(tree, models, cache, draft, jnp.full((batch,), 100, jnp.int32), reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default="", help="top_k/depth/num_nodes[/lookup],... (default: the shipped head's tuned tree and 4/4/16)")
    parser.add_argument("--verify-tokens", default="1,2,4,6,8,10,12,16", help="T values for the verify-step scan")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--head", default=None, help="a draft head directory (default: the shipped head)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    head_dir = args.head or default_head_dir(DEFAULT_MODEL)
    if args.trees:
        try:
            trees = parse_trees(args.trees)
        except EagleError as e:
            parser.error(str(e))
    else:
        tuned = load_tuned_tree(head_dir)
        trees = [tuned.tree if tuned else TreeConfig(), TreeConfig(4, 4, 16)]
    target = load_target(DEFAULT_MODEL, with_tokenizer=False)
    cfg, params = target.cfg, backend_layout(target.params)  # as the Engine runs them
    dcfg, dparams = load_draft(head_dir, cfg)
    dparams = backend_layout(dparams)
    cache = filled(make_cache(cfg, 1, CACHE_SLOTS))
    root = jnp.full((1,), 100, jnp.int32)

    def plain_step(params, cache, token):
        out = forward(params, cfg, token[:, None], cache.lengths[:, None], cache, jnp.ones((1, 1, 1), bool))
        return jnp.argmax(lm_head(params, out.hidden[:, 0]), -1), cache.write(out.k_new, out.v_new, jnp.ones((1,), jnp.int32))

    def verify_step(params, cache, tokens):  # (1, T) new tokens, causal among themselves
        t = tokens.shape[1]
        out = forward(params, cfg, tokens, cache.lengths[:, None] + jnp.arange(t)[None], cache, jnp.tril(jnp.ones((1, t, t), bool)))
        return lm_head(params, out.hidden)

    plain = median_ms({"plain_step": jax.jit(plain_step)}, {"plain_step": (params, cache, root)}, args.reps)["plain_step"]
    print(f"plain decode step: {plain} ms", flush=True)
    pieces = {}
    for tree in trees:
        name = f"{tree.top_k}/{tree.depth}/{tree.num_nodes}" + (f"/{tree.lookup}" if tree.lookup else "")
        pieces[name] = round_split(params, cfg, dcfg, dparams, tree, 1, args.reps)
        print(f"tree {name}: {pieces[name]} ms", flush=True)
    counts = [int(t) for t in args.verify_tokens.split(",")]
    step = jax.jit(verify_step)
    scan = median_ms({t: step for t in counts}, {t: (params, cache, jnp.full((1, t), 100, jnp.int32)) for t in counts}, args.reps)
    print(f"verify step by new tokens: {scan} ms", flush=True)
    result = {
        "plain_step_ms": plain,
        "round_pieces_ms": pieces,
        "verify_step_ms_by_tokens": scan,
        "config": {"model": DEFAULT_MODEL, "head": os.path.relpath(head_dir, REPO), "cache_slots": CACHE_SLOTS, "cache_filled": CACHE_FILLED,
                   "batch": 1, "reps": args.reps, "dtype": "float32"},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except EagleError as e:  # a --head that is not a draft head, or one that does not fit the model
        raise SystemExit(f"profile_round: error: {e}") from None
