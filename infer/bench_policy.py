"""The trees a benchmark measures: `--sweep AXIS=V1,V2` (repeatable, a grid over top_k, depth,
num_nodes, lookup), `--trees K/D/N[/L],...` (trees listed one by one), the budgets `--auto-tune`
tries by default, and the head directory it saves the winner into (the files: infer/settings.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import os

from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.errors import EagleError
from eagle_jax.infer.settings import SHAPE_FIELDS

AUTO_TUNE_NUM_NODES = (8, 16, 32, 64)  # default --auto-tune budgets, at the given top_k and depth


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
    """`--sweep AXIS=V1,V2,...` flags -> {axis: values}, axes among SHAPE_FIELDS (lookup may be 0)."""
    axes: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or name not in SHAPE_FIELDS:
            raise EagleError(f"--sweep expects AXIS=V1,V2,... with AXIS one of {', '.join(SHAPE_FIELDS)}, got {spec!r}")
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
    from eagle_jax.loading.hub import parse_hub_id

    if draft is not None and not os.path.exists(draft) and parse_hub_id(draft):
        raise EagleError(f"--auto-tune saves tree.json into the draft head's directory, and a Hub head lives in the Hugging Face "
                         f"cache: download it into a directory of your own (hf download {draft.split('@')[0]} --local-dir DIR) "
                         "and pass --draft DIR")
    if draft is None or not os.path.isdir(draft):
        raise EagleError(f"--auto-tune saves tree.json into the draft head directory; --draft {draft} is not a directory")
    if not os.access(draft, os.W_OK):
        raise EagleError(f"--auto-tune cannot write into the draft head directory {draft}")
    return draft
