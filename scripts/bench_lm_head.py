"""One plain decode step of the default model with `lm_head` as it is, against the same step written
as a product with embed.T (what `lm_head` did for tied embeddings before it special-cased one row).

    .venv/bin/python scripts/bench_lm_head.py --out results/lm_head_layout/cpu.json

The step: target forward over 1 token with a 512-slot cache holding 300 tokens, then the logits.
Both variants are compiled first and timed interleaved (median of --reps calls each), so they see
the same machine load; their logits must agree to 1e-4.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.atomic import write_text_atomic
from eagle_jax.kv_cache import KVCache
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL
from eagle_jax.model import forward, lm_head, make_cache

CACHE_SLOTS, CACHE_FILLED = 512, 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    target = load_target(args.model, with_tokenizer=False)
    cfg, params = target.cfg, target.params
    if "lm_head" in params:
        raise SystemExit(f"{args.model} has an untied lm_head; this compares the tied-embedding contractions")
    empty = make_cache(cfg, 1, CACHE_SLOTS)
    cache = KVCache(empty.k + 0.01, empty.v + 0.01, jnp.full((1,), CACHE_FILLED, jnp.int32))
    token = jnp.full((1, 1), 100, jnp.int32)

    def step(logits_of):
        def run(params, cache, token):
            out = forward(params, cfg, token, cache.lengths[:, None], cache, jnp.ones((1, 1, 1), bool))
            return logits_of(params, out.hidden)
        return jax.jit(run)

    variants = {
        "lm_head": step(lm_head),
        "embed_T": step(lambda p, h: jnp.einsum("...d,dv->...v", h, p["embed"].T, preferred_element_type=jnp.float32)),
    }
    logits = {name: np.asarray(fn(params, cache, token)) for name, fn in variants.items()}
    assert np.abs(logits["lm_head"] - logits["embed_T"]).max() <= 1e-4
    times = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, fn in variants.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params, cache, token))
            times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
    result = {
        "step_ms": ms, "embed_T_over_lm_head": ms["embed_T"] / ms["lm_head"],
        "config": {"model": args.model, "cache_slots": CACHE_SLOTS, "cache_filled": CACHE_FILLED, "reps": args.reps, "dtype": "float32"},
        "machine": {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind, "cpu_count": os.cpu_count(),
                    "jax_version": jax.__version__, "host": platform.platform()},
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"decode step: lm_head {ms['lm_head']:.1f} ms, embed.T {ms['embed_T']:.1f} ms ({result['embed_T_over_lm_head']:.2f}x); wrote {args.out}")


if __name__ == "__main__":
    main()
