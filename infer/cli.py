"""`eagle-jax` command line: generate, bench, train."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from eagle_jax.errors import EagleError  # noqa: E402


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    from eagle_jax.loading.registry import DEFAULT_MODEL
    from eagle_jax.decoding.tree import SCORINGS

    p.add_argument("--model", default=DEFAULT_MODEL, help=f"built-in name, HF directory or .gguf file (default: {DEFAULT_MODEL})")
    p.add_argument("--draft", default=None, help="draft head directory (ours, EAGLE-1/2, EAGLE-3, speculators layouts)")
    p.add_argument("--no-spec", action="store_true", help="plain autoregressive decoding")
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k-sampling", type=int, default=0, help="target-side top-k sampling (0 = off)")
    p.add_argument("--top-k", type=positive_int, default=None, help="draft tree: children per expanded node")
    p.add_argument("--depth", type=int, default=None, help="draft tree: expansion passes after the first")
    p.add_argument("--num-nodes", type=positive_int, default=None, help="draft tree: drafted nodes verified per round, root included")
    p.add_argument("--lookup", type=non_negative_int, default=None,
                   help="draft tree: also verify this many tokens looked up in the context (the continuation of the "
                        "latest earlier occurrence of the last 1-3 tokens), one chain under the root; 0 = none")
    p.add_argument("--scoring", choices=SCORINGS, default=None,
                   help="draft tree: 'dynamic' (EAGLE-2: by cumulative draft confidence), 'static' (by rank: a fixed shape) or "
                        "'sampled' (a fixed shape whose children are drawn from the draft; sampling only, where it accepts "
                        "more drafted tokens than top-k children); default: the tuned tree's, else dynamic")
    p.add_argument("--cache-len", type=positive_int, default=None, help="KV cache slots (default: fits prompt + max new tokens)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--attention", choices=("auto", "xla", "pallas", "pallas_interpret"), default="auto")
    p.add_argument("--seed", type=int, default=0)


def build_engine(args):
    """Engine from parsed model/draft/tree/sampling arguments."""
    import jax
    import jax.numpy as jnp

    from eagle_jax.draft.checkpoint import load_draft
    from eagle_jax.infer.bench_policy import load_batch_policy, load_tuned_tree, tuned_speculation_pays
    from eagle_jax.infer.engine import Engine
    from eagle_jax.loading import load_target
    from eagle_jax.loading.registry import default_head_dir
    from eagle_jax.decoding.sampling import SamplingConfig
    from eagle_jax.decoding.tree import TreeConfig

    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    target = load_target(args.model, dtype=dtype)
    draft, draft_dir = None, None
    if not args.no_spec:
        draft_dir = args.draft or default_head_dir(args.model)
        if draft_dir is None:
            raise EagleError(f"no draft head for {args.model}: pass --draft DIR, or --no-spec for plain decoding")
        draft = load_draft(draft_dir, target.cfg, dtype=dtype)
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k_sampling)
    tree, speculate = TreeConfig(), True
    if draft is not None and all(getattr(args, flag) is None for flag in ("top_k", "depth", "num_nodes", "lookup")):
        tuned = dict(device_kind=jax.devices()[0].device_kind, sampled=not sampling.greedy)
        tree = load_tuned_tree(draft_dir, **tuned) or tree
        speculate = args.scoring is not None or tuned_speculation_pays(draft_dir, **tuned)
    tree = TreeConfig(
        top_k=args.top_k or tree.top_k,
        depth=tree.depth if args.depth is None else args.depth,
        num_nodes=args.num_nodes or tree.num_nodes,
        lookup=tree.lookup if args.lookup is None else args.lookup,
        scoring=args.scoring or tree.scoring,
    )
    policy = load_batch_policy(draft_dir) if draft is not None else None
    return Engine(target, draft, tree, sampling, args.max_new_tokens, args.cache_len, args.attention, policy, speculate)


ESTIMATE_TOKENS = 64
NOT_TUNED_TO_PAY = ("decoded plainly: when this head's tree was tuned here (eagle-jax bench --auto-tune) no tree beat plain "
                    "decoding in this mode; pass --top-k/--depth/--num-nodes/--lookup/--scoring to speculate anyway")


def speedup_estimate(engine, ids: list[int], seed: int) -> float:
    """Speculative over plain tokens/s on this prompt, after engine's speculative run of it.

    Each is timed on a call after its executable's first, as `bench` times them (`timed_run`): on
    XLA:CPU the first call of a compiled program runs 0.5-0.9 s slower for SmolLM2, which would swamp
    a short answer. The plain run stops at ESTIMATE_TOKENS tokens.
    """
    from eagle_jax.infer.bench_measure import timed_run

    spec = engine.run([ids], speculative=True, seed=seed)  # the answer's run was its executable's first
    plain = dataclasses.replace(engine, draft=None, max_new_tokens=min(ESTIMATE_TOKENS, engine.max_new_tokens))
    plain_run = timed_run(plain, [ids], speculative=False, seed=seed)
    return (spec.new_tokens / spec.wall_s) / (plain_run.new_tokens / plain_run.wall_s)


def cmd_generate(args) -> int:
    engine = build_engine(args)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.prompt}]
    ids = engine.encode_chat(messages, raw=args.raw)
    speculative = not args.no_spec and engine.tree_for(1) is not None
    result = engine.run([ids], speculative=speculative, seed=args.seed)
    text = engine.decode(result.tokens[0])
    n = result.new_tokens
    report = {
        "text": text,
        "new_tokens": n,
        "tokens_per_s": n / result.wall_s,
        "wall_s": result.wall_s,
        "compile_s": result.compile_s,
        "mode": "speculative" if speculative else "plain",
    }
    if speculative:
        report.update(tau=result.tau, rounds=sum(result.rounds), tree=vars(engine.tree))
        if not args.no_estimate:
            report["speedup_estimate"] = speedup_estimate(engine, ids, args.seed)
    elif not args.no_spec:
        report["why_plain"] = NOT_TUNED_TO_PAY
    if args.json:
        print(json.dumps(report))
        return 0
    print(text)
    line = f"[{report['mode']}] {n} tokens in {result.wall_s:.2f}s ({report['tokens_per_s']:.1f} tok/s, compile {result.compile_s:.1f}s)"
    if speculative:
        line += f", tau {result.tau:.2f} over {sum(result.rounds)} rounds"
        if "speedup_estimate" in report:
            line += f", speedup ~{report['speedup_estimate']:.2f}x vs plain decoding of the same prompt (warm calls)"
    elif "why_plain" in report:
        line += f"; {report['why_plain']}"
    print(line, file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle-jax", description="EAGLE speculative decoding in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate an answer to one prompt")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", default=None, help="system prompt (default: the chat template's)")
    gen.add_argument("--raw", action="store_true", help="feed the prompt as raw text, without the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--no-estimate", action="store_true", help="skip the speedup estimate (the answer run again, and a short plain run twice)")
    add_model_arguments(gen)
    gen.set_defaults(func=cmd_generate)

    from eagle_jax.infer import bench
    from eagle_jax.train import cli as train_cli

    bench_parser = sub.add_parser("bench", help="plain vs speculative decoding on a prompt file: tau, tokens/s, speedup")
    add_model_arguments(bench_parser)
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(func=bench.run)
    train_parser = sub.add_parser("train", help="train a draft head for a target model")
    train_cli.add_arguments(train_parser)
    train_parser.set_defaults(func=train_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from eagle_jax.disk_cache import enable_compilation_cache

    enable_compilation_cache()  # a second run of the same shapes loads its executables
    try:
        return args.func(args)
    except EagleError as e:
        print(f"eagle-jax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
