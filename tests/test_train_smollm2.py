"""The one training test on the real SmolLM2-135M-Instruct and ShareGPT: its chat template's assistant
mask, and two short optimizer steps of the CLI ending in a head that loads for generation."""

from __future__ import annotations

import argparse
import math
import os

import pytest

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.loading.gguf_file import open_gguf
from eagle_jax.loading.registry import resolve_model_path
from eagle_jax.loading.tokenizer import tokenizer_from_gguf
from eagle_jax.train import cli
from eagle_jax.train.data import load_conversations, tokenize_conversation
from test_train_support import read_metrics

MODEL = "smollm2-135m-instruct"


@pytest.mark.slow
def test_smollm2_on_a_sharegpt_slice(tmp_path):
    path = resolve_model_path(MODEL)
    tokenizer = tokenizer_from_gguf(open_gguf(path), path)
    conv = load_conversations("sharegpt", limit=1)[0][0]
    ids, mask = tokenize_conversation(tokenizer, conv.messages, (tokenizer.eos_token_id,))
    answers = [m["content"] + "<|im_end|>" for m in conv.messages if m["role"] == "assistant"]
    masked_text = tokenizer.decode(ids[mask])
    assert masked_text == "".join(answers)  # every answer with its end of turn, no header, no question

    out = str(tmp_path / "run")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model", MODEL, "--data", "sharegpt", "--num-conversations", "6", "--out", out, "--seq-len", "96",
                              "--long-samples", "split", "--batch-size", "2", "--grad-accum", "1", "--ttt-steps", "2", "--draft-vocab", "512",
                              "--max-steps", "2", "--dev-fraction", "0", "--log-every", "1", "--no-progress"])
    assert cli.run(args) == 0
    train = [r for r in read_metrics(out) if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in train)
    dcfg, params = load_draft(os.path.join(out, "draft"))
    assert (dcfg.kind, dcfg.feature_layers, dcfg.draft_vocab_size, dcfg.target_vocab_size) == ("eagle3", (2, 15, 27), 512, 49152)
