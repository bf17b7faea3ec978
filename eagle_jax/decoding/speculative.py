"""Speculative generate: EAGLE draft tree + one target verification per round, in one compiled loop.

A round (batch B, T = tree.size verified tokens, P = tree.max_path) runs four phases over the
loop state `SpecState`:
  1. `draft_phase`: grow the dynamic tree from the root (the last emitted token) with the draft
     head, and with tree.lookup add a chain looked up in the context (`eagle_jax.decoding.lookup`);
  2. `verify_phase`: one target forward over the T tree tokens (prefix by length + ancestor mask);
  3. `accept_phase`: greedy or lossless sampling; the bonus token is the target's own;
  4. `commit_phase`: append the accepted path's KV to the target cache, run the draft over the
     accepted positions with the true target features (extending its context cache), emit tokens.
The caches hold P slack slots beyond `cache_len`, so a full round never writes out of bounds.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh

from eagle_jax.decoding.accept import Acceptance, accept_greedy, accept_sampling
from eagle_jax.decoding.lookup import lookup_proposals
from eagle_jax.decoding.prompts import PAD, check_prompt_fits, finish_reasons, is_stop, last_valid, prefill
from eagle_jax.decoding.sampling import SamplingConfig, sample_tokens
from eagle_jax.decoding.tree import Draw, DraftTree, TreeConfig, expand_tree
from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import draft_forward, draft_layer, draft_readout, draft_to_target_ids, make_draft_cache, project_features
from eagle_jax.errors import EagleError
from eagle_jax.model.config import ModelConfig
from eagle_jax.model.kv_cache import KVCache
from eagle_jax.model.sharding import constrain_caches, over_row_shards
from eagle_jax.model.transformer import ForwardOutput, causal_mask, forward, is_stacked, lm_head, make_cache


class SpecOutput(NamedTuple):
    tokens: jax.Array  # (B, max_new_tokens) int32, PAD after each row's end
    num_tokens: jax.Array  # (B,) int32 generated tokens per row (a stop token included)
    rounds: jax.Array  # (B,) int32 draft/verify rounds each row took part in
    accept_histogram: jax.Array  # (B, tree.max_path) rounds that accepted 0, 1, ... draft tokens
    finish_reason: jax.Array  # (B,) int32 why each row ended, an index into FINISH_REASONS (stop, max_new_tokens, cache_full)


@struct.dataclass
class SpecModels:
    """The target and the draft head as the phases take them: params pytrees (optionally laid out
    by `eagle_jax.model.cpu_layout.backend_layout`) and their static configs."""

    params: dict
    dparams: dict
    cfg: ModelConfig = struct.field(pytree_node=False)
    dcfg: DraftConfig = struct.field(pytree_node=False)


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """The static settings of a speculative generate."""

    tree: TreeConfig
    sampling: SamplingConfig
    max_new_tokens: int
    cache_len: int
    stop_ids: tuple[int, ...] = ()
    mesh: Mesh | None = None  # caches split by KV heads over its "model" axis (rows: `over_row_shards`)


class DraftState(NamedTuple):
    cache: KVCache  # the draft's context cache: one entry per target position, true features
    log_probs: jax.Array  # (B, Vd) draft log-probs of the root's children
    hidden: jax.Array  # (B, d) draft hidden that produced them


@struct.dataclass
class SpecState:
    """The loop's carry (B rows, N = max_new_tokens, P = tree.max_path)."""

    cache: KVCache  # the target's: the prompt and every committed token, lengths (B,)
    draft: DraftState
    root: jax.Array  # (B,) int32 the last emitted token: the next tree's root
    tokens: jax.Array  # (B, N + P) int32 emitted tokens, PAD past count
    count: jax.Array  # (B,) int32 tokens emitted so far
    done: jax.Array  # (B,) bool
    rng: jax.Array  # key of the next round
    rounds: jax.Array  # (B,) int32 rounds each row took part in
    histogram: jax.Array  # (B, P) int32 rounds by the number of draft tokens they accepted
    history: jax.Array | None  # (B, cache_len + 2P + 1) int32 every token by position, the root last (for the lookup chain); None without one


class Verified(NamedTuple):
    target: ForwardOutput  # the target over the T tree tokens: hidden, captured features, new KV
    logits: jax.Array  # (B, T, V) float32


def check_draft(cfg: ModelConfig, dcfg: DraftConfig, tree: TreeConfig, sampling: SamplingConfig = SamplingConfig()) -> None:
    dcfg.check_target(cfg)
    if tree.top_k > dcfg.draft_vocab_size:
        raise EagleError(f"top_k={tree.top_k} is larger than the draft vocabulary ({dcfg.draft_vocab_size})")
    if tree.scorer.draws and sampling.greedy:
        raise EagleError(f"tree scoring {tree.scoring!r} draws the draft's tokens at random, which only sampling can accept: "
                         "use temperature > 0, or scoring 'dynamic' or 'static' for greedy decoding")


def run_draft_context(models: SpecModels, draft_cache: KVCache, features, tokens, positions, num_new, first: bool = False) -> DraftState:
    """Draft over new context positions: features (B, N, d) at positions (B, N), paired with the
    next tokens (B, N); the first num_new (B,) are real; `first`: the cache is still empty.
    Returns the state for the next tree."""
    dcfg = models.dcfg
    b, n = tokens.shape
    mask = causal_mask(jnp.arange(n)[None, :] < num_new[:, None])
    prefix = KVCache.empty_prefix(1, b, dcfg.num_kv_heads, dcfg.head_dim, features.dtype) if first else draft_cache
    h, k, v = draft_layer(models.dparams, dcfg, models.params, features, tokens, positions, prefix, mask)
    logits, hidden = draft_readout(models.dparams, dcfg, models.params, last_valid(h, jnp.maximum(num_new, 1)))  # the last position only
    return DraftState(draft_cache.write(k[None], v[None], num_new), jax.nn.log_softmax(logits, axis=-1), hidden)


def draft_phase(models: SpecModels, state: SpecState, tree: TreeConfig, draw: Draw | None = None) -> DraftTree:
    """Grow the tree for the roots from the draft state; with tree.lookup, add the chain looked up
    in state.history (`lookup_proposals`); draw: the randomness of a tree whose children are drawn."""
    dcfg, draft = models.dcfg, state.draft
    b, k = state.root.shape[0], tree.top_k
    cache = draft.cache
    no_levels = jnp.zeros((b, 0, dcfg.num_kv_heads, dcfg.head_dim), cache.k[0].dtype)

    def run_level(level_kv, hidden, tokens, level, ancestors):
        positions = jnp.broadcast_to(cache.lengths[:, None] + level, (b, k))
        mask = jnp.concatenate([ancestors, jnp.broadcast_to(jnp.eye(k, dtype=bool), (b, k, k))], axis=-1)
        out = draft_forward(models.dparams, dcfg, models.params, hidden, tokens, positions, cache, mask, extra_kv=level_kv)
        level_kv = tuple(jnp.concatenate([buf, new[0]], axis=1) for buf, new in zip(level_kv, (out.k_new, out.v_new)))
        return level_kv, jax.nn.log_softmax(out.logits, axis=-1), out.hidden

    to_target = functools.partial(draft_to_target_ids, models.dparams, dcfg)
    looked_up = None
    if tree.lookup:  # the draft's context cache holds one entry per target position: the root is at its length
        proposals, match_length = lookup_proposals(state.history, cache.lengths + 1, tree.lookup)
        looked_up = proposals, match_length > 0
    return expand_tree(tree, state.root, draft.log_probs, draft.hidden, run_level, (no_levels, no_levels), to_target, looked_up, draw)


def verify_phase(models: SpecModels, nodes: DraftTree, cache: KVCache) -> Verified:
    """The target over the tree's tokens at their depths past each row's length, each seeing the
    cached prefix and its ancestors; with the features the draft fuses."""
    out = forward(models.params, models.cfg, nodes.tokens, cache.lengths[:, None] + nodes.depths, cache, nodes.ancestor_mask,
                  capture=models.dcfg.feature_layers)
    return Verified(out, lm_head(models.params, out.hidden))


def accept_phase(key: jax.Array, nodes: DraftTree, logits: jax.Array, spec: SpecConfig) -> Acceptance:
    if spec.sampling.greedy:
        return accept_greedy(nodes, logits)
    return accept_sampling(key, nodes, logits, spec.sampling, spec.tree)


def commit_phase(models: SpecModels, state: SpecState, nodes: DraftTree, verified: Verified, acc: Acceptance, spec: SpecConfig) -> SpecState:
    """Emit the accepted tokens and the bonus (cut at a stop token, max_new_tokens and the cache),
    append their KV to the target cache and run the draft over them."""
    cache, active, p = state.cache, ~state.done, spec.tree.max_path
    path = jnp.maximum(jnp.take_along_axis(nodes.paths, acc.node[:, None, None], axis=1)[:, 0], 0)  # (B, P) root first
    idx = jnp.arange(p)[None, :]
    emitted = jnp.where(idx < acc.num_accepted[:, None], jnp.roll(jnp.take_along_axis(nodes.tokens, path, axis=1), -1, axis=1), 0)
    emitted = jnp.where(idx == acc.num_accepted[:, None], acc.bonus[:, None], emitted)  # (B, P) the accepted tokens, then the bonus
    stops = is_stop(emitted, spec.stop_ids) & (idx <= acc.num_accepted[:, None])
    n_emit = jnp.minimum(jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1) + 1, p), acc.num_accepted + 1)
    n_emit = jnp.minimum(n_emit, spec.max_new_tokens - state.count)
    n_emit = jnp.where(active, jnp.minimum(n_emit, spec.cache_len - cache.lengths), 0)
    window = jnp.where(idx < n_emit[:, None], emitted, PAD)
    write = jax.vmap(lambda row, w, start: jax.lax.dynamic_update_slice(row, w, (start,)))
    new_cache = cache.commit_path(verified.target.k_new, verified.target.v_new, path, n_emit)
    take = jax.vmap(lambda x, i: x[:, i], in_axes=(1, 0), out_axes=1)
    target = verified.target
    features = target._replace(hidden=take(target.hidden[None], path)[0], captured=take(target.captured, path))
    draft = run_draft_context(models, state.draft.cache, project_features(models.dparams, models.dcfg, features), emitted,
                              cache.lengths[:, None] + idx, n_emit)
    count = state.count + n_emit
    last = jnp.take_along_axis(emitted, jnp.maximum(n_emit - 1, 0)[:, None], axis=1)[:, 0]
    stopped = jnp.any(stops & (idx < n_emit[:, None]), 1)
    return state.replace(
        cache=new_cache, draft=draft, root=jnp.where(active, last, state.root), tokens=write(state.tokens, window, state.count),
        count=count, done=state.done | stopped | (count >= spec.max_new_tokens) | (new_cache.lengths >= spec.cache_len),
        rounds=state.rounds + active, histogram=state.histogram + (active[:, None] & (idx == acc.num_accepted[:, None])),
        # emitted tokens follow the root; past n_emit they stay unknown (beyond the new root)
        history=None if state.history is None else write(state.history, window, cache.lengths + 1),
    )


def speculative_round(models: SpecModels, spec: SpecConfig, state: SpecState) -> SpecState:
    """One round: draft, verify, accept, commit."""
    rng, key = jax.random.split(state.rng)
    draw = None
    if spec.tree.scorer.draws:
        key, draw_key = jax.random.split(key)
        draw = Draw(draw_key, spec.sampling.temperature)
    nodes = draft_phase(models, state, spec.tree, draw)
    verified = verify_phase(models, nodes, state.cache)
    acc = accept_phase(key, nodes, verified.logits, spec)
    return constrain_caches(spec.mesh, commit_phase(models, state.replace(rng=rng), nodes, verified, acc, spec))


def start(models: SpecModels, spec: SpecConfig, prompt_tokens: jax.Array, prompt_lengths: jax.Array, rng: jax.Array) -> SpecState:
    """Prefill the target and the draft with the prompts (B, P); the first token is the target's alone."""
    b, p = prompt_tokens.shape
    path_len = spec.tree.max_path
    slack = spec.cache_len + path_len
    dtype = models.params["embed"].dtype
    cache = constrain_caches(spec.mesh, make_cache(models.cfg, b, slack, dtype, is_stacked(models.params)))
    out, cache = prefill(models.params, models.cfg, prompt_tokens, prompt_lengths, cache, models.dcfg.feature_layers)
    rng, key = jax.random.split(rng)
    root = sample_tokens(key, lm_head(models.params, last_valid(out.hidden, prompt_lengths)), spec.sampling)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    next_tokens = jnp.concatenate([prompt_tokens[:, 1:], jnp.zeros((b, 1), jnp.int32)], axis=1)
    next_tokens = jnp.where(positions == prompt_lengths[:, None] - 1, root[:, None], next_tokens)
    draft_cache = constrain_caches(spec.mesh, make_draft_cache(models.dcfg, b, slack, dtype))
    draft = run_draft_context(models, draft_cache, project_features(models.dparams, models.dcfg, out),
                              next_tokens, positions, prompt_lengths, first=True)
    history = None
    if spec.tree.lookup:  # prompt, then generated tokens, the root last; room for a round past the cache
        history = jnp.zeros((b, slack + path_len + 1), jnp.int32).at[:, :p].set(prompt_tokens)
        history = history.at[jnp.arange(b), prompt_lengths].set(root)
    return constrain_caches(spec.mesh, SpecState(
        cache=cache, draft=draft, root=root, tokens=jnp.full((b, spec.max_new_tokens + path_len), PAD, jnp.int32).at[:, 0].set(root),
        count=jnp.ones((b,), jnp.int32), done=is_stop(root, spec.stop_ids) | (spec.max_new_tokens == 1) | (cache.lengths >= spec.cache_len),
        rng=rng, rounds=jnp.zeros((b,), jnp.int32), histogram=jnp.zeros((b, path_len), jnp.int32), history=history,
    ))


def generate_spec(
    params: dict,
    cfg: ModelConfig,
    dparams: dict,
    dcfg: DraftConfig,
    prompt_tokens: jax.Array,  # (B, P) int32, right-padded
    prompt_lengths: jax.Array,  # (B,) int32
    rng: jax.Array,
    *,
    max_new_tokens: int,
    cache_len: int,
    tree: TreeConfig = TreeConfig(),
    sampling: SamplingConfig = SamplingConfig(),
    stop_ids: tuple[int, ...] = (),
    mesh: Mesh | None = None,
) -> SpecOutput:
    """Speculative decoding with an EAGLE head; output equal (greedy) or equal in law (sampling) to
    `generate_ar` with the same arguments. Pure and traceable: jit it with the keyword arguments,
    cfg and dcfg static (see `generate_spec_jit`), or call it inside your own jitted function.
    Params laid out by `eagle_jax.backend_layout` run faster on CPU. On a `mesh` (params placed by
    `eagle_jax.model.sharding`), rows split over "data" and the caches also by KV heads over
    "model"; tree, acceptance and commit stay per row."""
    check_draft(cfg, dcfg, tree, sampling)
    check_prompt_fits(prompt_tokens.shape[1], cache_len)
    spec = SpecConfig(tree, sampling, max_new_tokens, cache_len, stop_ids, mesh)

    def decode(shared, rows, rng):
        models = SpecModels(*shared, cfg, dcfg)
        state = start(models, spec, *rows, rng)
        state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), functools.partial(speculative_round, models, spec), state)
        tokens = state.tokens[:, :max_new_tokens]
        return SpecOutput(tokens, state.count, state.rounds, state.histogram, finish_reasons(tokens, state.count, max_new_tokens, stop_ids))

    return over_row_shards(mesh, decode, (params, dparams), (prompt_tokens, prompt_lengths), rng)


generate_spec_jit = jax.jit(generate_spec, static_argnames=("cfg", "dcfg", "max_new_tokens", "cache_len", "tree", "sampling", "stop_ids", "mesh"))
