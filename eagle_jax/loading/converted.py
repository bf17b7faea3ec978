"""On-disk cache of converted GGUF models: dequantizing and building the tokenizer takes seconds,
reading the converted float32 weights back takes well under one.

Entries live in $EAGLE_JAX_CACHE/converted (eagle_jax.disk_cache), keyed by the GGUF's absolute path,
size and modification time; each is written to a temporary directory and renamed into place, so a
half-written entry is never read, with checksums of its files, so a damaged one is rebuilt. Set
EAGLE_JAX_CACHE=off to disable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import shutil
import zlib

import jax
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
from safetensors.numpy import save_file

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.disk_cache import cache_root
from eagle_jax.errors import EagleError, warn
from eagle_jax.files import read_json, remove_leftovers, write_directory_atomic, write_json_atomic
from eagle_jax.loading.params import HostTensor


# Part of every entry's key: entries written for another params layout are never read.
PARAMS_LAYOUT = "per-layer, matrices (out, in)"
CHECKSUMS = "checksums.json"
# Staging directories younger than this may belong to another process converting now.
LIVE_WRITE_S = 3600
MAX_STORED_BYTES = 4 << 30  # float32 weights kept converted only up to this size


def entry_dir(path: str) -> str | None:
    root = cache_root()
    if root is None:
        return None
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{PARAMS_LAYOUT}"
    name = os.path.basename(path).removesuffix(".gguf")
    return os.path.join(root, "converted", f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def load_converted(path: str):
    """(cfg, params of unread float32 HostTensors, tokenizer) from the cache, or None on a miss. An entry whose files
    do not match the checksums written with it, or that does not load, is removed with a warning
    (the caller converts the GGUF again and stores a new one)."""
    entry = entry_dir(path)
    if entry is None or not os.path.isdir(entry):
        return None
    try:
        saved = read_json(os.path.join(entry, CHECKSUMS), what="the checksums of a converted model")
        if saved != checksums(entry):
            raise EagleError("its files do not match the checksums written with it")
        return _read_entry(entry)
    except Exception as e:  # any damage (truncated weights, a garbled config or tokenizer file) means: convert again
        warn(f"the converted-model cache {entry} is damaged ({e}); removing it and converting {path} again")
        shutil.rmtree(entry, ignore_errors=True)
        return None


def _read_entry(entry: str):
    from transformers import PreTrainedTokenizerFast

    from eagle_jax.loading.hf import safetensors_sources

    fields = read_json(os.path.join(entry, "config.json"), what="a converted model's config")
    fields["rope"] = RopeConfig(**fields["rope"])
    if fields.get("local_rope") is not None:
        fields["local_rope"] = RopeConfig(**fields["local_rope"])
    for key in ("eos_token_ids", "sliding_layers"):  # JSON lists back to the config's tuples
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    params = unflatten_dict(safetensors_sources(os.path.join(entry, "params.safetensors")), sep=".")
    params["layers"] = [params["layers"][str(i)] for i in range(len(params["layers"]))]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(os.path.join(entry, "tokenizer"))
    return ModelConfig(**fields), params, tokenizer


def checksums(entry: str) -> dict[str, str]:
    """CRC-32 and size of every file of an entry (but the checksum file), by relative path: CRC-32
    reads the weights at over 2 GB/s, where SHA-256 would halve the cache's gain."""
    sums = {}
    for root, _, files in os.walk(entry):
        for file in files:
            name = os.path.relpath(os.path.join(root, file), entry)
            if name == CHECKSUMS:
                continue
            crc, size = 0, 0
            with open(os.path.join(root, file), "rb") as f:
                while block := f.read(1 << 24):
                    crc, size = zlib.crc32(block, crc), size + len(block)
            sums[name] = f"{crc:08x}:{size}"
    return sums


def worth_storing(path: str, params: dict) -> bool:
    """Whether to keep a GGUF converted: the cache is on, and its float32 weights are small enough
    (storing reads them all on the host at once; a large model is dequantized tensor by tensor at
    each load instead)."""
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, HostTensor))
    return entry_dir(path) is not None and sum(4 * math.prod(t.shape) for t in leaves) <= MAX_STORED_BYTES


def store_converted(path: str, cfg: ModelConfig, params: dict, tokenizer) -> None:
    """Write a cache entry of (numpy) params atomically; failures (read-only home, full disk) only skip the cache."""
    entry = entry_dir(path)
    if entry is None:
        return

    def fill(staging: str) -> None:
        write_json_atomic(os.path.join(staging, "config.json"), dataclasses.asdict(cfg), indent=None)
        by_index = params | {"layers": {str(i): layer for i, layer in enumerate(params["layers"])}}
        flat = {k: np.asarray(v, np.float32) for k, v in flatten_dict(by_index, sep=".").items()}
        save_file(flat, os.path.join(staging, "params.safetensors"))
        tokenizer.save_pretrained(os.path.join(staging, "tokenizer"))
        write_json_atomic(os.path.join(staging, CHECKSUMS), checksums(staging))

    with contextlib.suppress(OSError):  # includes losing a race to another process writing the same entry
        remove_leftovers(os.path.dirname(entry), min_age_s=LIVE_WRITE_S)
        write_directory_atomic(entry, fill, replace=False)
