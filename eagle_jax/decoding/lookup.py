"""Draft tokens looked up in the context: the continuation of the latest earlier occurrence of the
last few tokens (n-gram prompt lookup), proposed as one extra chain under the tree's root. Where
the root token never occurred before, nothing is found, and the tree gives the chain's slots to
drafted nodes (`eagle_jax.decoding.tree`).

The draft head is weak at copying (names, quoted text, a repeated line), and the text a model is
asked to translate, summarise or answer from often reappears in its answer. A lookup costs no
draft pass, only the verification of its tokens, and keeps decoding lossless like any other draft
token: the target accepts a looked-up token only where it would have produced it itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAX_NGRAM = 3  # the longest suffix looked up; shorter ones are tried when it does not recur


def lookup_proposals(history: jax.Array, lengths: jax.Array, num_tokens: int, max_ngram: int = MAX_NGRAM) -> tuple[jax.Array, jax.Array]:
    """(B, num_tokens) int32 tokens to follow each row's known history, and (B,) int32 the length of
    the suffix matched, 0 where the row's last token never occurred before (the proposal is a guess).

    history: (B, S) int32 tokens by position, the first lengths[b] of row b known (the last one is
    the tree's root); lengths: (B,) int32, >= 1. The suffix of the longest length n <= max_ngram that
    also ends at an earlier position j (ties: the latest j) is looked up, and the tokens after it,
    history[j + 1 ...], are proposed. They are known up to the root at distance d = lengths - 1 - j;
    past it the proposal repeats that stretch with period d, as a repeating text would continue.
    A row whose last token never occurred before proposes it again (d = 1).
    """
    b, s = history.shape
    positions = jnp.arange(s, dtype=jnp.int32)[None, :]  # (1, S) candidate end j of an occurrence
    last = lengths[:, None] - 1  # (B, 1) the root's position
    matched = jnp.zeros((b, s), jnp.int32)  # suffix tokens matched at j, consecutively from the end
    running = jnp.ones((b, s), bool)
    for m in range(max_ngram):
        suffix_token = jnp.take_along_axis(history, jnp.maximum(last - m, 0), axis=1)  # (B, 1)
        earlier = jnp.take_along_axis(history, jnp.maximum(positions - m, 0), axis=1)  # history[j - m]
        running = running & (earlier == suffix_token) & (positions - m >= 0) & (last - m >= 0)
        matched = matched + running
    candidate = (positions < last) & (matched > 0)  # an earlier occurrence, not the suffix itself
    score = jnp.where(candidate, matched * s + positions, -1)  # longest suffix first, then latest
    best = jnp.argmax(score, axis=1).astype(jnp.int32)[:, None]  # (B, 1)
    match_length = jnp.take_along_axis(jnp.where(candidate, matched, 0), best, axis=1)[:, 0]  # (B,)
    distance = jnp.where(match_length[:, None] > 0, last - best, 1)
    offsets = jnp.arange(num_tokens, dtype=jnp.int32)[None, :] % distance  # (B, L)
    return jnp.take_along_axis(history, last + 1 - distance + offsets, axis=1), match_length
