"""Fixtures of the training tests (no tests here): a tiny random HF target directory with a word-level
ChatML tokenizer, synthetic conversations, and helpers that run the train CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
from safetensors.numpy import save_file

from conftest import tiny_config
from eagle_jax.model.transformer import init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL = ["<|im_start|>", "<|im_end|>", "<unk>"]
ROLES = ["system", "user", "assistant"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def words(vocab_size: int) -> list[str]:
    return [f"w{i}" for i in range(vocab_size - len(SPECIAL) - len(ROLES))]


def make_tokenizer(vocab_size: int):
    """A word-level tokenizer over SPECIAL + ROLES + w0, w1, ... with a ChatML template."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + ROLES + words(vocab_size))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL[:2]])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", unk_token="<unk>", pad_token="<|im_end|>", chat_template=CHAT_TEMPLATE
    )


def counting_params(cfg, seed: int) -> dict:
    """Random target params whose next-token choice mostly follows a rule, id -> id + 1, so that a
    draft head can learn it in a few steps: small attention/MLP outputs keep the residual stream
    close to the token's embedding, and lm_head row j is the unit embedding of token j - 1."""
    params = jax.tree.map(np.asarray, init_params(jax.random.key(seed), cfg, scale=0.3))
    params["layers"] = [layer | {key: layer[key] * 0.02 for key in ("wo", "w_down")} for layer in params["layers"]]
    embed = params["embed"]
    params["lm_head"] = (4 * np.roll(embed, 1, axis=0) / np.linalg.norm(embed, axis=1, keepdims=True)).astype(np.float32)
    return params


def write_tiny_model(directory: str, seed: int = 0, **overrides) -> str:
    """A `counting_params` Llama target (tiny_config sizes): config.json + model.safetensors + tokenizer files."""
    cfg = tiny_config(**overrides)
    params = counting_params(cfg, seed)
    names = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "wq": "self_attn.q_proj",
             "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
             "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
    tensors = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"],
               "lm_head.weight": params["lm_head"]}
    for key, name in names.items():
        for i, layer in enumerate(params["layers"]):
            tensors[f"model.layers.{i}.{name}.weight"] = layer[key]
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    tokenizer = make_tokenizer(cfg.vocab_size)
    tokenizer.save_pretrained(directory)
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
              "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
              "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope.theta, "tie_word_embeddings": False,
              "eos_token_id": tokenizer.eos_token_id}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return directory



def write_tiny_head(directory: str, model: str) -> str:
    """A random EAGLE-3 head (draft vocabulary 64) exported for the target directory `model`."""
    from eagle_jax.draft import DraftConfig, init_draft_params
    from eagle_jax.draft.checkpoint import export_draft
    from eagle_jax.loading import load_target

    dcfg = DraftConfig.for_target(load_target(model).cfg, kind="eagle3", draft_vocab_size=64)
    export_draft(directory, dcfg, init_draft_params(jax.random.key(0), dcfg, scale=0.3))
    return directory


def synthetic_conversations(n: int, vocab_size: int = 96, seed: int = 0) -> list[dict]:
    """ShareGPT records: the user names a start word and a stride; the assistant counts onwards."""
    rng = np.random.default_rng(seed)
    vocab = words(vocab_size)
    records = []
    for i in range(n):
        turns = []
        for _ in range(rng.integers(1, 3)):
            start, stride, length = rng.integers(0, len(vocab)), rng.integers(1, 4), rng.integers(8, 20)
            turns.append({"from": "human", "value": f"{vocab[start]} {vocab[stride]}"})
            turns.append({"from": "gpt", "value": " ".join(vocab[(start + j * stride) % len(vocab)] for j in range(length))})
        records.append({"id": f"c{i}", "conversations": turns})
    return records


def write_conversations(path: str, n: int, seed: int = 0) -> str:
    with open(path, "w") as f:
        json.dump(synthetic_conversations(n, seed=seed), f)
    return path


def tiny_run_args(model: str, data: str, out: str, *extra: str) -> list[str]:
    """CLI arguments of a short, fast run on the tiny target."""
    return ["--model", model, "--data", data, "--out", out, "--seq-len", "64", "--batch-size", "8", "--grad-accum", "1", "--ttt-steps", "3",
            "--draft-vocab", "64", "--lr", "3e-3", "--warmup-steps", "2", "--no-progress", *extra]


def run_cli(args: list[str], env: dict | None = None, devices: int = 1, **kw) -> subprocess.CompletedProcess:
    """`python -m eagle_jax.train ARGS` in a fresh process with `devices` simulated CPU devices."""
    full_env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-m", "eagle_jax.train", *args], env=full_env, cwd=ROOT, capture_output=True, text=True, **kw)


def read_metrics(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
