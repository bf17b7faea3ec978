"""Assemble the stacked params pytree from per-layer weights in our (in, out) orientation."""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from eagle_jax.config import ModelConfig
from eagle_jax.errors import EagleError

LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def layer_keys(cfg: ModelConfig) -> tuple[str, ...]:
    keys = LAYER_KEYS
    if cfg.qkv_bias:
        keys += ("bq", "bk", "bv")
    if cfg.qk_norm:
        keys += ("q_norm", "k_norm")
    return keys


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer shape of each weight, (in, out) orientation."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "attn_norm": (d,), "mlp_norm": (d,), "wq": (d, q), "wk": (d, kv), "wv": (d, kv), "wo": (q, d),
        "w_gate": (d, f), "w_up": (d, f), "w_down": (f, d), "bq": (q,), "bk": (kv,), "bv": (kv,),
        "q_norm": (cfg.head_dim,), "k_norm": (cfg.head_dim,),
    }


def assemble_params(cfg: ModelConfig, embed, final_norm, lm_head, layers: list[dict], dtype, source: str) -> dict:
    """Check shapes and stack per-layer numpy weights into the model's params pytree."""
    shapes = expected_shapes(cfg)

    def check(name, array, shape):
        if tuple(array.shape) != tuple(shape):
            raise EagleError(f"{source}: weight {name} has shape {tuple(array.shape)}, expected {tuple(shape)}")
        return array

    if len(layers) != cfg.num_layers:
        raise EagleError(f"{source}: found {len(layers)} layers, config says {cfg.num_layers}")
    stacked = {}
    for key in layer_keys(cfg):
        missing = [i for i, layer in enumerate(layers) if key not in layer]
        if missing:
            raise EagleError(f"{source}: weight {key!r} missing in layer {missing[0]}")
        stacked[key] = jnp.asarray(
            np.stack([check(f"layers.{i}.{key}", layer[key], shapes[key]) for i, layer in enumerate(layers)]), dtype
        )
    params = {
        "embed": jnp.asarray(check("embed", embed, (cfg.vocab_size, cfg.hidden_size)), dtype),
        "layers": stacked,
        "final_norm": jnp.asarray(check("final_norm", final_norm, (cfg.hidden_size,)), dtype),
    }
    if not cfg.tie_embeddings:
        if lm_head is None:
            raise EagleError(f"{source}: no lm_head weight and embeddings are not tied")
        params["lm_head"] = jnp.asarray(check("lm_head", lm_head, (cfg.hidden_size, cfg.vocab_size)), dtype)
    return params
