"""Fixed-shape KV cache with per-row lengths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
    """k, v: one (B, kv_heads, max_len, head_dim) array per layer, head-major (the layout `attend`
    reads), or, for a model whose layers are scanned over (`transformer.stack_layers`), one stacked
    (layers, B, kv_heads, max_len, head_dim) array; lengths: (B,) int32 valid entries per row. New
    blocks come token-major, (layers, B, T, KV, D), as the projections produce them, and are
    transposed on write.

    Separate arrays where the layers are unrolled: XLA:CPU copied each layer's slice of a stacked
    cache before attending over it (results/attention_layout/)."""

    k: tuple[jax.Array, ...] | jax.Array
    v: tuple[jax.Array, ...] | jax.Array
    lengths: jax.Array

    @property
    def stacked(self) -> bool:
        return not isinstance(self.k, tuple)

    @classmethod
    def zeros(cls, num_layers, batch, max_len, num_kv_heads, head_dim, dtype, stacked: bool = False) -> "KVCache":
        shape = (batch, num_kv_heads, max_len, head_dim)

        def layers():
            if stacked:
                return jnp.zeros((num_layers, *shape), dtype)
            return tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))

        return cls(layers(), layers(), jnp.zeros((batch,), jnp.int32))

    @classmethod
    def empty_prefix(cls, num_layers, batch, num_kv_heads, head_dim, dtype, stacked: bool = False) -> "KVCache":
        """A zero-slot cache: attention sees no prefix (prefill from scratch, training)."""
        return cls.zeros(num_layers, batch, 0, num_kv_heads, head_dim, dtype, stacked)

    def write(self, k_new: jax.Array, v_new: jax.Array, num_new: jax.Array) -> "KVCache":
        """Write blocks (layers, B, T, KV, D) at each row's length and advance lengths by num_new (B,).

        Entries past num_new are written too but stay invisible (beyond the length) until
        overwritten. Callers keep lengths + T <= max_len for rows that are still running.
        """

        def write_row(cache_row, block_row, start):  # (KV, S, D), (T, KV, D), ()
            block_row = block_row.swapaxes(0, 1).astype(cache_row.dtype)  # (KV, T, D)
            return jax.lax.dynamic_update_slice_in_dim(cache_row, block_row, start, axis=1)

        def write_layer(layer, block):  # (B, KV, S, D), (B, T, KV, D)
            return jax.vmap(write_row)(layer, block, self.lengths)

        def write(layers, blocks):
            if self.stacked:
                return jax.vmap(write_layer)(layers, blocks)
            return tuple(write_layer(layer, block) for layer, block in zip(layers, blocks))

        return KVCache(write(self.k, k_new), write(self.v, v_new), self.lengths + num_new.astype(jnp.int32))

    def commit_path(self, k_block: jax.Array, v_block: jax.Array, path: jax.Array, num_accepted: jax.Array) -> "KVCache":
        """Append the tree nodes on an accepted path, contiguously.

        k_block, v_block: (layers, B, T, KV, D) of the verified tree; path: (B, P) node indices
        root first; num_accepted: (B,) how many of them (root included) to keep.
        """
        gather = jax.vmap(lambda blk, idx: blk[:, idx], in_axes=(1, 0), out_axes=1)
        return self.write(gather(k_block, path), gather(v_block, path), num_accepted)
