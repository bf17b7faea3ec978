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
