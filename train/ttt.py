"""The draft head unrolled for training: EAGLE-3 training-time test (TTT) and the EAGLE-1 pass.

Step 0 is the ordinary causal pass over the sequence: at position t the draft reads the projected
target feature of t and the token x_{t+1}. Step k >= 1 at position t is the depth-k node of the draft
chain rooted at t, exactly as at inference:
  * hidden: step k-1's output at t (pre-norm h, or the post-norm one with norm_output);
  * token: the ground-truth x_{t+k+1} (teacher forcing, as the reference);
  * RoPE position: t + k, for the query and the new key;
  * attention: the step-0 keys 0..t (the causal context) plus the keys of steps 1..k at the same
    position t (the chain's ancestors and itself), one float32 softmax over both.
Every step is `draft_forward` itself, so training and inference share one layer. Steps k >= 1 are
vmapped over t: per position the context is the step-0 keys by length (t + 1, the draft cache of
inference) and the chain is `extra_kv`, i.e. the per-position "diagonal" scores concatenated to the
causal ones. Memory stays O(T^2 + k*T) per step, as with the reference's diagonal einsum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import draft_forward
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.model.transformer import causal_mask
from eagle_jax.train.losses import shift_left

TRAINING_ATTENTION = "xla"


def for_training(cfg):
    """A target or draft config whose attention training can differentiate: the Pallas kernels
    define no VJP, so training (draft and target features alike) runs the jnp attention."""
    return dataclasses.replace(cfg, attention=TRAINING_ATTENTION)


class StepOutput(NamedTuple):
    logits: jax.Array  # (B, T, Vd) float32
    hidden: jax.Array  # (B, T, d) fed to the next step


def chain_step(
    dparams: dict,
    dcfg: DraftConfig,
    target_params: dict,
    hidden: jax.Array,  # (B, T, d) previous step's output
    tokens: jax.Array,  # (B, T) int32, x_{t+k+1} at position t
    positions: jax.Array,  # (B, T) int32, t + k
    context: tuple[jax.Array, jax.Array],  # step-0 keys, values (B, T, KV, Dh)
    chain: tuple[jax.Array, jax.Array],  # keys, values of steps 1..k-1 (B, T, k-1, KV, Dh)
) -> tuple[StepOutput, jax.Array, jax.Array]:
    """TTT step k >= 1 at every position. Returns (output, k_new, v_new (B, T, KV, Dh))."""
    batch = tokens.shape[0]
    num_chain = chain[0].shape[2]
    context_k, context_v = ((x.swapaxes(1, 2),) for x in context)  # one cache layer, (B, KV, T, Dh)

    def at_position(h, token, position, length, chain_k, chain_v):  # (B, d), (B,), (B,), (), (B, k-1, KV, Dh) x2
        cache = KVCache(context_k, context_v, jnp.full((batch,), length, jnp.int32))
        mask = jnp.ones((batch, 1, num_chain + 1), bool)
        extra = (chain_k, chain_v) if num_chain else None
        out = draft_forward(dparams, for_training(dcfg), target_params, h[:, None], token[:, None], position[:, None], cache, mask, extra)
        return out.logits[:, 0], out.hidden[:, 0], out.k_new[0, :, 0], out.v_new[0, :, 0]

    lengths = jnp.arange(1, tokens.shape[1] + 1, dtype=jnp.int32)  # position t sees context keys 0..t
    logits, next_hidden, k, v = jax.vmap(at_position, in_axes=(1, 1, 1, 0, 1, 1), out_axes=1)(hidden, tokens, positions, lengths, *chain)
    return StepOutput(logits, next_hidden), k, v


def unroll(
    dparams: dict,
    dcfg: DraftConfig,
    target_params: dict,
    hidden: jax.Array,  # (B, T, d) projected target features (`project_features`)
    tokens: jax.Array,  # (B, T) int32 the sequence x_0 .. x_{T-1}
    num_steps: int,
    score: Callable[[int, jax.Array], object] | None = None,
) -> list:
    """Outputs of TTT steps 0..num_steps-1 (EAGLE-1: num_steps = 1, the plain causal pass): a
    StepOutput each, or with `score`, score(k, logits (B, T, Vd)) of each step k. A scored step is
    rematerialized: the backward pass recomputes it instead of keeping its logits and attention
    weights, so a training step holds one TTT step's (B, T, Vd) logits at a time, not num_steps.

    Rows are right-padded, so a causal mask keeps every valid position clear of padding; positions
    past a row's end produce values the loss masks out.
    """
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    empty = KVCache.zeros(1, b, 0, dcfg.num_kv_heads, dcfg.head_dim, hidden.dtype)

    def first(dparams, hidden):
        out = draft_forward(
            dparams, for_training(dcfg), target_params, hidden, shift_left(tokens, 1), positions, empty, causal_mask(jnp.ones((b, t), bool))
        )
        return StepOutput(out.logits, out.hidden), out.k_new[0], out.v_new[0]

    def later(k):
        return lambda dparams, hidden, context, chain: chain_step(
            dparams, dcfg, target_params, hidden, shift_left(tokens, k + 1), positions + k, context, chain)

    def scored(k, step):  # step k and its score: (StepOutput or score, next hidden, k_new, v_new)
        def run(*args):
            out, k_new, v_new = step(*args)
            return (out if score is None else score(k, out.logits)), out.hidden, k_new, v_new

        return run if score is None else jax.checkpoint(run)

    result, hidden, *context = scored(0, first)(dparams, hidden)
    results = [result]
    chain_k = jnp.zeros((b, t, 0, dcfg.num_kv_heads, dcfg.head_dim), context[0].dtype)
    chain_v = chain_k
    for k in range(1, num_steps):
        result, hidden, k_new, v_new = scored(k, later(k))(dparams, hidden, tuple(context), (chain_k, chain_v))
        results.append(result)
        chain_k = jnp.concatenate([chain_k, k_new[:, :, None]], axis=2)
        chain_v = jnp.concatenate([chain_v, v_new[:, :, None]], axis=2)
    return results
