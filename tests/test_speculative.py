"""Speculative generate is lossless: greedy output equals plain greedy output token for token;
sampled output follows the target distribution (chi-square against the exact law)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.dtypes import float32_activations
from eagle_jax.errors import EagleError
from eagle_jax.infer.engine import Engine
from eagle_jax.loading import TargetModel
from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import FINISH_REASONS, pad_prompts
from eagle_jax.model.cpu_layout import cpu_layout
from eagle_jax.model.transformer import causal_mask, forward, init_params, layer_form, lm_head, make_cache, stack_layers, unstack_layers
from eagle_jax.decoding.sampling import SamplingConfig, processed_log_probs
from eagle_jax.decoding.speculative import generate_spec, generate_spec_jit
from eagle_jax.decoding.tree import TreeConfig

# A small vocabulary makes random heads right often enough to exercise deep accepted paths.
CFG = tiny_config(vocab_size=8)
PARAMS = init_params(jax.random.key(0), CFG, scale=0.3)
PROMPTS = pad_prompts([[1, 2, 3, 4, 5], [7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3], [3], [5, 6, 7]], multiple=16)
HEADS = {
    "eagle1": dict(kind="eagle1"),
    "eagle3": dict(kind="eagle3"),
    "eagle3-fc_norm": dict(kind="eagle3", fc_norm=True),
    "eagle3-norm_output": dict(kind="eagle3", norm_output=True, norm_before_residual=True),
}


def head(name, seed=1):
    dcfg = DraftConfig.for_target(CFG, **HEADS[name])
    return dcfg, init_draft_params(jax.random.key(seed), dcfg, scale=0.3)


def run_both(dcfg, dparams, tree, prompts=PROMPTS, params=PARAMS, cfg=CFG, **kw):
    kw = dict(max_new_tokens=40, cache_len=64, stop_ids=()) | kw
    ar = generate_ar_jit(params, cfg, *prompts, jax.random.key(0), **kw)
    spec = generate_spec_jit(params, cfg, dparams, dcfg, *prompts, jax.random.key(0), tree=tree, **kw)
    return jax.tree.map(np.asarray, ar), jax.tree.map(np.asarray, spec)


@pytest.mark.parametrize(
    "head_name, tree",
    [
        ("eagle1", TreeConfig(4, 3, 16)),
        ("eagle3", TreeConfig(4, 3, 16)),
        ("eagle3-fc_norm", TreeConfig(3, 2, 8)),
        ("eagle3-norm_output", TreeConfig(2, 4, 12)),
        ("eagle3", TreeConfig.chain(4)),
        ("eagle1", TreeConfig(2, 2, 6, "static")),
        ("eagle3", TreeConfig(3, 2, 8, lookup=5)),
        ("eagle3-norm_output", TreeConfig(2, 1, 3, lookup=2)),
        ("eagle3", TreeConfig(2, 3, 3, lookup=3)),  # rows where nothing is looked up draft 5 nodes
    ],
)
def test_greedy_speculative_equals_greedy_plain(head_name, tree):
    ar, spec = run_both(*head(head_name), tree, stop_ids=(7,))
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    np.testing.assert_array_equal(spec.num_tokens, ar.num_tokens)
    np.testing.assert_array_equal(spec.finish_reason, ar.finish_reason)
    last = spec.tokens[np.arange(len(spec.tokens)), spec.num_tokens - 1]
    np.testing.assert_array_equal(spec.finish_reason, np.where(last == 7, 0, 1))  # a stop token, else max_new_tokens
    assert spec.accept_histogram[:, 1:].sum() > 0  # some rounds accepted draft tokens
    assert (spec.accept_histogram.sum(1) == spec.rounds).all()


def test_greedy_batch_one():
    prompts = pad_prompts([[4, 1, 2, 6]], multiple=8)
    ar, spec = run_both(*head("eagle3"), TreeConfig(3, 3, 10), prompts=prompts)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)


def bigram_target_and_perfect_eagle1():
    """A target whose layers add nothing and whose lm_head maps token x to x + 1 (mod V), and an
    EAGLE-1 head that reproduces it exactly: the fc passes the embedding through, its layer adds
    nothing."""
    cfg = tiny_config(vocab_size=16)
    params = init_params(jax.random.key(3), cfg, scale=0.5)
    embed = params["embed"] / jnp.linalg.norm(params["embed"], axis=-1, keepdims=True)
    params["embed"] = embed
    params["lm_head"] = 10 * jnp.roll(embed, 1, axis=0)  # logit of y is <e_x, e_(y-1)>
    params["layers"] = [layer | {"wo": jnp.zeros_like(layer["wo"]), "w_down": jnp.zeros_like(layer["w_down"])} for layer in params["layers"]]
    params["final_norm"] = jnp.ones_like(params["final_norm"])
    dcfg = DraftConfig.for_target(cfg, kind="eagle1")
    dparams = init_draft_params(jax.random.key(4), dcfg)
    d = cfg.hidden_size
    dparams["fc"] = jnp.concatenate([jnp.eye(d), jnp.zeros((d, d))], axis=1)
    dparams["layer"]["wo"] = jnp.zeros_like(dparams["layer"]["wo"])
    dparams["layer"]["w_down"] = jnp.zeros_like(dparams["layer"]["w_down"])
    return cfg, params, dcfg, dparams


def test_perfect_draft_accepts_full_depth_and_stops_inside_a_path():
    cfg, params, dcfg, dparams = bigram_target_and_perfect_eagle1()
    tree = TreeConfig(2, 3, 15)  # the budget holds the whole pool, so the greedy chain is in it
    prompts = pad_prompts([[1, 2], [5]], multiple=8)
    ar, spec = run_both(dcfg, dparams, tree, prompts=prompts, params=params, cfg=cfg, max_new_tokens=30)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert (spec.accept_histogram[:, tree.depth + 1] == spec.rounds).all()  # every round accepts all D+1
    assert (ar.tokens[:, 1:] == (ar.tokens[:, :-1] + 1) % 16).all()
    # a stop token that falls on an accepted draft slot (not the bonus) ends generation there
    row = ar.tokens[0]
    slot = next(i for i in range(2, 30) if row[i] not in row[:i] and (i - 1) % tree.max_path != tree.max_path - 1)
    ar, spec = run_both(dcfg, dparams, tree, prompts=prompts, params=params, cfg=cfg, max_new_tokens=30, stop_ids=(int(row[slot]),))
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert spec.num_tokens[0] == slot + 1


def test_lookup_chain_is_accepted_past_the_drafted_depth_on_repeating_text():
    """The bigram target counts x -> x + 1 (mod 16): once a prompt holds the cycle, every looked-up
    token is right, while a random head's drafted nodes rarely are."""
    cfg, params, dcfg, _ = bigram_target_and_perfect_eagle1()
    dparams = init_draft_params(jax.random.key(9), dcfg, scale=0.3)
    tree = TreeConfig(2, 1, 3, lookup=6)  # drafted paths hold at most 2 tokens, the chain 6
    prompts = pad_prompts([list(range(16)) + [0, 1], list(range(5, 16)) + list(range(16))], multiple=8)
    ar, spec = run_both(dcfg, dparams, tree, prompts=prompts, params=params, cfg=cfg, max_new_tokens=36, cache_len=96)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert (spec.accept_histogram[:, 6] == spec.rounds).all()  # every round accepts the whole chain
    assert (spec.rounds == (36 - 1) // 7).all()  # the first token comes from the prefill, then 7 a round


def test_rows_with_nothing_to_look_up_draft_the_chains_slots():
    """Where the root token never occurred before, the lookup's slots hold drafted nodes: with the
    perfect head, 1 drafted + 3 slots accept 4 tokens a round on text that does not repeat."""
    cfg, params, dcfg, dparams = bigram_target_and_perfect_eagle1()
    tree = TreeConfig(1, 3, 2, lookup=3)
    prompts = pad_prompts([[0, 1, 2, 3]], multiple=8)  # the answer 4, 5, ..., 14 never repeats
    ar, spec = run_both(dcfg, dparams, tree, prompts=prompts, params=params, cfg=cfg, max_new_tokens=11, cache_len=64)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert spec.rounds[0] == 2 and spec.accept_histogram[0, 4] == 2  # the prefill's token, then 5 a round


def test_cache_that_fills_up_stops_like_plain_decoding():
    for tree in (TreeConfig(3, 3, 12), TreeConfig(2, 1, 4, lookup=7)):
        ar, spec = run_both(*head("eagle3"), tree, max_new_tokens=60, cache_len=32)
        np.testing.assert_array_equal(spec.tokens, ar.tokens)
        lengths = np.asarray(PROMPTS[1])
        np.testing.assert_array_equal(spec.num_tokens, 1 + 32 - lengths)
        assert [FINISH_REASONS[r] for r in spec.finish_reason] == [FINISH_REASONS[r] for r in ar.finish_reason] == ["cache_full"] * 4


def test_compiled_generate_is_one_loop_without_host_callbacks():
    dcfg, dparams = head("eagle3")
    fn = lambda *a: generate_spec(*a, max_new_tokens=8, cache_len=32, tree=TreeConfig(2, 2, 6))  # noqa: E731
    jaxpr = jax.make_jaxpr(fn, static_argnums=(1, 3))(PARAMS, CFG, dparams, dcfg, *PROMPTS, jax.random.key(0))
    top_level = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert top_level.count("while") == 1

    def primitives(jx):
        for e in jx.eqns:
            yield e.primitive.name
            for value in e.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                    if hasattr(sub, "eqns"):
                        yield from primitives(sub)

    names = set(primitives(jaxpr.jaxpr))
    assert {"dot_general", "while"} <= names  # the walk reaches inside the loop
    assert not names & {"pure_callback", "io_callback", "debug_callback", "callback"}
    text = jax.jit(fn, static_argnums=(1, 3)).lower(PARAMS, CFG, dparams, dcfg, *PROMPTS, jax.random.key(0)).as_text()
    assert "callback" not in text


def test_callable_inside_a_users_jit():
    """generate_spec traced inside a user's own jitted function gives the tokens the Engine's run
    gives (which lays the params out for the backend and compiles ahead of time)."""
    dcfg, dparams = head("eagle1")
    tree = TreeConfig(2, 1, 4)
    rows = [[1, 2, 3, 4, 5], [7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3], [3], [5, 6, 7]]
    tokens, lengths = pad_prompts(rows)

    @jax.jit
    def user_fn(params, dparams, tokens, lengths):
        out = generate_spec(params, CFG, dparams, dcfg, tokens, lengths, jax.random.key(0), max_new_tokens=6, cache_len=256, tree=tree)
        return out.tokens, out.num_tokens, out.rounds.sum()

    ids, counts, rounds = jax.tree.map(np.asarray, user_fn(PARAMS, dparams, tokens, lengths))
    engine = Engine(TargetModel(CFG, PARAMS, None, "tiny"), (dcfg, dparams), max_new_tokens=6)
    run = engine.run(rows, tree=tree)
    assert [ids[i, : counts[i]].tolist() for i in range(len(rows))] == run.tokens
    assert rounds == sum(run.rounds) > 0


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(tree=TreeConfig(8, 1, 4)), "larger than the draft vocabulary"),
        (dict(dcfg_override=dict(target_hidden_size=64)), "target hidden size"),
        (dict(cache_len=16), "does not fit a cache"),
        (dict(tree=TreeConfig(2, 1, 4, "sampled")), "only sampling can accept"),
    ],
)
def test_bad_input_gives_one_line_errors(change, message):
    dcfg = DraftConfig.for_target(CFG, kind="eagle3", draft_vocab_size=4, **change.pop("dcfg_override", {}))
    dparams = init_draft_params(jax.random.key(0), dcfg)
    kw = dict(max_new_tokens=4, cache_len=32, tree=TreeConfig(2, 1, 4)) | change
    with pytest.raises(EagleError, match=message):
        generate_spec(PARAMS, CFG, dparams, dcfg, *PROMPTS, jax.random.key(0), **kw)


# ---------------------------------------------------------------- sampling is lossless

def exact_law(params, cfg, prompt, sampling, n):
    """Exact probability of every continuation (x0..x_{n-1}) under plain sampling: (V,)*n array."""
    v = cfg.vocab_size
    seqs = np.array(np.meshgrid(*[np.arange(v)] * n, indexing="ij")).reshape(n, -1).T  # (V**n, n)
    full = np.concatenate([np.broadcast_to(prompt, (len(seqs), len(prompt))), seqs], axis=1)
    ids = jnp.asarray(full, jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    out = forward(params, cfg, ids, pos, None, causal_mask(jnp.ones(ids.shape, bool)))
    logp = np.asarray(processed_log_probs(lm_head(params, out.hidden), sampling))  # (N, L, V)
    p0 = len(prompt) - 1
    total = sum(logp[np.arange(len(seqs)), p0 + j, seqs[:, j]] for j in range(n))
    return np.exp(total).reshape((v,) * n)


def chi_square_p(counts, probs, min_expected=5.0):
    """p-value of a chi-square goodness-of-fit test; cells with small expectation are pooled."""
    expected = probs * counts.sum()
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    stat = float(np.sum((obs[keep] - exp[keep]) ** 2 / exp[keep]))
    dof = int(keep.sum()) - 1
    return float(jax.scipy.special.gammaincc(dof / 2, stat / 2))


@pytest.mark.parametrize(
    "sampling, tree, draft_vocab",
    [
        (SamplingConfig(temperature=1.0), TreeConfig(3, 1, 7), 6),
        (SamplingConfig(temperature=0.7, top_p=0.9), TreeConfig(3, 1, 7), 6),
        (SamplingConfig(temperature=1.0), TreeConfig(2, 1, 4, lookup=2), 6),  # looked-up siblings and a deeper chain
        (SamplingConfig(temperature=1.0), TreeConfig(2, 2, 2, lookup=2), 6),  # drafted nodes where nothing is looked up
        # sampled trees: children drawn from the draft, tried against what they were drawn from
        (SamplingConfig(temperature=1.0), TreeConfig(3, 1, 7, "sampled"), 6),
        (SamplingConfig(temperature=0.7, top_p=0.9), TreeConfig(2, 2, 6, "sampled"), 6),
        (SamplingConfig(temperature=1.0), TreeConfig(2, 1, 4, "sampled", lookup=2), 6),  # drawn and looked-up siblings
        (SamplingConfig(temperature=1.0), TreeConfig(3, 1, 5, "sampled"), 4),  # a draft vocabulary of 4 of the 6 tokens
    ],
)
def test_speculative_sampling_follows_the_target_distribution(sampling, tree, draft_vocab):
    n_tokens, samples = 3, 24_000
    cfg = tiny_config(vocab_size=6)
    params = init_params(jax.random.key(5), cfg, scale=0.4)
    dcfg = DraftConfig.for_target(cfg, kind="eagle3", draft_vocab_size=draft_vocab)
    dparams = init_draft_params(jax.random.key(6), dcfg, scale=0.4)
    prompt = np.array([1, 4, 2], np.int32)
    tokens = jnp.asarray(np.broadcast_to(prompt, (samples, 3)))
    lengths = jnp.full((samples,), 3, jnp.int32)
    out = generate_spec_jit(
        params, cfg, dparams, dcfg, tokens, lengths, jax.random.key(11),
        max_new_tokens=n_tokens, cache_len=16, tree=tree, sampling=sampling,
    )
    assert np.asarray(out.accept_histogram)[:, 1:].sum() > samples // 4  # drafts were accepted often
    seqs = np.asarray(out.tokens)
    counts = np.zeros((cfg.vocab_size,) * n_tokens)
    np.add.at(counts, tuple(seqs.T), 1)
    law = exact_law(params, cfg, prompt, sampling, n_tokens)
    assert abs(law.sum() - 1) < 1e-4
    assert chi_square_p(counts.ravel(), law.ravel()) > 1e-3
    # the same test has the power to see a 2% bias: move 2% of the mass of the likeliest sequence
    biased = law.ravel().copy()
    top, second = np.argsort(-biased)[:2]
    biased[top] -= 0.02
    biased[second] += 0.02
    assert chi_square_p(counts.ravel(), biased) < 1e-3


@pytest.mark.parametrize("kernel", ["pallas_gpu_interpret", "pallas_tpu_interpret"])
def test_greedy_equality_with_pallas_kernels_in_interpret_mode(kernel):
    dcfg, dparams = head("eagle3")
    interpret = dict(cfg=dataclasses.replace(CFG, attention=kernel))
    ar, spec = run_both(dataclasses.replace(dcfg, attention=kernel), dparams, TreeConfig(3, 2, 8), max_new_tokens=12, cache_len=32,
                        **interpret)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    ar_xla, _ = run_both(dataclasses.replace(dcfg, attention="xla"), dparams, TreeConfig(3, 2, 8), max_new_tokens=12, cache_len=32,
                         cfg=dataclasses.replace(CFG, attention="xla"))
    np.testing.assert_array_equal(ar.tokens, ar_xla.tokens)


@pytest.mark.parametrize("tree", [TreeConfig(4, 3, 16), TreeConfig(2, 2, 2, lookup=3)])
def test_greedy_equality_with_the_cpu_layout(tree):
    """Params in the CPU layout (the Engine's on CPU: verify blocks multiply by (in, out) copies,
    decode steps by the stored weights in another form): the same tokens as plain params."""
    dcfg, dparams = head("eagle3")
    plain, _ = run_both(dcfg, dparams, tree, stop_ids=(7,))
    params = cpu_layout(PARAMS)
    ar, spec = run_both(dcfg, cpu_layout(dparams), tree, params=params, stop_ids=(7,))
    np.testing.assert_array_equal(ar.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    # the verify steps do read the copies: spoiled copies change what is accepted, not plain decoding
    # (whose prompts, padded to 64 tokens as the Engine pads them, prefill by the stored weights)
    spoiled = params | {"layers": [layer | {"w_down": layer["w_down"].replace(in_out=0 * layer["w_down"].in_out)} for layer in params["layers"]]}
    prompts = pad_prompts([[1, 2, 3, 4, 5], [7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3], [3], [5, 6, 7]], multiple=64)
    kw = dict(prompts=prompts, stop_ids=(7,), cache_len=128)
    _, right = run_both(dcfg, dparams, tree, params=params, **kw)
    ar_spoiled, wrong = run_both(dcfg, dparams, tree, params=spoiled, **kw)
    np.testing.assert_array_equal(ar_spoiled.tokens, right.tokens)
    assert (wrong.tokens != right.tokens).any()


@pytest.mark.slow
@pytest.mark.parametrize("kind, laid_out", [("eagle1", False), ("eagle3", False), ("eagle3", True)])
def test_smollm2_greedy_speculative_equals_plain_with_a_random_head(smollm2_target, kind, laid_out):
    cfg, params = smollm2_target.cfg, smollm2_target.params
    tok = smollm2_target.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("Name three colors.", "What is 12 times 7?")]
    prompts = pad_prompts([list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts])
    dcfg = DraftConfig.for_target(cfg, kind=kind, draft_vocab_size=4096)
    dparams = init_draft_params(jax.random.key(0), dcfg)
    kw = dict(max_new_tokens=24, cache_len=128, stop_ids=smollm2_target.stop_ids)
    ar = generate_ar_jit(params, cfg, *prompts, jax.random.key(0), **kw)
    if laid_out:  # as the Engine runs on CPU
        params, dparams = cpu_layout(params), cpu_layout(dparams)
    spec = generate_spec_jit(params, cfg, dparams, dcfg, *prompts, jax.random.key(0), tree=TreeConfig(4, 3, 12), **kw)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens))


def padded_shapes(closed_jaxpr, length: int) -> list[tuple[int, ...]]:
    """Shapes of every array with a dimension of at least `length` that a `pad` in the traced
    program (sub-programs included) pads."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pad" and max(eqn.invars[0].aval.shape, default=0) >= length:
                found.append(tuple(eqn.invars[0].aval.shape))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(closed_jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("kernel", ["pallas_gpu_interpret", "pallas_tpu_interpret"])
def test_no_attention_call_pads_a_cache(kernel):
    """Caches are allocated in whole kernel blocks, so neither plain nor speculative decoding pads
    (copies) one to call a kernel; 96 slots, and 96 + the tree's path, fit neither kernel's block."""
    cfg, (dcfg, dparams) = dataclasses.replace(CFG, attention=kernel), head("eagle3")
    dcfg = dataclasses.replace(dcfg, attention=kernel)
    kw = dict(max_new_tokens=8, cache_len=96)
    plain = jax.make_jaxpr(lambda p, t, n: generate_ar_jit(p, cfg, t, n, jax.random.key(0), **kw))(PARAMS, *PROMPTS)
    spec = jax.make_jaxpr(lambda p, dp, t, n: generate_spec_jit(p, cfg, dp, dcfg, t, n, jax.random.key(0), tree=TreeConfig(3, 2, 8), **kw))(
        PARAMS, dparams, *PROMPTS)
    assert padded_shapes(plain, 96) == [] and padded_shapes(spec, 96) == []


@pytest.mark.parametrize("head_name, tree", [("eagle3", TreeConfig(4, 3, 16)), ("eagle1", TreeConfig(3, 2, 8, lookup=3))])
def test_greedy_equality_with_scanned_layers(head_name, tree):
    """The target's layers stacked and scanned over (the accelerators' form): the tokens of the
    unrolled form, plain and speculative, with the EAGLE-3 features captured inside the scan."""
    dcfg, dparams = head(head_name)
    unrolled, _ = run_both(dcfg, dparams, tree, stop_ids=(7,))
    stacked = stack_layers(PARAMS)
    assert stacked["layers"]["wq"].shape == (CFG.num_layers, *PARAMS["layers"][0]["wq"].shape)
    ar, spec = run_both(dcfg, dparams, tree, params=stacked, stop_ids=(7,))
    np.testing.assert_array_equal(ar.tokens, unrolled.tokens)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert spec.accept_histogram[:, 1:].sum() > 0
    for a, b in zip(jax.tree.leaves(unstack_layers(stacked)), jax.tree.leaves(PARAMS)):
        np.testing.assert_array_equal(a, b)


def test_scanned_forward_matches_unrolled_and_refuses_a_per_layer_cache():
    tokens, lengths = PROMPTS
    b, t = tokens.shape
    positions, mask = jnp.broadcast_to(jnp.arange(t), (b, t)), causal_mask(jnp.ones((b, t), bool))
    capture = (2, 3, 3, 0)  # a layer captured twice, and the embeddings
    a = forward(PARAMS, CFG, tokens, positions, None, mask, capture=capture)
    b_ = forward(stack_layers(PARAMS), CFG, tokens, positions, None, mask, capture=capture)
    for x, y in zip(a, b_):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, atol=1e-4)
    with pytest.raises(EagleError, match="a per-layer KV cache for params whose layers are stacked"):
        forward(stack_layers(PARAMS), CFG, tokens, positions, make_cache(CFG, b, 64), mask)


def test_layer_form_is_scan_on_accelerators_and_unrolled_on_cpu():
    assert [layer_form("auto", p) for p in ("gpu", "tpu", "cpu")] == ["scan", "scan", "unrolled"]
    assert layer_form("scan", "cpu") == "scan" and layer_form() == "unrolled"  # this CPU
    with pytest.raises(EagleError, match="unknown layer form 'stacked'; expected one of auto, unrolled, scan"):
        layer_form("stacked")
    target = TargetModel(CFG, PARAMS, None, "tiny")
    dcfg, dparams = head("eagle3")
    scanned = Engine(target, (dcfg, dparams), max_new_tokens=24, layers="scan")
    assert isinstance(scanned.laid_out.params["layers"], dict) and scanned.laid_out.layers == "scan"
    rows = [[1, 2, 3], [4, 5, 6, 7]]
    expected = Engine(target, (dcfg, dparams), max_new_tokens=24).run(rows, tree=TreeConfig(3, 2, 8)).tokens
    assert scanned.run(rows, tree=TreeConfig(3, 2, 8)).tokens == expected == scanned.run(rows, tree=None).tokens


def test_bfloat16_weights_with_float32_activations():
    """--float32-activations: the weights stay bfloat16, the embedding (and so every activation and
    the KV caches) is float32, and greedy speculative output equals plain output over it."""
    params = float32_activations(jax.tree.map(lambda w: w.astype(jnp.bfloat16), PARAMS))
    assert params["embed"].dtype == jnp.float32 and params["layers"][0]["wq"].dtype == jnp.bfloat16
    dcfg, dparams = head("eagle3")
    dparams = jax.tree.map(lambda w: w.astype(jnp.bfloat16) if jnp.issubdtype(w.dtype, jnp.floating) else w, dparams)
    ar, spec = run_both(dcfg, dparams, TreeConfig(4, 3, 16), params=params, stop_ids=(7,))
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert spec.accept_histogram[:, 1:].sum() > 0
    assert make_cache(CFG, 1, 8, params["embed"].dtype).k[0].dtype == jnp.float32  # what decoding allocates


GEMMA_LIKE = tiny_config(  # Gemma 3's shape of model: two sliding layers per global one, a window far shorter than the cache
    vocab_size=8, family="gemma3", qk_norm=True, sandwich_norms=True, mlp_activation="gelu_tanh", embed_scale=32**0.5,
    query_scale=12**-0.5, sliding_window=6, sliding_layers=(0, 1, 3, 4), local_rope=dataclasses.replace(CFG.rope, theta=100.0),
    rope=dataclasses.replace(CFG.rope, theta=1e6), tie_embeddings=True,
)


@pytest.mark.parametrize("attention", ["xla", "pallas_gpu_interpret", "pallas_tpu_interpret"])
@pytest.mark.parametrize("form", ["unrolled", "scan"])
def test_greedy_equality_with_sliding_windows_shorter_than_the_cache(form, attention):
    """Decoding 40 tokens through windows of 6: speculative equals plain, and plain decoding (cache
    starts per query) gives at every step the argmax of one causal forward over the whole sequence
    (windows in the block mask), so the cache and the block agree on what a window hides."""
    cfg = dataclasses.replace(GEMMA_LIKE, attention=attention)
    params = init_params(jax.random.key(2), cfg, scale=0.3)
    params = stack_layers(params) if form == "scan" else params
    dcfg = DraftConfig.for_target(cfg, kind="eagle3")
    dparams = init_draft_params(jax.random.key(1), dcfg, scale=0.3)
    ar, spec = run_both(dcfg, dparams, TreeConfig(4, 3, 16), params=params, cfg=cfg)
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    assert spec.accept_histogram[:, 1:].sum() > 0
    tokens, lengths = PROMPTS
    row, n = 1, int(lengths[1])  # the longest prompt: 11 tokens, then 40 generated
    sequence = np.concatenate([np.asarray(tokens[row, :n]), ar.tokens[row]])[None]
    t = sequence.shape[1]
    out = forward(params, cfg, jnp.asarray(sequence), jnp.arange(t)[None], None, causal_mask(jnp.ones((1, t), bool)))
    np.testing.assert_array_equal(np.asarray(jnp.argmax(lm_head(params, out.hidden), -1))[0, n - 1:-1], ar.tokens[row])


def test_the_window_hides_what_lies_before_it():
    """Positions past the window see other logits than with full attention, positions inside it the same."""
    params = init_params(jax.random.key(2), GEMMA_LIKE, scale=0.3)
    tokens = jax.random.randint(jax.random.key(3), (1, 20), 0, 8)
    args = (jnp.arange(20)[None], None, causal_mask(jnp.ones((1, 20), bool)))
    windowed = lm_head(params, forward(params, GEMMA_LIKE, tokens, *args).hidden)
    full = lm_head(params, forward(params, dataclasses.replace(GEMMA_LIKE, sliding_window=1000), tokens, *args).hidden)
    np.testing.assert_allclose(windowed[:, :6], full[:, :6], atol=1e-5)
    assert np.abs(np.asarray(windowed[:, 6:] - full[:, 6:])).min(-1).max() > 1e-3


def test_greedy_equality_with_the_mosaic_gpu_kernel_in_interpret_mode():
    """The Hopper kernel (heads of 64, its smallest) for target and head: speculative equals plain,
    and both equal XLA attention's tokens."""
    cfg = tiny_config(vocab_size=8, head_dim=64)
    params = init_params(jax.random.key(0), cfg, scale=0.3)
    dcfg = DraftConfig.for_target(cfg, kind="eagle3")
    dparams = init_draft_params(jax.random.key(1), dcfg, scale=0.3)
    prompts = pad_prompts([[1, 2, 3, 4, 5], [3, 6]], multiple=8)
    runs = {}
    for attention in ("pallas_mosaic_gpu_interpret", "xla"):
        runs[attention] = run_both(dataclasses.replace(dcfg, attention=attention), dparams, TreeConfig(3, 2, 8), prompts, params,
                                   dataclasses.replace(cfg, attention=attention), max_new_tokens=8, cache_len=24)
    (ar, spec), (ar_xla, _) = runs["pallas_mosaic_gpu_interpret"], runs["xla"]
    np.testing.assert_array_equal(spec.tokens, ar.tokens)
    np.testing.assert_array_equal(ar.tokens, ar_xla.tokens)
    assert spec.accept_histogram[:, 1:].sum() > 0
