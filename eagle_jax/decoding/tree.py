"""EAGLE-2 dynamic draft tree with static shapes.

Each of the depth+1 draft levels expands the top_k nodes with the best cumulative draft log-prob;
every expanded node contributes its top_k children to a candidate pool of
top_k + depth * top_k**2 entries; the best num_nodes - 1 candidates, sorted by pool index (so
parents precede children), become the tree below the root. Levels deeper than the node budget can
reach are not drafted (`TreeConfig.effective_depth`). A chain is top_k = 1; a static tree
uses rank-based scores instead of draft log-probs, so the same machinery always picks the same shape.
A sampled tree has a static tree's shape, but each expanded node's children are drawn from the
draft distribution without replacement (Gumbel top-k, in draw order) instead of being its top_k;
the tree keeps the distributions they were drawn from, for lossless recursive rejection sampling
(`eagle_jax.decoding.accept`). Since its shape never depends on the draws, each node's kept children are
the first draws of that node.
With `lookup` > 0 the tree also holds one chain of that many tokens looked up in the context
(`eagle_jax.decoding.lookup`), under the root after the drafted nodes. In a row whose root token never
occurred earlier, nothing is looked up (such a guess was never right), and the rerank fills the
chain's slots with further drafted nodes instead: the chain joins the pool scored above every
drafted entry when it was found, below every one when not.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from eagle_jax.errors import EagleError

UNFOUND = -1e30  # the pool score of a chain that was not looked up: below every drafted entry


def rank_scores(shape: tuple[int, ...], k: int) -> jax.Array:
    """Static-tree scores: log(1 / (rank + 1)) for the ranks 0..k-1 of the last axis."""
    return jnp.broadcast_to(-jnp.log1p(jnp.arange(k, dtype=jnp.float32)), shape)


class Scoring:
    """How a tree picks and scores each expanded node's top_k children; `TreeConfig.scorer` is
    one of SCORINGS. `draws`: the children are drawn at random, so the tree keeps the distributions
    they were drawn from (`SampledNodes`), and only sampling can accept them."""

    draws = False

    def children(self, log_probs: jax.Array, k: int, key: jax.Array | None, temperature: float):
        """(scores, draft ids, the log-probs they were drawn from or None), each (..., k), of the
        children of nodes with draft log-probs (..., Vd)."""
        raise NotImplementedError


class DynamicScoring(Scoring):
    """EAGLE-2: the top_k by draft log-prob, the pool ranked by cumulative log-prob."""

    def children(self, log_probs, k, key, temperature):
        scores, ids = jax.lax.top_k(log_probs, k)
        return scores, ids, None


class StaticScoring(Scoring):
    """The top_k, scored by rank alone: the tree has the same shape every round."""

    def children(self, log_probs, k, key, temperature):
        _, ids = jax.lax.top_k(log_probs, k)
        return rank_scores(ids.shape, k), ids, None


class SampledScoring(Scoring):
    """A static tree's shape, the children drawn from the draft at `temperature` without
    replacement (Gumbel top-k), in draw order."""

    draws = True

    def children(self, log_probs, k, key, temperature):
        drawn_from = jax.nn.log_softmax(log_probs / temperature, axis=-1)
        _, ids = jax.lax.top_k(drawn_from + jax.random.gumbel(key, drawn_from.shape), k)
        return rank_scores(ids.shape, k), ids, drawn_from


SCORINGS = {"dynamic": DynamicScoring(), "static": StaticScoring(), "sampled": SampledScoring()}


@dataclasses.dataclass(frozen=True)
class TreeConfig:
    """top_k: children per expanded node and nodes expanded per level; depth: expansion passes after
    the first (depth + 1 draft levels); num_nodes: drafted tree size, root included; lookup: tokens
    looked up in the context, one chain under the root (0: none), whose slots hold drafted nodes
    in rows where nothing was found. The target verifies num_nodes + lookup tokens (`size`)."""

    top_k: int = 4
    depth: int = 4
    num_nodes: int = 16
    scoring: str = "dynamic"
    lookup: int = 0

    def __post_init__(self):
        if self.top_k < 1 or self.depth < 0 or self.lookup < 0:
            raise EagleError(
                f"tree needs top_k >= 1, depth >= 0 and lookup >= 0, got top_k={self.top_k}, depth={self.depth}, lookup={self.lookup}"
            )
        if not 2 <= self.num_nodes <= 1 + self.pool_size:
            raise EagleError(
                f"num_nodes={self.num_nodes} does not fit the tree: expected 2 <= num_nodes <= "
                f"1 + top_k + depth * top_k**2 = {1 + self.pool_size} for top_k={self.top_k}, depth={self.depth}"
            )
        if self.scoring not in SCORINGS:
            raise EagleError(f"unknown tree scoring {self.scoring!r}; expected one of {', '.join(SCORINGS)}")

    @property
    def scorer(self) -> Scoring:
        return SCORINGS[self.scoring]

    @classmethod
    def chain(cls, length: int) -> "TreeConfig":
        """A single path of `length` draft tokens."""
        return cls(top_k=1, depth=length - 1, num_nodes=length + 1)

    def pool_entries(self, passes: int) -> int:
        """Drafted candidates after the first level and `passes` expansion passes."""
        return self.top_k + passes * self.top_k**2

    @property
    def pool_size(self) -> int:
        return self.pool_entries(self.depth)

    @property
    def effective_depth(self) -> int:
        """The expansion passes whose children the budget can keep. A kept node comes with all its
        ancestors (none scores below its descendants, and ties go to the earlier pool entry), so
        no node deeper than the size - 1 drafted nodes of a row without a lookup is ever kept:
        passes past size - 2 are not run."""
        return min(self.depth, self.size - 2)

    @property
    def found_depth(self) -> int:
        """The expansion passes a row with a found lookup can use: its num_nodes - 1 drafted nodes."""
        return min(self.depth, self.num_nodes - 2)

    @property
    def max_path(self) -> int:
        """Nodes on the longest root-to-leaf path, root included."""
        return max(self.effective_depth + 2, self.lookup + 1)

    @property
    def size(self) -> int:
        """Tokens the target verifies per round: the drafted nodes, then the looked-up chain."""
        return self.num_nodes + self.lookup

    @property
    def max_children(self) -> int:
        """The most children of one node: the root's top_k drafted ones and the chain's first."""
        return self.top_k + (self.lookup > 0)


class SampledNodes(NamedTuple):
    """What a tree whose children were drawn (`Scoring.draws`) keeps for lossless acceptance."""

    draw_probs: jax.Array  # (B, T, Vd) float32 the draft distribution each node's drafted children were drawn from
    draw_vocab: jax.Array  # (B, Vd) int32 the target id of each draft-vocabulary entry
    looked_up: jax.Array  # (B, T) bool the node comes from the lookup chain (proposed, not drawn)


class DraftTree(NamedTuple):
    tokens: jax.Array  # (B, T) int32 target ids; node 0 is the root
    parents: jax.Array  # (B, T) int32 node index of the parent (root: 0)
    ancestor_mask: jax.Array  # (B, T, T) bool, [r, j] = j is r or an ancestor of r
    depths: jax.Array  # (B, T) int32, root 0
    paths: jax.Array  # (B, T, max_path) int32 node indices root -> node, -1 past the node's depth
    sampled: SampledNodes | None = None  # a tree whose children were drawn; None otherwise


class Draw(NamedTuple):
    """Randomness of a sampled tree: a key, and the temperature applied to the draft's log-probs."""

    key: jax.Array
    temperature: float


# run_level(carry, hidden (B, K, d), tokens (B, K), level, ancestors (B, K, K*level))
#   -> (carry, log_probs (B, K, Vd), hidden (B, K, d)); ancestors marks the nodes of earlier
#   levels (slot level' * K + i) each running node descends from; carry is the caller's state
#   (the draft's KV of earlier levels).
DraftLevelFn = Callable[..., tuple[Any, jax.Array, jax.Array]]


def expand_tree(
    tree: TreeConfig,
    root_tokens: jax.Array,  # (B,) int32 target ids
    root_log_probs: jax.Array,  # (B, Vd) draft log-probs of the root's children
    root_hidden: jax.Array,  # (B, d) draft hidden that produced them
    run_level: DraftLevelFn,
    carry: Any,
    to_target_ids: Callable[[jax.Array], jax.Array],
    looked_up: tuple[jax.Array, jax.Array] | None = None,
    draw: Draw | None = None,
) -> DraftTree:
    """Grow the draft tree level by level and rerank the pool to the node budget. looked_up, with
    tree.lookup: the chain (B, L) int32 and (B,) bool whether it was found (`lookup_proposals`);
    draw: the randomness of a tree whose children are drawn (`Scoring.draws`), else None."""
    if tree.scorer.draws != (draw is not None):
        raise EagleError(f"a Draw is needed by, and only by, a scoring that draws (tree scoring {tree.scoring!r})")
    grow = lambda passes: grow_pool(tree, passes, root_tokens, root_log_probs, root_hidden, run_level, carry, to_target_ids, draw)  # noqa: E731
    if not tree.lookup:
        return select_nodes(tree, root_tokens, grow(tree.effective_depth), to_target_ids)
    proposals, found = looked_up
    if tree.effective_depth == tree.found_depth:
        pool = grow(tree.effective_depth)
    else:  # the passes only rows without a lookup can use run when there is such a row
        entries = tree.pool_entries(tree.effective_depth)
        pool = jax.lax.cond(jnp.all(found), lambda: pad_pool(grow(tree.found_depth), entries), lambda: grow(tree.effective_depth))
    return select_nodes(tree, root_tokens, with_lookup_chain(pool, proposals, found), to_target_ids)


class Pool(NamedTuple):
    """Candidate nodes, parents before children, each (B, n): cumulative scores, target-id tokens,
    pool index of the parent (-1: the root); for a sampled tree the draft log-probs each entry's
    children were drawn from (B, 1 + n, Vd), the root's first (-inf where an entry has none)."""

    scores: jax.Array
    tokens: jax.Array
    parents: jax.Array
    draws: jax.Array | None = None


def grow_pool(tree: TreeConfig, passes: int, root_tokens, root_log_probs, root_hidden, run_level: DraftLevelFn, carry, to_target_ids,
              draw: Draw | None = None) -> Pool:
    """The candidate pool of `passes` expansion passes (arguments as in `expand_tree`), of
    top_k + passes * top_k**2 entries."""
    k = tree.top_k
    b = root_tokens.shape[0]
    keys = jax.random.split(draw.key, passes + 1) if draw else [None] * (passes + 1)
    temperature = draw.temperature if draw else 1.0
    scores, draft_ids, drawn_from = tree.scorer.children(root_log_probs, k, keys[0], temperature)  # (B, K)
    pool_scores, pool_tokens, pool_parents = [scores], [to_target_ids(draft_ids)], [jnp.full((b, k), -1, jnp.int32)]
    draws = None
    if draw:  # slot 0: the root; slot 1 + i: pool entry i
        draws = jnp.full((b, 1 + tree.pool_entries(passes), root_log_probs.shape[-1]), -jnp.inf, jnp.float32).at[:, 0].set(drawn_from)
    run_tokens = pool_tokens[0]
    run_hidden = jnp.repeat(root_hidden[:, None], k, axis=1)  # (B, K, d)
    run_pool_index = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))
    run_ancestors = jnp.zeros((b, k, 0), bool)  # earlier-level draft slots each run node descends from
    take = jax.vmap(lambda x, i: x[i])
    for level in range(passes):
        carry, log_probs, hidden = run_level(carry, run_hidden, run_tokens, level, run_ancestors)
        child_scores, child_ids, drawn_from = tree.scorer.children(log_probs, k, keys[level + 1], temperature)  # (B, K, K)
        if draw:
            draws = jax.vmap(lambda d, i, q: d.at[1 + i].set(q))(draws, run_pool_index, drawn_from)
        cumulative = (child_scores + scores[:, :, None]).reshape(b, k * k)
        pool_scores.append(cumulative)
        child_tokens = to_target_ids(child_ids).reshape(b, k * k)
        pool_tokens.append(child_tokens)
        pool_parents.append(jnp.repeat(run_pool_index, k, axis=1))
        scores, chosen = jax.lax.top_k(cumulative, k)  # next level expands the best K paths
        rows = chosen // k
        run_hidden = take(hidden, rows)
        run_tokens = take(child_tokens, chosen)
        run_ancestors = jnp.concatenate([take(run_ancestors, rows), jax.nn.one_hot(rows, k, dtype=bool)], axis=-1)
        run_pool_index = k + level * k * k + chosen
    return Pool(jnp.concatenate(pool_scores, 1), jnp.concatenate(pool_tokens, 1), jnp.concatenate(pool_parents, 1), draws)


def pad_pool(pool: Pool, entries: int) -> Pool:
    """The pool padded to `entries` entries, scored below all."""
    more = entries - pool.scores.shape[1]
    pad = lambda x, c: jnp.pad(x, ((0, 0), (0, more)) + ((0, 0),) * (x.ndim - 2), constant_values=c)  # noqa: E731
    return Pool(pad(pool.scores, UNFOUND), pad(pool.tokens, 0), pad(pool.parents, -1), None if pool.draws is None else pad(pool.draws, -jnp.inf))


def with_lookup_chain(pool: Pool, proposals, found) -> Pool:
    """The pool with the looked-up chain (B, L) appended, each entry the parent of the next (the
    first under the root), scored above every drafted entry (cumulative log-probs are <= 0) where
    found (B,), below them where not. Nothing is drawn from the chain's entries."""
    b, n = pool.scores.shape
    length = proposals.shape[1]
    scores = jnp.broadcast_to(jnp.where(found, 1.0, UNFOUND)[:, None], (b, length)).astype(pool.scores.dtype)
    parents = jnp.broadcast_to(jnp.arange(n - 1, n + length - 1, dtype=jnp.int32).at[0].set(-1), (b, length))
    draws = None if pool.draws is None else jnp.pad(pool.draws, ((0, 0), (0, length), (0, 0)), constant_values=-jnp.inf)
    return Pool(jnp.concatenate([pool.scores, scores], 1), jnp.concatenate([pool.tokens, proposals.astype(pool.tokens.dtype)], 1),
                jnp.concatenate([pool.parents, parents], 1), draws)


def select_nodes(tree: TreeConfig, root_tokens, pool: Pool, to_target_ids=None) -> DraftTree:
    """Keep the best size - 1 pool entries in pool order and derive the tree arrays; for a sampled
    tree also each node's draw distribution (draft vocabulary), the target id of each draft id
    (through to_target_ids) and which nodes the lookup chain proposed."""
    t = tree.size
    _, chosen = jax.lax.top_k(pool.scores, t - 1)
    chosen = jnp.sort(chosen, axis=-1)  # pool order: parents before children
    take = jax.vmap(lambda x, i: x[i])
    tokens = jnp.concatenate([root_tokens[:, None], take(pool.tokens, chosen)], axis=1)
    parent_pool = take(pool.parents, chosen)
    # node index of each parent: its position among the chosen entries, + 1 for the root slot
    parent_node = jax.vmap(jnp.searchsorted)(chosen, parent_pool) + 1
    parents = jnp.concatenate([jnp.zeros_like(root_tokens)[:, None], jnp.where(parent_pool < 0, 0, parent_node)], axis=1)
    parents = parents.astype(jnp.int32)
    eye = jnp.eye(t, dtype=bool)
    ancestors = jnp.broadcast_to(eye, (tokens.shape[0], t, t))
    for _ in range(tree.max_path - 1):
        ancestors = eye | jax.vmap(lambda a, p: a[p])(ancestors, parents)
    depths = jnp.sum(ancestors, axis=-1).astype(jnp.int32) - 1
    tree_arrays = (tokens.astype(jnp.int32), parents, ancestors, depths, node_paths(ancestors, depths, tree.max_path))
    if pool.draws is None:
        return DraftTree(*tree_arrays)
    rows = jnp.concatenate([jnp.zeros_like(chosen[:, :1]), chosen + 1], axis=1)  # each node's slot in pool.draws
    looked_up = jnp.concatenate([jnp.zeros_like(chosen[:, :1], bool), chosen >= pool.scores.shape[1] - tree.lookup], axis=1)
    vocab = jnp.broadcast_to(to_target_ids(jnp.arange(pool.draws.shape[-1])), (tokens.shape[0], pool.draws.shape[-1]))
    return DraftTree(*tree_arrays, SampledNodes(jnp.exp(take(pool.draws, rows)), vocab, looked_up))


def node_paths(ancestors: jax.Array, depths: jax.Array, max_path: int) -> jax.Array:
    """(B, T, max_path) node index of each node's ancestor at every depth, -1 below the node."""
    at_depth = depths[:, None, None, :] == jnp.arange(max_path)[None, None, :, None]  # (B, 1, P, T)
    hit = ancestors[:, :, None, :] & at_depth  # (B, T, P, T)
    return jnp.where(jnp.any(hit, -1), jnp.argmax(hit, -1), -1).astype(jnp.int32)
