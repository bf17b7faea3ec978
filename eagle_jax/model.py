"""Llama-family target model as pure functions over a params pytree.

params = {
  "embed": (V, d),
  "layers": {  # every leaf stacked over layers: (L, ...)
     "attn_norm": (L, d), "wq": (L, d, H*Dh), "wk": (L, d, KV*Dh), "wv": (L, d, KV*Dh),
     "wo": (L, H*Dh, d), ["bq", "bk", "bv"] (qwen2), ["q_norm", "k_norm"]: (L, Dh) (qwen3),
     "mlp_norm": (L, d), "w_gate": (L, d, F), "w_up": (L, d, F), "w_down": (L, F, d)},
  "final_norm": (d,),
  ["lm_head": (d, V)]  # absent when embeddings are tied
}
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.config import ModelConfig
from eagle_jax.errors import EagleError
from eagle_jax.kv_cache import KVCache
from eagle_jax.layers import rms_norm, rope_inverse_frequencies, self_attention, swiglu


class ForwardOutput(NamedTuple):
    hidden: jax.Array  # (B, T, d) final post-norm hidden state (the lm_head input; EAGLE-1/2 feature)
    captured: jax.Array  # (n_capture, B, T, d) HF hidden_states[i] for each requested index i
    k_new: jax.Array  # (L, B, T, KV, Dh) keys of the new tokens (post-RoPE)
    v_new: jax.Array  # (L, B, T, KV, Dh)


def make_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """An empty cache of max_len slots per row."""
    if cfg.sliding_window is not None and max_len > cfg.sliding_window:
        raise EagleError(
            f"cache of {max_len} tokens exceeds the model's sliding window of {cfg.sliding_window}; "
            "sliding-window attention is not supported, use a cache no longer than the window"
        )
    return KVCache.zeros(cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim, dtype)


def decoder_layer(cfg: ModelConfig, p: dict, x, positions, k_cache, v_cache, lengths, block_mask, inv_freq, attn_impl):
    """Pre-norm Llama decoder layer. Returns (x, k_new, v_new)."""
    a, k, v = self_attention(
        rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), p, positions, k_cache, v_cache, lengths, block_mask,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        inv_freq=inv_freq, eps=cfg.rms_norm_eps, attn_impl=attn_impl,
    )
    x = x + a
    return x + swiglu(rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps), p), k, v


def forward(
    params: dict,
    cfg: ModelConfig,
    tokens: jax.Array,  # (B, T) int32
    positions: jax.Array,  # (B, T) int32 absolute positions
    cache: KVCache | None,
    block_mask: jax.Array,  # (B, T, T) bool: which new tokens each new token sees
    *,
    capture: tuple[int, ...] = (),
    attn_impl: str = "auto",
) -> ForwardOutput:
    """Run the target over T new tokens that attend to the cached prefix (by length) + block_mask.

    `capture` lists HF hidden-state indices i in [0, L) (the input of layer i; 0 = embeddings) to
    return in `captured`, e.g. cfg.eagle3_feature_layers. The cache is read, not written: callers
    commit the returned k_new/v_new with `KVCache.write` or `KVCache.commit_path`.
    """
    if any(not 0 <= i < cfg.num_layers for i in capture):
        raise EagleError(f"capture indices {capture} out of range [0, {cfg.num_layers})")
    b, t = tokens.shape
    layers = params["layers"]
    dtype = params["embed"].dtype
    if cache is None:
        cache = KVCache.empty_prefix(cfg.num_layers, b, cfg.num_kv_heads, cfg.head_dim, dtype)
    inv_freq = rope_inverse_frequencies(cfg.rope, cfg.head_dim)
    x = params["embed"][tokens]

    # Slot of each captured layer's input in `stored`; other layers write to a spare last slot.
    layers_kept = sorted(set(capture))
    slot_of_layer = [len(layers_kept)] * cfg.num_layers
    for slot, layer in enumerate(layers_kept):
        slot_of_layer[layer] = slot
    stored = jnp.zeros((len(layers_kept) + 1, b, t, cfg.hidden_size), dtype) if capture else None

    def body(carry, xs):
        x, stored = carry
        p, k_cache, v_cache, slot = xs
        if capture:
            stored = jax.lax.dynamic_update_index_in_dim(stored, x, slot, axis=0)
        x, k, v = decoder_layer(cfg, p, x, positions, k_cache, v_cache, cache.lengths, block_mask, inv_freq, attn_impl)
        return (x, stored), (k, v)

    xs = (layers, cache.k, cache.v, jnp.asarray(slot_of_layer, jnp.int32))
    (x, stored), (k_new, v_new) = jax.lax.scan(body, (x, stored), xs)
    if capture:
        captured = stored[jnp.asarray([layers_kept.index(i) for i in capture])]
    else:
        captured = jnp.zeros((0, b, t, cfg.hidden_size), dtype)
    hidden = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    return ForwardOutput(hidden, captured, k_new, v_new)


def lm_head(params: dict, hidden: jax.Array) -> jax.Array:
    """Logits (..., V) in float32 from post-norm hidden (..., d).

    Tied embeddings are contracted over their own (V, d) layout for a single row (one decode step):
    written as a product with embed.T, XLA:CPU copies the whole transposed embedding first (for
    SmolLM2, 113 MB per step, 3-4x the cost of the product itself); from two rows on it does not,
    and the embed.T form is the faster one.
    """
    if "lm_head" in params:
        spec, w = "...d,dv->...v", params["lm_head"]
    elif math.prod(hidden.shape[:-1]) == 1:
        spec, w = "...d,vd->...v", params["embed"]
    else:
        spec, w = "...d,dv->...v", params["embed"].T
    return jnp.einsum(spec, hidden, w, preferred_element_type=jnp.float32)


def causal_mask(valid: jax.Array) -> jax.Array:
    """(B, T, T) lower-triangular block mask restricted to valid (B, T) tokens."""
    t = valid.shape[1]
    tril = jnp.tril(jnp.ones((t, t), bool))
    return tril[None] & valid[:, None, :]


def init_params(rng: jax.Array, cfg: ModelConfig, dtype=jnp.float32, scale: float = 0.05) -> dict:
    """Random target params (normal(0, scale) matrices and biases, norms near 1): tests and demos."""
    from eagle_jax.loading.params import expected_shapes, layer_keys

    shapes = expected_shapes(cfg)
    keys = iter(jax.random.split(rng, 32))

    def rand(shape, center=0.0):
        return (center + scale * jax.random.normal(next(keys), shape)).astype(dtype)

    layers = {k: rand((cfg.num_layers, *shapes[k]), 1.0 if k.endswith("norm") else 0.0) for k in layer_keys(cfg)}
    params = {"embed": rand((cfg.vocab_size, cfg.hidden_size)), "layers": layers, "final_norm": rand((cfg.hidden_size,), 1.0)}
    if not cfg.tie_embeddings:
        params["lm_head"] = rand((cfg.hidden_size, cfg.vocab_size))
    return params
