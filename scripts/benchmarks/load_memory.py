"""Peak host RSS of loading a target, on one device or straight into the shards of a model axis.

    XLA_FLAGS=--xla_force_host_platform_device_count=3 python scripts/benchmarks/load_memory.py SOURCE [--model-axis 3] [--layers scan]

Run it once per setting (a fresh process each, since the peak of a process only grows). The
converted-model cache is bypassed, so a GGUF is dequantized tensor by tensor as it is placed. It
prints one JSON line: the peak RSS, the RSS before loading (the interpreter, jax), the bytes of the
loaded params, and the largest float32 tensor. On simulated CPU devices the placed shards live in
host memory too, so the params count once in the peak.
"""

from __future__ import annotations

import argparse
import json
import math
import resource

import jax


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source", help="--model as the CLI takes it")
    parser.add_argument("--model-axis", type=int, default=1)
    parser.add_argument("--layers", choices=("unrolled", "scan"), default="unrolled", help="the layer form loaded")
    args = parser.parse_args()

    import eagle_jax.loading.converted as converted
    from eagle_jax.loading import load_target
    from eagle_jax.mesh import make_mesh
    from eagle_jax.model.sharding import target_shardings

    converted.entry_dir = lambda path: None  # measure the load itself, not a read of the cache
    jax.numpy.zeros(1).block_until_ready()
    before = peak_rss()
    mesh = make_mesh({"model": args.model_axis}) if args.model_axis > 1 else None
    shardings = None if mesh is None else (lambda cfg, params: target_shardings(mesh, cfg, params))
    target = load_target(args.source, with_tokenizer=False, shardings=shardings, layers=args.layers)
    leaves = jax.tree.leaves(target.params)
    print(json.dumps({
        "source": args.source, "model_axis": args.model_axis, "layers": args.layers, "peak_rss_mb": round(peak_rss() / 1e6),
        "rss_before_mb": round(before / 1e6), "params_mb": round(sum(x.nbytes for x in leaves) / 1e6),
        "largest_tensor_mb": round(max(4 * math.prod(x.shape) for x in leaves) / 1e6),
    }))


if __name__ == "__main__":
    main()
