"""Compile time of a speculative generate with the target's layers unrolled and scanned over.

    python results/scan-layers/compile_time.py --out results/scan-layers/compile_time.json

Tiny-width random Llama targets (hidden 64, 4 heads / 2 KV heads, head 16, MLP 128, vocabulary
256) of 16, 32 and 80 layers with a random EAGLE-3 head, greedy, batch 2, tree 4/3/16, 64 new
tokens, cache 256. For each depth and form (`Engine(layers=...)`: unrolled per-layer arrays, or
stacked and scanned), the seconds to lower and compile `generate_spec` (the on-disk compilation
cache off, so every compile is cold), then the median wall time of 3 runs of the compiled
program and whether its tokens equal the other form's. The forms alternate from depth to depth.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import jax
import numpy as np

from eagle_jax.decoding.prompts import pad_prompts
from eagle_jax.decoding.speculative import generate_spec_jit
from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.files import write_json_atomic
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.model.config import ModelConfig
from eagle_jax.model.transformer import init_params, stack_layers

TREE = TreeConfig(4, 3, 16)
KW = dict(max_new_tokens=64, cache_len=256, tree=TREE)


def config(layers: int) -> ModelConfig:
    return ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=layers, num_heads=4,
                       num_kv_heads=2, head_dim=16, attention="xla")


def measure(cfg, params, dcfg, dparams, tokens, lengths) -> dict:
    key = jax.random.key(0)
    start = time.perf_counter()
    compiled = jax.jit(lambda p, dp, t, n: generate_spec_jit(p, cfg, dp, dcfg, t, n, key, **KW)).lower(
        params, dparams, tokens, lengths).compile()
    compile_s = time.perf_counter() - start
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(params, dparams, tokens, lengths))
        walls.append(time.perf_counter() - start)
    return {"compile_s": round(compile_s, 2), "run_s_median": round(statistics.median(walls), 4), "tokens": np.asarray(out.tokens)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="16,32,80")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    tokens, lengths = pad_prompts([[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]], multiple=16)
    rows = []
    for index, depth in enumerate(int(d) for d in args.depths.split(",")):
        cfg = config(depth)
        params = init_params(jax.random.key(0), cfg, scale=0.3)
        dcfg = DraftConfig.for_target(cfg, kind="eagle3")
        dparams = init_draft_params(jax.random.key(1), dcfg, scale=0.3)
        forms = {"unrolled": params, "scan": stack_layers(params)}
        order = list(forms) if index % 2 == 0 else list(forms)[::-1]
        results = {form: measure(cfg, forms[form], dcfg, dparams, tokens, lengths) for form in order}
        same = bool((results["unrolled"].pop("tokens") == results["scan"].pop("tokens")).all())
        rows.append({"layers": depth, "order": order, "tokens_equal": same, **results})
        print(rows[-1], flush=True)
    write_json_atomic(args.out, {
        "config": {"target": "hidden 64, 4 heads / 2 KV, head 16, MLP 128, vocab 256, attention xla", "head": "eagle3",
                   "tree": "4/3/16", "batch": 2, **{k: v for k, v in KW.items() if k != "tree"}, "compilation_cache": False,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": describe_machine()},
        "rows": rows,
    })


if __name__ == "__main__":
    main()
