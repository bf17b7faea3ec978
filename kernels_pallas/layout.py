"""Wrapper-side layouts shared by the GPU and TPU tree-attention kernels.

Both kernels fold the query heads that share a kv head into the row axis of one tile (GQA
packing): row r of kv head k is query t = r // G, head k * G + r % G, with G = H // KV. One load
of a key block then serves all G query heads.

The new-block mask travels as bits, not as a dense (Tq, Tk) array: key j of new-key block p is
bit j % 32 of word j // 32 of that block, per packed row. A (bq, bk) tile is rebuilt in the kernel
from W = ceil(bk / 32) column words with shifts, without any lane reshapes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

BITS_PER_WORD = 32


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def next_power_of_2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    """Zero-pads `x` along `axis` up to `size` (no copy when it already has that size)."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def pack_query_rows(q: jax.Array, kv_heads: int, rows: int) -> jax.Array:
    """(B, Tq, H, D) -> (B, KV, rows, D): GQA rows (t, g) of each kv head, zero-padded to `rows`."""
    b, tq, h, d = q.shape
    groups = h // kv_heads
    packed = q.reshape(b, tq, kv_heads, groups, d).transpose(0, 2, 1, 3, 4)  # (B, KV, Tq, G, D)
    return pad_axis(packed.reshape(b, kv_heads, tq * groups, d), 2, rows)


def unpack_query_rows(out: jax.Array, tq: int, heads: int) -> jax.Array:
    """(B, KV, rows, D) -> (B, Tq, H, D); inverse of `pack_query_rows` (drops padded rows)."""
    b, kv, _, d = out.shape
    groups = heads // kv
    out = out[:, :, : tq * groups].reshape(b, kv, tq, groups, d)
    return out.transpose(0, 2, 1, 3, 4).reshape(b, tq, heads, d)


PAST_EVERY_SLOT = 2**30  # the start of a padded query row: no cache slot reaches it


def pack_query_starts(starts: jax.Array | None, b: int, tq: int, groups: int, rows: int) -> jax.Array:
    """(B, Tq) first visible cache slots (None: 0) -> (B, rows, 1) int32 in packed row order;
    padded rows start past every slot, so that a tile's smallest start is a real query's."""
    starts = jnp.zeros((b, tq), jnp.int32) if starts is None else starts.astype(jnp.int32)
    packed = jnp.repeat(starts, groups, axis=1)  # (B, Tq * G)
    extra = rows - packed.shape[1]
    return jnp.pad(packed, ((0, 0), (0, extra)), constant_values=PAST_EVERY_SLOT)[..., None]


def words_per_block(key_block: int) -> int:
    return math.ceil(key_block / BITS_PER_WORD)


def pack_mask_words(
    block_mask: jax.Array,  # (B, Tq, Tk) bool
    groups: int,
    rows: int,
    key_block: int,
    key_blocks: int,
) -> jax.Array:  # (B, nT, W, rows, 1) int32
    """Packs the new-block mask into per-row bit words, one group of W words per key block.

    nT = key_blocks (covering Tk), W = ceil(key_block / 32). Query t's words are repeated for its
    G packed rows; padded rows and padded keys get 0 bits, so a padded key is never visible. The
    trailing unit axis lets a kernel load one word column as a (rows, 1) tile.
    """
    b, tq, _ = block_mask.shape
    width = words_per_block(key_block)
    mask = pad_axis(block_mask, 2, key_blocks * key_block).reshape(b, tq, key_blocks, key_block)
    mask = pad_axis(mask, 3, width * BITS_PER_WORD).reshape(b, tq, key_blocks, width, BITS_PER_WORD)
    weights = jnp.left_shift(jnp.uint32(1), jnp.arange(BITS_PER_WORD, dtype=jnp.uint32))  # (32,)
    words = jnp.sum(jnp.where(mask, weights, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
    words = jax.lax.bitcast_convert_type(words, jnp.int32)  # (B, Tq, nT, W)
    words = pad_axis(jnp.repeat(words, groups, axis=1), 1, rows)  # (B, rows, nT, W)
    return words.transpose(0, 2, 3, 1)[..., None]
