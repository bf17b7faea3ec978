"""Plain autoregressive decoding: the baseline every speedup is measured against.

One `jax.jit` around prefill + `lax.while_loop`; fixed-shape cache; batch rows of different prompt
lengths; per-row stop on stop ids, max_new_tokens or a full cache.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax.sharding import Mesh
import jax.numpy as jnp

from eagle_jax.decoding.prompts import PAD, check_prompt_fits, finish_reasons, is_stop, last_valid, prefill
from eagle_jax.decoding.sampling import SamplingConfig, sample_tokens
from eagle_jax.model.config import ModelConfig
from eagle_jax.model.sharding import constrain_caches, over_row_shards
from eagle_jax.model.transformer import forward, is_stacked, lm_head, make_cache


class GenerateOutput(NamedTuple):
    tokens: jax.Array  # (B, max_new_tokens) int32, PAD after each row's end
    num_tokens: jax.Array  # (B,) int32 generated tokens per row (a stop token included)
    steps: jax.Array  # () int32 target forward passes after prefill
    finish_reason: jax.Array  # (B,) int32 why each row ended, an index into FINISH_REASONS (stop, max_new_tokens, cache_full)


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
    mesh: Mesh | None = None,
) -> GenerateOutput:
    """Decode up to max_new_tokens per row. Pure and traceable: wrap in jax.jit with the keyword
    arguments and `cfg` static (see `generate_ar_jit`), or call inside your own jitted function.
    On a `mesh` (params placed by `eagle_jax.model.sharding.target_shardings`) the rows split over
    "data", each shard decoding its own (`over_row_shards`), and the cache by KV heads over "model"."""
    check_prompt_fits(prompt_tokens.shape[1], cache_len)

    def decode(params, rows, rng):
        prompt_tokens, prompt_lengths = rows
        b = prompt_tokens.shape[0]
        cache = constrain_caches(mesh, make_cache(cfg, b, cache_len, params["embed"].dtype, is_stacked(params)))
        out, cache = prefill(params, cfg, prompt_tokens, prompt_lengths, cache)
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
            out = forward(params, cfg, last[:, None], positions, cache, jnp.ones((b, 1, 1), bool))
            cache = constrain_caches(mesh, cache.write(out.k_new, out.v_new, (~done).astype(jnp.int32)))
            rng, key = jax.random.split(rng)
            nxt = sample_tokens(key, lm_head(params, out.hidden[:, 0]), sampling)
            nxt = jnp.where(done, PAD, nxt)
            tokens = tokens.at[:, step + 1].set(nxt)
            done = done | is_stop(nxt, stop_ids) | (step + 2 >= max_new_tokens) | (cache.lengths >= cache_len)
            return cache, tokens, nxt, done, rng, step + 1

        _, tokens, _, _, _, steps = jax.lax.while_loop(cond, body, (cache, tokens, first, done, rng, jnp.int32(0)))
        num_tokens = jnp.sum(tokens != PAD, axis=1).astype(jnp.int32)
        return GenerateOutput(tokens, num_tokens, steps, finish_reasons(tokens, num_tokens, max_new_tokens, stop_ids))

    return over_row_shards(mesh, decode, params, (prompt_tokens, prompt_lengths), rng)


generate_ar_jit = jax.jit(
    generate_ar, static_argnames=("cfg", "max_new_tokens", "cache_len", "sampling", "stop_ids", "mesh")
)
