"""Target-side sampling: temperature, top-k, top-p (HF warper semantics); temperature 0 = greedy."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from eagle_jax.errors import EagleError


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 = off

    def __post_init__(self):
        # nan passes every comparison below as False, and inf divides every logit to 0 (a uniform draw)
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise EagleError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # false for nan
            raise EagleError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise EagleError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def processed_log_probs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Log-probabilities (..., V) float32 after temperature, top-k and top-p; removed tokens get -inf."""
    scores = logits.astype(jnp.float32) / cfg.temperature
    if 0 < cfg.top_k < scores.shape[-1]:  # a top_k of the vocabulary's size or more keeps every token
        kth = jax.lax.top_k(scores, cfg.top_k)[0][..., -1:]
        scores = jnp.where(scores < kth, -jnp.inf, scores)
    if cfg.top_p < 1:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (at least one token):
        # every token scoring at least the last kept score survives.
        sorted_scores = -jnp.sort(-scores, axis=-1)
        sorted_probs = jax.nn.softmax(sorted_scores, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        num_kept = jnp.sum(mass_before < cfg.top_p, axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(sorted_scores, num_kept - 1, axis=-1)
        scores = jnp.where(scores >= threshold, scores, -jnp.inf)
    return jax.nn.log_softmax(scores, axis=-1)


def target_probs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Probabilities (..., V) float32 of the processed target distribution."""
    return jnp.exp(processed_log_probs(logits, cfg))


def sample_tokens(rng: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Next tokens (...,) int32 from logits (..., V)."""
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(rng, processed_log_probs(logits, cfg), axis=-1).astype(jnp.int32)
