"""Plain autoregressive decoding: the baseline every speedup is measured against.

One `jax.jit` around prefill + `lax.while_loop`; fixed-shape cache; batch rows of different prompt
lengths; per-row stop on stop ids, max_new_tokens or a full cache.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.config import ModelConfig
from eagle_jax.errors import EagleError
from eagle_jax.kv_cache import KVCache
from eagle_jax.model import causal_mask, forward, lm_head, make_cache
from eagle_jax.sampling import SamplingConfig, sample_tokens

PAD = -1


class GenerateOutput(NamedTuple):
    tokens: jax.Array  # (B, max_new_tokens) int32, PAD after each row's end
    num_tokens: jax.Array  # (B,) int32 generated tokens per row (a stop token included)
    steps: jax.Array  # () int32 target forward passes after prefill


def pad_prompts(prompts: list[list[int]], multiple: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists to one (B, P) int32 array, P rounded up to `multiple` to limit recompiles."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise EagleError("every prompt needs at least one token")
    width = -(-max(len(p) for p in prompts) // multiple) * multiple
    tokens = np.zeros((len(prompts), width), np.int32)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)] = p
    return tokens, np.array([len(p) for p in prompts], np.int32)


def check_prompt_fits(prompt_len: int, cache_len: int) -> None:
    if prompt_len >= cache_len:
        raise EagleError(
            f"prompt of {prompt_len} tokens does not fit a cache of {cache_len} tokens; "
            "use a shorter prompt or a larger cache (--cache-len)"
        )


def prefill(params, cfg: ModelConfig, prompt_tokens, prompt_lengths, cache: KVCache, capture=(), attn_impl="auto"):
    """Run the prompt (B, P) through the target into an empty cache.
    Returns (ForwardOutput, cache with the prompt written)."""
    b, p = prompt_tokens.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    valid = positions < prompt_lengths[:, None]
    out = forward(params, cfg, prompt_tokens, positions, None, causal_mask(valid), capture=capture, attn_impl=attn_impl)
    return out, cache.write(out.k_new, out.v_new, prompt_lengths)


def last_valid(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """x[b, lengths[b] - 1] for x (B, T, ...)."""
    return jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]


def is_stop(tokens: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
    return jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros(tokens.shape, bool)


def generate_ar(
    params: dict,
    cfg: ModelConfig,
    prompt_tokens: jax.Array,  # (B, P) int32, right-padded
    prompt_lengths: jax.Array,  # (B,) int32
    rng: jax.Array,
    *,
    max_new_tokens: int,
    cache_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    stop_ids: tuple[int, ...] = (),
    attn_impl: str = "auto",
) -> GenerateOutput:
    """Decode up to max_new_tokens per row. Pure and traceable: wrap in jax.jit with the keyword
    arguments and `cfg` static (see `generate_ar_jit`), or call inside your own jitted function."""
    b, p = prompt_tokens.shape
    check_prompt_fits(p, cache_len)
    cache = make_cache(cfg, b, cache_len, params["embed"].dtype)
    out, cache = prefill(params, cfg, prompt_tokens, prompt_lengths, cache, attn_impl=attn_impl)
    rng, key = jax.random.split(rng)
    first = sample_tokens(key, lm_head(params, last_valid(out.hidden, prompt_lengths)), sampling)
    tokens = jnp.full((b, max_new_tokens), PAD, jnp.int32).at[:, 0].set(first)
    done = is_stop(first, stop_ids) | (max_new_tokens == 1) | (cache.lengths >= cache_len)

    def cond(state):
        _, _, _, done, _, step = state
        return (step < max_new_tokens - 1) & ~jnp.all(done)

    def body(state):
        cache, tokens, last, done, rng, step = state
        positions = cache.lengths[:, None]
        out = forward(params, cfg, last[:, None], positions, cache, jnp.ones((b, 1, 1), bool), attn_impl=attn_impl)
        cache = cache.write(out.k_new, out.v_new, (~done).astype(jnp.int32))
        rng, key = jax.random.split(rng)
        nxt = sample_tokens(key, lm_head(params, out.hidden[:, 0]), sampling)
        nxt = jnp.where(done, PAD, nxt)
        tokens = tokens.at[:, step + 1].set(nxt)
        done = done | is_stop(nxt, stop_ids) | (step + 2 >= max_new_tokens) | (cache.lengths >= cache_len)
        return cache, tokens, nxt, done, rng, step + 1

    state = (cache, tokens, first, done, rng, jnp.int32(0))
    _, tokens, _, _, _, steps = jax.lax.while_loop(cond, body, state)
    num_tokens = jnp.sum(tokens != PAD, axis=1).astype(jnp.int32)
    return GenerateOutput(tokens, num_tokens, steps)


generate_ar_jit = jax.jit(
    generate_ar, static_argnames=("cfg", "max_new_tokens", "cache_len", "sampling", "stop_ids", "attn_impl")
)
