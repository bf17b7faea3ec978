"""Speculative generate: EAGLE draft tree + one target verification per round, in one compiled loop.

Per round (batch B, K = top_k, D = depth, T = num_nodes, L = lookup):
  1. draft: grow the dynamic tree from the root (the last emitted token) with the draft head, and
     with L > 0 add a chain of L tokens looked up in the context (`eagle_jax.decoding.lookup`), or where
     nothing was found, L more drafted nodes;
  2. verify: one target forward over the T + L tree tokens (prefix by length + ancestor mask);
  3. accept: greedy or lossless sampling; the bonus token is the target's own;
  4. commit: append the accepted path's KV to the target cache, run the draft over the accepted
     positions with the true target features (extending the draft's context cache), emit tokens.
The caches hold max_path slack slots beyond `cache_len`, so a full round never writes out of bounds.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.decoding.accept import accept_greedy, accept_sampling
from eagle_jax.model.config import ModelConfig
from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import draft_forward, draft_layer, draft_readout, draft_to_target_ids, make_draft_cache, project_features
from eagle_jax.errors import EagleError
from eagle_jax.decoding.prompts import PAD, check_prompt_fits, is_stop, last_valid, prefill
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.decoding.lookup import lookup_proposals
from eagle_jax.model.transformer import causal_mask, for_blocks, forward, lm_head, make_cache
from eagle_jax.decoding.sampling import SamplingConfig, sample_tokens
from eagle_jax.decoding.tree import Draw, DraftTree, TreeConfig, expand_tree


class SpecOutput(NamedTuple):
    tokens: jax.Array  # (B, max_new_tokens) int32, PAD after each row's end
    num_tokens: jax.Array  # (B,) int32 generated tokens per row (a stop token included)
    rounds: jax.Array  # (B,) int32 draft/verify rounds each row took part in
    accept_histogram: jax.Array  # (B, tree.max_path) rounds that accepted 0, 1, ... draft tokens


class DraftState(NamedTuple):
    cache: KVCache  # the draft's context cache: one entry per target position, true features
    log_probs: jax.Array  # (B, Vd) draft log-probs of the root's children
    hidden: jax.Array  # (B, d) draft hidden that produced them


def check_draft(cfg: ModelConfig, dcfg: DraftConfig, tree: TreeConfig, sampling: SamplingConfig = SamplingConfig()) -> None:
    dcfg.check_target(cfg)
    if tree.top_k > dcfg.draft_vocab_size:
        raise EagleError(f"top_k={tree.top_k} is larger than the draft vocabulary ({dcfg.draft_vocab_size})")
    if tree.scoring == "sampled" and sampling.greedy:
        raise EagleError("tree scoring 'sampled' draws the draft's tokens at random, which only sampling can accept: "
                         "use temperature > 0, or scoring 'dynamic' or 'static' for greedy decoding")


def run_draft_context(dparams, dcfg, params, draft_cache, features, tokens, positions, num_new, attn_impl, first=False) -> DraftState:
    """Draft over new context positions: features (B, N, d) at positions (B, N), paired with the
    next tokens (B, N); the first num_new (B,) are real; `first`: the cache is still empty.
    Returns the state for the next tree."""
    b, n = tokens.shape
    mask = causal_mask(jnp.arange(n)[None, :] < num_new[:, None])
    prefix = KVCache.empty_prefix(1, b, dcfg.num_kv_heads, dcfg.head_dim, features.dtype) if first else draft_cache
    h, k, v = draft_layer(dparams, dcfg, params, features, tokens, positions, prefix, mask, attn_impl=attn_impl)
    logits, hidden = draft_readout(dparams, dcfg, params, last_valid(h, jnp.maximum(num_new, 1)))  # the last position only
    return DraftState(draft_cache.write(k[None], v[None], num_new), jax.nn.log_softmax(logits, axis=-1), hidden)


def draft_tree(dparams, dcfg: DraftConfig, params, state: DraftState, root: jax.Array, tree: TreeConfig, attn_impl, history=None,
               draw: Draw | None = None) -> DraftTree:
    """Grow the tree for root tokens (B,) from the draft state; with tree.lookup, add the chain
    looked up in `history` (B, S), every token by position with the root last (`lookup_proposals`);
    draw: the randomness of a sampled tree (scoring "sampled")."""
    b, k = root.shape[0], tree.top_k
    cache = state.cache
    no_levels = jnp.zeros((b, 0, dcfg.num_kv_heads, dcfg.head_dim), cache.k[0].dtype)

    def run_level(level_kv, hidden, tokens, level, ancestors):
        positions = jnp.broadcast_to(cache.lengths[:, None] + level, (b, k))
        mask = jnp.concatenate([ancestors, jnp.broadcast_to(jnp.eye(k, dtype=bool), (b, k, k))], axis=-1)
        out = draft_forward(dparams, dcfg, params, hidden, tokens, positions, cache, mask, extra_kv=level_kv, attn_impl=attn_impl)
        level_kv = tuple(jnp.concatenate([buf, new[0]], axis=1) for buf, new in zip(level_kv, (out.k_new, out.v_new)))
        return level_kv, jax.nn.log_softmax(out.logits, axis=-1), out.hidden

    to_target = lambda ids: draft_to_target_ids(dparams, dcfg, ids)  # noqa: E731
    # the draft's context cache holds one entry per target position: the root is at its length
    looked_up = None
    if tree.lookup:
        proposals, match_length = lookup_proposals(history, cache.lengths + 1, tree.lookup)
        looked_up = proposals, match_length > 0
    return expand_tree(tree, root, state.log_probs, state.hidden, run_level, (no_levels, no_levels), to_target, looked_up, draw)


def generate_spec(
    params: dict,
    cfg: ModelConfig,
    dparams: dict,
    dcfg: DraftConfig,
    prompt_tokens: jax.Array,  # (B, P) int32, right-padded
    prompt_lengths: jax.Array,  # (B,) int32
    rng: jax.Array,
    *,
    max_new_tokens: int,
    cache_len: int,
    tree: TreeConfig = TreeConfig(),
    sampling: SamplingConfig = SamplingConfig(),
    stop_ids: tuple[int, ...] = (),
    attn_impl: str = "auto",
) -> SpecOutput:
    """Speculative decoding with an EAGLE head; output equal (greedy) or equal in law (sampling) to
    `generate_ar` with the same arguments. Pure and traceable: jit it with the keyword arguments,
    cfg and dcfg static (see `generate_spec_jit`), or call it inside your own jitted function.
    On CPU, params from `eagle_jax.model.transformer.with_block_copies` verify faster."""
    check_draft(cfg, dcfg, tree, sampling)
    b, p = prompt_tokens.shape
    check_prompt_fits(p, cache_len)
    path_len = tree.max_path
    slack = cache_len + path_len
    dtype = params["embed"].dtype
    capture = dcfg.feature_layers

    # Prefill target and draft; the first token comes from the target alone.
    out, cache = prefill(params, cfg, prompt_tokens, prompt_lengths, make_cache(cfg, b, slack, dtype), capture, attn_impl)
    rng, key = jax.random.split(rng)
    root = sample_tokens(key, lm_head(params, last_valid(out.hidden, prompt_lengths)), sampling)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    next_tokens = jnp.concatenate([prompt_tokens[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)
    next_tokens = jnp.where(positions == prompt_lengths[:, None] - 1, root[:, None], next_tokens)
    draft = run_draft_context(
        dparams, dcfg, params, make_draft_cache(dcfg, b, slack, dtype), project_features(dparams, dcfg, out),
        next_tokens, positions, prompt_lengths, attn_impl, first=True,
    )
    tokens = jnp.full((b, max_new_tokens + path_len), PAD, jnp.int32).at[:, 0].set(root)
    done = is_stop(root, stop_ids) | (max_new_tokens == 1) | (cache.lengths >= cache_len)
    state = dict(
        cache=cache, draft=draft, root=root, tokens=tokens, count=jnp.ones((b,), jnp.int32), done=done, rng=rng,
        rounds=jnp.zeros((b,), jnp.int32), histogram=jnp.zeros((b, path_len), jnp.int32),
    )
    if tree.lookup:  # every token by position (prompt, then generated; the root last), room for a round past the cache
        history = jnp.zeros((b, slack + path_len + 1), jnp.int32).at[:, :p].set(prompt_tokens)
        state["history"] = history.at[jnp.arange(b), prompt_lengths].set(root)

    block_params = for_blocks(params)  # the layers' (in, out) copies, where params has them

    def round_(s):
        cache, draft, active = s["cache"], s["draft"], ~s["done"]
        rng, key = jax.random.split(s["rng"])
        draw = None
        if tree.scoring == "sampled":
            key, draw_key = jax.random.split(key)
            draw = Draw(draw_key, sampling.temperature)
        t = draft_tree(dparams, dcfg, params, draft, s["root"], tree, attn_impl, s.get("history"), draw)
        verify = forward(
            block_params, cfg, t.tokens, cache.lengths[:, None] + t.depths, cache, t.ancestor_mask, capture=capture, attn_impl=attn_impl
        )
        logits = lm_head(params, verify.hidden)  # (B, T, V)
        acc = accept_greedy(t, logits) if sampling.greedy else accept_sampling(key, t, logits, sampling, tree)
        path = jnp.take_along_axis(t.paths, acc.node[:, None, None], axis=1)[:, 0]  # (B, max_path) root first
        gather = jnp.maximum(path, 0)
        path_tokens = jnp.take_along_axis(t.tokens, gather, axis=1)
        # emitted this round: the accepted draft tokens then the bonus  (B, max_path)
        idx = jnp.arange(path_len)[None, :]
        emitted = jnp.where(idx < acc.num_accepted[:, None], jnp.roll(path_tokens, -1, axis=1), 0)
        emitted = jnp.where(idx == acc.num_accepted[:, None], acc.bonus[:, None], emitted)
        n_emit = acc.num_accepted + 1
        stops = is_stop(emitted, stop_ids) & (idx < n_emit[:, None])
        first_stop = jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1) + 1, path_len)
        n_emit = jnp.minimum(jnp.minimum(n_emit, first_stop), max_new_tokens - s["count"])
        n_emit = jnp.where(active, jnp.minimum(n_emit, cache_len - cache.lengths), 0)
        window = jnp.where(idx < n_emit[:, None], emitted, PAD)
        write = jax.vmap(lambda row, w, start: jax.lax.dynamic_update_slice(row, w, (start,)))
        tokens = write(s["tokens"], window, s["count"])
        # commit: target KV of the root + accepted nodes; draft over the same positions
        new_cache = cache.commit_path(verify.k_new, verify.v_new, gather, n_emit)
        take = jax.vmap(lambda x, i: x[:, i], in_axes=(1, 0), out_axes=1)
        features = verify._replace(hidden=take(verify.hidden[None], gather)[0], captured=take(verify.captured, gather))
        draft = run_draft_context(
            dparams, dcfg, params, draft.cache, project_features(dparams, dcfg, features), emitted,
            cache.lengths[:, None] + idx, n_emit, attn_impl,
        )
        count = s["count"] + n_emit
        last = jnp.take_along_axis(emitted, jnp.maximum(n_emit - 1, 0)[:, None], axis=1)[:, 0]
        done = s["done"] | jnp.any(stops & (idx < n_emit[:, None]), 1) | (count >= max_new_tokens)
        done = done | (new_cache.lengths >= cache_len)
        histogram = s["histogram"] + (active[:, None] & (idx == acc.num_accepted[:, None]))
        new = dict(
            cache=new_cache, draft=draft, root=jnp.where(active, last, s["root"]), tokens=tokens, count=count,
            done=done, rng=rng, rounds=s["rounds"] + active, histogram=histogram,
        )
        if tree.lookup:  # emitted tokens follow the root; past n_emit they stay unknown (beyond the new root)
            new["history"] = write(s["history"], window, cache.lengths + 1)
        return new

    s = jax.lax.while_loop(lambda s: ~jnp.all(s["done"]), round_, state)
    return SpecOutput(s["tokens"][:, :max_new_tokens], s["count"], s["rounds"], s["histogram"])


generate_spec_jit = jax.jit(
    generate_spec,
    static_argnames=("cfg", "dcfg", "max_new_tokens", "cache_len", "tree", "sampling", "stop_ids", "attn_impl"),
)
