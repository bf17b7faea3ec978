"""Files written atomically (a reader sees the old file or the whole new one, never a part) and
JSON read with one-line errors. Every writer and JSON reader of eagle-jax goes through here."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from typing import Callable, Iterator

from eagle_jax.errors import EagleError


def fsync_path(path: str) -> None:
    """Flush a file's or a directory's entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary sibling of `path` to write; when the block ends without an error it is
    fsynced and renamed over `path`, else removed. `suffix` keeps the extension that some writers
    (numpy.savez, matplotlib) add or read."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=suffix, dir=directory)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make results private to the writer
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json_atomic(path: str, data, indent: int | None = 2) -> None:
    """`data` as JSON (NaN and infinity refused), atomically."""
    write_text_atomic(path, json.dumps(data, indent=indent, allow_nan=False) + "\n")


def write_jsonl_atomic(path: str, rows) -> None:
    """One JSON object per line, non-ASCII kept, atomically."""
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def savez_atomic(path: str, **arrays) -> None:
    """numpy.savez to `path` (which should end in .npz), atomically."""
    import numpy as np

    with atomic_path(path, suffix=".npz") as tmp:
        np.savez(tmp, **arrays)


def write_directory_atomic(directory: str, fill: Callable[[str], None]) -> None:
    """Make `directory` by `fill(staging)` in a hidden sibling, fsync it and rename it into place.
    An existing directory is replaced: it is moved aside first (rename cannot replace a non-empty
    directory) and removed once the new one is in, or moved back if the rename fails."""
    directory = os.path.abspath(directory)
    parent, name = os.path.split(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise EagleError(f"{directory} exists and is not a directory")
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.partial-", dir=parent)
    try:
        fill(staging)
        for root, _, files in os.walk(staging):
            for file in files:
                fsync_path(os.path.join(root, file))
        fsync_path(staging)
        old = None
        if os.path.exists(directory):
            old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex}")
            os.rename(directory, old)
        try:
            os.rename(staging, directory)
        except BaseException:
            if old is not None:
                os.rename(old, directory)
            raise
        fsync_path(parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def read_json(path: str, expect: type | None = dict, what: str = "") -> object:
    """The JSON in `path`; a missing, unreadable or malformed file, or (with `expect`) a value of
    another type, is one EagleError line naming the file (and `what` it should hold)."""
    label = f"{path} ({what})" if what else path
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise EagleError(f"{label}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EagleError(f"{label}: cannot read it as JSON ({e})") from None
    if expect is not None and not isinstance(data, expect):
        raise EagleError(f"{label}: expected a JSON {'object' if expect is dict else expect.__name__}, got {type(data).__name__}")
    return data
