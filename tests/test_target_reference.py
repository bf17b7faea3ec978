"""Target logits and hidden states equal transformers' PyTorch models (fixtures from
scripts/tools/make_reference_fixtures.py, run with torch 2.13.0 in a Python 3.11 venv)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import FIXTURES, assert_last_logits_match
from eagle_jax.decoding.prompts import prefill
from eagle_jax.loading import load_target
from eagle_jax.model.cpu_layout import FEW_ROWS, MAX_BLOCK_TOKENS, CpuWeight, cpu_layout
from eagle_jax.model.layers import dense
from eagle_jax.model.transformer import causal_mask, forward, lm_head, make_cache, stack_layers

FAMILIES = ["llama", "llama3", "mistral", "mistral_window", "qwen2", "qwen3", "smollm", "gemma3"]


@pytest.mark.parametrize("layout", ["stored", "cpu_layout", "scan"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_hidden_states_match_transformers(family, layout):
    """The forward matches transformers with the weights as loaded, in the CPU layout (whose
    (in, out) copies blocks of tokens multiply by, and whose other form one row takes) and with
    the layers stacked and scanned over."""
    directory = os.path.join(FIXTURES, family)
    ref = np.load(os.path.join(directory, "reference.npz"))
    target = load_target(directory, with_tokenizer=False)
    cfg = target.cfg
    ids = jnp.asarray(ref["input_ids"])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    layers = tuple(range(cfg.num_layers))
    laid_out = layout == "cpu_layout"
    params = cpu_layout(target.params) if laid_out else stack_layers(target.params) if layout == "scan" else target.params
    if laid_out:
        assert all(isinstance(layer["wq"], CpuWeight) and layer["wq"].in_out is not None for layer in params["layers"])
        assert 1 < ids.shape[1] < MAX_BLOCK_TOKENS  # the block multiplies by the copies
    out = forward(params, cfg, ids, positions, None, causal_mask(jnp.ones(ids.shape, bool)), capture=layers)
    logits = lm_head(params, out.hidden)
    assert np.abs(np.asarray(logits) - ref["logits"]).max() <= 1e-4
    # one row alone, as in a decode step
    single = lm_head(params, out.hidden[:1, -1:])
    assert np.abs(np.asarray(single)[0, 0] - ref["logits"][0, -1]).max() <= 1e-4
    # HF hidden_states[i] (i < L) is the input of layer i; hidden_states[L] is post-norm.
    assert np.abs(np.asarray(out.captured) - ref["hidden_states"][:-1]).max() <= 1e-4
    assert np.abs(np.asarray(out.hidden) - ref["hidden_states"][-1]).max() <= 1e-4


@pytest.mark.parametrize("family", ["llama3", "qwen3", "mistral_window", "gemma3"])
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
    assert_last_logits_match(smollm2_target.params, out.hidden, lengths, ref)


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
def test_dense_matches_numpy_in_every_form(rows):
    """`dense` of a plain weight, and of a CpuWeight in each of its forms (w @ x^T up to FEW_ROWS
    rows, padded to whole ROW_BLOCKs past PAD_ABOVE; the (in, out) copy for blocks of tokens; the
    plain contraction above), its gradient and its vmap: all x @ w.T."""
    rng = np.random.default_rng(rows)
    x, w = rng.normal(size=(1, rows, 24)).astype(np.float32), rng.normal(size=(40, 24)).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ w64.T
    weights = {"plain": jnp.asarray(w), "cpu": CpuWeight(jnp.asarray(w)), "cpu_copies": CpuWeight(jnp.asarray(w), jnp.asarray(w.T))}
    cotangent = rng.normal(size=(1, rows, 40))
    for name, weight in weights.items():
        np.testing.assert_allclose(dense(jnp.asarray(x), weight), want, rtol=1e-5, atol=1e-5, err_msg=name)
        # rows of one token each, as decode steps have them
        np.testing.assert_allclose(dense(jnp.asarray(x[0][:, None]), weight)[:, 0], want[0], rtol=1e-5, atol=1e-5, err_msg=name)
        gx = jax.grad(lambda x: jnp.sum(dense(x, weight) * cotangent))(jnp.asarray(x))
        np.testing.assert_allclose(gx, cotangent @ w64, rtol=1e-4, atol=1e-4, err_msg=name)
        batched = jax.vmap(lambda x: dense(x, weight), in_axes=1, out_axes=1)(jnp.asarray(x))
        np.testing.assert_allclose(batched, want, rtol=1e-5, atol=1e-5, err_msg=name)
    gw = jax.grad(lambda w: jnp.sum(dense(jnp.asarray(x), w) * cotangent))(jnp.asarray(w))
    np.testing.assert_allclose(gw, cotangent[0].T @ x64[0], rtol=1e-4, atol=1e-4)


def test_cpu_layout_covers_every_projection_of_target_and_head():
    """Every projection, the fc and the lm_head (a tied target's: its embedding) take the layout;
    embeddings, norms and the vocabulary map stay arrays; laying out twice changes nothing."""
    from conftest import tiny_config
    from eagle_jax.draft import DraftConfig, init_draft_params
    from eagle_jax.model.transformer import init_params

    cfg = tiny_config(vocab_size=8, tie_embeddings=True)
    params = cpu_layout(init_params(jax.random.key(0), cfg))
    assert params["lm_head"].w is params["embed"] and params["lm_head"].in_out is None
    for layer in params["layers"]:
        assert {k for k, v in layer.items() if isinstance(v, CpuWeight)} == {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"}
    assert cpu_layout(params) is params
    dparams = cpu_layout(init_draft_params(jax.random.key(1), DraftConfig.for_target(cfg, kind="eagle3", draft_vocab_size=4)))
    assert all(isinstance(dparams[k], CpuWeight) and dparams[k].in_out is None for k in ("fc", "lm_head"))
    assert all(v.in_out is None for v in dparams["layer"].values() if isinstance(v, CpuWeight))
    assert not isinstance(dparams["d2t"], CpuWeight) and not isinstance(dparams["final_norm"], CpuWeight)
    assert cpu_layout(params, block_copies=False)["layers"][0]["wq"].in_out is not None  # already laid out: as it was
