"""Tree attention as a Pallas Mosaic GPU kernel for Hopper (sm90) and newer; contract in reference.py.

One program per (batch row, kv head, tile of packed GQA query rows), written with `plgpu.kernel`
(Pallas's `pallas_call` has no Mosaic GPU lowering in this JAX). The program copies its query tile
and the tile's per-row window starts into shared memory with TMA, then runs two pipelines
(`plgpu.emit_pipeline`, two stages, so the TMA copy of the next key block overlaps the products of
this one): the cached prefix from the block of the tile's first visible slot to the row's length
(a dynamic step count, so no block outside them is fetched), then the new keys under the bit-packed
ancestor mask. One online softmax runs over both, its state carried from the first pipeline into
the second.

The products run on wgmma with float32 accumulation. bfloat16 and float16 inputs go in as they are.
Hopper's wgmma takes float32 only as TF32 (10 mantissa bits), which would not be the reference's
result, so a float32 input is split into three bfloat16 parts (hi + mid + lo hold its 24 bits) and
each product summed over the six part pairs whose error is above float32's rounding; its pipelines
run one stage deep, and heads up to 128, to fit the parts in shared memory.

Block sizes: block_q = 64 query rows, the M of one warpgroup's wgmma and the smallest it takes;
block_k = block_new = 64 keys, the smallest K a 16-bit P @ V wgmma takes with 128-byte swizzle, so
that a short prefix or a small tree wastes little, while two stages of K and V blocks (64 x 128 x 2
bytes each) stay far inside Hopper's shared memory. The head size must be a multiple of 64 (the K
of Q @ K^T): 64, 128 and 256 are. Caches allocated in multiples of CACHE_BLOCK are never padded.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from eagle_jax.kernels_pallas import layout
from eagle_jax.kernels_pallas.layout import BITS_PER_WORD
from eagle_jax.kernels_pallas.reference import NEG_INF

CACHE_BLOCK = 64  # the default block_k: caches sized in multiples of it are never padded
WGMMA_TILE = 64  # wgmma's M, and the K step of 16-bit operands with 128-byte swizzle
# bf16x3 parts (i, j) of q.k and w.v whose products matter in float32: hi.hi, hi.mid, mid.hi,
# hi.lo, mid.mid, lo.hi (the three left out are below 2**-24 of the result)
F32_PART_PAIRS = ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))


MAX_FLOAT32_HEAD = 128  # float32's parts and blocks of larger heads do not fit Hopper's shared memory


def supports(head_dim: int, dtype=jnp.bfloat16) -> bool:
    """Whether the kernel takes heads of this size in this dtype."""
    return head_dim % WGMMA_TILE == 0 and (jnp.dtype(dtype) != jnp.float32 or head_dim <= MAX_FLOAT32_HEAD)


def _bf16_parts(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """float32 x as three bfloat16 parts whose float32 sum is x to 24 bits."""
    hi = x.astype(jnp.bfloat16)
    rest = x - hi.astype(jnp.float32)
    mid = rest.astype(jnp.bfloat16)
    return hi, mid, (rest - mid.astype(jnp.float32)).astype(jnp.bfloat16)


def _rows(x: jax.Array, shape: tuple[int, int]) -> jax.Array:
    """A (rows,) vector broadcast along the lanes of a (rows, n) tile."""
    return lax.broadcast_in_dim(x, shape, [0])


def _kernel(lengths_gmem, first_gmem, q_gmem, k_cache_gmem, v_cache_gmem, k_new_gmem, v_new_gmem, words_gmem,
            starts_gmem, out_gmem, q_smem, starts_smem, out_smem, barriers, *parts_scratch,
            scale: float, block_q: int, block_k: int, block_new: int, new_blocks: int, stages: int):
    b, head, tile = lax.axis_index("b"), lax.axis_index("kv"), lax.axis_index("r")
    rows = pl.ds(tile * block_q, block_q)
    length = lengths_gmem[b]
    first = first_gmem[b, tile] // block_k
    prefix_steps = jnp.maximum(lax.div(length + block_k - 1, block_k) - first, 0)
    split = bool(parts_scratch)  # float32 inputs: products over bfloat16 parts
    plgpu.copy_gmem_to_smem(starts_gmem.at[b, rows], starts_smem, barriers.at[0])
    # a float32 query tile lands in the output tile (free until the end) and is split from there
    plgpu.copy_gmem_to_smem(q_gmem.at[b, head, rows], out_smem if split else q_smem.at[0], barriers.at[1])
    plgpu.barrier_wait(barriers.at[0])
    plgpu.barrier_wait(barriers.at[1])
    if split:
        (parts_smem,) = parts_scratch
        for i, part in enumerate(_bf16_parts(out_smem[...])):
            q_smem.at[i][...] = part
        plgpu.commit_smem()
    pairs = F32_PART_PAIRS if split else ((0, 0),)

    def operands(ref):
        """The block as wgmma reads it: itself, or its bfloat16 parts (one buffer, for the keys and
        then the values: each product has finished when its accumulator is read)."""
        if not split:
            return [ref]
        for i, part in enumerate(_bf16_parts(ref[...])):
            parts_smem.at[i][...] = part
        plgpu.commit_smem()
        return [parts_smem.at[i] for i in range(3)]

    def attend(state, k_ref, v_ref, visible):
        acc, peak, total = state
        keys = operands(k_ref)

        def scores(acc_ref):
            for i, j in pairs:
                plgpu.wgmma(acc_ref, q_smem.at[i], keys[j].transpose((1, 0)))
            return acc_ref[...]

        s = jnp.where(visible, pl.run_scoped(scores, plgpu.ACC(visible.shape, jnp.float32)) * scale, NEG_INF)
        new_peak = jnp.maximum(peak, s.max(axis=1))
        rescale = jnp.exp(peak - new_peak)
        weights = jnp.where(visible, jnp.exp(s - _rows(new_peak, s.shape)), 0.0)
        total = total * rescale + weights.sum(axis=1)
        weight_parts = _bf16_parts(weights) if split else (weights.astype(q_smem.dtype),)
        values = operands(v_ref)

        def weighted_values(acc_ref):
            for i, j in pairs:
                plgpu.wgmma(acc_ref, weight_parts[i], values[j])
            return acc_ref[...]

        acc = acc * _rows(rescale, acc.shape) + pl.run_scoped(weighted_values, plgpu.ACC(acc.shape, jnp.float32))
        return acc, new_peak, total

    starts = _rows(starts_smem[...], (block_q, block_k))
    prefix_lane = lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def prefix_step(index, k_ref, v_ref, state):
        position = (first + index[0]) * block_k + prefix_lane
        return attend(state, k_ref, v_ref, (position < length) & (position >= starts))

    new_lane = lax.broadcasted_iota(jnp.int32, (block_q, block_new), 1)

    def new_step(index, k_ref, v_ref, words_ref, state):
        word = _rows(words_ref.at[0][...], (block_q, block_new))
        for i in range(1, words_ref.shape[0]):  # lane j reads word j // 32
            word = jnp.where(new_lane >= BITS_PER_WORD * i, _rows(words_ref.at[i][...], (block_q, block_new)), word)
        visible = ((word >> (new_lane & (BITS_PER_WORD - 1))) & 1) == 1
        return attend(state, k_ref, v_ref, visible)

    d = q_smem.shape[-1]
    state = (jnp.zeros((block_q, d), jnp.float32), jnp.full((block_q,), NEG_INF, jnp.float32), jnp.zeros((block_q,), jnp.float32))
    cache_block = pl.BlockSpec((block_k, d), lambda step: (first + step, 0))
    state = plgpu.emit_pipeline(prefix_step, grid=(prefix_steps,), in_specs=[cache_block, cache_block],
                                max_concurrent_steps=stages, init_carry=state)(k_cache_gmem.at[b, head], v_cache_gmem.at[b, head])
    new_block = pl.BlockSpec((None, block_new, None, d), lambda step: (b, step, head, 0))
    words_block = pl.BlockSpec((None, None, words_gmem.shape[2], block_q), lambda step: (b, step, 0, tile))
    state = plgpu.emit_pipeline(new_step, grid=(new_blocks,), in_specs=[new_block, new_block, words_block],
                                max_concurrent_steps=stages, init_carry=state)(k_new_gmem, v_new_gmem, words_gmem)
    acc, _, total = state
    out_smem[...] = (acc / _rows(jnp.where(total > 0.0, total, 1.0), acc.shape)).astype(out_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[b, head, rows])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_k", "block_new"))
def tree_attention_mosaic_gpu(
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
    block_k: int = CACHE_BLOCK,
    block_new: int = WGMMA_TILE,
) -> jax.Array:  # (B, Tq, H, D)
    """Pallas Mosaic GPU tree attention; same contract and result as `tree_attention_reference`.

    block_k (cache keys per pipeline step) and block_new (new keys per step) are multiples of 64 up
    to 256; D a multiple of 64 (`supports`). interpret: run in Mosaic GPU's interpreter (on CPU).
    """
    b, tq, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    tk, groups = k_new.shape[1], h // kv
    if not supports(d, q.dtype) or block_k % WGMMA_TILE or block_new % WGMMA_TILE:
        raise ValueError(f"the Mosaic GPU kernel needs D, block_k and block_new multiples of {WGMMA_TILE} (D <= {MAX_FLOAT32_HEAD} "
                         f"in float32), got D {d} in {jnp.dtype(q.dtype).name}, {block_k}, {block_new}")
    scale = d**-0.5 if scale is None else scale
    split = jnp.dtype(q.dtype) == jnp.float32
    block_q = WGMMA_TILE
    rows = layout.round_up(tq * groups, block_q)
    s_pad = layout.round_up(max(s, 1), block_k)  # an empty cache or block becomes one hidden block
    tk_pad = layout.round_up(max(tk, 1), block_new)
    new_blocks = tk_pad // block_new

    q_rows = layout.pack_query_rows(q, kv, rows)  # (B, KV, rows, D)
    k_cache, v_cache = (layout.pad_axis(x, 2, s_pad) for x in (k_cache, v_cache))
    k_new, v_new = (layout.pad_axis(x, 1, tk_pad) for x in (k_new, v_new))
    words = layout.pack_mask_words(block_mask, groups, rows, block_new, new_blocks)[..., 0]  # (B, nT, W, rows)
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, s)
    row_starts = layout.pack_query_starts(starts, b, tq, groups, rows)[..., 0]  # (B, rows)
    tile_first = row_starts.reshape(b, rows // block_q, block_q).min(-1)  # (B, tiles)

    operand = jnp.bfloat16 if split else q.dtype
    scratch = [plgpu.SMEM((3 if split else 1, block_q, d), operand), plgpu.SMEM((block_q,), jnp.int32),
               plgpu.SMEM((block_q, d), q.dtype), plgpu.Barrier(num_barriers=2)]
    if split:  # the bfloat16 parts of one key or value block
        scratch.append(plgpu.SMEM((3, max(block_k, block_new), d), operand))
    kernel = functools.partial(_kernel, scale=scale, block_q=block_q, block_k=block_k, block_new=block_new, new_blocks=new_blocks,
                               stages=1 if split else 2)
    out = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
        grid=(b, kv, rows // block_q),
        grid_names=("b", "kv", "r"),
        scratch_types=scratch,
        interpret=plgpu.InterpretGPUParams() if interpret else None,
    )(lengths, tile_first, q_rows, k_cache, v_cache, k_new, v_new, words, row_starts)
    return layout.unpack_query_rows(out, tq, h)
