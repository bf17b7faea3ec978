"""Reference (pure jnp) tree attention: the oracle every Pallas kernel must match.

Contract shared by the reference and the kernels. For batch row b, query t attends to
  * the cached prefix: cache keys s with s < lengths[b], and
  * the new block: new keys j with block_mask[b, t, j].
A plain causal step is the special case block_mask = lower-triangular; a tree-verify step uses the
ancestor-or-self mask of the draft tree. GQA: query head h reads kv head h // (H // KV).
Scores, softmax and accumulation run in float32; the output has q's dtype. A query that sees no
key at all (a padded node) returns zeros.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def tree_attention_reference(
    q: jax.Array,  # (B, Tq, H, D)
    k_cache: jax.Array,  # (B, S, KV, D)
    v_cache: jax.Array,  # (B, S, KV, D)
    lengths: jax.Array,  # (B,) int32, visible prefix length per row, 0..S
    k_new: jax.Array,  # (B, Tk, KV, D)
    v_new: jax.Array,  # (B, Tk, KV, D)
    block_mask: jax.Array,  # (B, Tq, Tk) bool
    *,
    scale: float | None = None,
) -> jax.Array:  # (B, Tq, H, D)
    b, tq, h, d = q.shape
    kv = k_cache.shape[2]
    groups = h // kv
    scale = d**-0.5 if scale is None else scale
    qg = q.astype(jnp.float32).reshape(b, tq, kv, groups, d) * scale
    prefix_scores = jnp.einsum("btkgd,bskd->bkgts", qg, k_cache.astype(jnp.float32))
    block_scores = jnp.einsum("btkgd,bjkd->bkgtj", qg, k_new.astype(jnp.float32))
    prefix_visible = jnp.arange(k_cache.shape[1])[None, :] < lengths[:, None]  # (B, S)
    prefix_scores = jnp.where(prefix_visible[:, None, None, None, :], prefix_scores, NEG_INF)
    block_scores = jnp.where(block_mask[:, None, None, :, :], block_scores, NEG_INF)
    scores = jnp.concatenate([prefix_scores, block_scores], axis=-1)
    peak = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - peak)
    visible = jnp.concatenate(
        [jnp.broadcast_to(prefix_visible[:, None, :], (b, tq, k_cache.shape[1])), block_mask], axis=-1
    )[:, None, None]  # (B, 1, 1, Tq, S + Tk)
    weights = jnp.where(visible, weights, 0.0)
    denom = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(denom > 0, denom, 1.0)
    s = k_cache.shape[1]
    out = jnp.einsum("bkgts,bskd->btkgd", probs[..., :s], v_cache.astype(jnp.float32))
    out = out + jnp.einsum("bkgtj,bjkd->btkgd", probs[..., s:], v_new.astype(jnp.float32))
    return out.reshape(b, tq, h, d).astype(q.dtype)
