"""Plain autoregressive generate: equal to a step-by-step decode without a cache; batching, stops,
cache capacity, sampling processors and bfloat16."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import pad_prompts
from eagle_jax.model.transformer import causal_mask, forward, init_params, lm_head
from eagle_jax.decoding.sampling import SamplingConfig, processed_log_probs

CFG = tiny_config(vocab_size=40)
PARAMS = init_params(jax.random.key(2), CFG, scale=0.3)


REFERENCE_LEN = 32  # the reference's sequences are zero-padded to one shape: one compile


@jax.jit
def next_greedy_token_without_cache(ids: jax.Array, length: jax.Array) -> jax.Array:
    """argmax of the logits after the first `length` tokens of ids (1, REFERENCE_LEN), run from
    scratch; the causal mask keeps the padding after them out of the result."""
    positions = jnp.arange(REFERENCE_LEN)[None]
    hidden = forward(PARAMS, CFG, ids, positions, None, causal_mask(positions < length)).hidden
    return jnp.argmax(lm_head(PARAMS, hidden[0, length - 1]))


def reference_greedy(prompt: list[int], steps: int, stop_ids=()) -> list[int]:
    """Re-run the whole sequence without any cache for every new token."""
    seq, out = list(prompt), []
    for _ in range(steps):
        ids = jnp.zeros((1, REFERENCE_LEN), jnp.int32).at[0, : len(seq)].set(jnp.asarray(seq, jnp.int32))
        nxt = int(next_greedy_token_without_cache(ids, len(seq)))
        out.append(nxt)
        seq.append(nxt)
        if nxt in stop_ids:
            break
    return out


def test_greedy_equals_step_by_step_reference_for_a_ragged_batch():
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]]
    out = generate_ar_jit(PARAMS, CFG, *pad_prompts(prompts, multiple=8), jax.random.key(0), max_new_tokens=12, cache_len=32)
    for row, prompt in enumerate(prompts):
        assert np.asarray(out.tokens[row, : out.num_tokens[row]]).tolist() == reference_greedy(prompt, 12)


def test_rows_stop_at_their_own_stop_token_and_at_cache_capacity():
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    free = [reference_greedy(p, 12) for p in prompts]
    stop = free[0][4]
    out = generate_ar_jit(PARAMS, CFG, *pad_prompts(prompts, multiple=8), jax.random.key(0), max_new_tokens=12, cache_len=32, stop_ids=(stop,))
    for row, prompt in enumerate(prompts):
        expected = reference_greedy(prompt, 12, stop_ids=(stop,))
        assert np.asarray(out.tokens[row, : out.num_tokens[row]]).tolist() == expected
        assert (np.asarray(out.tokens[row, out.num_tokens[row] :]) == -1).all()
    full = generate_ar_jit(PARAMS, CFG, *pad_prompts(prompts, multiple=8), jax.random.key(0), max_new_tokens=40, cache_len=12)
    np.testing.assert_array_equal(np.asarray(full.num_tokens), [1 + 12 - 5, 1 + 12 - 3])  # one token per free slot, plus one


@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.3, top_k=3)])
def test_first_sampled_token_follows_the_processed_distribution(sampling):
    n = 20_000
    prompt = np.array([[3, 1, 4]], np.int32)
    tokens = jnp.asarray(np.repeat(prompt, n, 0))
    out = generate_ar_jit(PARAMS, CFG, tokens, jnp.full((n,), 3, jnp.int32), jax.random.key(1), max_new_tokens=1, cache_len=8, sampling=sampling)
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=CFG.vocab_size)
    hidden = forward(PARAMS, CFG, jnp.asarray(prompt), jnp.arange(3)[None], None, causal_mask(jnp.ones((1, 3), bool))).hidden
    probs = np.exp(np.asarray(processed_log_probs(lm_head(PARAMS, hidden[0, -1]), sampling)))
    assert counts[probs == 0].sum() == 0  # nothing outside top-k / top-p is ever drawn
    tolerance = 4 * np.sqrt(probs * (1 - probs) / n) + 1e-3  # four standard errors per token
    assert np.all(np.abs(counts / n - probs) <= tolerance), (counts / n, probs)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    kept = np.isfinite(np.asarray(processed_log_probs(logits, SamplingConfig(1.0, top_p=0.8))))
    np.testing.assert_array_equal(kept, [True, True, False, False])
    kept = np.isfinite(np.asarray(processed_log_probs(logits, SamplingConfig(1.0, top_p=0.81))))
    np.testing.assert_array_equal(kept, [True, True, True, False])


def test_bfloat16_model_stays_close_to_float32():
    prompts = pad_prompts([[3, 1, 4, 1, 5]], multiple=8)
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), PARAMS)
    ids = jnp.asarray([[3, 1, 4, 1, 5]])
    mask = causal_mask(jnp.ones(ids.shape, bool))
    pos = jnp.arange(5)[None]
    ref = lm_head(PARAMS, forward(PARAMS, CFG, ids, pos, None, mask).hidden)
    low = lm_head(bf16, forward(bf16, CFG, ids, pos, None, mask).hidden)
    assert low.dtype == jnp.float32 and float(jnp.max(jnp.abs(low - ref))) < 0.1 * float(jnp.max(jnp.abs(ref)))
    out = generate_ar_jit(bf16, CFG, *prompts, jax.random.key(0), max_new_tokens=6, cache_len=16)
    assert int(out.num_tokens[0]) == 6
