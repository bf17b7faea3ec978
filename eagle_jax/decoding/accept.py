"""Acceptance of a verified draft tree: greedy (exact match) and lossless sampling (recursive
rejection over siblings, SpecInfer style). A deterministic proposal (a top-k child, a looked-up
token) is tried as q = one-hot; the children a sampled tree drew from the draft distribution q
without replacement are tried against q with the earlier draws removed (Jeon et al., recursive
speculative decoding)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.decoding.sampling import SamplingConfig, target_probs
from eagle_jax.decoding.tree import DraftTree, SampledNodes, TreeConfig


class Acceptance(NamedTuple):
    node: jax.Array  # (B,) int32 deepest accepted node (0 = only the root)
    num_accepted: jax.Array  # (B,) int32 accepted draft tokens (the node's depth)
    bonus: jax.Array  # (B,) int32 the target's own next token after that node


def accept_greedy(tree: DraftTree, logits: jax.Array) -> Acceptance:
    """logits (B, T, V): a node survives when it and all its ancestors equal the target's argmax
    at their parents; take the deepest survivor and the argmax there as the bonus."""
    choice = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # (B, T)
    parent_choice = jnp.take_along_axis(choice, tree.parents, axis=1)
    match = (tree.tokens == parent_choice).at[:, 0].set(True)  # the root is the target's own token
    survives = ~jnp.any(tree.ancestor_mask & ~match[:, None, :], axis=-1)  # (B, T)
    node = jnp.argmax(jnp.where(survives, tree.depths, -1), axis=-1).astype(jnp.int32)
    depth = jnp.take_along_axis(tree.depths, node[:, None], axis=1)[:, 0]
    bonus = jnp.take_along_axis(choice, node[:, None], axis=1)[:, 0]
    return Acceptance(node, depth, bonus)


def children_table(parents: jax.Array, width: int) -> jax.Array:
    """(T, min(width, T)) child node indices of each node in ascending index order (= descending
    draft probability among siblings), -1 padded. parents: (T,)."""
    t = parents.shape[0]
    nodes = jnp.arange(t, dtype=jnp.int32)
    is_child = (parents[None, :] == nodes[:, None]) & (nodes[None, :] > 0)  # (T parent, T child)
    ordered = jnp.sort(jnp.where(is_child, nodes[None, :], t), axis=1)[:, : min(width, t)]
    return jnp.where(ordered == t, -1, ordered)


def accept_sampling(rng: jax.Array, tree: DraftTree, logits: jax.Array, sampling: SamplingConfig, tree_cfg: TreeConfig) -> Acceptance:
    """Lossless acceptance under `sampling` (the target's temperature / top-p / top-k).

    Walking down from the root, the children of the current node are tried in order against the
    residual target distribution r (p at first): child x, proposed with probability q(x), is
    accepted with probability min(1, r(x) / q(x)); on rejection r becomes max(r - q, 0)
    renormalised. q is one-hot at x for a deterministic child (so r(x) is zeroed), and for a drawn
    child the node's draw distribution without the siblings drawn before it. When a level rejects
    every child, the bonus is drawn from r; otherwise from p at the last node.
    """
    probs = target_probs(logits, sampling)  # (B, T, V)
    keys = jax.random.split(rng, logits.shape[0])
    b, t = tree.tokens.shape
    sampled = tree.sampled
    if sampled is None:  # every child deterministic: nothing was drawn from
        sampled = SampledNodes(jnp.zeros((b, t, 1), jnp.float32), jnp.zeros((b, 1), jnp.int32), jnp.ones((b, t), bool))
    is_drawn = ~sampled.looked_up  # the node was drawn (the root is never tried)
    return jax.vmap(lambda *row: accept_row(*row, tree_cfg))(
        keys, tree.tokens, tree.parents, tree.depths, probs, sampled.draw_probs, sampled.draw_vocab, is_drawn
    )


def accept_row(rng, tokens, parents, depths, probs, draw_probs, draw_vocab, is_drawn, tree_cfg: TreeConfig) -> Acceptance:
    """One row: tokens, parents, depths, is_drawn (T,), probs (T, V), draw_probs (T, Vd) with
    draw_vocab (Vd,) their target ids."""
    children = children_table(parents, tree_cfg.max_children)
    max_depth, width = tree_cfg.max_path - 1, children.shape[1]
    rng_try, rng_bonus = jax.random.split(rng)
    uniforms = jax.random.uniform(rng_try, (max_depth, width))
    vocab = probs.shape[-1]

    def try_level(level, state):
        node, p, stopped = state
        q_node = jnp.zeros(vocab, jnp.float32).at[draw_vocab].add(draw_probs[node])  # (V,) what node's children were drawn from

        def try_child(j, inner):
            chosen, p, q = inner
            child = children[node, j]
            token = tokens[jnp.maximum(child, 0)]
            live = (chosen < 0) & (child >= 0) & ~stopped
            drawn = is_drawn[jnp.maximum(child, 0)]
            proposal = jnp.where(drawn, q / jnp.maximum(jnp.sum(q), 1e-30), jax.nn.one_hot(token, vocab, dtype=jnp.float32))
            accept = live & (uniforms[level, j] * proposal[token] < p[token])
            residual = jnp.maximum(p - proposal, 0.0)
            residual = residual / jnp.maximum(jnp.sum(residual), 1e-30)
            rejected = live & ~accept
            return jnp.where(accept, child, chosen), jnp.where(rejected, residual, p), jnp.where(rejected & drawn, q.at[token].set(0.0), q)

        chosen, p, _ = jax.lax.fori_loop(0, width, try_child, (jnp.int32(-1), p, q_node))
        moved = chosen >= 0
        node = jnp.where(moved, chosen, node)
        return node, jnp.where(moved, probs[node], p), stopped | ~moved

    node, p, _ = jax.lax.fori_loop(0, max_depth, try_level, (jnp.int32(0), probs[0], jnp.bool_(False)))
    bonus = jax.random.categorical(rng_bonus, jnp.log(p)).astype(jnp.int32)
    return Acceptance(node, depths[node], bonus)
