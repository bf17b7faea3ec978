"""Files written atomically (a reader sees the old file or the whole new one, never a part) and
JSON and .npz files read with one-line errors. Every writer and reader of such files of eagle-jax goes through here.

Only the standard library is imported at module level (numpy when an .npz is written): scripts that
run in a venv without JAX import this module from the source tree."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import uuid
from typing import Callable, Iterator

from eagle_jax.errors import EagleError

FilePath = str | os.PathLike


def fsync_path(path: FilePath) -> None:
    """Flush a file's or a directory's entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hidden_sibling(path: str, label: str) -> str:
    """A fresh name beside `path`, hidden, that says whose it is and what it is (LEFTOVER matches it)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{label}-{uuid.uuid4().hex[:12]}")


LEFTOVER = re.compile(r"\.(.+)\.(partial|old)-[0-9a-f]{12}(\.\w+)?")


def remove_leftovers(directory: FilePath, of: str | None = None, min_age_s: float = 0.0) -> list[str]:
    """Remove from `directory` what atomic writes killed halfway (kill -9, a power cut) left there:
    their hidden staging files and directories, and moved-aside old copies (only those of the entry
    named `of`, if given), modified at least `min_age_s` seconds ago (an age that no live writer of
    a directory others share reaches). Returns the names removed."""
    removed = []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            match = LEFTOVER.fullmatch(entry.name)
            if not match or (of is not None and match.group(1) != of):
                continue
            if time.time() - entry.stat(follow_symlinks=False).st_mtime >= min_age_s:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                removed.append(entry.name)
    return sorted(removed)


@contextlib.contextmanager
def atomic_path(path: FilePath, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary sibling of `path` to write; when the block ends without an error it is
    fsynced and renamed over `path`, else removed. `suffix` keeps the extension that some writers
    (numpy.savez, matplotlib) add or read."""
    tmp = _hidden_sibling(path, "partial") + suffix
    # Created here with the mode open() would give (0666 less the umask); mkstemp's 0600 would
    # make results private to the writer.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(os.path.dirname(tmp))  # the rename itself
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: FilePath, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json_atomic(path: FilePath, data, indent: int | None = 2) -> None:
    """`data` as JSON (NaN and infinity refused), atomically."""
    write_text_atomic(path, json.dumps(data, indent=indent, allow_nan=False) + "\n")


def write_jsonl_atomic(path: FilePath, rows) -> None:
    """One JSON object per line, non-ASCII kept, atomically."""
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def savez_atomic(path: FilePath, compressed: bool = False, **arrays) -> None:
    """numpy.savez (or savez_compressed) to `path` (which should end in .npz), atomically."""
    import numpy as np

    with atomic_path(path, suffix=".npz") as tmp:
        (np.savez_compressed if compressed else np.savez)(tmp, **arrays)


def read_npz(path: FilePath, names: tuple[str, ...], what: str, remedy: str = "") -> dict:
    """The arrays `names` of the .npz file `path`, read whole; a missing, truncated or garbled file,
    or one without those arrays, is one EagleError line naming the file, `what` it holds and the
    `remedy` (a sentence) if one is given."""
    import zipfile
    import zlib

    import numpy as np

    label = f"{path} ({what})"
    try:
        with np.load(path) as f:
            return {name: np.asarray(f[name]) for name in names}
    except FileNotFoundError:
        raise EagleError(f"{label}: no such file") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise EagleError(f"{label}: cannot read it ({e}){'; ' + remedy if remedy else ''}") from None


def write_directory_atomic(directory: FilePath, fill: Callable[[str], None], replace: bool = True) -> None:
    """Make `directory` by `fill(staging)` in a hidden sibling, fsync it and rename it into place.

    An existing directory is replaced: it is moved aside first (rename cannot replace a non-empty
    directory) and removed once the new one is in, or moved back if the rename fails. With
    `replace=False` it is kept instead and the rename's OSError raised (a writer that lost a race to
    another writing the same content)."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise EagleError(f"{directory} exists and is not a directory")
    os.makedirs(parent, exist_ok=True)
    staging = _hidden_sibling(directory, "partial")
    os.mkdir(staging)  # 0777 less the umask, as for any directory (mkdtemp's 0700 would hide it)
    try:
        fill(staging)
        for root, _, files in os.walk(staging, topdown=False):  # each entry before the directory naming it
            for file in files:
                fsync_path(os.path.join(root, file))
            fsync_path(root)
        old = _hidden_sibling(directory, "old") if replace and os.path.exists(directory) else None
        if old is not None:
            os.rename(directory, old)
        try:
            os.rename(staging, directory)
        except BaseException:
            if old is not None:
                os.rename(old, directory)
            raise
        fsync_path(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)  # the new directory is in: a leftover old copy is only litter


_JSON_NAMES = {dict: "object", list: "array", str: "string", float: "number", int: "integer", bool: "boolean", type(None): "null"}


def _json_name(value) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def read_json(path: FilePath, expect: type | None = dict, what: str = "") -> object:
    """The JSON in `path`; a missing, unreadable or malformed file, or (with `expect`) a value of
    another type, is one EagleError line naming the file (and `what` it should hold)."""
    label = f"{path} ({what})" if what else str(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise EagleError(f"{label}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EagleError(f"{label}: cannot read it as JSON ({e})") from None
    if expect is not None and not isinstance(data, expect):
        raise EagleError(f"{label}: expected a JSON {_JSON_NAMES.get(expect, expect.__name__)}, got {_json_name(data)}")
    return data



def check_output_path(path: FilePath, flag: str, directory: bool = False) -> None:
    """Refuse (EagleError), before any work, an output path that could not be written when the work
    is done: an existing directory where a file goes (or a file where a directory goes), a path
    under a file, or a folder this process may not write in. Creates nothing."""
    path = os.path.abspath(path)
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise EagleError(f"{flag} {path} is a file; expected a directory (new or existing)")
    if not directory and os.path.isdir(path):
        raise EagleError(f"{flag} {path} is a directory; expected the path of a file to write")
    existing = path if directory and os.path.isdir(path) else os.path.dirname(path)
    while not os.path.exists(existing):  # the nearest ancestor that exists: the folders below it would be created
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise EagleError(f"{flag} {path}: {existing} is a file, so nothing can be written under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise EagleError(f"{flag} {path}: no permission to write in {existing}")
