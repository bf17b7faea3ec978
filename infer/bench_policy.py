"""Tree settings measured by the benchmark and saved with a draft head.

- `--sweep AXIS=V1,V2` (repeatable, a grid over top_k, depth, num_nodes, lookup) and `--trees
  K/D/N[/L],...` (trees listed one by one) -> the trees to measure.
- `--auto-tune` writes DRAFT/tree.json `{top_k, depth, num_nodes, lookup, speculate, measured_on}`: the
  tree with the highest speculative tokens/s at batch 1 on this machine, and whether it beat plain
  decoding there (`speculate`); `load_tuned_tree` and `tuned_speculation_pays` read them back. Tuned
  with sampling (temperature > 0), it writes DRAFT/tree_sampled.json instead: drafts are accepted
  less often when sampling, so the fastest tree is often smaller, and may not pay at all.
- With `--batch-sizes`, it also writes DRAFT/batch_policy.json `{measured_on, table}`: the measured
  throughput of plain and speculative decoding per batch size and tree; `tree_for_batch` turns the
  table into a decision for any batch size.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

from eagle_jax.errors import EagleError
from eagle_jax.files import write_json_atomic
from eagle_jax.decoding.tree import TreeConfig

SWEEP_AXES = ("top_k", "depth", "num_nodes", "lookup")
AUTO_TUNE_NUM_NODES = (8, 16, 32, 64)  # default --auto-tune budgets, at the given top_k and depth
TREE_FILE, SAMPLED_TREE_FILE = "tree.json", "tree_sampled.json"
POLICY_FILE = "batch_policy.json"


def tree_fields(tree: TreeConfig) -> dict:
    """The measured and saved fields of a tree (SWEEP_AXES and its scoring)."""
    return {axis: getattr(tree, axis) for axis in SWEEP_AXES} | {"scoring": tree.scoring}


def tree_from_fields(fields: dict, base: TreeConfig = TreeConfig()) -> TreeConfig:
    """`base` with the SWEEP_AXES values and scoring of a saved or measured row; lookup and scoring
    may be absent (saved before they existed: none, and base's scoring)."""
    values = {axis: int(fields.get(axis, 0) if axis == "lookup" else fields[axis]) for axis in SWEEP_AXES}
    return dataclasses.replace(base, **values, scoring=str(fields.get("scoring", base.scoring)))


def parse_int_list(text: str, flag: str, minimum: int = 1) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every value >= minimum."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise EagleError(f"{flag} expects a comma list of integers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise EagleError(f"{flag} expects integers >= {minimum}, got {text!r}")
    return values


def parse_sweep(specs: list[str]) -> dict[str, list[int]]:
    """`--sweep AXIS=V1,V2,...` flags -> {axis: values}, axes among SWEEP_AXES (lookup may be 0)."""
    axes: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or name not in SWEEP_AXES:
            raise EagleError(f"--sweep expects AXIS=V1,V2,... with AXIS one of {', '.join(SWEEP_AXES)}, got {spec!r}")
        if name in axes:
            raise EagleError(f"--sweep gives {name} twice")
        axes[name] = parse_int_list(values, f"--sweep {name}", minimum=0 if name == "lookup" else 1)
    return axes


def parse_trees(text: str, flag: str = "--trees") -> list[TreeConfig]:
    """'2/2/4,2/1/3/5' -> trees top_k/depth/num_nodes[/lookup], in order, without repeats."""
    trees = []
    for spec in (s.strip() for s in text.split(",") if s.strip()):
        try:
            fields = [int(n) for n in spec.split("/")]
            if len(fields) not in (3, 4):
                raise ValueError(f"{len(fields)} numbers")
            trees.append(TreeConfig(*fields[:3], lookup=fields[3] if len(fields) == 4 else 0))
        except (ValueError, EagleError) as e:
            raise EagleError(f"{flag} {spec!r}: expected top_k/depth/num_nodes[/lookup], e.g. 2/2/4 or 2/1/3/5 ({e})") from None
    if not trees:
        raise EagleError(f"{flag} expects at least one tree top_k/depth/num_nodes[/lookup], got {text!r}")
    return list(dict.fromkeys(trees))


def sweep_trees(axes: dict[str, list[int]], base: TreeConfig) -> list[TreeConfig]:
    """The grid of `axes` over `base`, in order, without repeats."""
    trees = []
    for combo in itertools.product(*axes.values()):
        setting = dict(zip(axes, combo))
        try:
            trees.append(dataclasses.replace(base, **setting))
        except EagleError as e:
            raise EagleError(f"--sweep setting {setting} is not a valid tree: {e}") from None
    return list(dict.fromkeys(trees))


def auto_tune_trees(base: TreeConfig) -> list[TreeConfig]:
    """`base` at each AUTO_TUNE_NUM_NODES budget the tree can hold (at least 2 nodes, at most 1 + pool)."""
    return [dataclasses.replace(base, num_nodes=n) for n in AUTO_TUNE_NUM_NODES if n <= 1 + base.pool_size]


def draft_directory(draft: str | None) -> str:
    """The draft head directory the tuned settings are written into."""
    if draft is None or not os.path.isdir(draft):
        raise EagleError(f"--auto-tune saves tree.json into the draft head directory; --draft {draft} is not a directory")
    if not os.access(draft, os.W_OK):
        raise EagleError(f"--auto-tune cannot write into the draft head directory {draft}")
    return draft


def save_tuned_tree(draft_dir: str, tree: TreeConfig, measured_on: dict, sampled: bool = False, speculate: bool = True) -> str:
    """Write DRAFT/tree.json (greedy) or DRAFT/tree_sampled.json atomically; returns its path.
    `speculate` False records that even this, the fastest tree, was slower than plain decoding."""
    path = os.path.join(draft_dir, SAMPLED_TREE_FILE if sampled else TREE_FILE)
    write_json_atomic(path, tree_fields(tree) | {"speculate": speculate, "measured_on": measured_on})
    return path


def _read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise EagleError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, dict):
        raise EagleError(f"{path}: expected a JSON object")
    return data


def _tuned_file(draft_dir: str, device_kind: str | None, sampled: bool) -> tuple[str, dict] | None:
    """(path, contents) of the tuned tree file that applies: with `sampled` the sampling one where it
    exists, else the greedy one; None when there is none or it was measured on another `device_kind`."""
    path = os.path.join(draft_dir, SAMPLED_TREE_FILE)
    if not (sampled and os.path.exists(path)):
        path = os.path.join(draft_dir, TREE_FILE)
    data = _read_json(path)
    if data is None or (device_kind is not None and data.get("measured_on", {}).get("device_kind") != device_kind):
        return None
    return path, data


def load_tuned_tree(draft_dir: str, device_kind: str | None = None, sampled: bool = False) -> TreeConfig | None:
    """The tree saved by `--auto-tune` in `draft_dir` for greedy decoding, or with `sampled` the one
    tuned with sampling (the greedy one where there is none); None when there is none, or when
    `device_kind` is given and differs from the device it was measured on."""
    found = _tuned_file(draft_dir, device_kind, sampled)
    if found is None:
        return None
    path, data = found
    try:
        return tree_from_fields(data)
    except (KeyError, TypeError, ValueError, EagleError) as e:
        raise EagleError(f"{path}: expected integer top_k, depth, num_nodes and lookup, and a known scoring ({e})") from None


def tuned_speculation_pays(draft_dir: str, device_kind: str | None = None, sampled: bool = False) -> bool:
    """False when the tuned tree that applies (as `load_tuned_tree` picks it) was measured slower than
    plain decoding; True otherwise, also when nothing was tuned (files saved before the field: True)."""
    found = _tuned_file(draft_dir, device_kind, sampled)
    if found is None:
        return True
    path, data = found
    speculate = data.get("speculate", True)
    if not isinstance(speculate, bool):
        raise EagleError(f"{path}: expected 'speculate' to be true or false, got {speculate!r}")
    return speculate


def save_batch_policy(draft_dir: str, table: list[dict], measured_on: dict) -> str:
    """Write DRAFT/batch_policy.json atomically (the rows of OUT.json["batch"]); returns its path."""
    path = os.path.join(draft_dir, POLICY_FILE)
    write_json_atomic(path, {"measured_on": measured_on, "table": table})
    return path


def load_batch_policy(draft_dir: str) -> list[dict] | None:
    """The measured table saved beside tree.json, or None."""
    path = os.path.join(draft_dir, POLICY_FILE)
    data = _read_json(path)
    if data is None:
        return None
    if not isinstance(data.get("table"), list):
        raise EagleError(f"{path}: expected a 'table' list")
    return data["table"]


def tree_for_batch(tree: TreeConfig, batch: int, table: list[dict]) -> TreeConfig | None:
    """The tree to decode `batch` rows with, from a measured table; None = speculation off.

    table rows: {batch, top_k, depth, num_nodes, lookup[, scoring], ar_tokens_per_s, spec_tokens_per_s} (OUT.json["batch"]).
    The decision is taken at the smallest measured batch size >= `batch` (the largest measured one
    beyond the table): speculation pays less as the batch grows, so rounding up errs toward plain
    decoding. There, the tree with the highest speculative tokens/s wins if it beats plain decoding,
    else None. The scoring stays `tree`'s (the table may have been measured in the other decoding
    mode), and `tree` is returned unchanged when the table has no speculative measurement.
    """
    if batch < 1:
        raise EagleError(f"batch size must be >= 1, got {batch}")
    rows = [r for r in table if r.get("spec_tokens_per_s") is not None]
    if not rows:
        return tree
    sizes = sorted({r["batch"] for r in rows})
    size = min((s for s in sizes if s >= batch), default=sizes[-1])
    best = max((r for r in rows if r["batch"] == size), key=lambda r: r["spec_tokens_per_s"])
    if best["spec_tokens_per_s"] <= best["ar_tokens_per_s"]:
        return None
    return tree_from_fields(best | {"scoring": tree.scoring}, tree)
