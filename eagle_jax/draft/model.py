"""Draft heads as pure functions over a params pytree.

params (eagle1) = {"fc": (d, 2d), ["fc_bias": (d,)], "layer": L}
params (eagle3) = {"fc": (d, 3*dt), ["fc_norm": (3, dt)] | ["fc_pre_norm": (3*dt,)], "layer": L,
                   "final_norm": (d,), "lm_head": (Vd, d), "d2t": (Vd,) int32, ["embed": (V, d)]}
L = {["input_norm": (d,), "hidden_norm": (d,)] (eagle3), "wq": (H*Dh, a), "wk": (KV*Dh, a),
     "wv": (KV*Dh, a), "wo": (d, H*Dh), ["q_norm": (Dh,), "k_norm": (Dh,)] (Qwen3-style layer),
     "mlp_norm": (d,), "w_gate", "w_up", "w_down"}
with a = d for eagle1 and a = 2d for eagle3. Matrices are (out, in), as the checkpoints store them. The embedding (and for eagle1 the lm_head) are the
target's own, frozen: they are read from the target params, never stored in the head. The one
exception is an eagle3 head narrower than its target (d != dt): the target's (V, dt) embedding does
not fit it, so such a head carries its own (V, d) "embed", as in the reference implementation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.model import transformer as target_model
from eagle_jax.draft.config import DraftConfig
from eagle_jax.model.attention import cache_slots
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.model.layers import dense, gated_mlp, rms_norm, rope_inverse_frequencies, self_attention


class DraftOutput(NamedTuple):
    logits: jax.Array  # (B, T, Vd) float32 over the draft vocabulary
    hidden: jax.Array  # (B, T, d) the hidden fed to the next draft step
    k_new: jax.Array  # (1, B, T, KV, Dh)
    v_new: jax.Array  # (1, B, T, KV, Dh)


def make_draft_cache(dcfg: DraftConfig, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
    """An empty draft cache of max_len usable slots per row (allocated as `cache_slots` says)."""
    return KVCache.zeros(1, batch, cache_slots(max_len, dcfg.attention), dcfg.num_kv_heads, dcfg.head_dim, dtype)


def project_features(dparams: dict, dcfg: DraftConfig, target_out: target_model.ForwardOutput) -> jax.Array:
    """The (B, T, d) hidden the draft consumes at context positions, from a target forward.

    eagle1: the target's final post-norm hidden (the fc over [embed, feature] runs inside the step).
    eagle3: fc over the concatenated low/mid/high captured states (each RMS-normed first with fc_norm).
    """
    if dcfg.kind == "eagle1":
        return target_out.hidden
    feats = target_out.captured  # (3, B, T, dt)
    if dcfg.fc_norm:
        feats = jax.vmap(lambda f, w: rms_norm(f, w, dcfg.rms_norm_eps))(feats, dparams["fc_norm"])
    fused = jnp.concatenate(list(feats), axis=-1)  # (B, T, 3*dt), low first
    if dcfg.norm_before_fc:
        fused = rms_norm(fused, dparams["fc_pre_norm"], dcfg.rms_norm_eps)
    return dense(fused, dparams["fc"])


def draft_forward(
    dparams: dict,
    dcfg: DraftConfig,
    target_params: dict,
    hidden: jax.Array,  # (B, T, d) projected target features, or the draft's own previous hidden
    tokens: jax.Array,  # (B, T) int32 target-vocabulary ids paired with `hidden`
    positions: jax.Array,  # (B, T) int32 draft positions
    cache: KVCache,  # the draft's own context cache (1 layer)
    block_mask: jax.Array,  # (B, T, E + T) bool over extra_kv then the T new keys
    extra_kv: tuple[jax.Array, jax.Array] | None = None,  # (B, E, KV, Dh) earlier tree levels
) -> DraftOutput:
    """One pass of the draft decoder layer over T tokens (context positions or tree nodes), read out
    at every one of them."""
    h, k, v = draft_layer(dparams, dcfg, target_params, hidden, tokens, positions, cache, block_mask, extra_kv)
    logits, next_hidden = draft_readout(dparams, dcfg, target_params, h)
    return DraftOutput(logits, next_hidden, k[None], v[None])


def draft_layer(dparams, dcfg, target_params, hidden, tokens, positions, cache, block_mask, extra_kv=None):
    """The decoder layer of `draft_forward` alone: (h (B, T, d), k_new, v_new (B, T, KV, Dh))."""
    p = dparams["layer"]
    eps = dcfg.rms_norm_eps
    embed = dparams.get("embed", target_params["embed"])[tokens].astype(hidden.dtype)
    if dcfg.kind == "eagle1":
        x = dense(jnp.concatenate([embed, hidden], axis=-1), dparams["fc"])
        if "fc_bias" in dparams:
            x = x + dparams["fc_bias"]
        residual, attn_in = x, x  # the EAGLE-1 layer has no input norm
    else:
        normed_hidden = rms_norm(hidden, p["hidden_norm"], eps)
        attn_in = jnp.concatenate([rms_norm(embed, p["input_norm"], eps), normed_hidden], axis=-1)
        residual = normed_hidden if dcfg.norm_before_residual else hidden
    a, k, v = self_attention(
        attn_in, p, positions, cache.k[0], cache.v[0], cache.lengths, block_mask,
        num_heads=dcfg.num_heads, num_kv_heads=dcfg.num_kv_heads, head_dim=dcfg.head_dim,
        inv_freq=rope_inverse_frequencies(dcfg.rope, dcfg.head_dim), eps=eps, extra_kv=extra_kv, attention=dcfg.attention,
    )
    h = residual + a
    return h + gated_mlp(rms_norm(h, p["mlp_norm"], eps), p), k, v


def draft_readout(dparams: dict, dcfg: DraftConfig, target_params: dict, h: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logits (..., Vd) float32, the hidden fed to the next draft step (..., d)) from the layer's h."""
    if dcfg.kind == "eagle1":
        return target_model.lm_head(target_params, h), h
    normed = rms_norm(h, dparams["final_norm"], dcfg.rms_norm_eps)
    logits = dense(normed, dparams["lm_head"], out_dtype=jnp.float32)
    return logits, normed if dcfg.norm_output else h


def draft_to_target_ids(dparams: dict, dcfg: DraftConfig, draft_ids: jax.Array) -> jax.Array:
    """Map draft-vocabulary ids to target ids: target = draft + d2t[draft] (identity when equal)."""
    if not dcfg.maps_vocab:
        return draft_ids
    return draft_ids + dparams["d2t"][draft_ids]


def init_draft_params(rng: jax.Array, dcfg: DraftConfig, dtype=jnp.float32, scale: float = 0.02) -> dict:
    """Random head (normal(0, scale) matrices, unit norms, identity vocabulary map)."""
    d, f, dt = dcfg.hidden_size, dcfg.intermediate_size, dcfg.target_hidden_size
    attn_in = d if dcfg.kind == "eagle1" else 2 * d
    q, kv = dcfg.num_heads * dcfg.head_dim, dcfg.num_kv_heads * dcfg.head_dim
    shapes = {"wq": (q, attn_in), "wk": (kv, attn_in), "wv": (kv, attn_in), "wo": (d, q),
              "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
    keys = iter(jax.random.split(rng, len(shapes) + 2))
    normal = lambda shape: (scale * jax.random.normal(next(keys), shape)).astype(dtype)  # noqa: E731
    layer = {name: normal(shape) for name, shape in shapes.items()}
    layer["mlp_norm"] = jnp.ones((d,), dtype)
    if dcfg.kind == "eagle1":
        params = {"fc": normal((d, 2 * d)), "layer": layer}
        if dcfg.fc_bias:
            params["fc_bias"] = jnp.zeros((d,), dtype)
        return params
    layer["input_norm"] = jnp.ones((d,), dtype)
    layer["hidden_norm"] = jnp.ones((d,), dtype)
    params = {
        "fc": normal((d, len(dcfg.feature_layers) * dt)),
        "layer": layer,
        "final_norm": jnp.ones((d,), dtype),
        "lm_head": normal((dcfg.draft_vocab_size, d)),
        "d2t": jnp.zeros((dcfg.draft_vocab_size,), jnp.int32),
    }
    if dcfg.fc_norm:
        params["fc_norm"] = jnp.ones((len(dcfg.feature_layers), dt), dtype)
    if dcfg.norm_before_fc:
        params["fc_pre_norm"] = jnp.ones((len(dcfg.feature_layers) * dt,), dtype)
    if d != dt:  # own embedding, from a key apart so the other weights stay as they were
        embed_key = jax.random.fold_in(rng, len(shapes) + 2)
        params["embed"] = (scale * jax.random.normal(embed_key, (dcfg.target_vocab_size, d))).astype(dtype)
    return params
