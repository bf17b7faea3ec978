"""Assemble the params pytree from per-layer weights, matrices (out, in) as checkpoints store them."""

from __future__ import annotations

import jax.numpy as jnp

from eagle_jax.model.config import ModelConfig
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
    """Per-layer shape of each weight, matrices (out, in)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {
        "attn_norm": (d,), "mlp_norm": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q),
        "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f), "bq": (q,), "bk": (kv,), "bv": (kv,),
        "q_norm": (cfg.head_dim,), "k_norm": (cfg.head_dim,),
    }


def assemble_params(cfg: ModelConfig, embed, final_norm, lm_head, layers: list[dict], dtype, source: str) -> dict:
    """Check shapes and turn per-layer numpy weights into the model's params pytree."""
    shapes = expected_shapes(cfg)

    def check(name, array, shape):
        if tuple(array.shape) != tuple(shape):
            raise EagleError(f"{source}: weight {name} has shape {tuple(array.shape)}, expected {tuple(shape)}")
        return jnp.asarray(array, dtype)

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
