"""Atomic file writes: readers see the old file or the complete new one, never a partial one."""

from __future__ import annotations

import json
import os
import tempfile


def write_json_atomic(path: str, data) -> None:
    """Write JSON to a temporary sibling, fsync it, then rename it over `path`: readers see the old
    file or the complete new one, never a partial one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
