"""The one attention entry point: prefix-by-length plus a masked block of new keys.

Every attention call of target and draft goes through `attend`, which runs the implementation
that the model's config names (`ModelConfig.attention`, `DraftConfig.attention`):
  * "xla": the jnp reference (kernels_pallas/reference.py), the oracle and the CPU path;
  * "pallas": the Pallas tree-attention kernel for the current backend: on TPU the Mosaic TPU one;
    on a GPU the Mosaic GPU one on Hopper and newer (for head sizes that are multiples of 64),
    else the Triton one;
  * "pallas_mosaic_gpu", "pallas_triton": one GPU kernel by name (to compare them);
  * "pallas_mosaic_gpu_interpret", "pallas_gpu_interpret" (Triton), "pallas_tpu_interpret": a
    kernel in interpret mode (CPU testing);
  * "auto": Pallas on GPU/TPU, XLA elsewhere.
Pallas's Triton backend is deprecated since JAX 0.11; its kernel stays the fallback for GPUs before
Hopper for as long as JAX ships the backend.

On a mesh with a "model" axis (decoding traced under the mesh, `eagle_jax.model.sharding`), a
Pallas kernel runs under shard_map: each device attends with its own query heads over its own KV
heads, and nothing is gathered. That needs the model axis to divide the KV heads; where it does
not (the KV heads are then replicated), "auto" falls back to XLA and a named kernel is refused.

Caches are allocated with `cache_slots`, rounded up to the kernel's cache block, so that no
kernel call pads (copies) a cache.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import PartitionSpec

from eagle_jax.errors import EagleError
from eagle_jax.kernels_pallas.layout import round_up
from eagle_jax.kernels_pallas.reference import tree_attention_reference
from eagle_jax.model.config import check_attention, on_accelerator

MODEL_AXIS = "model"  # the inference mesh's tensor-parallel axis (`eagle_jax.mesh.INFERENCE_AXES`)
# implementation name -> (kernel, interpreted); "pallas" is resolved by `kernel_backend`
KERNELS = {"pallas_mosaic_gpu": ("mosaic_gpu", False), "pallas_triton": ("triton", False),
           "pallas_mosaic_gpu_interpret": ("mosaic_gpu", True), "pallas_gpu_interpret": ("triton", True),
           "pallas_tpu_interpret": ("tpu", True)}
HOPPER = 9.0  # the first compute capability with wgmma and TMA


def resolve_impl(impl: str, platform: str | None = None) -> str:
    """Map "auto" to a concrete implementation for `platform` (default: jax's default backend)."""
    check_attention(impl)
    if impl != "auto":
        return impl
    return "pallas" if on_accelerator(platform) else "xla"


def kernel_backend(impl: str, head_dim: int | None = None, dtype=None) -> str:
    """Which kernel ("mosaic_gpu", "triton" or "tpu") a resolved Pallas implementation runs for
    heads of `head_dim` in `dtype` (None: the GPU kernel the device would take for some heads)."""
    if impl in KERNELS:
        return KERNELS[impl][0]
    device = jax.devices()[0]
    if device.platform == "tpu":
        return "tpu"
    from eagle_jax.kernels_pallas.tree_attention_mosaic_gpu import supports

    hopper = float(getattr(device, "compute_capability", 0) or 0) >= HOPPER
    return "mosaic_gpu" if hopper and (head_dim is None or supports(head_dim, dtype or "bfloat16")) else "triton"


def _kernel(impl: str, backend: str):
    """(kernel function, cache block) of a resolved Pallas implementation on `backend` (`kernel_backend`'s
    answer); the kernels load lazily."""
    interpret = KERNELS.get(impl, (None, False))[1]
    if backend == "tpu":
        from eagle_jax.kernels_pallas.tree_attention_tpu import CACHE_BLOCK, tree_attention_tpu as kernel
    elif backend == "mosaic_gpu":
        from eagle_jax.kernels_pallas.tree_attention_mosaic_gpu import CACHE_BLOCK, tree_attention_mosaic_gpu as kernel
    else:
        from eagle_jax.kernels_pallas.tree_attention_gpu import CACHE_BLOCK, tree_attention_gpu as kernel
    return functools.partial(kernel, interpret=interpret), CACHE_BLOCK


def cache_slots(slots: int, impl: str) -> int:
    """How many slots to allocate for a cache of `slots`: a multiple of the kernel's cache block
    under Pallas, so that the kernel never pads it; `slots` itself under XLA."""
    impl = resolve_impl(impl)
    return slots if impl == "xla" else round_up(slots, _kernel(impl, kernel_backend(impl))[1])


def model_shards() -> int:
    """Size of the "model" axis of the mesh being traced under, where it is not already manual."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MODEL_AXIS not in mesh.axis_names or MODEL_AXIS in mesh.manual_axes:
        return 1
    return int(mesh.shape[MODEL_AXIS])


def mesh_impl(impl: str, kv_heads: int, shards: int, platform: str | None = None) -> str:
    """The implementation to run on `shards` model shards: "auto" resolved for `platform`, falling
    back to XLA where the shards do not split the KV heads; a named kernel there is an EagleError."""
    resolved = resolve_impl(impl, platform)
    if resolved == "xla" or kv_heads % shards == 0:
        return resolved
    if impl == "auto":
        return "xla"
    raise EagleError(f"attention {impl!r} on a model axis of {shards} needs the axis to divide the {kv_heads} KV heads; "
                     "use --attention xla (or auto) or a model size that divides them")


def attend(q, k_cache, v_cache, lengths, k_new, v_new, block_mask, starts=None, *, scale: float | None = None,
           impl: str = "auto") -> jax.Array:
    """Attention of q (B, Tq, H, D) over cache keys from starts (B, Tq) (None: 0) below lengths (B,)
    and new keys under block_mask, scores scaled by `scale` (None: D ** -0.5).

    Shapes as in `tree_attention_reference`. Returns (B, Tq, H, D).
    """
    shards = model_shards()
    impl = mesh_impl(impl, k_cache.shape[1], shards)
    args = (q, k_cache, v_cache, lengths, k_new, v_new, block_mask) + (() if starts is None else (starts,))
    if impl == "xla":
        return tree_attention_reference(*args, scale=scale)
    backend = kernel_backend(impl, q.shape[-1], q.dtype)
    if backend == "mosaic_gpu":
        from eagle_jax.kernels_pallas.tree_attention_mosaic_gpu import MAX_FLOAT32_HEAD, WGMMA_TILE, supports

        if not supports(q.shape[-1], q.dtype):
            raise EagleError(f"attention {impl!r} needs a head size that is a multiple of {WGMMA_TILE} (at most {MAX_FLOAT32_HEAD} "
                             f"in float32), the model's is {q.shape[-1]} in {q.dtype}; use --attention pallas_triton, xla or auto")
    kernel = functools.partial(_kernel(impl, backend)[0], scale=scale)
    if shards == 1:
        return kernel(*args)
    heads, cache, whole = PartitionSpec(None, None, MODEL_AXIS), PartitionSpec(None, MODEL_AXIS), PartitionSpec()
    specs = (heads, cache, cache, whole, heads, heads, whole, whole)[: len(args)]
    on_shards = jax.shard_map(kernel, in_specs=specs, out_specs=heads, axis_names={MODEL_AXIS}, check_vma=False)
    return on_shards(*args)
