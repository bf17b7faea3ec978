"""The tuned settings saved with a draft head, and the one decision they feed: which tree decodes
a batch, or None for plain decoding.

`eagle-jax bench --auto-tune` writes them into the head's directory:
- DRAFT/tree.json `{top_k, depth, num_nodes, lookup, scoring, speculate, measured_on}`: the fastest
  tree at batch 1 on this machine, and whether it beat plain decoding there (`speculate`). Tuned
  with sampling (temperature > 0) it is DRAFT/tree_sampled.json instead: drafts are accepted less
  often when sampling, so the fastest tree is often smaller, and may not pay at all.
- with `--batch-sizes`, DRAFT/batch_policy.json `{measured_on, table}`: the measured throughput of
  plain and speculative decoding per batch size and tree (the rows of OUT.json["batch"]).
A file applies only on the kind of device it was measured on (`measured_on.device_kind`).

`choose_tree` turns the flags and these files into a `TreeChoice`; `TreeChoice.for_batch` is the
decision the engine's callers pass to `Engine.run(prompts, tree=...)`.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json, write_json_atomic

SHAPE_FIELDS = ("top_k", "depth", "num_nodes", "lookup")  # a tree's integer fields, as saved and swept
TREE_FILE, SAMPLED_TREE_FILE = "tree.json", "tree_sampled.json"
POLICY_FILE = "batch_policy.json"
SPECULATE_ANYWAY = "pass a --tree-* flag to speculate anyway"


def tree_fields(tree: TreeConfig) -> dict:
    """The saved and measured fields of a tree (SHAPE_FIELDS and its scoring)."""
    return {field: getattr(tree, field) for field in SHAPE_FIELDS} | {"scoring": tree.scoring}


def tree_from_fields(fields: dict, base: TreeConfig = TreeConfig()) -> TreeConfig:
    """`base` with the SHAPE_FIELDS values and scoring of a saved or measured row; lookup and scoring
    may be absent (saved before they existed: none, and base's scoring)."""
    values = {field: int(fields.get(field, 0) if field == "lookup" else fields[field]) for field in SHAPE_FIELDS}
    return dataclasses.replace(base, **values, scoring=str(fields.get("scoring", base.scoring)))


def current_device_kind() -> str:
    return jax.devices()[0].device_kind


def _measured_here(data: dict, device_kind: str | None) -> bool:
    return device_kind is None or data.get("measured_on", {}).get("device_kind") == device_kind


@dataclasses.dataclass(frozen=True)
class TunedTree:
    tree: TreeConfig
    speculate: bool  # False: even this, the fastest tree measured, was slower than plain decoding
    path: str  # the file it was read from


def save_tuned_tree(draft_dir: str, tree: TreeConfig, measured_on: dict, sampled: bool = False, speculate: bool = True) -> str:
    """Write DRAFT/tree.json (greedy) or DRAFT/tree_sampled.json atomically; returns its path."""
    path = os.path.join(draft_dir, SAMPLED_TREE_FILE if sampled else TREE_FILE)
    write_json_atomic(path, tree_fields(tree) | {"speculate": speculate, "measured_on": measured_on})
    return path


def load_tuned_tree(draft_dir: str, device_kind: str | None = None, sampled: bool = False) -> TunedTree | None:
    """The tree saved by `--auto-tune` in `draft_dir` for greedy decoding, or with `sampled` the one
    tuned with sampling (the greedy one where there is none); None when there is none, or when
    `device_kind` is given and differs from the device it was measured on. Files saved before
    `speculate` existed speculated."""
    path = os.path.join(draft_dir, SAMPLED_TREE_FILE)
    if not (sampled and os.path.exists(path)):
        path = os.path.join(draft_dir, TREE_FILE)
    if not os.path.exists(path):
        return None
    data = read_json(path, expect=dict, what="a tuned draft tree")
    if not _measured_here(data, device_kind):
        return None
    try:
        tree = tree_from_fields(data)
    except (KeyError, TypeError, ValueError, EagleError) as e:
        raise EagleError(f"{path}: expected integer top_k, depth, num_nodes and lookup, and a known scoring ({e})") from None
    speculate = data.get("speculate", True)
    if not isinstance(speculate, bool):
        raise EagleError(f"{path}: expected 'speculate' to be true or false, got {speculate!r}")
    return TunedTree(tree, speculate, path)


def save_batch_policy(draft_dir: str, table: list[dict], measured_on: dict) -> str:
    """Write DRAFT/batch_policy.json atomically (the rows of OUT.json["batch"]); returns its path."""
    path = os.path.join(draft_dir, POLICY_FILE)
    write_json_atomic(path, {"measured_on": measured_on, "table": table})
    return path


def load_batch_policy(draft_dir: str, device_kind: str | None = None) -> list[dict] | None:
    """The measured table saved beside tree.json; None when there is none, or when `device_kind`
    is given and differs from the device it was measured on."""
    path = os.path.join(draft_dir, POLICY_FILE)
    if not os.path.exists(path):
        return None
    data = read_json(path, expect=dict, what="a measured batch policy")
    if not isinstance(data.get("table"), list):
        raise EagleError(f"{path}: expected a 'table' list")
    return data["table"] if _measured_here(data, device_kind) else None


@dataclasses.dataclass(frozen=True)
class TreeChoice:
    """The tree settings that apply to a head, and from them the decision for each batch size."""

    tree: TreeConfig | None  # the tree speculation uses; None: no draft head (plain decoding)
    speculate: bool = True  # False: the tuned file found no tree faster than plain decoding
    batch_table: tuple[dict, ...] | None = None  # a measured batch policy's rows, which pick per batch size
    tuned_file: str | None = None  # where `tree` and `speculate` were read from
    policy_file: str | None = None  # where `batch_table` was read from

    def for_batch(self, batch: int) -> TreeConfig | None:
        """The tree that decodes a batch of `batch` rows; None = plain decoding.

        With a batch table (rows {batch, top_k, depth, num_nodes, lookup[, scoring],
        ar_tokens_per_s, spec_tokens_per_s}), the decision is taken at the smallest measured batch
        size >= `batch` (the largest measured one beyond the table): speculation pays less as the
        batch grows, so rounding up errs toward plain decoding. There, the tree with the highest
        speculative tokens/s wins if it beats plain decoding, else None. The scoring stays `tree`'s
        (the table may have been measured in the other decoding mode), and `tree` is kept when the
        table has no speculative measurement.
        """
        if batch < 1:
            raise EagleError(f"batch size must be >= 1, got {batch}")
        if self.tree is None or not self.speculate:
            return None
        rows = [r for r in self.batch_table or () if r.get("spec_tokens_per_s") is not None]
        if not rows:
            return self.tree
        sizes = sorted({r["batch"] for r in rows})
        size = min((s for s in sizes if s >= batch), default=sizes[-1])
        best = max((r for r in rows if r["batch"] == size), key=lambda r: r["spec_tokens_per_s"])
        if best["spec_tokens_per_s"] <= best["ar_tokens_per_s"]:
            return None
        return tree_from_fields(best | {"scoring": self.tree.scoring}, self.tree)

    def why_plain(self, batch: int) -> str | None:
        """Which saved setting turned speculation off for a batch of this size; None where the
        batch speculates, or where plain decoding was asked for (no draft head)."""
        if self.tree is None or self.for_batch(batch) is not None:
            return None
        if not self.speculate:
            return (f"decoded plainly: when this head's tree was tuned here (eagle-jax bench --auto-tune, {self.tuned_file}) "
                    f"no tree beat plain decoding in this mode; {SPECULATE_ANYWAY}")
        return (f"decoded plainly: the batch policy measured here (eagle-jax bench --auto-tune --batch-sizes, {self.policy_file}) "
                f"found plain decoding faster at batch size {batch}; {SPECULATE_ANYWAY}")


def choose_tree(
    draft_dir: str | None, *, sampled: bool, top_k: int | None = None, depth: int | None = None,
    num_nodes: int | None = None, lookup: int | None = None, scoring: str | None = None,
) -> TreeChoice:
    """The tree settings for decoding with the head in `draft_dir` (None: no head, plain decoding).

    Explicit values (the --tree-* flags; None = not given) always win over the saved settings:
    with any of them the tree speculates at every batch size. Shape values (top_k, depth,
    num_nodes, lookup) replace the whole tuned shape (the others from TreeConfig()), since a shape
    is tuned as a whole; `scoring` alone keeps the tuned shape. Without explicit values, the tuned
    tree of this mode (greedy or `sampled`) measured on this kind of device applies, else
    TreeConfig(), and the batch policy measured here, if any, picks per batch size.
    """
    if draft_dir is None:
        return TreeChoice(None)
    shape = {"top_k": top_k, "depth": depth, "num_nodes": num_nodes, "lookup": lookup}
    given = {field: value for field, value in shape.items() if value is not None}
    device_kind = current_device_kind()
    tuned = None if given else load_tuned_tree(draft_dir, device_kind, sampled)
    tree = dataclasses.replace(tuned.tree if tuned else TreeConfig(), **given, **({"scoring": scoring} if scoring else {}))
    if given or scoring:
        return TreeChoice(tree)
    table = load_batch_policy(draft_dir, device_kind)
    return TreeChoice(
        tree, speculate=tuned.speculate if tuned else True, batch_table=tuple(table) if table is not None else None,
        tuned_file=tuned.path if tuned else None, policy_file=os.path.join(draft_dir, POLICY_FILE) if table is not None else None,
    )
