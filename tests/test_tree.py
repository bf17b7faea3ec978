"""Property tests of the dynamic draft tree and greedy acceptance on hand-made draft/target tables."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from eagle_jax.decoding.accept import accept_greedy, accept_sampling, children_table
from eagle_jax.errors import EagleError
from eagle_jax.decoding.lookup import lookup_proposals
from eagle_jax.decoding.sampling import SamplingConfig, target_probs
from eagle_jax.decoding.tree import Draw, DraftTree, SampledNodes, TreeConfig, expand_tree, grow_pool, select_nodes

VOCAB = 12


def table_draft(table):
    """A draft whose next-token log-probs depend only on the current token: log_softmax(table[token])."""

    def run_level(carry, hidden, tokens, level, ancestors):
        return carry, jax.nn.log_softmax(table[tokens], axis=-1), hidden

    return run_level


@functools.partial(jax.jit, static_argnums=0)  # one compile per tree shape, not one per operation
def build(tree: TreeConfig, table, roots, chain=None, found=None):
    """The tree for roots (B,); with tree.lookup, the looked-up chain (B, L) and whether it was found (B,)."""
    b = roots.shape[0]
    root_lp = jax.nn.log_softmax(table[roots], axis=-1)
    looked_up = (chain, found) if tree.lookup else None
    return expand_tree(tree, roots, root_lp, jnp.zeros((b, 4)), table_draft(table), None, lambda ids: ids, looked_up)


trees = st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(2, 40), st.sampled_from(["dynamic", "static"])).filter(
    lambda t: t[2] <= 1 + t[0] + t[1] * t[0] ** 2
)


founds = st.sampled_from([(True, True, True), (True, False, True), (False, False, False)])  # per row: a lookup was found


def random_tree(tree: TreeConfig, found, seed):
    """A random draft table (VOCAB, VOCAB), 3 roots, a random looked-up chain (3, lookup) and the tree built from them."""
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(VOCAB, VOCAB)) * 3, jnp.float32)
    roots = jnp.asarray(rng.integers(0, VOCAB, size=3), jnp.int32)
    chain = rng.integers(0, VOCAB, size=(3, tree.lookup))
    return table, roots, chain, jax.tree.map(np.asarray, build(tree, table, roots, jnp.asarray(chain, jnp.int32), jnp.asarray(found)))


@settings(max_examples=25, deadline=None)
@given(tree_args=trees, lookup=st.integers(0, 5), found=founds, seed=st.integers(0, 2**16))
def test_tree_structure_invariants(tree_args, lookup, found, seed):
    k, depth, drafted, scoring = tree_args
    tree = TreeConfig(k, depth, drafted, scoring, lookup=lookup)
    table, roots, chain, t = random_tree(tree, found, seed)
    nodes = tree.size
    assert t.tokens.shape == (3, nodes) and t.ancestor_mask.shape == (3, nodes, nodes) and t.paths.shape[2] == tree.max_path
    for b in range(3):
        mask, parents, depths = t.ancestor_mask[b], t.parents[b], t.depths[b]
        assert mask.diagonal().all()  # reflexive
        assert t.tokens[b, 0] == roots[b] and parents[0] == 0 and depths[0] == 0
        for r in range(1, nodes):
            assert parents[r] < r  # parents precede children
            assert depths[r] == depths[parents[r]] + 1 <= tree.max_path - 1
            # ancestor-closed: r's ancestors are exactly its parent's ancestors plus itself
            expected = mask[parents[r]].copy()
            expected[r] = True
            np.testing.assert_array_equal(mask[r], expected)
            path = t.paths[b, r]
            assert path[0] == 0 and path[depths[r]] == r and (path[depths[r] + 1 :] == -1).all()
            assert len([p for p in path if p >= 0]) == depths[r] + 1  # depth = path length - 1
            for d in range(1, depths[r] + 1):
                assert parents[path[d]] == path[d - 1]
        assert depths[1:drafted].max(initial=0) <= depth + 1
        if found[b]:  # the looked-up chain hangs under the root after the drafted nodes, in order
            np.testing.assert_array_equal(t.tokens[b, drafted:], chain[b])
            np.testing.assert_array_equal(depths[drafted:], np.arange(1, lookup + 1))
        assert all(len([c for c in range(nodes) if parents[c] == r and c > 0]) <= tree.max_children for r in range(nodes))
        # drafted siblings carry distinct tokens (top-k children of one node)
        for r in range(drafted):
            kids = [c for c in range(1, drafted) if parents[c] == r]
            assert len(set(t.tokens[b, kids])) == len(kids)


@settings(max_examples=25, deadline=None)
@given(tree_args=trees, seed=st.integers(0, 2**16))
def test_perfect_draft_accepts_the_whole_best_path(tree_args, seed):
    """When the target's argmax follows the draft's top-1 child, greedy acceptance walks the
    greedy chain as deep as the tree holds it and the bonus is the next chain token."""
    tree = TreeConfig(*tree_args)
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(VOCAB, VOCAB)) * 3, jnp.float32)
    roots = jnp.asarray(rng.integers(0, VOCAB, size=2), jnp.int32)
    t = build(tree, table, roots)
    logits = table[t.tokens]  # target logits at each node = the draft's table
    acc = jax.tree.map(np.asarray, jax.jit(accept_greedy)(t, logits))
    tokens, parents = np.asarray(t.tokens), np.asarray(t.parents)
    greedy_next = np.argmax(np.asarray(table), axis=-1)
    for b in range(2):
        node, depth = 0, 0
        while True:
            kids = [c for c in range(1, tree.num_nodes) if parents[b, c] == node and tokens[b, c] == greedy_next[tokens[b, node]]]
            if not kids:
                break
            node, depth = kids[0], depth + 1
        assert acc.node[b] == node and acc.num_accepted[b] == depth
        assert acc.bonus[b] == greedy_next[tokens[b, node]]


@functools.partial(jax.jit, static_argnums=0)
def build_from_every_pass(tree: TreeConfig, table, roots):
    """The tree selected from a pool of all `depth` passes, the ones past the budget's reach included."""
    b = roots.shape[0]
    root_lp = jax.nn.log_softmax(table[roots], axis=-1)
    pool = grow_pool(tree, tree.depth, roots, root_lp, jnp.zeros((b, 4)), table_draft(table), None, lambda ids: ids)
    return select_nodes(tree, roots, pool)


small_budgets = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(2, 5), st.sampled_from(["dynamic", "static"])).filter(
    lambda t: t[1] > t[2] - 2 and t[2] <= 1 + t[0] + t[1] * t[0] ** 2
)


@settings(max_examples=20, deadline=None)
@given(tree_args=small_budgets, seed=st.integers(0, 2**16), peaked=st.booleans())
def test_passes_past_the_node_budget_would_keep_no_node(tree_args, seed, peaked):
    """expand_tree drafts only effective_depth passes; drafting every pass selects the same tree
    (static scores and saturated log-probs give ties, which go to the earlier pool entry)."""
    tree = TreeConfig(*tree_args)
    assert tree.effective_depth == tree.num_nodes - 2 < tree.depth
    rng = np.random.default_rng(seed)
    table = jnp.asarray(rng.normal(size=(VOCAB, VOCAB)) * (300 if peaked else 3), jnp.float32)
    roots = jnp.asarray(rng.integers(0, VOCAB, size=3), jnp.int32)
    jax.tree.map(np.testing.assert_array_equal, build(tree, table, roots), build_from_every_pass(tree, table, roots))


@settings(max_examples=25, deadline=None)
@given(tree_args=trees, lookup=st.integers(1, 5), found=founds, seed=st.integers(0, 2**16))
def test_rows_without_a_lookup_draft_its_slots(tree_args, lookup, found, seed):
    """A row whose lookup was found holds the drafted tree of num_nodes and the chain; a row where
    nothing was found holds the drafted tree of num_nodes + lookup nodes (as many as the pool has,
    then the chain's first tokens), whichever rows the batch mixes."""
    k, depth, drafted, scoring = tree_args
    tree = TreeConfig(k, depth, drafted, scoring, lookup=lookup)
    table, roots, chain, t = random_tree(tree, found, seed)
    only_drafted = jax.tree.map(np.asarray, build(TreeConfig(k, depth, drafted, scoring), table, roots))
    wider = min(tree.size, 1 + tree.pool_size)
    all_drafted = jax.tree.map(np.asarray, build(TreeConfig(k, depth, wider, scoring), table, roots))
    for b in range(3):
        expected = only_drafted if found[b] else all_drafted
        n = expected.tokens.shape[1]
        np.testing.assert_array_equal(t.tokens[b, :n], expected.tokens[b])
        np.testing.assert_array_equal(t.parents[b, :n], expected.parents[b])
        np.testing.assert_array_equal(t.tokens[b, n:], chain[b, : tree.size - n])
        np.testing.assert_array_equal(t.parents[b, n:], np.arange(n - 1, tree.size - 1) * (np.arange(tree.size - n) > 0))


def test_chain_is_a_single_path():
    tree = TreeConfig.chain(4)
    table = jnp.asarray(np.random.default_rng(0).normal(size=(VOCAB, VOCAB)), jnp.float32)
    t = build(tree, table, jnp.array([3], jnp.int32))
    np.testing.assert_array_equal(np.asarray(t.parents[0]), [0, 0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(t.depths[0]), [0, 1, 2, 3, 4])


def test_static_tree_shape_does_not_depend_on_the_draft():
    tree = TreeConfig(3, 2, 10, "static")
    rng = np.random.default_rng(1)
    shapes = {tuple(np.asarray(build(tree, jnp.asarray(rng.normal(size=(VOCAB, VOCAB)) * 4, jnp.float32), jnp.array([i])).parents[0])) for i in range(5)}
    assert len(shapes) == 1


def test_children_table_orders_siblings_by_node_index():
    parents = jnp.array([0, 0, 0, 1, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(children_table(parents, 3)), [[1, 2, -1], [3, 4, -1], [5, -1, -1], [6, -1, -1], [-1] * 3, [-1] * 3, [-1] * 3])


def naive_lookup(history: list[int], num_tokens: int, max_ngram: int) -> tuple[list[int], int]:
    """The longest recurring suffix (<= max_ngram), its latest earlier occurrence, what followed it,
    continued with the period of that distance, and the suffix's length; the last token repeated
    and 0 when nothing recurs."""
    last = len(history) - 1
    for n in range(min(max_ngram, len(history)), 0, -1):
        for j in range(last - 1, n - 2, -1):
            if history[j - n + 1 : j + 1] == history[last - n + 1 :]:
                d = last - j
                return [history[j + 1 + i % d] for i in range(num_tokens)], n
    return [history[last]] * num_tokens, 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), vocab=st.integers(2, 6), num_tokens=st.integers(1, 6))
def test_lookup_proposals_match_a_direct_search(seed, vocab, num_tokens):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 20, size=4)
    history = rng.integers(0, vocab, size=(4, 24))  # past each row's length: junk that must be ignored
    got, match_length = lookup_proposals(jnp.asarray(history, jnp.int32), jnp.asarray(lengths, jnp.int32), num_tokens)
    for b in range(4):
        known = history[b, : lengths[b]].tolist()
        assert (np.asarray(got)[b].tolist(), int(match_length[b])) == naive_lookup(known, num_tokens, max_ngram=3)
        assert (int(match_length[b]) > 0) == (known[-1] in known[:-1])


def test_lookup_continues_a_repeating_line():
    line = [5, 6, 7, 8]
    history = jnp.asarray([[1, 2] + line * 2 + [5, 6]], jnp.int32)
    got, match_length = lookup_proposals(history, jnp.asarray([12], jnp.int32), 7)
    np.testing.assert_array_equal(np.asarray(got)[0], [7, 8, 5, 6, 7, 8, 5])
    assert int(match_length[0]) == 3  # the suffix 8 5 6 recurs 4 tokens back


@pytest.mark.parametrize(
    "args, message",
    [((2, 2, 12), "num_nodes=12 does not fit"), ((2, 2, 1), "num_nodes=1 does not fit"), ((0, 2, 4), "top_k >= 1"), ((2, 2, 4, "wide"), "unknown tree scoring"),
     ((2, 2, 4, "dynamic", -1), "lookup >= 0")],
)
def test_bad_tree_budgets_are_refused(args, message):
    with pytest.raises(EagleError, match=message):
        TreeConfig(*args)


def _draft_agreement_script():
    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "draft_agreement.py"
    spec = importlib.util.spec_from_file_location("draft_agreement", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chain_rounds_replays_greedy_acceptance():
    script = _draft_agreement_script()
    answer = [10, 11, 12, 13, 14]  # answer[0] comes from the prefill: 4 tokens to emit
    draft_top1 = np.array([[11, 12], [0, 0], [0, 0], [14, 0], [0, 0]])  # per root: the head's top-1 per step
    lookups = np.array([[11, 99], [0, 0], [0, 0], [0, 0], [0, 0]])
    found = np.ones(5, bool)
    rounds = functools.partial(script.chain_rounds, answer)
    # root 10: chain 11, 12 both right (the lookup only 11) -> 2 accepted + bonus 13; root 13: chain 14, the end
    assert rounds(draft_top1, lookups, found, chain=2, fallback=2) == 2
    # a chain of 1: root 10 accepts 11 (+ bonus 12), root 12 nothing (+ bonus 13), root 13 accepts 14
    assert rounds(draft_top1, lookups, found, chain=1, fallback=1) == 3
    # where root 10's lookup found nothing, its chain of 1 drafts 2: 11, 12 accepted, then root 13 as before
    assert rounds(draft_top1, lookups, np.array([False] + [True] * 4), chain=1, fallback=2) == 2
    # lookups alone (nothing drafted right): root 10 takes 11 from the lookup, then one token a round
    assert rounds(np.zeros((5, 2), int), lookups, found, chain=2, fallback=2) == 3
    # hypothetical heads: always right -> (chain + 1) tokens a round; never right, no lookup -> 1
    no_lookup = np.zeros((5, 0), int)
    assert rounds(draft_top1, no_lookup, found, chain=2, fallback=2, accept_p=1.0, rng=random.Random(0)) == 2
    assert rounds(draft_top1, no_lookup, found, chain=2, fallback=2, accept_p=0.0, rng=random.Random(0)) == 4


def test_parse_chains_rejects_chains_past_the_ttt_steps_or_the_budget():
    script = _draft_agreement_script()
    assert script.parse_chains("1/0,3/4,1/3/3", ttt_steps=3) == [(1, 0, 1), (3, 4, 3), (1, 3, 3)]
    for bad in ("4/1", "0/3", "1", "a/b", "1/-1", "1/3/4", "2/3/1", "1/1/3", "1/2/3/4"):
        with pytest.raises(SystemExit, match="--chains"):
            script.parse_chains(bad, ttt_steps=3)


# ----------------------------------------------------------------------------- sampled trees


@functools.partial(jax.jit, static_argnums=0)
def build_sampled(tree: TreeConfig, table, roots, key, chain=None, found=None):
    b = roots.shape[0]
    root_lp = jax.nn.log_softmax(table[roots], axis=-1)
    looked_up = (chain, found) if tree.lookup else None
    return expand_tree(tree, roots, root_lp, jnp.zeros((b, 4)), table_draft(table), None, lambda ids: ids, looked_up, Draw(key, 0.8))


def test_sampled_tree_has_the_static_shape_and_draws_each_nodes_children_without_replacement():
    tree = TreeConfig(3, 2, 8, "sampled", lookup=2)
    rng = np.random.default_rng(3)
    table = jnp.asarray(rng.normal(size=(VOCAB, VOCAB)) * 2, jnp.float32)
    roots = jnp.asarray([1, 5, 7], jnp.int32)
    chain, found = jnp.asarray(rng.integers(0, VOCAB, size=(3, 2)), jnp.int32), jnp.asarray([True, False, True])
    static = jax.tree.map(np.asarray, build(TreeConfig(3, 2, 8, "static", lookup=2), table, roots, chain, found))
    shapes, first_children = set(), []
    for seed in range(200):
        t = jax.tree.map(np.asarray, build_sampled(tree, table, roots, jax.random.key(seed), chain, found))
        np.testing.assert_array_equal(t.parents, static.parents)  # the shape never depends on the draws
        np.testing.assert_array_equal(t.sampled.looked_up, (np.arange(tree.size)[None] >= tree.num_nodes) & np.asarray(found)[:, None])
        for b in range(3):
            for node in range(tree.size):
                kids = [c for c in range(tree.size) if static.parents[b, c] == node and c > 0 and not t.sampled.looked_up[b, c]]
                assert len(set(t.tokens[b, kids])) == len(kids)  # without replacement
                if kids:  # drawn from the node's draft distribution at the draw temperature
                    want = np.asarray(jax.nn.softmax(table[t.tokens[b, node]] / 0.8))
                    np.testing.assert_allclose(t.sampled.draw_probs[b, node], want, rtol=1e-5, atol=1e-6)
        shapes.add(tuple(map(tuple, t.tokens[:, 1:3])))
        first_children.append(t.tokens[0, 1])
    assert len(shapes) > 100  # the draws differ from key to key
    counts = np.bincount(first_children, minlength=VOCAB)
    expected = np.asarray(jax.nn.softmax(table[1] / 0.8)) * len(first_children)
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected + 1))  # the first draw follows q


def test_drawn_children_are_tried_against_the_distribution_they_were_drawn_from():
    """A chain whose draft distribution equals the target's is accepted to its end: min(1, p/q) = 1.
    Tried as fixed proposals (q = one-hot), the same tokens would be accepted with probability p."""
    tree_cfg = TreeConfig(1, 2, 4, "sampled")
    logits = jax.random.normal(jax.random.key(0), (1, 4, VOCAB)) * 2
    probs = target_probs(logits, SamplingConfig(1.0))
    tokens = jnp.asarray([[3, 0, 7, 2]], jnp.int32)
    eye = np.tril(np.ones((4, 4), bool))[None]
    paths = jnp.asarray(np.where(eye, np.arange(4)[None, None], -1), jnp.int32)
    chain = DraftTree(tokens, jnp.asarray([[0, 0, 1, 2]], jnp.int32), jnp.asarray(eye), jnp.arange(4, dtype=jnp.int32)[None], paths)
    drawn = chain._replace(sampled=SampledNodes(probs, jnp.arange(VOCAB, dtype=jnp.int32)[None], jnp.zeros((1, 4), bool)))
    accept = jax.jit(lambda key, t: accept_sampling(key, t, logits, SamplingConfig(1.0), tree_cfg).num_accepted[0])
    assert all(int(accept(jax.random.key(i), drawn)) == 3 for i in range(50))
    assert sum(int(accept(jax.random.key(i), chain)) for i in range(50)) < 100
