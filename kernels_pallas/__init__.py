"""Tree attention: the jnp reference and its Pallas kernels for GPU (Mosaic GPU for Hopper and
newer, Triton before it) and TPU (Mosaic)."""

from eagle_jax.kernels_pallas.reference import tree_attention_reference
from eagle_jax.kernels_pallas.tree_attention_gpu import tree_attention_gpu
from eagle_jax.kernels_pallas.tree_attention_mosaic_gpu import tree_attention_mosaic_gpu
from eagle_jax.kernels_pallas.tree_attention_tpu import tree_attention_tpu

__all__ = ["tree_attention_gpu", "tree_attention_mosaic_gpu", "tree_attention_reference", "tree_attention_tpu"]
