"""Reference (pure jnp) tree attention: the oracle every Pallas kernel must match.

Contract shared by the reference and the kernels. For batch row b, query t attends to
  * the cached prefix: cache keys s with starts[b, t] <= s < lengths[b] (starts default 0; a
    sliding-window layer passes the first slot inside the query's window), and
  * the new block: new keys j with block_mask[b, t, j].
A plain causal step is the special case block_mask = lower-triangular; a tree-verify step uses the
ancestor-or-self mask of the draft tree. GQA: query head h reads kv head h // (H // KV).
The cache is head-major, (B, KV, S, D): each kv head's keys are one contiguous (S, D) matrix, so
both products are batched matrix products over (B, KV) with no transposed copy of the cache
(see eagle_jax/model/kv_cache.py for what that gained). The new keys come as the projections produce
them, (B, Tk, KV, D).
Scores, softmax and accumulation run in float32; the output has q's dtype. A query that sees no
key at all (a padded node) returns zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def tree_attention_reference(
    q: jax.Array,  # (B, Tq, H, D)
    k_cache: jax.Array,  # (B, KV, S, D)
    v_cache: jax.Array,  # (B, KV, S, D)
    lengths: jax.Array,  # (B,) int32, visible prefix length per row, 0..S
    k_new: jax.Array,  # (B, Tk, KV, D)
    v_new: jax.Array,  # (B, Tk, KV, D)
    block_mask: jax.Array,  # (B, Tq, Tk) bool
    starts: jax.Array | None = None,  # (B, Tq) int32, first visible cache slot per query; None: 0
    *,
    scale: float | None = None,
) -> jax.Array:  # (B, Tq, H, D)
    b, tq, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    groups = h // kv
    scale = d**-0.5 if scale is None else scale
    # query rows of kv head k, ordered (g, t): (B, KV, G * Tq, D)
    qg = (q.astype(jnp.float32) * scale).reshape(b, tq, kv, groups, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, groups * tq, d)
    prefix_scores = jnp.einsum("bkqd,bksd->bkqs", qg, k_cache.astype(jnp.float32))
    block_scores = jnp.einsum("bkqd,bjkd->bkqj", qg, k_new.astype(jnp.float32))
    prefix_visible = (jnp.arange(s)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    if starts is not None:  # rows (g, t): query t's start for each of its G heads
        prefix_visible = prefix_visible & (jnp.arange(s) >= jnp.tile(starts, (1, groups))[:, :, None])[:, None]
    block_visible = jnp.tile(block_mask, (1, groups, 1))[:, None]  # (B, 1, G * Tq, Tk)
    prefix_scores = jnp.where(prefix_visible, prefix_scores, NEG_INF)
    block_scores = jnp.where(block_visible, block_scores, NEG_INF)
    peak = jnp.maximum(  # an empty cache (S = 0) or block (Tk = 0) contributes nothing
        jnp.max(prefix_scores, -1, keepdims=True, initial=NEG_INF), jnp.max(block_scores, -1, keepdims=True, initial=NEG_INF)
    )
    prefix_weights = jnp.where(prefix_visible, jnp.exp(prefix_scores - peak), 0.0)
    block_weights = jnp.where(block_visible, jnp.exp(block_scores - peak), 0.0)
    denom = jnp.sum(prefix_weights, -1, keepdims=True) + jnp.sum(block_weights, -1, keepdims=True)
    out = jnp.einsum("bkqs,bksd->bkqd", prefix_weights, v_cache.astype(jnp.float32))
    out = out + jnp.einsum("bkqj,bjkd->bkqd", block_weights, v_new.astype(jnp.float32))
    out = out / jnp.where(denom > 0, denom, 1.0)
    return out.reshape(b, kv, groups, tq, d).transpose(0, 3, 1, 2, 4).reshape(b, tq, h, d).astype(q.dtype)
