"""Device check of the Pallas GPU tree-attention kernels (Mosaic GPU and Triton): correctness and
speed against XLA.

On a GPU machine (about 5 minutes on one H200):
    python scripts/tools/device_check_kernels.py            # writes results/kernels_gpu.json
On CPU, tiny shapes in interpret mode (what CI runs, to keep the script working):
    python scripts/tools/device_check_kernels.py --smoke --out /tmp/kernels_gpu.json

Each row is one verify step: batch rows with different prefix lengths (the cache holds `prefix`
slots, rows see between 3/4 of them and all), a random draft tree of T nodes, 32 query and 8 kv
heads of 128, bfloat16. Each kernel (the Mosaic GPU one on Hopper and newer, the Triton one) is
timed against the jitted jnp reference (plain XLA), all after a warm-up, as the median of several
runs, the two kernels interleaved shape by shape. A time budget stops starting new rows, so one run
fits its device slot even if compiles are slow; rows not reached are listed as skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import statistics
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.files import write_text_atomic
from eagle_jax.kernels_pallas import tree_attention_gpu, tree_attention_mosaic_gpu, tree_attention_reference

TOLERANCE = 2e-2  # atol and rtol for bfloat16 inputs
KERNELS = {"mosaic_gpu": tree_attention_mosaic_gpu, "triton": tree_attention_gpu}


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    nodes: int  # T: tree queries and tree keys
    prefix: int  # S: cache slots
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128


def random_tree_mask(rng: np.random.Generator, nodes: int) -> np.ndarray:  # (T, T) bool
    """Ancestor-or-self mask of a random tree (node i hangs under one of nodes 0..i-1)."""
    mask = np.eye(nodes, dtype=bool)
    for i in range(1, nodes):
        mask[i] |= mask[rng.integers(0, i)]
    return mask


def make_inputs(shape: Shape, seed: int) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    b, t, s, h, kv, d = dataclasses.astuple(shape)

    def normal(*dims: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(dims, dtype=np.float32), jnp.bfloat16)

    lengths = rng.integers(s - s // 4, s + 1, size=b)
    mask = np.stack([random_tree_mask(rng, t) for _ in range(b)])
    return (
        normal(b, t, h, d),  # q
        normal(b, kv, s, d),  # k_cache, head-major
        normal(b, kv, s, d),  # v_cache
        jnp.asarray(lengths, jnp.int32),
        normal(b, t, kv, d),  # k_new
        normal(b, t, kv, d),  # v_new
        jnp.asarray(mask),
    )


def median_ms(fn, args: tuple[jax.Array, ...], repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # warm-up; compiles on first use
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def check_row(shape: Shape, name: str, blocks: dict[str, int], interpret: bool, repeats: int) -> dict:
    args = make_inputs(shape, seed=shape.batch * 1000 + shape.nodes + shape.prefix)
    kernel = jax.jit(lambda *a: KERNELS[name](*a, interpret=interpret, **blocks))
    reference = jax.jit(tree_attention_reference)
    out = np.asarray(kernel(*args), np.float32)
    expected = np.asarray(reference(*args), np.float32)
    ok = bool(np.allclose(out, expected, atol=TOLERANCE, rtol=TOLERANCE))
    kernel_ms = median_ms(kernel, args, repeats)
    reference_ms = median_ms(reference, args, repeats)
    return {
        **dataclasses.asdict(shape),
        "kernel": name,
        **blocks,
        "max_abs_err": float(np.max(np.abs(out - expected))),
        "tolerance": TOLERANCE,
        "ok": ok,
        "kernel_ms": kernel_ms,
        "reference_ms": reference_ms,
        "speedup": reference_ms / kernel_ms,
    }


def plan(smoke: bool) -> list[tuple[Shape, str, dict[str, int]]]:
    """(shape, kernel, block sizes) rows in run order: the default model's verify step first (the
    kit's budget may reach few rows), the main grid for both kernels, then a block-size sweep."""
    if smoke:
        return [
            (Shape(1, 5, 32, heads=4, kv_heads=1, head_dim=64), "triton", {}),
            (Shape(2, 16, 64, heads=8, kv_heads=2, head_dim=64), "triton", {"block_k": 32}),
            (Shape(1, 5, 96, heads=4, kv_heads=1, head_dim=64), "mosaic_gpu", {}),
        ]
    smollm2 = [(Shape(b, 32, 704, heads=9, kv_heads=3, head_dim=64), name, {}) for b in (1, 8) for name in KERNELS]
    grid = smollm2 + [
        (Shape(b, t, s), name, {})
        for b, t, s in itertools.product((1, 4, 8), (16, 64), (512, 2048, 8192))
        for name in KERNELS
    ]
    sweep = [
        (Shape(b, 64, 8192), "triton", {"block_q": bq, "block_k": bk})
        for b in (1, 8)
        for bq, bk in ((32, 64), (64, 128), (128, 64), (32, 128))
    ] + [(Shape(b, 64, 8192), "mosaic_gpu", {"block_k": bk}) for b in (1, 8) for bk in (128, 256)]
    return grid + sweep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, interpret mode (CPU)")
    parser.add_argument("--out", default="results/kernels_gpu.json")
    parser.add_argument("--budget-s", type=float, default=270.0, help="start no row after this")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)  # jax 0.12 deprecates Pallas Triton

    device = jax.devices()[0]
    if not args.smoke and device.platform != "gpu":
        parser.error(f"needs a GPU (found {device.platform}); use --smoke on CPU")
    repeats = 1 if args.smoke else args.repeats
    start = time.perf_counter()
    rows, failures, skipped = [], [], []
    header = f"{'B':>2} {'T':>3} {'S':>5} {'kernel':<10} {'blocks':<18} {'err':>8} {'kernel ms':>9} {'xla ms':>8} {'x':>5}"
    print(f"jax {jax.__version__} on {device.device_kind}\n{header}")
    for shape, name, blocks in plan(args.smoke):
        label = {**dataclasses.asdict(shape), "kernel": name, **blocks}
        if time.perf_counter() - start > args.budget_s:
            skipped.append(label)
            continue
        try:
            row = check_row(shape, name, blocks, interpret=args.smoke, repeats=repeats)
        except Exception as error:  # a row that fails to compile must not cost the other rows
            failures.append({**label, "error": f"{type(error).__name__}: {error}"[:2000]})
            print(f"{shape.batch:>2} {shape.nodes:>3} {shape.prefix:>5} {name:<10} {blocks!s:<18} FAILED {error!r:.200}")
            continue
        rows.append(row)
        print(
            f"{shape.batch:>2} {shape.nodes:>3} {shape.prefix:>5} {name:<10} {blocks!s:<18} {row['max_abs_err']:>8.1e}"
            f" {row['kernel_ms']:>9.3f} {row['reference_ms']:>8.3f} {row['speedup']:>5.2f}"
            + ("" if row["ok"] else "  MISMATCH")
        )
    report = {
        "jax": jax.__version__,
        "device": device.device_kind,
        "smoke": args.smoke,
        "seconds": time.perf_counter() - start,
        "rows": rows,
        "failures": failures,
        "skipped": skipped,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(report, indent=1))  # NaN allowed: a broken kernel's error is reported, not refused
    print(f"wrote {out} ({len(rows)} rows, {len(failures)} failed, {len(skipped)} skipped)")
    return 0 if rows and not failures and all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
