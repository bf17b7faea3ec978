"""Why the target's weights are per-layer (out, in) arrays, and why on CPU they take the forms of
`eagle_jax.model.cpu_layout` (decode steps: w @ x^T behind a barrier; verify steps: (in, out) copies).

    .venv/bin/python scripts/benchmarks/bench_dense.py --out results/dense_layout/cpu.json

The matrix products alone: the default model's seven projections per layer over all its layers,
for 1-16 rows, written four ways and timed interleaved (median of --reps calls each):
  * "stacked_scan_dense": weights stacked (L, out, in), a lax.scan over layers, the CPU layout's
    few-row form (`CpuWeight` without copies);
  * "per_layer_einsum": per-layer (out, in) arrays, a Python loop, the plain contraction (`dense`);
  * "per_layer_dense": per-layer arrays in the few-row form: decode steps;
  * "per_layer_in_out": per-layer (in, out) copies, x @ w: verify steps.
The whole model against an earlier commit: scripts/benchmarks/bench_step_vs_checkout.py.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.files import write_text_atomic
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL
from eagle_jax.model.cpu_layout import CpuWeight
from eagle_jax.model.layers import dense

ROWS = (1, 2, 4, 5, 6, 8, 12, 16)
MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def median_ms(fns: dict, args: dict, reps: int) -> dict:
    """Median wall time of each fn(*args[name]), calls interleaved so all see the same machine load."""
    for name, fn in fns.items():
        jax.block_until_ready(fn(*args[name]))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args[name]))
            times[name].append(time.perf_counter() - start)
    return {name: round(1e3 * float(np.median(t)), 2) for name, t in times.items()}


def layer_products(p: dict, x, mul):
    """x (rows, d) through one layer's seven products, kept shape-preserving (k and v are tiled up to
    q's width, gate/up come back through down): the model's projection work without the rest."""
    q, k, v = mul(x, p["wq"]), mul(x, p["wk"]), mul(x, p["wv"])
    x = x + mul(q + jnp.tile(k + v, (1, q.shape[1] // k.shape[1])), p["wo"])
    return x + mul(jnp.tanh(mul(x, p["w_gate"])) * mul(x, p["w_up"]), p["w_down"])


def products_part(layers: list[dict], reps: int) -> dict:
    matrices = [{k: layer[k] for k in MATRICES} for layer in layers]
    stacked = {k: jnp.stack([m[k] for m in matrices]) for k in MATRICES}
    copies = [{k: jnp.array(layer[k].T) for k in MATRICES} for layer in layers]
    few_rows = lambda x, w: CpuWeight(w).multiply(x)  # noqa: E731

    def per_layer(mul):
        def run(ms, x):
            for p in ms:
                x = layer_products(p, x, mul)
            return x
        return jax.jit(run)

    def scanned(stacked, x):
        return jax.lax.scan(lambda x, p: (layer_products(p, x, few_rows), None), x, stacked)[0]

    fns = {
        "stacked_scan_dense": jax.jit(scanned),
        "per_layer_einsum": per_layer(dense),
        "per_layer_dense": per_layer(few_rows),
        "per_layer_in_out": per_layer(lambda x, w: jnp.einsum("...i,io->...o", x, w)),
    }
    results = {}
    for rows in ROWS:
        x = jnp.full((rows, matrices[0]["wq"].shape[1]), 0.01, jnp.float32)
        args = {"stacked_scan_dense": (stacked, x), "per_layer_einsum": (matrices, x), "per_layer_dense": (matrices, x),
                "per_layer_in_out": (copies, x)}
        results[rows] = median_ms(fns, args, reps)
        print(f"products, {rows:2d} rows: {results[rows]} ms", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    target = load_target(args.model, with_tokenizer=False)
    result = {
        "products_ms_by_rows": products_part(target.params["layers"], args.reps),
        "config": {"model": args.model, "reps": args.reps, "dtype": "float32"},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
