"""The matmul layout XLA:CPU multiplies fastest, as an opt-in for params (`backend_layout`).

The model code multiplies by weights stored (out, in) with one plain contraction (`layers.dense`).
On CPU, XLA folds the transpose into the product and runs it about twice as slowly for the few rows
of a decode step, a verify block or a draft tree level; these weights take other forms:
  * up to FEW_ROWS rows, the product is computed as w @ x^T and transposed back behind an
    optimization barrier (which keeps XLA from folding the transpose back in), the rows padded to a
    multiple of ROW_BLOCK past PAD_ABOVE (6-7 or 9-15 rows multiply more slowly than 8 or 16);
  * the target's layers also keep (in, out) copies, by which blocks of several tokens per row
    (verify steps) multiply faster still, though one row (a decode step) multiplies more slowly.
Results are the same up to float rounding; the measurements behind these choices are in
results/dense_layout/ and results/row_padding/. Training keeps the plain form: under its vmap each
call sees only a slice of the rows it will run.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from eagle_jax.model.layers import LaidOutWeight

FEW_ROWS = 64  # at most this many rows take the w @ x^T form
ROW_BLOCK, PAD_ABOVE = 8, 5
# Blocks of fewer tokens per row than this multiply by the (in, out) copies. Prompts are padded to
# multiples of 64 tokens (`pad_prompts`), so a prefill keeps the stored form.
MAX_BLOCK_TOKENS = 64
PROJECTIONS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@struct.dataclass
class CpuWeight(LaidOutWeight):
    """w: (out, in) as stored; in_out: its (in, out) copy for blocks of tokens, or None."""

    w: jax.Array
    in_out: jax.Array | None = None

    def multiply(self, x: jax.Array, out_dtype=None) -> jax.Array:
        tokens = x.shape[-2] if x.ndim > 1 else 1
        if self.in_out is not None and 1 < tokens < MAX_BLOCK_TOKENS:
            return jnp.einsum("...i,io->...o", x, self.in_out, preferred_element_type=out_dtype)
        rows = math.prod(x.shape[:-1])
        if rows > FEW_ROWS:
            return jnp.einsum("...i,oi->...o", x, self.w, preferred_element_type=out_dtype)
        padded = rows if rows <= PAD_ABOVE else -(-rows // ROW_BLOCK) * ROW_BLOCK
        flat = jnp.pad(x.reshape(rows, x.shape[-1]), ((0, padded - rows), (0, 0)))
        product = jax.lax.dot_general(self.w, flat, (((1,), (1,)), ((), ())), preferred_element_type=out_dtype)  # (out, padded)
        return jax.lax.optimization_barrier(product)[:, :rows].T.reshape(*x.shape[:-1], self.w.shape[0])


def cpu_layout(params: dict, block_copies: bool = True) -> dict:
    """Target params ("layers") or draft-head params ("layer") with every projection, the fc and
    the lm_head (for a tied target, the embedding's) as CpuWeights; with `block_copies`, the target's
    layer projections also carry (in, out) copies (the projections' memory again: about 0.4 GB for
    SmolLM2-135M in float32). Params already laid out are returned as they are."""
    if any(isinstance(w, CpuWeight) for w in jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, CpuWeight))):
        return params

    def layer_weights(layer: dict, copies: bool) -> dict:
        return layer | {k: CpuWeight(layer[k], jnp.array(layer[k].T) if copies else None) for k in PROJECTIONS}

    laid_out = dict(params)
    if "layers" in params:
        laid_out["layers"] = [layer_weights(layer, block_copies) for layer in params["layers"]]
        laid_out["lm_head"] = CpuWeight(params.get("lm_head", params["embed"]))
    if "layer" in params:
        laid_out["layer"] = layer_weights(params["layer"], False)
        for key in ("fc", "lm_head"):
            if key in params:
                laid_out[key] = CpuWeight(params[key])
    return laid_out


def backend_layout(params: dict, block_copies: bool = True) -> dict:
    """Target or draft-head params laid out for the default backend: `cpu_layout` on CPU, unchanged
    elsewhere. Optional; the engine applies it. Decoding gives the same tokens either way."""
    return cpu_layout(params, block_copies) if jax.default_backend() == "cpu" else params
