"""PNG plots of a bench report (the OUT.json dict), drawn with matplotlib's Agg backend."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from eagle_jax.files import atomic_path  # noqa: E402


def _save(fig, path: str) -> str:
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path


def _value(x: float | None) -> float:
    return float("nan") if x is None else x


def plot_categories(report: dict, path: str) -> str:
    """Bars of tau (left) and speedup (right) per category, plus the overall value."""
    groups = list(report["per_category"].items()) + [("all", report["summary"])]
    names = [name for name, _ in groups]
    fig, (ax_tau, ax_speed) = plt.subplots(1, 2, figsize=(max(6, 1.4 * len(names)), 3.5))
    ax_tau.bar(names, [_value(s["tau"]) for _, s in groups], color="tab:blue")
    ax_tau.set_ylabel("tau (tokens per round)")
    ax_speed.bar(names, [_value(s["speedup"]) for _, s in groups], color="tab:green")
    ax_speed.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax_speed.set_ylabel("speedup vs plain decoding")
    for ax in (ax_tau, ax_speed):
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    return _save(fig, path)


def plot_acceptance(report: dict, path: str) -> str:
    """Share of rounds by acceptance length (accepted draft tokens + 1)."""
    counts = report["summary"]["accept_histogram"]
    total = sum(counts)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(range(1, len(counts) + 1), [c / total for c in counts], color="tab:purple")
    ax.set_xlabel("tokens per round (accepted + 1)")
    ax.set_ylabel("share of rounds")
    ax.set_title(f"tau = {report['summary']['tau']:.2f}")
    return _save(fig, path)


def plot_sweep(report: dict, path: str) -> str:
    """Speculative tokens/s (and tau) against the node budget, one line per (top_k, depth, lookup)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax_tau = ax.twinx()
    shape = lambda r: (r["top_k"], r["depth"], r.get("lookup", 0))  # noqa: E731
    for top_k, depth, lookup in dict.fromkeys(map(shape, report["sweep"])):
        rows = sorted((r for r in report["sweep"] if shape(r) == (top_k, depth, lookup)), key=lambda r: r["num_nodes"])
        nodes = [r["num_nodes"] for r in rows]
        label = f"top_k={top_k}, depth={depth}" + (f", lookup={lookup}" if lookup else "")
        line = ax.plot(nodes, [_value(r["spec_tokens_per_s"]) for r in rows], marker="o", label=label)[0]
        ax_tau.plot(nodes, [_value(r["tau"]) for r in rows], marker="x", linestyle=":", color=line.get_color())
    ar = report["summary"]["ar_tokens_per_s"]
    if ar is not None:
        ax.axhline(ar, color="gray", linewidth=0.8, linestyle="--", label="plain decoding")
    ax.set_xticks(sorted({r["num_nodes"] for r in report["sweep"]}))
    ax.set_xlabel("drafted tree budget (num_nodes)")
    ax.set_ylabel("speculative tokens/s (solid)")
    ax_tau.set_ylabel("tau (dotted)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_batch(report: dict, path: str) -> str:
    """Throughput against batch size: plain decoding and each measured tree."""
    rows = report["batch"]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    plain = sorted({(r["batch"], r["ar_tokens_per_s"]) for r in rows})
    ax.plot([b for b, _ in plain], [t for _, t in plain], marker="o", color="black", label="plain")
    shape = lambda r: (r["top_k"], r["depth"], r["num_nodes"], r.get("lookup", 0))  # noqa: E731
    trees = dict.fromkeys(shape(r) for r in rows if r["spec_tokens_per_s"] is not None)
    for tree in trees:
        mine = sorted((r for r in rows if shape(r) == tree), key=lambda r: r["batch"])
        ax.plot([r["batch"] for r in mine], [r["spec_tokens_per_s"] for r in mine], marker="o",
                label="speculative k={} d={} n={} l={}".format(*tree))
    ax.set_xscale("log", base=2)
    ax.set_xticks([b for b, _ in plain], [str(b) for b, _ in plain])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s (all rows)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def write_plots(report: dict, directory: str) -> list[str]:
    """Every plot the report has data for, as PNG files in `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    out = os.path.join
    paths = []
    if report["summary"]["tau"] is not None:
        paths.append(plot_categories(report, out(directory, "categories.png")))
        paths.append(plot_acceptance(report, out(directory, "acceptance.png")))
    if report["sweep"]:
        paths.append(plot_sweep(report, out(directory, "sweep.png")))
    if report["batch"]:
        paths.append(plot_batch(report, out(directory, "batch.png")))
    return paths
