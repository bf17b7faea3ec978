"""Building blocks shared by target models and draft heads: RMSNorm, RoPE, SwiGLU, attention."""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.model.attention import attend
from eagle_jax.model.config import RopeConfig


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inverse_frequencies(rope: RopeConfig, head_dim: int) -> jax.Array:
    """(head_dim // 2,) float32 inverse frequencies, with linear or llama3 scaling applied."""
    inv_freq = 1.0 / (rope.theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(medium, smoothed, scaled)
    return inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotate x (B, T, heads, D) by positions (B, T), HF's rotate-half convention."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, D/2)
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


# At most this many rows (decode steps, verify blocks, draft tree levels) take `dense`'s CPU path.
FEW_ROWS = 64
# On that path more than PAD_ABOVE rows are padded to a multiple of ROW_BLOCK: XLA:CPU multiplies
# 6-7 or 9-15 rows more slowly than 8 or 16, and padded, one target step over 6-12 new tokens is
# 1.18-1.24x faster (`scripts/benchmarks/bench_step_vs_checkout.py --new-tokens ...`, results/row_padding).
ROW_BLOCK, PAD_ABOVE = 8, 5
_few_row_form = contextvars.ContextVar("few_row_form", default=True)


@contextlib.contextmanager
def many_rows():
    """Within it, `dense` takes the plain contraction whatever row count it sees: for code under
    jax.vmap, where each call sees a slice of the rows it will run (training's TTT steps)."""
    token = _few_row_form.set(False)
    try:
        yield
    finally:
        _few_row_form.reset(token)


class InOut(NamedTuple):
    """A projection transposed to (in, out) (`eagle_jax.model.transformer.with_block_copies`), which `dense`
    multiplies as it is."""

    w: jax.Array  # (in, out)


def dense(x: jax.Array, w: jax.Array | InOut, out_dtype=None) -> jax.Array:
    """x (..., in) times a weight stored (out, in), as in PyTorch checkpoints, or an InOut: (..., out).

    On CPU, for a few rows, the product is computed as w @ x^T and transposed back behind an
    optimization barrier. XLA:CPU otherwise folds the transpose into the product and runs the same
    matrix product about twice as slowly for 2-16 rows (`python scripts/benchmarks/bench_dense.py`); with the
    barrier, verifying a block of 2 tokens costs what one decode step does. The rows are padded
    to a multiple of ROW_BLOCK past PAD_ABOVE. Many rows (prefill, training) and other backends
    take the plain contraction. An InOut is multiplied as x @ w: over 2-16 rows XLA:CPU runs that
    faster still, over one row more slowly (`python scripts/benchmarks/bench_dense.py`), so verify steps
    multiply by transposed copies (`eagle_jax.model.transformer.with_block_copies`), decode steps by the weights.
    """
    if isinstance(w, InOut):
        return jnp.einsum("...i,io->...o", x, w.w, preferred_element_type=out_dtype)
    rows = math.prod(x.shape[:-1])
    if rows > FEW_ROWS or not _few_row_form.get() or jax.default_backend() != "cpu":
        return jnp.einsum("...i,oi->...o", x, w, preferred_element_type=out_dtype)
    padded = rows if rows <= PAD_ABOVE else -(-rows // ROW_BLOCK) * ROW_BLOCK
    flat = jnp.pad(x.reshape(rows, x.shape[-1]), ((0, padded - rows), (0, 0)))
    product = jax.lax.dot_general(w, flat, (((1,), (1,)), ((), ())), preferred_element_type=out_dtype)  # (out, padded)
    return jax.lax.optimization_barrier(product)[:, :rows].T.reshape(*x.shape[:-1], w.shape[0])


def swiglu(x: jax.Array, p: dict) -> jax.Array:
    """SwiGLU MLP: down(silu(gate(x)) * up(x)). Weights are (out, in)."""
    return dense(jax.nn.silu(dense(x, p["w_gate"])) * dense(x, p["w_up"]), p["w_down"])


def self_attention(
    x: jax.Array,  # (B, T, d_in)
    p: dict,
    positions: jax.Array,  # (B, T)
    k_cache: jax.Array,  # (B, KV, S, D)
    v_cache: jax.Array,  # (B, KV, S, D)
    lengths: jax.Array,  # (B,)
    block_mask: jax.Array,  # (B, T, T_new) bool
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    inv_freq: jax.Array,
    eps: float,
    extra_kv: tuple[jax.Array, jax.Array] | None = None,
    attn_impl: str = "auto",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GQA self-attention over a cached prefix plus a new block.

    The new keys are this call's own T tokens, preceded by `extra_kv` (B, E, KV, D) when given
    (the draft's earlier tree levels); block_mask then covers (B, T, E + T).
    Returns (out (B, T, d), k_new (B, T, KV, D), v_new (B, T, KV, D)) where k_new is post-RoPE.
    """
    b, t, _ = x.shape
    q = dense(x, p["wq"])
    k = dense(x, p["wk"])
    v = dense(x, p["wv"])
    if "bq" in p:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    q = q.reshape(b, t, num_heads, head_dim)
    k = k.reshape(b, t, num_kv_heads, head_dim)
    v = v.reshape(b, t, num_kv_heads, head_dim)
    if "q_norm" in p:
        q = rms_norm(q, p["q_norm"], eps)
        k = rms_norm(k, p["k_norm"], eps)
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    k_block, v_block = k, v
    if extra_kv is not None:
        k_block = jnp.concatenate([extra_kv[0], k], axis=1)
        v_block = jnp.concatenate([extra_kv[1], v], axis=1)
    out = attend(q, k_cache, v_cache, lengths, k_block, v_block, block_mask, impl=attn_impl)
    return dense(out.reshape(b, t, num_heads * head_dim), p["wo"]), k, v
