"""eagle_jax.files: atomic writes leave the old file or directory whole when they fail, and leave no
temporary sibling behind; read_json's errors are one line naming the file."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from eagle_jax import files
from eagle_jax.errors import EagleError
from eagle_jax.files import (
    atomic_path,
    read_json,
    savez_atomic,
    write_directory_atomic,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)


class Interrupted(Exception):
    pass


def read_error(path, **kwargs) -> str:
    with pytest.raises(EagleError) as info:
        read_json(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    return message


def fill_with(contents: dict[str, str]):
    """A `fill` writing {relative path: text}, subdirectories included."""
    def fill(staging: str) -> None:
        for name, text in contents.items():
            os.makedirs(os.path.dirname(os.path.join(staging, name)), exist_ok=True)
            with open(os.path.join(staging, name), "w") as f:
                f.write(text)
    return fill


def tree(directory) -> dict[str, str]:
    """{relative path: text} of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name)) as f:
                out[os.path.relpath(os.path.join(root, name), directory)] = f.read()
    return out


# ----------------------------------------------------------------------------- files


def test_a_write_that_fails_midway_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old")
    with pytest.raises(Interrupted):
        with atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write("half of the new")
            raise Interrupted
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["report.json"]


def test_a_failed_first_write_leaves_nothing(tmp_path):
    with pytest.raises(Interrupted):
        with atomic_path(tmp_path / "new.txt"):
            raise Interrupted
    assert os.listdir(tmp_path) == []


def test_a_write_replaces_the_file_with_the_mode_open_would_give(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("old")
    write_text_atomic(path, "new ü\n")
    assert path.read_text(encoding="utf-8") == "new ü\n"
    assert os.listdir(tmp_path) == ["notes.txt"]
    reference = tmp_path / "by_open.txt"
    reference.write_text("")  # created by plain open(): 0666 less the umask
    assert os.stat(path).st_mode == os.stat(reference).st_mode


def test_json_refuses_nan_before_touching_the_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"tokens_per_s": 1.5})
    with pytest.raises(ValueError):
        write_json_atomic(path, {"tokens_per_s": float("nan")})
    assert json.loads(path.read_text()) == {"tokens_per_s": 1.5}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_jsonl_round_trip_keeps_non_ascii(tmp_path):
    rows = [{"id": 1, "text": "naïve"}, {"id": 2, "text": "日本"}]
    write_jsonl_atomic(tmp_path / "rows.jsonl", rows)
    text = (tmp_path / "rows.jsonl").read_text(encoding="utf-8")
    assert "naïve" in text and [json.loads(line) for line in text.splitlines()] == rows


@pytest.mark.parametrize("compressed", [False, True])
def test_savez_output_loads_with_numpy(tmp_path, compressed):
    path = tmp_path / "data.npz"
    tokens, mask = np.arange(12, dtype=np.int32).reshape(3, 4), np.array([True, False, True])
    savez_atomic(path, compressed=compressed, tokens=tokens, loss_mask=mask)
    with np.load(path) as f:
        assert sorted(f.files) == ["loss_mask", "tokens"]
        np.testing.assert_array_equal(f["tokens"], tokens)
        np.testing.assert_array_equal(f["loss_mask"], mask)
    assert os.listdir(tmp_path) == ["data.npz"]  # numpy wrote no .npz.npz beside it


# ----------------------------------------------------------------------------- directories


def test_a_fill_that_fails_keeps_the_old_directory_and_no_staging(tmp_path):
    directory = tmp_path / "head"
    write_directory_atomic(directory, fill_with({"config.json": "old", "sub/weights": "old weights"}))

    def fill(staging: str) -> None:
        fill_with({"config.json": "new"})(staging)
        raise Interrupted

    with pytest.raises(Interrupted):
        write_directory_atomic(directory, fill)
    assert tree(directory) == {"config.json": "old", os.path.join("sub", "weights"): "old weights"}
    assert os.listdir(tmp_path) == ["head"]


def test_a_replaced_directory_has_only_the_new_content(tmp_path):
    directory = tmp_path / "head"
    write_directory_atomic(directory, fill_with({"config.json": "old", "stale.txt": "old", "sub/a": "old"}))
    write_directory_atomic(directory, fill_with({"config.json": "new", "sub/b": "new"}))
    assert tree(directory) == {"config.json": "new", os.path.join("sub", "b"): "new"}
    assert os.listdir(tmp_path) == ["head"]


def test_a_failed_rename_moves_the_old_directory_back(tmp_path, monkeypatch):
    directory = tmp_path / "head"
    write_directory_atomic(directory, fill_with({"config.json": "old"}))
    rename = os.rename

    def rename_refusing_the_new(src, dst):
        if os.path.basename(src).startswith(".head.partial-"):
            raise OSError("rename refused")
        rename(src, dst)

    monkeypatch.setattr(files.os, "rename", rename_refusing_the_new)
    with pytest.raises(OSError, match="rename refused"):
        write_directory_atomic(directory, fill_with({"config.json": "new"}))
    assert tree(directory) == {"config.json": "old"}
    assert os.listdir(tmp_path) == ["head"]


def test_without_replace_an_existing_directory_is_kept(tmp_path):
    directory = tmp_path / "entry"
    write_directory_atomic(directory, fill_with({"config.json": "first"}))
    with pytest.raises(OSError):
        write_directory_atomic(directory, fill_with({"config.json": "second"}), replace=False)
    assert tree(directory) == {"config.json": "first"}
    assert os.listdir(tmp_path) == ["entry"]


def test_a_directory_is_not_written_over_a_file(tmp_path):
    (tmp_path / "head").write_text("a file")
    with pytest.raises(EagleError, match="not a directory"):
        write_directory_atomic(tmp_path / "head", fill_with({"config.json": "new"}))
    assert (tmp_path / "head").read_text() == "a file"
    assert os.listdir(tmp_path) == ["head"]


# ----------------------------------------------------------------------------- read_json


def test_read_json_returns_the_value(tmp_path):
    (tmp_path / "c.json").write_text('{"a": [1, 2]}')
    assert read_json(tmp_path / "c.json") == {"a": [1, 2]}
    (tmp_path / "l.json").write_text("[1, 2]")
    assert read_json(tmp_path / "l.json", expect=list) == [1, 2]


def test_read_json_errors_are_one_line_naming_the_file(tmp_path):
    assert "no such file" in read_error(tmp_path / "missing.json", what="a draft head's config")
    assert "a draft head's config" in read_error(tmp_path / "missing.json", what="a draft head's config")
    (tmp_path / "bad.json").write_text('{"a": 1,\n "b": ')
    assert "cannot read it as JSON" in read_error(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "expected a JSON object, got array" in read_error(tmp_path / "list.json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{}")
    assert "cannot read it as JSON" in read_error(tmp_path / "binary.json")


def test_leftovers_of_interrupted_writes_are_removed_and_nothing_else(tmp_path, monkeypatch):
    def interrupted(directory):  # what a kill -9 leaves: the staging names of atomic_path and write_directory_atomic
        paths = {}
        for label, make in (("partial", os.mkdir), ("old", os.mkdir)):
            paths[label] = files._hidden_sibling(str(tmp_path / directory), label)
            make(paths[label])
        file_staging = files._hidden_sibling(str(tmp_path / "o.json"), "partial") + ".tmp"
        open(file_staging, "w").close()
        return [os.path.basename(p) for p in (*paths.values(), file_staging)]

    draft = interrupted("draft")
    kept = [".hidden", ".draft.partial-notahexname", "draft", ".o.json.partial-0123456789ab.tmp.bak"]
    for name in kept:
        (tmp_path / name).mkdir()
    assert files.remove_leftovers(tmp_path, of="o.json") == [draft[2]]
    assert files.remove_leftovers(tmp_path, min_age_s=3600) == []  # too young: perhaps a live writer's
    assert files.remove_leftovers(tmp_path) == sorted(draft[:2])
    assert sorted(os.listdir(tmp_path)) == sorted(kept)
    assert files.remove_leftovers(tmp_path / "missing") == []
