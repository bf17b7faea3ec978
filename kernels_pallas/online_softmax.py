"""In-kernel math shared by the GPU and TPU tree-attention kernels.

Everything here runs on values already loaded from refs, with only ops that both the Triton and
the Mosaic lowerings accept: 2-D tiles, dots with a float32 accumulator, lane iotas, shifts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.kernels_pallas.layout import BITS_PER_WORD
from eagle_jax.kernels_pallas.reference import NEG_INF

_CONTRACT_LAST = (((1,), (1,)), ((), ()))  # (bq, D) x (bk, D) -> (bq, bk)
_CONTRACT_INNER = (((1,), (0,)), ((), ()))  # (bq, bk) x (bk, D) -> (bq, D)


class SoftmaxState(NamedTuple):
    """Running flash-attention state of one tile of query rows."""

    peak: jax.Array  # (bq, 1) float32, running max score (NEG_INF before any visible key)
    total: jax.Array  # (bq, 1) float32, running sum of exp(score - peak)
    acc: jax.Array  # (bq, Dv) float32, running sum of exp(score - peak) * v


def empty_state(rows: int, dim: int) -> SoftmaxState:
    return SoftmaxState(
        jnp.full((rows, 1), NEG_INF, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
        jnp.zeros((rows, dim), jnp.float32),
    )


def _precision(dtype: jnp.dtype) -> jax.lax.Precision:
    # float32 inputs must not drop to tf32 (GPU) or one bf16 pass (TPU): the contract is float32.
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def attend_block(
    state: SoftmaxState,
    q: jax.Array,  # (bq, D)
    k: jax.Array,  # (bk, D)
    v: jax.Array,  # (bk, Dv)
    visible: jax.Array,  # (bq, bk) bool
    scale: float,
) -> SoftmaxState:
    """One online-softmax step: folds a key block into the running state of a query tile.

    Hidden keys get exactly zero weight (not just exp(-huge)), so a row that has seen no visible
    key keeps total == 0 and `finish` returns zeros for it.
    """
    precision = _precision(q.dtype)
    scores = jax.lax.dot_general(
        q, k, _CONTRACT_LAST, precision=precision, preferred_element_type=jnp.float32
    )
    scores = jnp.where(visible, scores * scale, NEG_INF)  # (bq, bk)
    peak = jnp.maximum(state.peak, jnp.max(scores, axis=1, keepdims=True))
    rescale = jnp.exp(state.peak - peak)  # (bq, 1)
    weights = jnp.where(visible, jnp.exp(scores - peak), 0.0)
    total = rescale * state.total + jnp.sum(weights, axis=1, keepdims=True)
    update = jax.lax.dot_general(
        weights.astype(v.dtype), v, _CONTRACT_INNER, precision=precision,
        preferred_element_type=jnp.float32,
    )
    return SoftmaxState(peak, total, rescale * state.acc + update)


def finish(state: SoftmaxState) -> jax.Array:  # (bq, Dv) float32
    """Normalised output; zeros for rows that saw no key."""
    return state.acc / jnp.where(state.total > 0.0, state.total, 1.0)


def visible_from_words(
    words: list[jax.Array],  # W x (bq, 1) int32, word i holds keys 32 * i .. 32 * i + 31
    key_index: jax.Array,  # (bq, bk) int32, key position inside the block (a lane iota)
) -> jax.Array:  # (bq, bk) bool
    """Rebuilds a block's visibility tile from its packed bit words (see layout.pack_mask_words)."""
    word = jnp.broadcast_to(words[0], key_index.shape)
    for i, column in enumerate(words[1:], start=1):
        word = jnp.where(key_index >= i * BITS_PER_WORD, column, word)
    bit = key_index & (BITS_PER_WORD - 1)
    return ((word >> bit) & 1) == 1
