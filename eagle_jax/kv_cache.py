"""Fixed-shape KV cache with per-row lengths."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class KVCache:
    """k, v: (layers, B, max_len, kv_heads, head_dim); lengths: (B,) int32 valid entries per row."""

    k: jax.Array
    v: jax.Array
    lengths: jax.Array

    @classmethod
    def zeros(cls, num_layers, batch, max_len, num_kv_heads, head_dim, dtype) -> "KVCache":
        shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))

    @classmethod
    def empty_prefix(cls, num_layers, batch, num_kv_heads, head_dim, dtype) -> "KVCache":
        """A zero-slot cache: attention sees no prefix (prefill from scratch, training)."""
        return cls.zeros(num_layers, batch, 0, num_kv_heads, head_dim, dtype)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write(self, k_new: jax.Array, v_new: jax.Array, num_new: jax.Array) -> "KVCache":
        """Write blocks (layers, B, T, KV, D) at each row's length and advance lengths by num_new (B,).

        Entries past num_new are written too but stay invisible (beyond the length) until
        overwritten. Callers keep lengths + T <= max_len for rows that are still running.
        """

        def write_row(cache_row, block_row, start):  # (L, S, KV, D), (L, T, KV, D), ()
            return jax.lax.dynamic_update_slice_in_dim(cache_row, block_row.astype(cache_row.dtype), start, axis=1)

        write = jax.vmap(write_row, in_axes=(1, 1, 0), out_axes=1)
        return KVCache(
            write(self.k, k_new, self.lengths),
            write(self.v, v_new, self.lengths),
            self.lengths + num_new.astype(jnp.int32),
        )

    def commit_path(self, k_block: jax.Array, v_block: jax.Array, path: jax.Array, num_accepted: jax.Array) -> "KVCache":
        """Append the tree nodes on an accepted path, contiguously.

        k_block, v_block: (layers, B, T, KV, D) of the verified tree; path: (B, P) node indices
        root first; num_accepted: (B,) how many of them (root included) to keep.
        """
        gather = jax.vmap(lambda blk, idx: blk[:, idx], in_axes=(1, 0), out_axes=1)
        return self.write(gather(k_block, path), gather(v_block, path), num_accepted)
