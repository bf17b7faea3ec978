"""Tree attention as a Pallas GPU kernel (Triton lowering); contract in reference.py.

One program per (batch row, kv head, tile of packed GQA query rows). It streams the row's cached
prefix in blocks of `block_k` keys, from the block of the tile's first visible slot (sliding
windows) to the row's length (a loop with dynamic bounds, so cache blocks outside them are never
read), then the Tk new keys under the packed ancestor
bitmask, with one online softmax over both. Triton needs power-of-two tiles of at least 16 for its
dots: query rows and new keys are zero-padded to that here. The cache is padded along S only when
S is not a multiple of `block_k`, which copies it: eagle-jax allocates caches in multiples of
CACHE_BLOCK (`eagle_jax.model.attention.cache_slots`), so that never happens there.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from eagle_jax.kernels_pallas import layout
from eagle_jax.kernels_pallas.online_softmax import (
    attend_block,
    empty_state,
    finish,
    visible_from_words,
)

_MIN_TILE = 16  # smallest dot operand side Triton accepts
CACHE_BLOCK = 64  # the default block_k: caches sized in multiples of it are never padded


def _kernel(
    lengths_ref,  # () int32
    first_ref,  # () int32, the tile's smallest start
    q_ref,  # (bq, D)
    k_cache_ref,  # (S_pad, D), one kv head's contiguous keys
    v_cache_ref,  # (S_pad, D)
    k_new_ref,  # (nT * bn, D)
    v_new_ref,  # (nT * bn, D)
    words_ref,  # (nT, W, bq, 1) int32
    starts_ref,  # (bq, 1) int32, first visible cache slot per row
    out_ref,  # (bq, D)
    *,
    scale: float,
    block_k: int,
    block_new: int,
):
    q = q_ref[...]
    rows = q.shape[0]
    length = lengths_ref[...]
    starts = starts_ref[...]
    prefix_lane = jax.lax.broadcasted_iota(jnp.int32, (rows, block_k), 1)
    new_lane = jax.lax.broadcasted_iota(jnp.int32, (rows, block_new), 1)

    def prefix_step(i, state):
        start = pl.multiple_of(i * block_k, block_k)
        keys = pl.ds(start, block_k)
        position = start + prefix_lane
        visible = (position < length) & (position >= starts)
        return attend_block(state, q, k_cache_ref[keys, :], v_cache_ref[keys, :], visible, scale)

    def new_step(p, state):
        keys = pl.ds(pl.multiple_of(p * block_new, block_new), block_new)
        words = [words_ref[p, i] for i in range(words_ref.shape[1])]
        visible = visible_from_words(words, new_lane)
        return attend_block(state, q, k_new_ref[keys, :], v_new_ref[keys, :], visible, scale)

    state = empty_state(rows, q.shape[1])
    state = jax.lax.fori_loop(first_ref[...] // block_k, pl.cdiv(length, block_k), prefix_step, state)
    state = jax.lax.fori_loop(0, words_ref.shape[0], new_step, state)
    out_ref[...] = finish(state).astype(out_ref.dtype)


@functools.partial(
    jax.jit,
    static_argnames=("scale", "interpret", "block_q", "block_k", "block_new", "num_warps", "num_stages"),
)
def tree_attention_gpu(
    q: jax.Array,  # (B, Tq, H, D)
    k_cache: jax.Array,  # (B, KV, S, D)
    v_cache: jax.Array,  # (B, KV, S, D)
    lengths: jax.Array,  # (B,) int32, visible prefix length per row, 0..S
    k_new: jax.Array,  # (B, Tk, KV, D)
    v_new: jax.Array,  # (B, Tk, KV, D)
    block_mask: jax.Array,  # (B, Tq, Tk) bool
    starts: jax.Array | None = None,  # (B, Tq) int32, first visible cache slot per query; None: 0
    *,
    scale: float | None = None,
    interpret: bool = False,
    block_q: int = 64,
    block_k: int = CACHE_BLOCK,
    block_new: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> jax.Array:  # (B, Tq, H, D)
    """Pallas GPU tree attention; same contract and result as `tree_attention_reference`.

    block_q: packed query rows (Tq * H / KV per kv head) per program; block_k: cache keys per loop
    step; block_new: new keys per loop step. All are powers of two >= 16 (shrunk to fit small
    inputs). D must be a power of two >= 16 (64 and 128 are the supported head sizes).
    """
    b, tq, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    tk = k_new.shape[1]
    groups = h // kv
    scale = d**-0.5 if scale is None else scale

    block_q = min(block_q, layout.next_power_of_2(max(tq * groups, _MIN_TILE)))
    rows = layout.round_up(tq * groups, block_q)
    block_k = min(block_k, layout.next_power_of_2(max(s, _MIN_TILE)))
    s_pad = layout.round_up(max(s, 1), block_k)  # an empty cache or block becomes one hidden block
    block_new = min(block_new, layout.next_power_of_2(max(tk, _MIN_TILE)))
    tk_pad = layout.round_up(max(tk, 1), block_new)
    n_new_blocks = tk_pad // block_new
    width = layout.words_per_block(block_new)

    q_rows = layout.pack_query_rows(q, kv, rows)  # (B, KV, rows, D)
    k_cache, v_cache = (layout.pad_axis(x, 2, s_pad) for x in (k_cache, v_cache))
    k_new, v_new = (layout.pad_axis(x, 1, tk_pad) for x in (k_new, v_new))
    words = layout.pack_mask_words(block_mask, groups, rows, block_new, n_new_blocks)  # (B, nT, W, rows, 1)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, s)
    row_starts = layout.pack_query_starts(starts, b, tq, groups, rows)  # (B, rows, 1)
    tile_first = row_starts.reshape(b, rows // block_q, block_q).min(-1)  # (B, tiles)

    row_tile = pl.BlockSpec((None, None, block_q, d), lambda i, j, r: (i, j, r, 0))
    cache = pl.BlockSpec((None, None, s_pad, d), lambda i, j, r: (i, j, 0, 0))
    new = pl.BlockSpec((None, tk_pad, None, d), lambda i, j, r: (i, 0, j, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, scale=scale, block_k=block_k, block_new=block_new),
        grid=(b, kv, rows // block_q),
        in_specs=[
            pl.BlockSpec((None,), lambda i, j, r: (i,)),
            pl.BlockSpec((None, None), lambda i, j, r: (i, r)),
            row_tile,
            cache,
            cache,
            new,
            new,
            pl.BlockSpec((None, n_new_blocks, width, block_q, 1), lambda i, j, r: (i, 0, 0, r, 0)),
            pl.BlockSpec((None, block_q, 1), lambda i, j, r: (i, r, 0)),
        ],
        out_specs=row_tile,
        out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="tree_attention_gpu",
    )(lengths, tile_first, q_rows, k_cache, v_cache, k_new, v_new, words, row_starts)
    return layout.unpack_query_rows(out, tq, h)
