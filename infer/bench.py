"""`eagle-jax bench`: plain and speculative decoding of the same prompts in one process.

Reports tau, tokens/s and speedup (definitions in bench_report), whether greedy speculative output
equals plain output token for token, per prompt and per category; optionally robustness variants,
tree sweeps with auto-tuning, batch-size throughput and plots. Writes OUT.json atomically:

  summary      numbers over all prompts + the configs used (model, draft, tree, sampling,
               max_new_tokens, dtype, attention, machine)
  per_prompt   [{question_id, category, prompt_tokens, answers, <numbers>}]
  per_category {category: <numbers>}
  per_variant  {variant: <numbers>}                      (--variants; else {})
  sweep        [{top_k, depth, num_nodes, lookup, scoring, <numbers>}]   (--sweep / --trees / --auto-tune; else [])
  batch        [{batch, top_k, depth, num_nodes, lookup, scoring, sequences, ar_tokens_per_s, spec_tokens_per_s,
                 speedup, tau, ar_new_tokens, spec_new_tokens}]   (--batch-sizes; else [])
  auto_tune    {tree, speculate, tree_file, batch_policy_file} or null
<numbers> = bench_report.summarize(): num_prompts, num_turns, tau, spec_tokens_per_s,
ar_tokens_per_s, speedup, mean_speedup, identical_to_ar, identical_prompts, new_tokens,
ar_new_tokens, rounds, spec_wall_s, ar_wall_s, spec_compile_s, ar_compile_s, accept_histogram,
acceptance_by_depth, mean_prompt_tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys

import jax

from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.dtypes import dtype_name
from eagle_jax.errors import EagleError
from eagle_jax.files import check_output_path, remove_leftovers, write_json_atomic
from eagle_jax.infer.arguments import build_engine, require_extra
from eagle_jax.infer.bench_measure import PromptRecord, fill_batches, measure_batches, measure_prompts
from eagle_jax.infer.bench_policy import auto_tune_trees, draft_directory, parse_int_list, parse_sweep, parse_trees, sweep_trees
from eagle_jax.infer.bench_report import batch_row, describe_machine, format_report, per_category, per_prompt, summarize
from eagle_jax.infer.engine import Engine
from eagle_jax.mesh import describe
from eagle_jax.infer.prompts import (
    VARIANT_SYSTEM_PROMPT,
    VARIANTS,
    Prompt,
    apply_variant,
    load_prompts,
    long_context,
    messages_for_turn,
    parse_variants,
    select_prompts,
)
from eagle_jax.infer.settings import save_batch_policy, save_tuned_tree, tree_fields, tree_from_fields


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", required=True, help="JSON lines: {question_id, category, turns: [str, ...], system?} per line")
    p.add_argument("--out", required=True, help="result JSON (written atomically)")
    p.add_argument("--limit", type=int, default=None, help="the first K prompts of each category, in file order (default: all)")
    p.add_argument("--categories", default=None, help="comma list of categories to run (default: all)")
    p.add_argument("--ar-only", action="store_true", help="plain decoding alone, no draft needed (--no-spec does the same)")
    p.add_argument("--variants", nargs="?", const="all", default=None, metavar="LIST",
                   help=f"also run robustness variants: 'all' (without a value) or a comma list of {', '.join(VARIANTS)}")
    p.add_argument("--variant-system", default=VARIANT_SYSTEM_PROMPT, help="system prompt of the 'system' variant")
    p.add_argument("--long-context-tokens", type=int, default=2000,
                   help="about this many unrelated tokens precede the first turn in the long_context variant")
    p.add_argument("--sweep", action="append", default=[], metavar="AXIS=V1,V2",
                   help="measure each tree setting: top_k=, depth=, num_nodes= or lookup= values; repeat the flag for a grid")
    p.add_argument("--trees", default=None, metavar="K/D/N[/L],...",
                   help="measure these trees too (top_k/depth/num_nodes[/lookup] each, with the --tree-scoring given), after the --sweep grid")
    p.add_argument("--auto-tune", action="store_true",
                   help="save the fastest tree of the sweep (default num_nodes=8,16,32,64; fastest: the highest speedup "
                        "over its own plain runs) as DRAFT/tree.json "
                        "(DRAFT/tree_sampled.json when sampling), "
                        "and with --batch-sizes the measured table as DRAFT/batch_policy.json")
    p.add_argument("--batch-sizes", default=None, metavar="1,2,4,...",
                   help="throughput of plain vs speculative decoding at each batch size (first turns of the prompts)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots into DIR (needs matplotlib: the train extra)")


def run(args: argparse.Namespace) -> int:
    ar_only = args.ar_only or args.no_spec
    prompts = select_prompts(load_prompts(args.prompts), args.limit, args.categories and args.categories.split(","))
    variants = parse_variants(args.variants) if args.variants else ["as_given"]
    batch_sizes = parse_int_list(args.batch_sizes, "--batch-sizes") if args.batch_sizes else []
    sweep_axes = parse_sweep(args.sweep)
    listed = parse_trees(args.trees) if args.trees is not None else []
    if ar_only and (args.sweep or listed or args.auto_tune):
        raise EagleError("--sweep, --trees and --auto-tune measure speculative decoding; drop --ar-only/--no-spec")
    if args.plots:
        require_extra("matplotlib", "--plots", "train")
    draft_dir = draft_directory(args.draft) if args.auto_tune else None
    check_output_path(args.out, "--out")
    if args.plots:
        check_output_path(args.plots, "--plots", directory=True)
        remove_leftovers(args.plots)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    remove_leftovers(out_dir, of=os.path.basename(args.out))

    engine, choice = build_engine(argparse.Namespace(**{**vars(args), "no_spec": ar_only}))
    # every tree is measured as given: a saved setting that turns speculation off must not apply here
    base = choice.tree
    listed = [dataclasses.replace(t, scoring=base.scoring) for t in listed]  # --tree-scoring applies to them too
    trees = list(dict.fromkeys((sweep_trees(sweep_axes, base) if sweep_axes else []) + listed))
    if not trees and args.auto_tune:
        trees = auto_tune_trees(base)
    for tree in trees:
        engine.check_tree(tree)
    machine = describe_machine()

    by_variant = measure_variants(
        engine, prompts, variants, tree=base, system_prompt=args.variant_system, context_tokens=args.long_context_tokens, seed=args.seed,
    )
    main = by_variant["as_given"]
    sweep = []
    for tree in trees:
        sweep.append(sweep_row(engine, tree, base, main, prompts, args.seed))
        if tree != base:
            engine.release(tree)  # a long sweep would otherwise keep executables of trees measured already
    batch_trees = trees or ([] if base is None else [base])
    batch = measure_batch_table(engine, batch_trees, prompts, batch_sizes, args.seed)

    report = {
        "summary": summarize(main) | run_config(engine, base, args, machine),
        "per_prompt": per_prompt(main),
        "per_category": per_category(main),
        "per_variant": {v: summarize(records) for v, records in by_variant.items()} if args.variants else {},
        "sweep": sweep,
        "batch": batch,
        "auto_tune": auto_tune(draft_dir, sweep, batch, measured_on(engine, args, machine, len(prompts)), not engine.sampling.greedy)
        if draft_dir else None,
    }
    if jax.process_index() != 0:  # in a multi-process run, process 0 writes and reports for all
        return 0
    write_json_atomic(args.out, report)
    print(format_report(report))
    print(f"wrote {args.out}", file=sys.stderr)
    if args.plots:
        from eagle_jax.infer.plots import write_plots

        for path in write_plots(report, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def measure_variants(
    engine: Engine, prompts: list[Prompt], variants: list[str], *, tree: TreeConfig | None, system_prompt: str, context_tokens: int,
    seed: int,
) -> dict[str, list[PromptRecord]]:
    """Records of each robustness variant of the same prompts (see prompts.apply_variant), decoded
    plainly and (`tree` not None) speculatively with `tree`."""
    context = long_context(engine.target.tokenizer, context_tokens) if "long_context" in variants else ""
    return {
        v: measure_prompts(
            engine, [apply_variant(p, v, system_prompt=system_prompt, context=context) for p in prompts], tree=tree, seed=seed, desc=v,
        )
        for v in variants
    }


def sweep_row(engine: Engine, tree: TreeConfig, base: TreeConfig, main: list[PromptRecord], prompts: list[Prompt], seed: int) -> dict:
    """Numbers of one tree setting: its speculative runs against plain runs interleaved with them
    prompt by prompt (the main run when the setting is the main tree `base`). Each tree gets its own
    plain runs: on a host whose speed drifts over a long sweep, plain runs measured once, at the
    start, made the later trees look up to 1.6x slower than they were."""
    records = main if tree == base else measure_prompts(engine, prompts, tree=tree, seed=seed, desc=f"tree {tree_label(tree)}")
    return tree_fields(tree) | summarize(records)


def tree_label(tree: TreeConfig) -> str:
    return f"k{tree.top_k} d{tree.depth} n{tree.num_nodes}" + (f" l{tree.lookup}" if tree.lookup else "")


def measure_batch_table(engine: Engine, trees: list[TreeConfig], prompts: list[Prompt], sizes: list[int], seed: int) -> list[dict]:
    """Per batch size: plain throughput once, speculative throughput per tree (none: plain only),
    over the first turns of `prompts` decoded `size` at a time (bench_measure.fill_batches)."""
    ids = [engine.encode_chat(messages_for_turn(p, [], 0), raw=p.raw) for p in prompts]
    rows = []
    for size in sizes:
        batches = fill_batches(ids, size)
        sequences = sum(len(b) for b in batches)
        plain = measure_batches(engine, batches, None, seed, desc=f"batch {size} plain")
        if not trees:
            rows.append(batch_row(size, sequences, plain, None, None))
        for tree in trees:
            spec = measure_batches(engine, batches, tree, seed, desc=f"batch {size} {tree_label(tree)}")
            rows.append(batch_row(size, sequences, plain, spec, tree))
    return rows


def run_config(engine: Engine, tree: TreeConfig | None, args, machine: dict) -> dict:
    """The configs a summary was measured with (`tree` None: plain decoding alone)."""
    return {
        "mode": "plain" if tree is None else "speculative+plain",
        "model": args.model,
        "model_source": engine.target.source,
        "draft": None if tree is None else args.draft,
        "tree": None if tree is None else tree_fields(tree),
        "sampling": dataclasses.asdict(engine.sampling),
        "max_new_tokens": engine.max_new_tokens,
        "cache_len": engine.cache_len,
        "dtype": dtype_name(args.dtype),
        "float32_activations": args.float32_activations,
        "attention": args.attention,
        "layers": engine.laid_out.layers,
        "mesh": describe(engine.mesh),
        "seed": args.seed,
        "prompts": args.prompts,
        "limit_per_category": args.limit,
        "categories": args.categories.split(",") if args.categories else None,
        "machine": machine,
    }


def measured_on(engine: Engine, args, machine: dict, num_prompts: int) -> dict:
    """Where and how a tuned setting was measured (saved with it)."""
    return machine | {
        "model": args.model, "dtype": dtype_name(args.dtype), "attention": args.attention, "mesh": describe(engine.mesh), "max_new_tokens": engine.max_new_tokens,
        "prompts": os.path.abspath(args.prompts), "num_prompts": num_prompts,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def auto_tune(draft_dir: str, sweep: list[dict], batch: list[dict], measured: dict, sampled: bool) -> dict:
    """Save the sweep's fastest tree (`sampled`: as the sampling tree), whether it beat plain
    decoding, and the batch table with the head. Fastest = the highest speedup over the tree's own
    interleaved plain runs, not the highest tokens/s: a host's speed drifts over a sweep, and the
    ratio cancels the drift that the raw rate carries."""
    best = max(sweep, key=lambda r: r["speedup"])
    tree = tree_from_fields(best)
    numbers = {k: best[k] for k in ("tau", "spec_tokens_per_s", "ar_tokens_per_s", "speedup")}
    speculate = best["speedup"] > 1
    return {
        "tree": tree_fields(tree),
        "speculate": speculate,
        "tree_file": save_tuned_tree(draft_dir, tree, measured | numbers, sampled, speculate),
        "batch_policy_file": save_batch_policy(draft_dir, batch, measured) if batch else None,
    }
