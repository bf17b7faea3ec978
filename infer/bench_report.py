"""Benchmark numbers from measured runs: summaries, per-category and batch rows, the stdout tables,
and the machine description.

tau = (new tokens - turns) / rounds: each round emits its accepted draft tokens + 1 (the target's
own token); each turn's first token comes from prefill, not from a round (RunResult.tau).
Tokens/s of a mode = its total new tokens / its total decode wall time (compile excluded);
speedup = speculative tokens/s / plain tokens/s over the same prompts; mean_speedup = the mean of
the per-prompt ratios. acceptance_by_depth[d] = the share of rounds that accepted a (d+1)-th draft
token among those that accepted d of them (`acceptance_by_depth`): where along a drafted path the
target starts to disagree.
"""

from __future__ import annotations

import math
import os
import platform

import jax

from eagle_jax.infer.bench_measure import PromptRecord, merge
from eagle_jax.infer.engine import RunResult
from eagle_jax.infer.settings import SHAPE_FIELDS, tree_fields
from eagle_jax.decoding.tree import TreeConfig


def finite(x: float | None) -> float | None:
    """x, or None for NaN/inf (JSON has neither)."""
    return x if x is not None and math.isfinite(x) else None


def tokens_per_s(result: RunResult | None) -> float | None:
    return result.new_tokens / result.wall_s if result is not None and result.wall_s > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def merged(conversations) -> RunResult | None:
    """All turns of the given conversations (None entries skipped) as one RunResult; None if there are none."""
    results = [r for c in conversations if c is not None for r in c.results]
    return merge(results) if results else None


def acceptance_by_depth(histogram: list[int]) -> list[float | None]:
    """Per depth d = 0 .. P-2, P(a round accepts > d draft tokens | it accepts >= d), from the
    histogram (P,) of rounds by accepted draft tokens; None where no round got that far."""
    reached = [sum(histogram[d:]) for d in range(len(histogram))]  # rounds that accepted >= d
    return [reached[d + 1] / reached[d] if reached[d] else None for d in range(len(histogram) - 1)]


def summarize(records: list[PromptRecord]) -> dict:
    """Aggregate numbers of a set of prompts (see the module docstring for the definitions)."""
    spec, plain = merged(rec.spec for rec in records), merged(rec.plain for rec in records)
    spec_tps, ar_tps = tokens_per_s(spec), tokens_per_s(plain)
    ratios = [ratio(tokens_per_s(merged([rec.spec])), tokens_per_s(merged([rec.plain]))) for rec in records]
    ratios = [x for x in ratios if x is not None]
    identical = [rec.identical_to_ar for rec in records]
    main = spec or plain
    inputs = [n for rec in records for n in (rec.spec or rec.plain).prompt_tokens]
    histogram = spec.accept_histogram.sum(0).tolist() if spec and spec.accept_histogram.size else None
    return {
        "num_prompts": len(records),
        "num_turns": sum(len(rec.prompt.turns) for rec in records),
        "tau": finite(spec.tau) if spec else None,
        "spec_tokens_per_s": spec_tps,
        "ar_tokens_per_s": ar_tps,
        "speedup": ratio(spec_tps, ar_tps),
        "mean_speedup": sum(ratios) / len(ratios) if ratios else None,
        "identical_to_ar": None if None in identical else all(identical),
        "identical_prompts": None if None in identical else sum(identical),
        "new_tokens": main.new_tokens,
        "ar_new_tokens": plain.new_tokens if plain else None,
        "rounds": sum(spec.rounds) if spec else None,
        "spec_wall_s": spec.wall_s if spec else None,
        "ar_wall_s": plain.wall_s if plain else None,
        "spec_compile_s": spec.compile_s if spec else None,
        "ar_compile_s": plain.compile_s if plain else None,
        "accept_histogram": histogram,
        "acceptance_by_depth": acceptance_by_depth(histogram) if histogram else None,
        "mean_prompt_tokens": sum(inputs) / len(inputs),
    }


def per_prompt(records: list[PromptRecord]) -> list[dict]:
    """One row per prompt: its id, category, input sizes, answers (speculative, else plain), why each
    turn's answer ended, and numbers."""
    return [
        {
            "question_id": rec.prompt.question_id,
            "category": rec.prompt.category,
            "prompt_tokens": (rec.spec or rec.plain).prompt_tokens,
            "answers": (rec.spec or rec.plain).answers,
            "finish_reasons": [r.finish_reasons[0] for r in (rec.spec or rec.plain).results],  # per turn
            **summarize([rec]),
        }
        for rec in records
    ]


def per_category(records: list[PromptRecord]) -> dict[str, dict]:
    """summarize() per category, in order of first appearance."""
    categories = list(dict.fromkeys(rec.prompt.category for rec in records))
    return {c: summarize([rec for rec in records if rec.prompt.category == c]) for c in categories}


def batch_row(batch: int, sequences: int, plain: RunResult, spec: RunResult | None, tree: TreeConfig | None) -> dict:
    """Throughput of `sequences` prompts decoded `batch` at a time, plain and (with a tree) speculative."""
    spec_tps, ar_tps = tokens_per_s(spec), tokens_per_s(plain)
    return {
        "batch": batch,
        **(tree_fields(tree) if tree else dict.fromkeys(tree_fields(TreeConfig()))),
        "sequences": sequences,
        "ar_tokens_per_s": ar_tps,
        "spec_tokens_per_s": spec_tps,
        "speedup": ratio(spec_tps, ar_tps),
        "tau": finite(spec.tau) if spec else None,
        "ar_new_tokens": plain.new_tokens,
        "spec_new_tokens": spec.new_tokens if spec else None,
    }


def describe_machine() -> dict:
    """Where the numbers were measured: backend, device kind and count, usable CPUs, versions."""
    device = jax.devices()[0]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "cpu_count": cpus,
        "jax_version": jax.__version__,
        "host": platform.platform(),
        "python": platform.python_version(),
    }


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(headers: list[str], rows: list[list]) -> str:
    """Fixed-width text table: first column left-aligned, the others right-aligned."""
    cells = [headers] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in cells]
    return "\n".join(lines[:1] + ["-" * len(lines[0])] + lines[1:])


SUMMARY_COLUMNS = ["prompts", "new tokens", "tau", "spec tok/s", "plain tok/s", "speedup", "identical"]


def _summary_cells(s: dict) -> list:
    return [s["num_prompts"], s["new_tokens"], s["tau"], s["spec_tokens_per_s"], s["ar_tokens_per_s"], s["speedup"], s["identical_to_ar"]]


def format_report(report: dict) -> str:
    """The readable stdout view of OUT.json: categories, then variants, sweep and batch when present."""
    rows = [[c] + _summary_cells(s) for c, s in report["per_category"].items()] + [["all"] + _summary_cells(report["summary"])]
    parts = [format_table(["category"] + SUMMARY_COLUMNS, rows)]
    s = report["summary"]
    parts.append(
        f"mean per-prompt speedup {_cell(s['mean_speedup'])}; compile excluded: spec {_cell(s['spec_compile_s'])} s, "
        f"plain {_cell(s['ar_compile_s'])} s; accepted-draft-token histogram {s['accept_histogram']}"
        + (f"; acceptance by depth {' / '.join(map(_cell, s['acceptance_by_depth']))}" if s["acceptance_by_depth"] else "")
    )
    if report["per_variant"]:
        parts.append(format_table(["variant"] + SUMMARY_COLUMNS + ["prompt tokens"],
                                  [[v] + _summary_cells(s) + [s["mean_prompt_tokens"]] for v, s in report["per_variant"].items()]))
    if report["sweep"]:
        columns = [*SHAPE_FIELDS, "tau", "spec_tokens_per_s", "speedup", "identical_to_ar"]
        parts.append(format_table([*SHAPE_FIELDS, "tau", "spec tok/s", "speedup", "identical"],
                                  [[r[c] for c in columns] for r in report["sweep"]]))
    if report["batch"]:
        columns = ["batch", *SHAPE_FIELDS, "ar_tokens_per_s", "spec_tokens_per_s", "speedup", "tau"]
        parts.append(format_table(["batch", *SHAPE_FIELDS, "plain tok/s", "spec tok/s", "speedup", "tau"],
                                  [[r[c] for c in columns] for r in report["batch"]]))
    return "\n\n".join(parts)
