"""`eagle-jax` command line: generate, bench, train."""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from eagle_jax.errors import EagleError, warn  # noqa: E402
from eagle_jax.infer.arguments import HelpFormatter, OneLineParser, add_model_arguments, build_engine, utf8_text  # noqa: E402

# What the tokens/s that generate prints is, so that nobody takes it for a benchmark. The one run is
# its program's first call, which on XLA:CPU takes about 0.3 s longer than the next (SmolLM2, 2-core
# CPU), and a short answer is mostly prefill and that fixed cost: an 8-token answer ran at 13 tok/s
# cold and 24 warm, and identical warm runs on a shared host took 0.33-1.33 s. bench times warm
# calls over many prompts, both modes on the same ones.
TIMING_NOTE = "one run of this answer, its first call, compile excluded; not a benchmark: eagle-jax bench measures speed"


def cmd_generate(args) -> int:
    import jax

    from eagle_jax.infer.settings import tree_fields
    from eagle_jax.mesh import describe

    engine, choice = build_engine(args)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.prompt}]
    ids = engine.encode_chat(messages, raw=args.raw)
    tree = choice.for_batch(1)
    result = engine.run([ids], tree=tree, seed=args.seed)
    if jax.process_index() != 0:  # in a multi-process run, process 0 answers for all
        return 0
    text = engine.decode(result.tokens[0])
    n = result.new_tokens
    report = {
        "text": text,
        "new_tokens": n,
        "tokens_per_s": n / result.wall_s,
        "wall_s": result.wall_s,
        "compile_s": result.compile_s,
        "mode": "plain" if tree is None else "speculative",
        "finish_reason": result.finish_reasons[0],
        "tokens": result.tokens[0],
        "mesh": describe(engine.mesh),
    }
    if tree is not None:
        report.update(tau=result.tau, rounds=sum(result.rounds), tree=tree_fields(tree))
    elif choice.why_plain(1):
        report["why_plain"] = choice.why_plain(1)
    if report["finish_reason"] == "cache_full":
        warn(f"the answer stopped after {n} of at most {engine.max_new_tokens} tokens because the KV cache "
             f"({engine.cache_len} slots, prompt included) is full; give a larger --cache-len")
    if args.json:
        print(json.dumps(report))
        return 0
    print(text)
    line = f"[{report['mode']}] {n} tokens in {result.wall_s:.2f}s, {report['tokens_per_s']:.1f} tok/s ({TIMING_NOTE}; compile {result.compile_s:.1f}s)"
    if tree is not None:
        line += f"; tau {result.tau:.2f} over {sum(result.rounds)} rounds"
    elif "why_plain" in report:
        line += f"; {report['why_plain']}"
    print(line, file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="eagle-jax", description="EAGLE speculative decoding in JAX")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate an answer to one prompt", formatter_class=HelpFormatter,
                         description="Generate an answer to one prompt. The tokens/s it prints come from that one run; "
                                     "eagle-jax bench measures speed and speedup.")
    gen.add_argument("--prompt", required=True, type=utf8_text, help="the user message (or the raw text, with --raw)")
    gen.add_argument("--system", default=None, type=utf8_text, help="system prompt (default: the chat template's)")
    gen.add_argument("--raw", action="store_true", help="feed the prompt as raw text, without the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("--no-estimate", action="store_true",
                     help="accepted for older scripts: generate no longer estimates the speedup from one short answer "
                          "(it swung from 0.9x to 2.3x on the same prompt); eagle-jax bench measures it")
    add_model_arguments(gen)
    gen.set_defaults(func=cmd_generate)

    from eagle_jax.infer import bench
    from eagle_jax.train import cli as train_cli

    bench_parser = sub.add_parser("bench", help="plain vs speculative decoding on a prompt file: tau, tokens/s, speedup",
                                  formatter_class=HelpFormatter, description=bench.__doc__.split("\n\n")[0])
    add_model_arguments(bench_parser)
    bench.add_arguments(bench_parser)
    bench_parser.set_defaults(func=bench.run)
    train_parser = sub.add_parser("train", help="train a draft head for a target model", formatter_class=HelpFormatter,
                                  description=train_cli.__doc__.split("\n\n")[0])
    train_cli.add_arguments(train_parser)
    train_parser.set_defaults(func=train_cli.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from eagle_jax.disk_cache import enable_compilation_cache

    # a second run of the same shapes loads its executables; not in a multi-process run, where on
    # CPU a loaded program with collectives between the processes hung (jax 0.12.1, tests/test_mesh.py)
    if not (getattr(args, "coordinator", None) or getattr(args, "distributed", False)):
        enable_compilation_cache()
    try:
        return args.func(args)
    except EagleError as e:
        print(f"eagle-jax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
