"""What plain and speculative decoding share: prompt batches, the prefill, stop tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.errors import EagleError
from eagle_jax.model.config import ModelConfig
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.model.transformer import causal_mask, forward

PAD = -1  # fills the token buffers past each row's end
FINISH_REASONS = ("stop", "max_new_tokens", "cache_full")  # what a row's finish_reason code 0, 1, 2 means


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


def prefill(params, cfg: ModelConfig, prompt_tokens, prompt_lengths, cache: KVCache, capture=()):
    """Run the prompt (B, P) through the target into an empty cache.
    Returns (ForwardOutput, cache with the prompt written)."""
    b, p = prompt_tokens.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    valid = positions < prompt_lengths[:, None]
    out = forward(params, cfg, prompt_tokens, positions, None, causal_mask(valid), capture=capture)
    return out, cache.write(out.k_new, out.v_new, prompt_lengths)


def last_valid(x: jax.Array, lengths: jax.Array) -> jax.Array:
    """x[b, lengths[b] - 1] for x (B, T, ...)."""
    return jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]


def is_stop(tokens: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
    """(...,) bool: which of tokens (...,) are stop tokens."""
    return jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else jnp.zeros(tokens.shape, bool)


def finish_reasons(tokens: jax.Array, num_tokens: jax.Array, max_new_tokens: int, stop_ids: tuple[int, ...]) -> jax.Array:
    """(B,) int32 why each row of tokens (B, N) with num_tokens (B,) ended, an index into
    FINISH_REASONS: its last token is a stop token; else it has max_new_tokens; else (the only other
    way a row ends) its cache is full."""
    last = jnp.take_along_axis(tokens, jnp.maximum(num_tokens - 1, 0)[:, None], axis=1)[:, 0]
    return jnp.where(is_stop(last, stop_ids), 0, jnp.where(num_tokens >= max_new_tokens, 1, 2)).astype(jnp.int32)
