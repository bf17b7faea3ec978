"""One target step of this tree's model code against another checkout's, in one process.

    git worktree add /tmp/baseline <commit>
    .venv/bin/python scripts/benchmarks/bench_step_vs_checkout.py --baseline /tmp/baseline --out step.json

The step: forward over T new tokens (T = 1: a decode step; more: a verify block of that many tree
nodes), with the params laid out as each checkout's Engine lays them out on CPU (`backend_layout`,
or before it `with_block_copies`), with a --cache-slots cache holding --cache-filled tokens
(default 512 and 300), then the logits. Both versions load the same model,
are compiled first and timed interleaved (median of --reps calls each); their logits must agree to
1e-4 of their largest magnitude (float32, products in another order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench_dense import median_ms

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEW_TOKENS = (1, 2, 4, 8, 16)


# Folders the package installs under the eagle_jax namespace (pyproject's package-dir): an editable
# install maps them to this tree, so a checkout's own copies are loaded by path.
MAPPED_FOLDERS = {"kernels_pallas": "eagle_jax.kernels_pallas", "train": "eagle_jax.train", "infer": "eagle_jax.infer"}


def import_checkout(root: str, *modules: str) -> list:
    """The named eagle_jax modules imported from the checkout under `root` (earlier imports dropped)."""
    import importlib
    import importlib.util

    for name in [m for m in sys.modules if m == "eagle_jax" or m.startswith("eagle_jax.")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        importlib.import_module("eagle_jax")
        for folder, name in MAPPED_FOLDERS.items():
            location = os.path.join(root, folder)
            spec = importlib.util.spec_from_file_location(name, os.path.join(location, "__init__.py"), submodule_search_locations=[location])
            sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[name])
        imported = [importlib.import_module(m) for m in modules]
    finally:
        sys.path.pop(0)
    for name in ("eagle_jax", *MAPPED_FOLDERS.values(), *modules):
        if not sys.modules[name].__file__.startswith(os.path.abspath(root)):
            raise SystemExit(f"imported {name} from {sys.modules[name].__file__}, not from {root}")
    return imported


# Module names of the two layouts a checkout may have: subpackages (from the restructure on) or
# the flat package before it.
LAYOUTS = {
    "subpackages": {"kv_cache": "eagle_jax.model.kv_cache", "model": "eagle_jax.model.transformer", "plain": "eagle_jax.decoding.plain",
                    "prompts": "eagle_jax.decoding.prompts", "speculative": "eagle_jax.decoding.speculative", "tree": "eagle_jax.decoding.tree",
                    "layout": "eagle_jax.model.cpu_layout"},
    "flat": {"kv_cache": "eagle_jax.kv_cache", "model": "eagle_jax.model", "plain": "eagle_jax.generate_ar", "prompts": "eagle_jax.generate_ar",
             "speculative": "eagle_jax.speculative", "tree": "eagle_jax.tree"},
}


def layout_of(root: str) -> dict[str, str]:
    """The module names of the checkout under `root`."""
    if os.path.isfile(os.path.join(root, "eagle_jax", "model", "transformer.py")):
        return LAYOUTS["subpackages"]
    if os.path.isfile(os.path.join(root, "eagle_jax", "model.py")):
        return LAYOUTS["flat"]
    raise SystemExit(f"--baseline {root}: not an eagle-jax checkout (no eagle_jax/model/transformer.py or eagle_jax/model.py); "
                     "expected e.g. the directory of `git worktree add DIR <commit>`")


def import_roles(root: str, *roles: str, same_in_both: tuple[str, ...] = ()) -> dict:
    """{role: module} of the checkout under `root` for `roles` (keys of LAYOUTS; "layout" only where
    the checkout has it), "loading", and the modules named `same_in_both` (both layouts have them;
    keyed by name), in one import."""
    names = layout_of(root) | {"loading": "eagle_jax.loading"} | {name: name for name in same_in_both}
    roles = tuple(r for r in roles if r in names) + ("loading", *same_in_both)
    return dict(zip(roles, import_checkout(root, *(names[r] for r in roles))))


def engine_params(modules: dict, params: dict, dparams: dict | None = None) -> tuple:
    """(params for verify steps, params for one-token steps, draft params) as the checkout's Engine
    runs them on CPU: laid out by `backend_layout`, or with `with_block_copies`' copies before it."""
    if "layout" in modules:
        laid_out = modules["layout"].backend_layout(params)
        return laid_out, laid_out, None if dparams is None else modules["layout"].backend_layout(dparams)
    same = lambda p: p  # noqa: E731
    copies = getattr(modules["model"], "with_block_copies", same)(params)
    return getattr(modules["model"], "for_blocks", same)(copies), params, dparams


def step_of(root: str, model: str, slots: int, filled: int):
    """(jitted step, params, cache) built from the eagle_jax package under `root`."""
    modules = import_roles(root, "kv_cache", "model", "layout")
    model_code = modules["model"]
    KVCache, forward, lm_head, make_cache = modules["kv_cache"].KVCache, model_code.forward, model_code.lm_head, model_code.make_cache
    target = modules["loading"].load_target(model, with_tokenizer=False)
    cfg = target.cfg
    empty = make_cache(cfg, 1, slots)
    k, v = jax.tree.map(lambda x: x + 0.01, (empty.k, empty.v))  # a stacked array or per-layer arrays
    cache = KVCache(k, v, jnp.full((1,), filled, jnp.int32))

    block_params, params, _ = engine_params(modules, target.params)

    @jax.jit
    def step(both, cache, tokens):  # (1, T) new tokens, causal among themselves
        params, block_params = both
        t = tokens.shape[1]
        out = forward(block_params if t > 1 else params, cfg, tokens, cache.lengths[:, None] + jnp.arange(t)[None], cache,
                      jnp.tril(jnp.ones((1, t, t), bool)))
        return lm_head(params, out.hidden)

    return step, (params, block_params), cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="root of another checkout (a git worktree)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--cache-slots", type=int, default=512)
    parser.add_argument("--cache-filled", type=int, default=300, help="tokens already in the cache")
    parser.add_argument("--new-tokens", default=",".join(map(str, NEW_TOKENS)), help="comma list of T values")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    try:
        new_tokens = [int(t) for t in args.new_tokens.split(",")]
    except ValueError:
        parser.error(f"--new-tokens {args.new_tokens!r}: expected a comma list of integers")
    if min(new_tokens) < 1:
        parser.error(f"--new-tokens {args.new_tokens!r}: every T must be >= 1")
    if not 0 <= args.cache_filled <= args.cache_slots - max(new_tokens):
        parser.error(f"--cache-filled {args.cache_filled}: expected 0..{args.cache_slots - max(new_tokens)} "
                     f"(--cache-slots {args.cache_slots} minus room for {max(new_tokens)} new tokens)")
    layout_of(args.baseline)
    os.environ["EAGLE_JAX_CACHE"] = "off"  # each version converts the GGUF in its own layout
    versions = {name: step_of(root, args.model, args.cache_slots, args.cache_filled) for name, root in (("baseline", args.baseline), ("this_tree", HERE))}
    from eagle_jax.files import write_text_atomic  # this tree's, imported last
    from eagle_jax.infer.bench_report import describe_machine

    results = {}
    for t in new_tokens:
        tokens = jnp.full((1, t), 100, jnp.int32)
        logits = {name: np.asarray(fn(params, cache, tokens)) for name, (fn, params, cache) in versions.items()}
        diff = float(np.abs(logits["baseline"] - logits["this_tree"]).max()) / float(np.abs(logits["baseline"]).max())
        assert diff <= 1e-4, f"{t} new tokens: the logits differ by {diff:.2e} of their largest magnitude"
        ms = median_ms({name: fn for name, (fn, _, _) in versions.items()},
                       {name: (params, cache, tokens) for name, (_, params, cache) in versions.items()}, args.reps)
        results[t] = ms | {"baseline_over_this_tree": round(ms["baseline"] / ms["this_tree"], 2)}
        print(f"{t:2d} new tokens: {results[t]}", flush=True)
    result = {
        "step_ms_by_new_tokens": results,
        "baseline": os.path.abspath(args.baseline),
        "config": {"model": args.model, "cache_slots": args.cache_slots, "cache_filled": args.cache_filled, "reps": args.reps, "dtype": "float32"},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
