"""Atomic file writes: readers see the old file or the complete new one, never a partial one."""

from __future__ import annotations

import json
import os
import tempfile


def write_json_atomic(path: str, data) -> None:
    """Write `data` as indented JSON to `path` atomically (NaN and infinity refused)."""
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """Write to a temporary sibling, fsync it, then rename it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make results private to the writer
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def savez_atomic(path: str, **arrays) -> None:
    """numpy.savez to a temporary sibling, then rename it over `path` (which should end in .npz)."""
    import numpy as np

    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
