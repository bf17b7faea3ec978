"""Where a speculative round's time goes, with the default model and its shipped head.

    .venv/bin/python scripts/benchmarks/profile_round.py --out results/round_cost/pieces.json

Each piece is jitted on its own and timed interleaved with the others (median of --reps calls),
with a 520-slot cache holding 300 tokens, batch 1, float32:
  * the plain decode step (forward of 1 token, cache write, logits, argmax): the baseline's unit;
  * per tree: the draft tree (with the looked-up chain, if the tree has one), the verify forward of
    its tokens with their logits, greedy acceptance, and the commit (target cache + the draft's pass
    over the accepted tokens);
  * the verify step alone (forward + logits) over T = --verify-tokens new tokens.
Verify forwards over more than one token multiply by `with_block_copies`' copies, as generate's do.
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
from eagle_jax.decoding.accept import accept_greedy
from eagle_jax.files import write_text_atomic
from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.draft.model import make_draft_cache, project_features
from eagle_jax.errors import EagleError
from eagle_jax.infer.bench_policy import load_tuned_tree, parse_trees
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL, default_head_dir
from eagle_jax.model.transformer import for_blocks, forward, lm_head, make_cache, with_block_copies
from eagle_jax.decoding.speculative import DraftState, draft_tree, run_draft_context
from eagle_jax.decoding.tree import TreeConfig

CACHE_SLOTS, CACHE_FILLED = 520, 300
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def filled(cache: KVCache) -> KVCache:
    k, v = jax.tree.map(lambda x: x + 0.01, (cache.k, cache.v))
    return KVCache(k, v, jnp.full(cache.lengths.shape, CACHE_FILLED, jnp.int32))


def tree_pieces(tree: TreeConfig, cfg, params, block_params, dcfg, dparams, cache, state, root, reps: int) -> dict:
    capture = dcfg.feature_layers
    history = jnp.arange(CACHE_SLOTS + tree.max_path + 1, dtype=jnp.int32)[None] % 50  # a repeating text

    def verify(params, block_params, cache, t):
        out = forward(block_params, cfg, t.tokens, cache.lengths[:, None] + t.depths, cache, t.ancestor_mask, capture=capture)
        return out, lm_head(params, out.hidden)

    def commit(params, dparams, cache, state, t, out, acc):
        gather = jnp.maximum(jnp.take_along_axis(t.paths, acc.node[:, None, None], axis=1)[:, 0], 0)
        n_emit = acc.num_accepted + 1
        take = jax.vmap(lambda x, i: x[:, i], in_axes=(1, 0), out_axes=1)
        features = out._replace(hidden=take(out.hidden[None], gather)[0], captured=take(out.captured, gather))
        positions = cache.lengths[:, None] + jnp.arange(tree.max_path)[None]
        emitted = jnp.take_along_axis(t.tokens, gather, axis=1)
        draft = run_draft_context(dparams, dcfg, params, state.cache, project_features(dparams, dcfg, features), emitted, positions, n_emit, "auto")
        return cache.commit_path(out.k_new, out.v_new, gather, n_emit), draft

    fns = {
        "draft_tree": jax.jit(lambda dp, p, s, r: draft_tree(dp, dcfg, p, s, r, tree, "auto", history)),
        "verify_with_logits": jax.jit(verify),
        "accept_greedy": jax.jit(accept_greedy),
        "commit_and_draft_context": jax.jit(commit),
    }
    t = fns["draft_tree"](dparams, params, state, root)
    out, logits = fns["verify_with_logits"](params, block_params, cache, t)
    acc = fns["accept_greedy"](t, logits)
    args = {
        "draft_tree": (dparams, params, state, root),
        "verify_with_logits": (params, block_params, cache, t),
        "accept_greedy": (t, logits),
        "commit_and_draft_context": (params, dparams, cache, state, t, out, acc),
    }
    return median_ms(fns, args, reps)


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
        trees = [load_tuned_tree(head_dir) or TreeConfig(), TreeConfig(4, 4, 16)]
    target = load_target(DEFAULT_MODEL, with_tokenizer=False)
    cfg, params = target.cfg, target.params
    dcfg, dparams = load_draft(head_dir, cfg)
    block_params = for_blocks(with_block_copies(params))  # what verify steps multiply by
    cache = filled(make_cache(cfg, 1, CACHE_SLOTS))
    draft_cache = filled(make_draft_cache(dcfg, 1, CACHE_SLOTS))
    log_probs = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (1, dcfg.draft_vocab_size)))
    state = DraftState(draft_cache, log_probs, jnp.full((1, dcfg.hidden_size), 0.1))
    root = jnp.full((1,), 100, jnp.int32)

    def plain_step(params, cache, token):
        out = forward(params, cfg, token[:, None], cache.lengths[:, None], cache, jnp.ones((1, 1, 1), bool))
        return jnp.argmax(lm_head(params, out.hidden[:, 0]), -1), cache.write(out.k_new, out.v_new, jnp.ones((1,), jnp.int32))

    def verify_step(params, block_params, cache, tokens):  # (1, T) new tokens, causal among themselves
        t = tokens.shape[1]
        out = forward(block_params if t > 1 else params, cfg, tokens, cache.lengths[:, None] + jnp.arange(t)[None], cache, jnp.tril(jnp.ones((1, t, t), bool)))
        return lm_head(params, out.hidden)

    plain = median_ms({"plain_step": jax.jit(plain_step)}, {"plain_step": (params, cache, root)}, args.reps)["plain_step"]
    print(f"plain decode step: {plain} ms", flush=True)
    pieces = {}
    for tree in trees:
        name = f"{tree.top_k}/{tree.depth}/{tree.num_nodes}" + (f"/{tree.lookup}" if tree.lookup else "")
        pieces[name] = tree_pieces(tree, cfg, params, block_params, dcfg, dparams, cache, state, root, args.reps)
        print(f"tree {name}: {pieces[name]} ms", flush=True)
    counts = [int(t) for t in args.verify_tokens.split(",")]
    step = jax.jit(verify_step)
    scan = median_ms({t: step for t in counts}, {t: (params, block_params, cache, jnp.full((1, t), 100, jnp.int32)) for t in counts}, args.reps)
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
