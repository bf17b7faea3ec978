"""The tracked tree stays small enough to travel (issue 33): a copy of the working tree goes to the
device machines with a limit on its size, so the files git tracks may take at most 28 MB. Large
outputs belong in the history (data/regenerated/README.md) or outside the repository."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIMIT_BYTES = 28_000_000


def tracked_sizes() -> dict[str, int]:
    """Size in the working tree of each file `git ls-files` lists (0 for one listed but missing)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60, check=False)
    if listing.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout")
    sizes = {}
    for name in listing.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if name:
            path = ROOT / name
            sizes[name] = path.stat().st_size if path.is_file() and not path.is_symlink() else (
                len(os.readlink(path)) if path.is_symlink() else 0)
    return sizes


def test_tracked_tree_is_at_most_28_mb():
    sizes = tracked_sizes()
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: item[1], reverse=True)[:5]
    listing = ", ".join(f"{name} ({size:,} bytes)" for name, size in largest)
    assert total <= LIMIT_BYTES, f"the tracked files take {total:,} bytes, over {LIMIT_BYTES:,}; the largest: {listing}"
