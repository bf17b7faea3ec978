"""Assemble the params pytree from per-layer weights, matrices (out, in) as checkpoints store them,
and place it: tensor by tensor, each device receiving only its own slice.

Loaders hand over each weight as a `HostTensor` (its shape, and how to read it as float32 on the
host), so that no more than one tensor is ever read at a time and none is read twice. For the
scanned layer form (`transformer.stack_layers`), `stack_sources` groups each weight of every layer
into a `HostStack`, which is placed as one (L, ...) array written layer by layer in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from eagle_jax.model.config import ModelConfig
from eagle_jax.errors import EagleError

LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


@dataclasses.dataclass(frozen=True)
class HostTensor:
    """A weight not read yet: `read()` returns it as a numpy array of `shape` (in the file's dtype,
    or float32 where it is dequantized)."""

    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, array: np.ndarray) -> "HostTensor":
        return cls(tuple(array.shape), lambda: array)


@dataclasses.dataclass(frozen=True)
class HostStack:
    """One weight of every layer (HostTensors of equal shape), placed as a single (L, ...) array."""

    layers: tuple[HostTensor, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.layers),) + self.layers[0].shape

    @property
    def ndim(self) -> int:
        return len(self.shape)


def stack_sources(params: dict) -> dict:
    """Params of HostTensors with their layers grouped as the stacked form has them: one HostStack per
    weight (nothing is read)."""
    layers = params["layers"]
    return params | {"layers": {key: HostStack(tuple(layer[key] for layer in layers)) for key in layers[0]}}


def _layer_sharding(sharding):
    """The sharding of one layer of a stacked array split as `sharding` (its layer axis whole)."""
    if sharding is None:
        return None
    if not isinstance(sharding, NamedSharding) or (sharding.spec and sharding.spec[0] is not None):
        raise EagleError(f"stacked layers are placed with a NamedSharding whose layer axis is whole, got {sharding}")
    return NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec[1:]))


def materialize(tree, dtype, shardings=None) -> object:
    """jax arrays of a pytree of HostTensors and HostStacks, one tensor read (and cast to dtype) on
    the host at a time. shardings (a pytree of jax shardings, the tree's structure): each device
    receives only its slice, through jax.make_array_from_callback; None: the default device. A
    HostStack's array is allocated once and each layer written into it in place (the buffer
    donated), so its devices hold the stack and one layer's slice at most."""
    np_dtype = jnp.dtype(dtype)

    def put(source: HostTensor, sharding=None):
        host = source.read()
        if tuple(host.shape) != source.shape:
            raise EagleError(f"a weight read as {tuple(host.shape)}, its file declares {source.shape}")
        host = host.astype(np_dtype, copy=False)
        if sharding is None:
            return jnp.asarray(host)
        return jax.make_array_from_callback(source.shape, sharding, lambda index: host[index])

    def put_stack(source: HostStack, sharding=None):
        per_layer = _layer_sharding(sharding)
        on = {} if sharding is None else {"out_shardings": sharding}
        stacked = jax.jit(lambda: jnp.zeros(source.shape, np_dtype), **on)()
        write = jax.jit(lambda s, layer, i: jax.lax.dynamic_update_index_in_dim(s, layer, i, 0), donate_argnums=0, **on)
        for i, layer in enumerate(source.layers):
            stacked = write(stacked, put(layer, per_layer), i)
        return stacked

    def place(source, sharding=None):
        return put_stack(source, sharding) if isinstance(source, HostStack) else put(source, sharding)

    is_leaf = lambda x: isinstance(x, (HostTensor, HostStack))  # noqa: E731
    if shardings is None:
        return jax.tree.map(place, tree, is_leaf=is_leaf)
    return jax.tree.map(place, tree, shardings, is_leaf=is_leaf)


def layer_keys(cfg: ModelConfig) -> tuple[str, ...]:
    keys = LAYER_KEYS
    if cfg.qkv_bias:
        keys += ("bq", "bk", "bv")
    if cfg.qk_norm:
        keys += ("q_norm", "k_norm")
    if cfg.sandwich_norms:
        keys += ("post_attn_norm", "post_mlp_norm")
    return keys


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer shape of each weight, matrices (out, in)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "attn_norm": (d,), "mlp_norm": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q),
        "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f), "bq": (q,), "bk": (kv,), "bv": (kv,),
        "q_norm": (cfg.head_dim,), "k_norm": (cfg.head_dim,), "post_attn_norm": (d,), "post_mlp_norm": (d,),
    }


def assemble_params(cfg: ModelConfig, embed, final_norm, lm_head, layers: list[dict], source: str) -> dict:
    """Check shapes and arrange per-layer HostTensors into the model's params pytree (nothing is read)."""
    shapes = expected_shapes(cfg)

    def check(name, tensor: HostTensor, shape):
        if tuple(tensor.shape) != tuple(shape):
            raise EagleError(f"{source}: weight {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
        return tensor

    if len(layers) != cfg.num_layers:
        raise EagleError(f"{source}: found {len(layers)} layers, config says {cfg.num_layers}")
    checked = []
    for i, layer in enumerate(layers):
        missing = [key for key in layer_keys(cfg) if key not in layer]
        if missing:
            raise EagleError(f"{source}: weight {missing[0]!r} missing in layer {i}")
        checked.append({key: check(f"layers.{i}.{key}", layer[key], shapes[key]) for key in layer_keys(cfg)})
    params = {
        "embed": check("embed", embed, (cfg.vocab_size, cfg.hidden_size)),
        "layers": checked,
        "final_norm": check("final_norm", final_norm, (cfg.hidden_size,)),
    }
    if not cfg.tie_embeddings:
        if lm_head is None:
            raise EagleError(f"{source}: no lm_head weight and embeddings are not tied")
        params["lm_head"] = check("lm_head", lm_head, (cfg.vocab_size, cfg.hidden_size))
    return params
