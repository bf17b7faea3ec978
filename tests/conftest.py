"""Shared fixtures: tiny random targets for fast tests, the real SmolLM2 for the tests that need it."""

from __future__ import annotations

import functools
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax
import pytest

from eagle_jax.model.config import ModelConfig
from eagle_jax.model.transformer import init_params

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=6, num_heads=4, num_kv_heads=2, head_dim=8)
    fields.update(overrides)
    return ModelConfig(**fields)


@pytest.fixture(scope="session")
def tiny_target():
    cfg = tiny_config()
    return cfg, init_params(jax.random.key(0), cfg, scale=0.3)


@functools.lru_cache(maxsize=1)
def smollm2():
    from eagle_jax.loading import load_target

    try:
        return load_target("smollm2-135m-instruct")
    except Exception as e:  # the model wheel is a test dependency; say so plainly if it is absent
        pytest.fail(f"SmolLM2 not available: {e}")


@pytest.fixture(scope="session")
def smollm2_target():
    return smollm2()


def assert_last_logits_match(params: dict, hidden, lengths, ref, tol: float = 1e-3) -> None:
    """Logits at the last three prompt positions of post-norm `hidden` (B, T, d) against a GGUF
    reference of scripts/tools/make_reference_fixtures.py: its top-64 logits and the logsumexp over
    the whole vocabulary, within `tol`."""
    import numpy as np

    from eagle_jax.decoding.prompts import last_valid
    from eagle_jax.model.transformer import lm_head

    for back in range(3):
        logits = np.asarray(lm_head(params, last_valid(hidden, lengths - (2 - back))), np.float64)
        top = np.take_along_axis(logits, ref["last_top64_ids"][:, back], 1)
        assert np.abs(top - ref["last_top64_logits"][:, back]).max() <= tol
        peak = logits.max(-1)
        logsumexp = peak + np.log(np.exp(logits - peak[:, None]).sum(-1))
        assert np.abs(logsumexp - ref["last_logits_logsumexp"][:, back]).max() <= tol
