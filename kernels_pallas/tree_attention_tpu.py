"""Tree attention as a Pallas TPU kernel (Mosaic lowering); contract in reference.py.

Grid (batch row, kv-head group, query tile, key step). The key steps walk the cached prefix in
blocks of `block_k`, then the new keys in blocks of `block_new`, carrying one online softmax in
VMEM scratch. The row lengths are scalar-prefetched: the cache index map clamps the block index
to the row's last visible block, so blocks past the length are neither copied (an unchanged block
index skips the DMA) nor computed (`pl.when`); only the empty grid steps remain.

TPU blocks must end in (8k, 128k) or span the full array dims. The caches are read as
(B, S, KV * D) views (free reshapes, no copy), and one block holds the D-lane slices of `hb` kv
heads, hb * D a multiple of 128 (hb = 1 for D = 128, 2 for D = 64) or all KV heads. Each head's
queries are pre-placed in its own lanes of an hb * D wide row with zeros elsewhere, so q . k over
the full block width is that head's score, and no kernel op slices lanes at odd offsets; the MXU
is 128 lanes wide, so the zero lanes cost nothing for D = 64. The cache is padded along S only when
S is not a multiple of `block_k` (a copy; eagle-jax cache sizes are multiples of 128).
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


def heads_per_block(kv_heads: int, head_dim: int) -> int:
    """Smallest kv-head count whose lanes fill whole 128-lane tiles, else all kv heads."""
    for hb in range(1, kv_heads + 1):
        if kv_heads % hb == 0 and hb * head_dim % _LANES == 0:
            return hb
    return kv_heads


def _spread_heads(q_rows: jax.Array, hb: int) -> jax.Array:
    """(B, KV, R, D) -> (B, KV / hb, hb, R, hb * D): head j of a group keeps only lanes j*D..j*D+D."""
    b, kv, rows, d = q_rows.shape
    grouped = q_rows.reshape(b, kv // hb, hb, rows, 1, d)
    own_lanes = jnp.eye(hb, dtype=bool)[:, None, :, None]  # (hb, 1, hb, 1)
    return jnp.where(own_lanes, grouped, 0).reshape(b, kv // hb, hb, rows, hb * d)


def _gather_heads(out: jax.Array, kv: int, d: int) -> jax.Array:
    """(B, KV / hb, R, hb * D) -> (B, KV, R, D)."""
    b, groups, rows, _ = out.shape
    return out.reshape(b, groups, rows, kv // groups, d).transpose(0, 1, 3, 2, 4).reshape(b, kv, rows, d)


def _kernel(
    lengths_ref,  # (B,) int32, SMEM
    q_ref,  # (hb, bq, hb * D)
    k_cache_ref,  # (bk, hb * D)
    v_cache_ref,  # (bk, hb * D)
    k_new_ref,  # (bn, hb * D)
    v_new_ref,  # (bn, hb * D)
    words_ref,  # (W, bq, 1) int32
    out_ref,  # (bq, hb * D)
    peak_ref,  # (hb, bq, 128) float32, lane-replicated
    total_ref,  # (hb, bq, 128) float32, lane-replicated
    acc_ref,  # (hb, bq, hb * D) float32
    *,
    scale: float,
    head_dim: int,
    prefix_blocks: int,
    new_blocks: int,
):
    step = pl.program_id(3)
    length = lengths_ref[pl.program_id(0)]
    hb, rows, width = q_ref.shape

    @pl.when(step == 0)
    def _init():
        peak_ref[...] = jnp.full(peak_ref.shape, NEG_INF, jnp.float32)
        total_ref[...] = jnp.zeros(total_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def state_of(j: int) -> SoftmaxState:
        return SoftmaxState(peak_ref[j, :, :1], total_ref[j, :, :1], acc_ref[j])

    def attend(k, v, visible):
        for j in range(hb):
            state = attend_block(state_of(j), q_ref[j], k, v, visible, scale)
            peak_ref[j] = jnp.broadcast_to(state.peak, (rows, _LANES))
            total_ref[j] = jnp.broadcast_to(state.total, (rows, _LANES))
            acc_ref[j] = state.acc

    @pl.when((step < prefix_blocks) & (step * k_cache_ref.shape[0] < length))
    def _prefix():
        block_k = k_cache_ref.shape[0]
        position = step * block_k + jax.lax.broadcasted_iota(jnp.int32, (rows, block_k), 1)
        attend(k_cache_ref[...], v_cache_ref[...], position < length)

    @pl.when(step >= prefix_blocks)
    def _new():
        key_index = jax.lax.broadcasted_iota(jnp.int32, (rows, k_new_ref.shape[0]), 1)
        words = [words_ref[i] for i in range(words_ref.shape[0])]
        attend(k_new_ref[...], v_new_ref[...], visible_from_words(words, key_index))

    @pl.when(step == prefix_blocks + new_blocks - 1)
    def _finish():
        head_of_lane = jax.lax.div(jax.lax.broadcasted_iota(jnp.int32, (rows, width), 1), head_dim)
        out = jnp.zeros((rows, width), jnp.float32)
        for j in range(hb):
            out = jnp.where(head_of_lane == j, finish(state_of(j)), out)
        out_ref[...] = out.astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_q", "block_k", "block_new"))
def tree_attention_tpu(
    q: jax.Array,  # (B, Tq, H, D)
    k_cache: jax.Array,  # (B, S, KV, D)
    v_cache: jax.Array,  # (B, S, KV, D)
    lengths: jax.Array,  # (B,) int32, visible prefix length per row, 0..S
    k_new: jax.Array,  # (B, Tk, KV, D)
    v_new: jax.Array,  # (B, Tk, KV, D)
    block_mask: jax.Array,  # (B, Tq, Tk) bool
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
    s, kv = k_cache.shape[1], k_cache.shape[2]
    tk = k_new.shape[1]
    groups = h // kv
    hb = heads_per_block(kv, d)
    scale = d**-0.5 if scale is None else scale

    block_q = min(block_q, layout.round_up(tq * groups, _SUBLANES))
    rows = layout.round_up(tq * groups, block_q)
    block_k = min(block_k, layout.round_up(max(s, 1), _SUBLANES))
    s_pad = layout.round_up(max(s, 1), block_k)  # an empty cache or block becomes one hidden block
    block_new = min(block_new, layout.round_up(max(tk, 1), _SUBLANES))
    tk_pad = layout.round_up(max(tk, 1), block_new)
    prefix_blocks, new_blocks = s_pad // block_k, tk_pad // block_new
    width = layout.words_per_block(block_new)

    q_lanes = _spread_heads(layout.pack_query_rows(q, kv, rows), hb)  # (B, KV/hb, hb, rows, hb*D)
    k_cache, v_cache = (layout.pad_axis(x, 1, s_pad).reshape(b, s_pad, kv * d) for x in (k_cache, v_cache))
    k_new, v_new = (layout.pad_axis(x, 1, tk_pad).reshape(b, tk_pad, kv * d) for x in (k_new, v_new))
    words = layout.pack_mask_words(block_mask, groups, rows, block_new, new_blocks)  # (B, nT, W, rows, 1)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, s)

    def cache_map(i, g, r, step, lengths_ref):
        # lax.div truncates; lengths are >= 0, so this is a ceil-div without a sign op.
        last_visible = jnp.maximum(jax.lax.div(lengths_ref[i] + block_k - 1, block_k) - 1, 0)
        return i, jnp.minimum(step, last_visible), g

    def new_map(i, g, r, step, lengths_ref):
        return i, jnp.maximum(step - prefix_blocks, 0), g

    def words_map(i, g, r, step, lengths_ref):
        return i, jnp.maximum(step - prefix_blocks, 0), 0, r, 0

    lane_width = hb * d
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(b, kv // hb, rows // block_q, prefix_blocks + new_blocks),
        in_specs=[
            pl.BlockSpec((None, None, hb, block_q, lane_width), lambda i, g, r, step, _: (i, g, 0, r, 0)),
            pl.BlockSpec((None, block_k, lane_width), cache_map),
            pl.BlockSpec((None, block_k, lane_width), cache_map),
            pl.BlockSpec((None, block_new, lane_width), new_map),
            pl.BlockSpec((None, block_new, lane_width), new_map),
            pl.BlockSpec((None, None, width, block_q, 1), words_map),
        ],
        out_specs=pl.BlockSpec((None, None, block_q, lane_width), lambda i, g, r, step, _: (i, g, r, 0)),
        scratch_shapes=[
            pltpu.VMEM((hb, block_q, _LANES), jnp.float32),
            pltpu.VMEM((hb, block_q, _LANES), jnp.float32),
            pltpu.VMEM((hb, block_q, lane_width), jnp.float32),
        ],
    )
    kernel = functools.partial(
        _kernel, scale=scale, head_dim=d, prefix_blocks=prefix_blocks, new_blocks=new_blocks
    )
    out = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((b, kv // hb, rows, lane_width), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
        name="tree_attention_tpu",
    )(lengths, q_lanes, k_cache, v_cache, k_new, v_new, words)
    return layout.unpack_query_rows(_gather_heads(out, kv, d), tq, h)
