"""Target logits and hidden states equal transformers' PyTorch models (fixtures from
scripts/tools/make_reference_fixtures.py, run with torch 2.13.0 in a Python 3.11 venv)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import FIXTURES
from eagle_jax.decoding.prompts import last_valid, prefill
from eagle_jax.loading import load_target
from eagle_jax.model.layers import FEW_ROWS, InOut, dense
from eagle_jax.model.transformer import causal_mask, for_blocks, forward, lm_head, make_cache, with_block_copies

FAMILIES = ["llama", "llama3", "mistral", "qwen2", "qwen3", "smollm"]


@pytest.mark.parametrize("blocks", [False, True], ids=["stored", "block_copies"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_hidden_states_match_transformers(family, blocks):
    """The forward matches transformers with the weights as loaded and with the (in, out) copies
    that verify steps multiply by (`with_block_copies`)."""
    directory = os.path.join(FIXTURES, family)
    ref = np.load(os.path.join(directory, "reference.npz"))
    target = load_target(directory, with_tokenizer=False)
    cfg = target.cfg
    ids = jnp.asarray(ref["input_ids"])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    layers = tuple(range(cfg.num_layers))
    params = for_blocks(with_block_copies(target.params)) if blocks else target.params
    if blocks:
        assert all(isinstance(layer["wq"], InOut) for layer in params["layers"])  # CPU: the copies are used
    out = forward(params, cfg, ids, positions, None, causal_mask(jnp.ones(ids.shape, bool)), capture=layers)
    logits = lm_head(target.params, out.hidden)
    assert np.abs(np.asarray(logits) - ref["logits"]).max() <= 1e-4
    # one row alone, as in a decode step
    single = lm_head(target.params, out.hidden[:1, -1:])
    assert np.abs(np.asarray(single)[0, 0] - ref["logits"][0, -1]).max() <= 1e-4
    # HF hidden_states[i] (i < L) is the input of layer i; hidden_states[L] is post-norm.
    assert np.abs(np.asarray(out.captured) - ref["hidden_states"][:-1]).max() <= 1e-4
    assert np.abs(np.asarray(out.hidden) - ref["hidden_states"][-1]).max() <= 1e-4


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_incremental_decoding_with_cache_matches(family):
    directory = os.path.join(FIXTURES, family)
    ref = np.load(os.path.join(directory, "reference.npz"))
    target = load_target(directory, with_tokenizer=False)
    ids = jnp.asarray(ref["input_ids"])
    b, t = ids.shape
    p = int(ref["prefix_len"])
    cache = make_cache(target.cfg, b, 32)
    out, cache = prefill(target.params, target.cfg, ids[:, :p], jnp.full((b,), p, jnp.int32), cache)
    got = [lm_head(target.params, out.hidden)]
    for i in range(p, t):
        out = forward(target.params, target.cfg, ids[:, i : i + 1], jnp.full((b, 1), i), cache, jnp.ones((b, 1, 1), bool))
        cache = cache.write(out.k_new, out.v_new, jnp.ones((b,), jnp.int32))
        got.append(lm_head(target.params, out.hidden))
    assert np.abs(np.asarray(jnp.concatenate(got, 1)) - ref["step_logits"]).max() <= 1e-4


@pytest.mark.slow
def test_smollm2_gguf_logits_match_transformers(smollm2_target):
    ref = np.load(os.path.join(FIXTURES, "smollm2_gguf_reference.npz"))
    ids, lengths = jnp.asarray(ref["prompt_ids"]), jnp.asarray(ref["prompt_lengths"])
    cache = make_cache(smollm2_target.cfg, ids.shape[0], 64)
    out, _ = prefill(smollm2_target.params, smollm2_target.cfg, ids, lengths, cache)
    for back in range(3):  # the last three prompt positions
        hidden = last_valid(out.hidden, lengths - (2 - back))
        logits = np.asarray(lm_head(smollm2_target.params, hidden))
        assert np.abs(logits - ref["last_logits"][:, back]).max() <= 1e-3


@pytest.mark.slow
def test_gguf_tokenizer_and_chat_template_match_transformers(smollm2_target):
    with open(os.path.join(FIXTURES, "tokenizer_cases.json")) as f:
        cases = json.load(f)
    tok = smollm2_target.tokenizer
    for case in cases["cases"]:
        assert tok.encode(case["text"], add_special_tokens=False) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["decoded"]
    for name, conv in cases["chat_template"].items():
        rendered = tok.apply_chat_template(conv["messages"], tokenize=False, add_generation_prompt=conv["add_generation_prompt"])
        assert rendered == conv["rendered"], name


@pytest.mark.parametrize("rows", [1, 5, 7, 12, FEW_ROWS - 1, FEW_ROWS, FEW_ROWS + 1, 300])
def test_dense_matches_numpy_on_both_paths(rows):
    """`dense` takes a CPU-specific form up to FEW_ROWS rows (padded to whole ROW_BLOCKs past
    PAD_ABOVE rows) and the plain contraction above: both, their gradients (training goes through
    both) and their vmap (TTT steps) must be x @ w.T."""
    rng = np.random.default_rng(rows)
    x, w = rng.normal(size=(1, rows, 24)).astype(np.float32), rng.normal(size=(40, 24)).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    np.testing.assert_allclose(dense(jnp.asarray(x), jnp.asarray(w)), x64 @ w64.T, rtol=1e-5, atol=1e-5)
    cotangent = rng.normal(size=(1, rows, 40))
    gx, gw = jax.grad(lambda x, w: jnp.sum(dense(x, w) * cotangent), argnums=(0, 1))(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(gx, cotangent @ w64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw, cotangent[0].T @ x64[0], rtol=1e-4, atol=1e-4)
    batched = jax.vmap(dense, in_axes=(1, None), out_axes=1)(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(batched, x64 @ w64.T, rtol=1e-5, atol=1e-5)
    # an (in, out) copy, as verify steps multiply
    np.testing.assert_allclose(dense(jnp.asarray(x), InOut(jnp.asarray(w.T))), x64 @ w64.T, rtol=1e-5, atol=1e-5)
