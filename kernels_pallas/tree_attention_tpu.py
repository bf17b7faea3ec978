"""Tree attention as a Pallas TPU kernel (Mosaic lowering); contract in reference.py.

Grid (batch row, kv head, query tile, key step). The key steps walk the cached prefix in
blocks of `block_k`, then the new keys in blocks of `block_new`, carrying one online softmax in
VMEM scratch. The row lengths are scalar-prefetched: the cache index map clamps the block index
to the row's last visible block, so blocks past the length are neither copied (an unchanged block
index skips the DMA) nor computed (`pl.when`); only the empty grid steps remain.

TPU blocks must end in (8k, 128k) or span the full array dims. The caches are head-major,
(B, KV, S, D), so one block is a contiguous (block_k, D) slice of one kv head (D spans the full
last dim, so D = 64 is allowed), and the GQA-packed query rows of that head are one (block_q, D)
tile. The new keys, a few rows from the projections, are transposed to the same layout here. Where
S is not a multiple of `block_k`, a block of CACHE_BLOCK keys that divides S is taken instead; the
cache is padded along S (a copy) only when neither divides it, which never happens for the caches
eagle-jax allocates (`eagle_jax.model.attention.cache_slots`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from eagle_jax.kernels_pallas import layout
from eagle_jax.kernels_pallas.online_softmax import (
    SoftmaxState,
    attend_block,
    finish,
    visible_from_words,
)
from eagle_jax.kernels_pallas.reference import NEG_INF

_LANES = 128
_SUBLANES = 16  # bf16 packs 16 rows per (8, 128) tile; 16 keeps both dtypes aligned
CACHE_BLOCK = _LANES  # caches sized in multiples of it are never padded


def _kernel(
    lengths_ref,  # (B,) int32, SMEM
    q_ref,  # (bq, D)
    k_cache_ref,  # (bk, D)
    v_cache_ref,  # (bk, D)
    k_new_ref,  # (bn, D)
    v_new_ref,  # (bn, D)
    words_ref,  # (W, bq, 1) int32
    starts_ref,  # (bq, 1) int32, first visible cache slot per row
    out_ref,  # (bq, D)
    peak_ref,  # (bq, 128) float32, lane-replicated
    total_ref,  # (bq, 128) float32, lane-replicated
    acc_ref,  # (bq, D) float32
    *,
    scale: float,
    prefix_blocks: int,
    new_blocks: int,
):
    step = pl.program_id(3)
    length = lengths_ref[pl.program_id(0)]
    rows = q_ref.shape[0]

    @pl.when(step == 0)
    def _init():
        peak_ref[...] = jnp.full(peak_ref.shape, NEG_INF, jnp.float32)
        total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def state() -> SoftmaxState:
        return SoftmaxState(peak_ref[:, :1], total_ref[:, :1], acc_ref[...])

    def attend(k, v, visible):
        new = attend_block(state(), q_ref[...], k, v, visible, scale)
        peak_ref[...] = jnp.broadcast_to(new.peak, (rows, _LANES))
        total_ref[...] = jnp.broadcast_to(new.total, (rows, _LANES))
        acc_ref[...] = new.acc

    @pl.when((step < prefix_blocks) & (step * k_cache_ref.shape[0] < length))
    def _prefix():
        block_k = k_cache_ref.shape[0]
        position = step * block_k + jax.lax.broadcasted_iota(jnp.int32, (rows, block_k), 1)
        attend(k_cache_ref[...], v_cache_ref[...], (position < length) & (position >= starts_ref[...]))

    @pl.when(step >= prefix_blocks)
    def _new():
        key_index = jax.lax.broadcasted_iota(jnp.int32, (rows, k_new_ref.shape[0]), 1)
        words = [words_ref[i] for i in range(words_ref.shape[0])]
        attend(k_new_ref[...], v_new_ref[...], visible_from_words(words, key_index))

    @pl.when(step == prefix_blocks + new_blocks - 1)
    def _finish():
        out_ref[...] = finish(state()).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_q", "block_k", "block_new"))
def tree_attention_tpu(
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
    block_q: int = 256,
    block_k: int = 256,
    block_new: int = 128,
) -> jax.Array:  # (B, Tq, H, D)
    """Pallas TPU tree attention; same contract and result as `tree_attention_reference`.

    block_q: packed query rows (Tq * H / KV per kv head) per tile; block_k: cache keys per grid
    step; block_new: new keys per grid step. All multiples of 16 (shrunk to fit small inputs);
    block_k and block_new should be multiples of 128 for long inputs.
    """
    b, tq, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    tk = k_new.shape[1]
    groups = h // kv
    scale = d**-0.5 if scale is None else scale

    block_q = min(block_q, layout.round_up(tq * groups, _SUBLANES))
    rows = layout.round_up(tq * groups, block_q)
    block_k = min(block_k, layout.round_up(max(s, 1), _SUBLANES))
    if s % block_k and s % CACHE_BLOCK == 0:
        block_k = CACHE_BLOCK
    s_pad = layout.round_up(max(s, 1), block_k)  # an empty cache or block becomes one hidden block
    block_new = min(block_new, layout.round_up(max(tk, 1), _SUBLANES))
    tk_pad = layout.round_up(max(tk, 1), block_new)
    prefix_blocks, new_blocks = s_pad // block_k, tk_pad // block_new
    width = layout.words_per_block(block_new)

    q_rows = layout.pack_query_rows(q, kv, rows)  # (B, KV, rows, D)
    k_cache, v_cache = (layout.pad_axis(x, 2, s_pad) for x in (k_cache, v_cache))
    k_new, v_new = (layout.pad_axis(x, 1, tk_pad).swapaxes(1, 2) for x in (k_new, v_new))  # (B, KV, tk_pad, D)
    words = layout.pack_mask_words(block_mask, groups, rows, block_new, new_blocks)  # (B, nT, W, rows, 1)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, s)
    row_starts = layout.pack_query_starts(starts, b, tq, groups, rows)  # (B, rows, 1)

    def cache_map(i, g, r, step, lengths_ref):
        # lax.div truncates; lengths are >= 0, so this is a ceil-div without a sign op.
        last_visible = jnp.maximum(jax.lax.div(lengths_ref[i] + block_k - 1, block_k) - 1, 0)
        return i, g, jnp.minimum(step, last_visible), 0

    def new_map(i, g, r, step, lengths_ref):
        return i, g, jnp.maximum(step - prefix_blocks, 0), 0

    def words_map(i, g, r, step, lengths_ref):
        return i, jnp.maximum(step - prefix_blocks, 0), 0, r, 0

    row_tile = pl.BlockSpec((None, None, block_q, d), lambda i, g, r, step, _: (i, g, r, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(b, kv, rows // block_q, prefix_blocks + new_blocks),
        in_specs=[
            row_tile,
            pl.BlockSpec((None, None, block_k, d), cache_map),
            pl.BlockSpec((None, None, block_k, d), cache_map),
            pl.BlockSpec((None, None, block_new, d), new_map),
            pl.BlockSpec((None, None, block_new, d), new_map),
            pl.BlockSpec((None, None, width, block_q, 1), words_map),
            pl.BlockSpec((None, block_q, 1), lambda i, g, r, step, _: (i, r, 0)),
        ],
        out_specs=row_tile,
        scratch_shapes=[
            pltpu.VMEM((block_q, _LANES), jnp.float32),
            pltpu.VMEM((block_q, _LANES), jnp.float32),
            pltpu.VMEM((block_q, d), jnp.float32),
        ],
    )
    kernel = functools.partial(_kernel, scale=scale, prefix_blocks=prefix_blocks, new_blocks=new_blocks)
    out = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
        name="tree_attention_tpu",
    )(lengths, q_rows, k_cache, v_cache, k_new, v_new, words, row_starts)
    return layout.unpack_query_rows(out, tq, h)
