"""Draft-head objectives over aligned (B, T) arrays.

Alignment (position t of every array is a position of the sequence x_0 .. x_{T-1}):
  target_features[t] / target_logits[t]: the target at position t (its distribution of x_{t+1});
  loss_mask[t]: x_t is an assistant token (a token to be predicted).
The draft at position t, TTT step k, reads x_{t+k+1} and predicts x_{t+k+2}: its soft label is the
target distribution at t+k+1 (= shift_left(target_logits, k+1)) and it counts where
loss_mask[t+k+2] (= shift_left(loss_mask, k+2)), so ids, targets and masks shift together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

EAGLE1_CLS_WEIGHT = 0.1  # L = SmoothL1 regression + 0.1 * soft cross-entropy (EAGLE-1 paper, eagle/train/main.py)


class LossOutput(NamedTuple):
    loss: jax.Array  # () the objective that is minimised
    token_loss: jax.Array  # (K,) per-position loss of each TTT step summed over counted positions (EAGLE-1: K = 1)
    correct: jax.Array  # (K,) draft top-1 == target top-1, summed over counted positions
    count: jax.Array  # (K,) counted positions (the shifted loss mask's sum)


def shift_left(x: jax.Array, k: int) -> jax.Array:
    """x (B, T, ...) moved k positions to the left along T, zero-filled at the end."""
    if k == 0:
        return x
    return jnp.concatenate([x[:, k:], jnp.zeros_like(x[:, :k])], axis=1)


def restrict_to_draft_vocab(target_logits: jax.Array, used: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """(teacher logits (B, T, Vd), in_vocab (B, T) bool) from full-vocabulary logits (B, T, V).

    The soft label is the target distribution restricted to the draft vocabulary `used` (Vd,) and
    renormalised (a softmax of the gathered logits); positions whose target argmax lies outside the
    draft vocabulary are not trained on. `used` None: the draft vocabulary is the target's.
    """
    if used is None:
        return target_logits, jnp.ones(target_logits.shape[:2], bool)
    in_draft = jnp.zeros(target_logits.shape[-1], bool).at[used].set(True)  # t2d, (V,)
    return target_logits[..., used], in_draft[jnp.argmax(target_logits, axis=-1)]


def soft_cross_entropy(teacher_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """(B, T) -sum_v softmax(teacher)_v log_softmax(logits)_v, in float32."""
    p = jax.nn.softmax(teacher_logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(p * jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), axis=-1)


class StepTerms(NamedTuple):
    """One TTT step's share of the EAGLE-3 loss, each a () sum over the counted positions."""

    loss: jax.Array
    correct: jax.Array
    count: jax.Array


def eagle3_step_terms(
    k: int,
    logits: jax.Array,  # (B, T, Vd) draft logits of TTT step k
    teacher: jax.Array,  # (B, T, Vd) target logits over the draft vocabulary (`restrict_to_draft_vocab`)
    in_vocab: jax.Array,  # (B, T) bool, the target argmax lies in the draft vocabulary
    loss_mask: jax.Array,  # (B, T) bool
) -> StepTerms:
    """Masked soft cross-entropy, top-1 agreement and counted positions of step k."""
    mask = shift_left(loss_mask, k + 2)  # (B, T)
    label = shift_left(teacher, k + 1)  # (B, T, Vd)
    counted = mask & shift_left(in_vocab, k + 1)
    hit = jnp.argmax(logits, axis=-1) == jnp.argmax(label, axis=-1)
    return StepTerms(jnp.sum(jnp.where(counted, soft_cross_entropy(label, logits), 0.0)), jnp.sum(hit & counted), jnp.sum(mask))


def eagle3_combine(terms: Sequence[StepTerms], num_positions: int, step_decay: float = 0.8) -> LossOutput:
    """sum_k step_decay**k * L_k, L_k step k's loss averaged over all `num_positions` = B*T
    positions (the reference's normalisation)."""
    token_loss = jnp.stack([t.loss for t in terms])
    weights = step_decay ** jnp.arange(len(terms), dtype=jnp.float32)
    loss = jnp.sum(weights * token_loss) / num_positions
    return LossOutput(loss, token_loss, jnp.stack([t.correct for t in terms]), jnp.stack([t.count for t in terms]))


def eagle3_loss(
    step_logits: Sequence[jax.Array],  # K x (B, T, Vd) draft logits of TTT steps 0..K-1
    target_logits: jax.Array,  # (B, T, V) float32
    loss_mask: jax.Array,  # (B, T) bool
    used: jax.Array | None,  # (Vd,) int32 draft vocabulary (target ids), None = full vocabulary
    step_decay: float = 0.8,
) -> LossOutput:
    """EAGLE-3 training-time-test loss over all steps' logits at once (training scores each step
    as the draft unrolls, `train.ttt.unroll(score=...)`, with the same terms)."""
    teacher, in_vocab = restrict_to_draft_vocab(target_logits, used)
    terms = [eagle3_step_terms(k, logits, teacher, in_vocab, loss_mask) for k, logits in enumerate(step_logits)]
    return eagle3_combine(terms, loss_mask.size, step_decay)


def eagle1_loss(
    predicted: jax.Array,  # (B, T, d) draft output at position t: its estimate of the feature at t+1
    logits: jax.Array,  # (B, T, V) target lm_head of `predicted`
    target_features: jax.Array,  # (B, T, d) post-norm target hidden states
    target_logits: jax.Array,  # (B, T, V) float32, lm_head(target_features)
    loss_mask: jax.Array,  # (B, T) bool
) -> LossOutput:
    """EAGLE-1/2: SmoothL1 feature regression + 0.1 soft cross-entropy, each divided by the mask sum."""
    mask = shift_left(loss_mask, 2)
    denom = jnp.maximum(jnp.sum(mask), 1)
    goal = shift_left(target_features, 1).astype(jnp.float32)
    regression = jnp.mean(optax.huber_loss(predicted.astype(jnp.float32), goal, delta=1.0), axis=-1)  # SmoothL1, beta 1
    label = shift_left(target_logits, 1)
    classification = soft_cross_entropy(label, logits)
    total = jnp.sum(jnp.where(mask, regression + EAGLE1_CLS_WEIGHT * classification, 0.0))
    hit = jnp.argmax(logits, axis=-1) == jnp.argmax(label, axis=-1)
    return LossOutput(total / denom, total[None], jnp.sum(hit & mask)[None], jnp.sum(mask)[None])
