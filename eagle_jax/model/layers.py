"""Building blocks shared by target models and draft heads: RMSNorm, RoPE, gated MLPs, attention."""

from __future__ import annotations

import math

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


class LaidOutWeight:
    """A projection weight that a backend layout (`eagle_jax.model.cpu_layout`) stores in a form of
    its own; `dense` hands the product to it."""

    def multiply(self, x: jax.Array, out_dtype=None) -> jax.Array:
        raise NotImplementedError


def dense(x: jax.Array, w: jax.Array | LaidOutWeight, out_dtype=None) -> jax.Array:
    """x (..., in) times a weight stored (out, in), as in PyTorch checkpoints: (..., out)."""
    if isinstance(w, LaidOutWeight):
        return w.multiply(x, out_dtype)
    return jnp.einsum("...i,oi->...o", x, w, preferred_element_type=out_dtype)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}  # config.MLP_ACTIVATIONS


def gated_mlp(x: jax.Array, p: dict, activation: str = "silu") -> jax.Array:
    """down(act(gate(x)) * up(x)): SwiGLU with silu, GeGLU with gelu_tanh. Weights are (out, in)."""
    return dense(ACTIVATIONS[activation](dense(x, p["w_gate"])) * dense(x, p["w_up"]), p["w_down"])


def self_attention(
    x: jax.Array,  # (B, T, d_in)
    p: dict,
    positions: jax.Array,  # (B, T)
    k_cache: jax.Array,  # (B, KV, S, D)
    v_cache: jax.Array,  # (B, KV, S, D)
    lengths: jax.Array,  # (B,)
    block_mask: jax.Array,  # (B, T, T_new) bool
    starts: jax.Array | None = None,  # (B, T) first visible cache slot per query (sliding windows); None: 0
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    inv_freq: jax.Array,
    eps: float,
    extra_kv: tuple[jax.Array, jax.Array] | None = None,
    attention: str = "auto",
    scale: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GQA self-attention over a cached prefix plus a new block.

    The new keys are this call's own T tokens, preceded by `extra_kv` (B, E, KV, D) when given
    (the draft's earlier tree levels); block_mask then covers (B, T, E + T). `attention` names the
    implementation (`eagle_jax.model.attention.attend`); scale: of the scores (None: head_dim ** -0.5).
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
    out = attend(q, k_cache, v_cache, lengths, k_block, v_block, block_mask, starts, scale=scale, impl=attention)
    return dense(out.reshape(b, t, num_heads * head_dim), p["wo"]), k, v
