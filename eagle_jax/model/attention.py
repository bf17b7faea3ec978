"""The one attention entry point: prefix-by-length plus a masked block of new keys.

Every attention call of target and draft goes through `attend`, which runs the implementation
that the model's config names (`ModelConfig.attention`, `DraftConfig.attention`):
  * "xla": the jnp reference (kernels_pallas/reference.py), the oracle and the CPU path;
  * "pallas": the Pallas tree-attention kernel for the current backend (GPU or TPU);
  * "pallas_interpret": the Pallas kernel in interpret mode (CPU testing);
  * "auto": Pallas on GPU/TPU, XLA elsewhere.
"""

from __future__ import annotations

import jax

from eagle_jax.kernels_pallas.reference import tree_attention_reference
from eagle_jax.model.config import check_attention


def resolve_impl(impl: str, platform: str | None = None) -> str:
    """Map "auto" to a concrete implementation for `platform` (default: jax's default backend)."""
    check_attention(impl)
    if impl != "auto":
        return impl
    platform = platform or jax.default_backend()
    return "pallas" if platform in ("gpu", "cuda", "tpu") else "xla"


def attend(q, k_cache, v_cache, lengths, k_new, v_new, block_mask, *, impl: str = "auto") -> jax.Array:
    """Attention of q (B, Tq, H, D) over cache keys below lengths (B,) and new keys under block_mask.

    Shapes as in `tree_attention_reference`. Returns (B, Tq, H, D).
    """
    impl = resolve_impl(impl)
    if impl == "xla":
        return tree_attention_reference(q, k_cache, v_cache, lengths, k_new, v_new, block_mask)
    from eagle_jax import kernels_pallas

    platform = "cpu" if impl == "pallas_interpret" else jax.default_backend()
    kernel = kernels_pallas.tree_attention_tpu if platform == "tpu" else kernels_pallas.tree_attention_gpu
    return kernel(q, k_cache, v_cache, lengths, k_new, v_new, block_mask, interpret=impl == "pallas_interpret")
