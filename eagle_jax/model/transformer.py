"""Llama-family target model as pure functions over a params pytree.

params = {
  "embed": (V, d),
  "layers": [  # one dict per layer; matrices (out, in), as the checkpoints store them
     {"attn_norm": (d,), "wq": (H*Dh, d), "wk": (KV*Dh, d), "wv": (KV*Dh, d), "wo": (d, H*Dh),
      ["bq", "bk", "bv"] (qwen2), ["q_norm", "k_norm"]: (Dh,) (qwen3, gemma3),
      ["post_attn_norm", "post_mlp_norm"]: (d,) (gemma3),
      "mlp_norm": (d,), "w_gate": (F, d), "w_up": (F, d), "w_down": (d, F)}, ...],
  "final_norm": (d,),
  ["lm_head": (V, d)]  # absent when embeddings are tied
}
A norm weight is the scale itself: Gemma's checkpoints store scale - 1, and loading adds the 1.

Two forms of the layers, the same model:
  * unrolled (above): separate arrays walked by a Python loop. On XLA:CPU a scan's per-layer slice
    of stacked weights slowed the products of a verify block (results/dense_layout/), so CPU keeps
    this form; the price is compile time, since every layer is compiled on its own;
  * stacked (`stack_layers`): "layers" is one dict of (L, ...) arrays, scanned over with
    `lax.scan`, its KV cache stacked the same way, so that compile time does not grow with depth
    (accelerators; results/scan-layers/).
`forward` runs whichever form the params are in.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.model.attention import cache_slots
from eagle_jax.model.config import LAYER_FORMS, ModelConfig, on_accelerator
from eagle_jax.errors import EagleError
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.model.layers import dense, gated_mlp, rms_norm, rope_inverse_frequencies, self_attention


class ForwardOutput(NamedTuple):
    hidden: jax.Array  # (B, T, d) final post-norm hidden state (the lm_head input; EAGLE-1/2 feature)
    captured: jax.Array  # (n_capture, B, T, d) HF hidden_states[i] for each requested index i
    k_new: jax.Array  # (L, B, T, KV, Dh) keys of the new tokens (post-RoPE)
    v_new: jax.Array  # (L, B, T, KV, Dh)


def layer_form(name: str = "auto", platform: str | None = None) -> str:
    """"unrolled" or "scan" for a LAYER_FORMS name ("auto" resolved for `platform`, default jax's backend)."""
    if name not in LAYER_FORMS:
        raise EagleError(f"unknown layer form {name!r}; expected one of {', '.join(LAYER_FORMS)}")
    if name != "auto":
        return name
    return "scan" if on_accelerator(platform) else "unrolled"


def is_stacked(params: dict) -> bool:
    """Whether the params' layers are in the stacked (scanned) form."""
    return isinstance(params["layers"], dict)


def stack_layers(params: dict) -> dict:
    """The params with their layers stacked into one dict of (L, ...) arrays (the scanned form).
    A copy: while the per-layer arrays are held elsewhere too, the layers take twice the memory
    (`load_target(layers="scan")` loads straight into this form)."""
    layers = params["layers"]
    return params | {"layers": {key: jnp.stack([layer[key] for layer in layers]) for key in layers[0]}}


def unstack_layers(params: dict) -> dict:
    """The inverse of `stack_layers`: one dict of arrays per layer."""
    stacked = params["layers"]
    return params | {"layers": [{key: w[i] for key, w in stacked.items()} for i in range(len(next(iter(stacked.values()))))]}


def make_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32, stacked: bool = False) -> KVCache:
    """An empty cache of max_len usable slots per row (allocated as `cache_slots` says); stacked
    for params in the stacked form (`is_stacked`). Sliding layers keep every slot too: their window
    is a mask over cache slots, which hold positions (slot s is the token at position s)."""
    return KVCache.zeros(cfg.num_layers, batch, cache_slots(max_len, cfg.attention), cfg.num_kv_heads, cfg.head_dim, dtype, stacked)


ALL_POSITIONS = 2**30  # the window of a layer that attends to everything (scanned layers mix both)


def windowed(block_mask: jax.Array, positions: jax.Array, window) -> tuple[jax.Array, jax.Array]:
    """The block mask (B, T, T) and cache starts (B, T) of a sliding layer: query position p sees
    positions above p - window (a Python int, or a traced one inside a scan)."""
    distance = positions[:, :, None] - positions[:, None, :]
    return block_mask & (distance < window), jnp.maximum(positions - window + 1, 0)


def decoder_layer(cfg: ModelConfig, p: dict, x, positions, k_cache, v_cache, lengths, block_mask, inv_freq, window=None):
    """Pre-norm decoder layer (with Gemma's norms of the attention and MLP outputs where the layer
    has them); window: of a sliding layer, None for full attention. Returns (x, k_new, v_new)."""
    starts = None
    if window is not None:
        block_mask, starts = windowed(block_mask, positions, window)
    a, k, v = self_attention(
        rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), p, positions, k_cache, v_cache, lengths, block_mask, starts,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        inv_freq=inv_freq, eps=cfg.rms_norm_eps, attention=cfg.attention, scale=cfg.query_scale,
    )
    if "post_attn_norm" in p:
        a = rms_norm(a, p["post_attn_norm"], cfg.rms_norm_eps)
    x = x + a
    m = gated_mlp(rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps), p, cfg.mlp_activation)
    if "post_mlp_norm" in p:
        m = rms_norm(m, p["post_mlp_norm"], cfg.rms_norm_eps)
    return x + m, k, v


def forward(
    params: dict,
    cfg: ModelConfig,
    tokens: jax.Array,  # (B, T) int32
    positions: jax.Array,  # (B, T) int32 absolute positions
    cache: KVCache | None,
    block_mask: jax.Array,  # (B, T, T) bool: which new tokens each new token sees
    *,
    capture: tuple[int, ...] = (),
) -> ForwardOutput:
    """Run the target over T new tokens that attend to the cached prefix (by length) + block_mask.

    `capture` lists HF hidden-state indices i in [0, L) (the input of layer i; 0 = embeddings) to
    return in `captured`, e.g. cfg.eagle3_feature_layers. The cache is read, not written: callers
    commit the returned k_new/v_new with `KVCache.write` or `KVCache.commit_path`.
    """
    if any(not 0 <= i < cfg.num_layers for i in capture):
        raise EagleError(f"capture indices {capture} out of range [0, {cfg.num_layers})")
    b, t = tokens.shape
    dtype = params["embed"].dtype
    stacked = is_stacked(params)
    if cache is None:
        cache = KVCache.empty_prefix(cfg.num_layers, b, cfg.num_kv_heads, cfg.head_dim, dtype, stacked)
    if cache.stacked != stacked:
        raise EagleError(f"a {'stacked' if cache.stacked else 'per-layer'} KV cache for params whose layers are "
                         f"{'stacked' if stacked else 'per-layer'}; make the cache with make_cache(..., stacked=is_stacked(params))")
    x = params["embed"][tokens]
    if cfg.embed_scale != 1.0:
        x = x * jnp.asarray(cfg.embed_scale, dtype)
    ropes = [cfg.layer_rope(i) for i in range(cfg.num_layers)]
    windows = [cfg.layer_window(i) for i in range(cfg.num_layers)]

    def layer(x, p, k_cache, v_cache, inv_freq, window):
        return decoder_layer(cfg, p, x, positions, k_cache, v_cache, cache.lengths, block_mask, inv_freq, window)

    if stacked:
        # Each captured layer's input goes to its slot of a buffer, every other layer's to a spare last one.
        unique = sorted(set(capture))
        slots = np.full((cfg.num_layers,), len(unique), np.int32)
        slots[unique] = np.arange(len(unique))

        # Per-layer rope frequencies and windows are scanned over where the layers differ in them.
        inv_freqs = jnp.stack([rope_inverse_frequencies(r, cfg.head_dim) for r in ropes])
        slides = any(w is not None for w in windows)
        layer_windows = jnp.asarray([ALL_POSITIONS if w is None else w for w in windows], jnp.int32)

        def step(carry, xs):
            x, buffer = carry
            slot, p, k_cache, v_cache, inv_freq, window = xs
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, x, slot, 0)
            x, k, v = layer(x, p, k_cache, v_cache, inv_freq, window if slides else None)
            return (x, buffer), (k, v)

        buffer = jnp.zeros((len(unique) + 1, b, t, cfg.hidden_size), dtype)
        xs = (jnp.asarray(slots), params["layers"], cache.k, cache.v, inv_freqs, layer_windows)
        (x, buffer), (k_new, v_new) = jax.lax.scan(step, (x, buffer), xs)
        captured = buffer[np.asarray([unique.index(i) for i in capture], np.int32)]
    else:
        inputs, k_new, v_new = [], [], []
        for i, p in enumerate(params["layers"]):
            inputs.append(x)
            x, k, v = layer(x, p, cache.k[i], cache.v[i], rope_inverse_frequencies(ropes[i], cfg.head_dim), windows[i])
            k_new.append(k)
            v_new.append(v)
        captured = jnp.stack([inputs[i] for i in capture]) if capture else jnp.zeros((0, b, t, cfg.hidden_size), dtype)
        k_new, v_new = jnp.stack(k_new), jnp.stack(v_new)
    hidden = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    return ForwardOutput(hidden, captured, k_new, v_new)


def lm_head(params: dict, hidden: jax.Array) -> jax.Array:
    """Logits (..., V) in float32 from post-norm hidden (..., d): the lm_head, or the tied embedding."""
    return dense(hidden, params.get("lm_head", params["embed"]), out_dtype=jnp.float32)


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

    stacked = {k: rand((cfg.num_layers, *shapes[k]), 1.0 if k.endswith("norm") else 0.0) for k in layer_keys(cfg)}
    layers = [{k: w[i] for k, w in stacked.items()} for i in range(cfg.num_layers)]
    params = {"embed": rand((cfg.vocab_size, cfg.hidden_size)), "layers": layers, "final_norm": rand((cfg.hidden_size,), 1.0)}
    if not cfg.tie_embeddings:
        params["lm_head"] = rand((cfg.vocab_size, cfg.hidden_size))
    return params
