"""On-disk cache of converted GGUF models: dequantizing and building the tokenizer takes seconds,
reading the converted float32 weights back takes well under one.

Entries live in $EAGLE_JAX_CACHE/converted (eagle_jax.disk_cache), keyed by the GGUF's absolute path,
size and modification time; each is written to a temporary directory and renamed into place, so a
half-written entry is never read. Set EAGLE_JAX_CACHE=off to disable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os

import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import load_file, save_file

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.disk_cache import cache_root
from eagle_jax.files import read_json, write_directory_atomic, write_json_atomic


# Part of every entry's key: entries written for another params layout are never read.
PARAMS_LAYOUT = "per-layer, matrices (out, in)"


def entry_dir(path: str) -> str | None:
    root = cache_root()
    if root is None:
        return None
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{PARAMS_LAYOUT}"
    name = os.path.basename(path).removesuffix(".gguf")
    return os.path.join(root, "converted", f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def load_converted(path: str):
    """(cfg, float32 numpy params, tokenizer) from the cache, or None on a miss."""
    entry = entry_dir(path)
    if entry is None or not os.path.isdir(entry):
        return None
    from transformers import PreTrainedTokenizerFast

    fields = read_json(os.path.join(entry, "config.json"), what="a converted model's config")
    fields["rope"] = RopeConfig(**fields["rope"])
    fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
    params = unflatten_dict(load_file(os.path.join(entry, "params.safetensors")), sep=".")
    params["layers"] = [params["layers"][str(i)] for i in range(len(params["layers"]))]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(os.path.join(entry, "tokenizer"))
    return ModelConfig(**fields), params, tokenizer


def store_converted(path: str, cfg: ModelConfig, params: dict, tokenizer) -> None:
    """Write a cache entry atomically; failures (read-only home, full disk) only skip the cache."""
    entry = entry_dir(path)
    if entry is None:
        return

    def fill(staging: str) -> None:
        write_json_atomic(os.path.join(staging, "config.json"), dataclasses.asdict(cfg), indent=None)
        by_index = params | {"layers": {str(i): layer for i, layer in enumerate(params["layers"])}}
        flat = {k: np.asarray(v, np.float32) for k, v in flatten_dict(by_index, sep=".").items()}
        save_file(flat, os.path.join(staging, "params.safetensors"))
        tokenizer.save_pretrained(os.path.join(staging, "tokenizer"))

    with contextlib.suppress(OSError):  # includes losing a race to another process writing the same entry
        write_directory_atomic(entry, fill, replace=False)
