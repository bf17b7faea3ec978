"""The dtype of a run's weights, activations and caches: bfloat16 on GPU/TPU, float32 on CPU.

Accelerators decode in bfloat16 (half the bytes each step streams); on CPU bfloat16 is no faster
and greedy speculative output then drifts from plain output (docs/correctness.md), so CPU keeps
float32. Attention and logits accumulate in float32 whatever the dtype (`tree_attention_reference`,
the kernels, `transformer.lm_head`), so acceptance always compares float32 logits.

What remains in bfloat16 is the rounding of the activations between layers, which differs between
a verify block and a one-token step; at near-ties greedy speculative output then parts from plain
output (results/bf16-agreement/). `float32_activations` keeps bfloat16 weights but float32
activations and KV caches, which closes that gap.
"""

from __future__ import annotations

from eagle_jax.model.config import on_accelerator

DTYPE_NAMES = ("auto", "float32", "bfloat16")  # what --dtype takes


def dtype_name(name: str = "auto", platform: str | None = None) -> str:
    """"float32" or "bfloat16" for a --dtype value; "auto": bfloat16 on GPU/TPU, float32 elsewhere."""
    if name != "auto":
        return name
    return "bfloat16" if on_accelerator(platform) else "float32"


def run_dtype(dtype="auto", platform: str | None = None):
    """The jnp dtype for a --dtype name ("auto" as `dtype_name` resolves it) or a dtype itself."""
    import jax.numpy as jnp

    return jnp.dtype(dtype_name(dtype, platform) if isinstance(dtype, str) else dtype)


def float32_activations(params: dict) -> dict:
    """Target params whose activations and KV caches run in float32 over weights in their own dtype:
    the model computes in its embedding's dtype, so only the embedding (with tied embeddings, the
    lm_head too) is held in float32."""
    import jax.numpy as jnp

    return params | {"embed": params["embed"].astype(jnp.float32)}
