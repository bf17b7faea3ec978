"""pytorch_model.bin without torch: files torch.save wrote (tests/fixtures/torch_bin, made by
scripts/tools/make_torch_fixtures.py with torch 2.14) read exactly, and pickles that name anything
but tensor rebuilders refused before any of it runs."""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import shutil
import zipfile

import jax
import ml_dtypes
import numpy as np
import pytest
from conftest import tiny_config

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.errors import EagleError
from eagle_jax.loading.torch_pickle import read_torch_file

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "torch_bin")


def test_every_dtype_and_view_reads_as_torch_wrote_it():
    tensors = read_torch_file(os.path.join(FIXTURES, "dtypes.bin"))
    base = np.arange(24, dtype=np.float32).reshape(4, 6) / 8 - 1
    expected = {
        "f32": base, "f32_t": base.T, "f32_slice": base[1:, 2:4], "f16": base.astype(np.float16),
        "bf16": base.astype(ml_dtypes.bfloat16), "i64": np.arange(-3, 5), "i32": np.arange(5, dtype=np.int32) * 1000,
        "i8": np.arange(-4, 4, dtype=np.int8), "u8": np.arange(250, 256, dtype=np.uint8), "bool": np.arange(6) % 2 == 0,
        "param": base[0], "empty": np.zeros((0, 3), np.float32),
    }
    assert list(tensors) == list(expected)  # the state dict's order
    for key, want in expected.items():
        got = tensors[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8), err_msg=key)


@pytest.mark.parametrize("name", ["eagle1", "eagle3"])
def test_a_head_in_pytorch_model_bin_loads_bit_exact_to_its_safetensors_twin(name):
    """eagle1: float16, sharded in two .bin files with an index; eagle3: bfloat16, one file."""
    target = tiny_config(vocab_size=96)
    from_bin = load_draft(os.path.join(FIXTURES, f"{name}_bin"), target, dtype=None)
    from_st = load_draft(os.path.join(FIXTURES, f"{name}_safetensors"), target, dtype=None)
    assert from_bin[0] == from_st[0]
    flat_bin, flat_st = jax.tree_util.tree_leaves_with_path(from_bin[1]), jax.tree_util.tree_leaves_with_path(from_st[1])
    assert [p for p, _ in flat_bin] == [p for p, _ in flat_st]
    for (path, a), (_, b) in zip(flat_bin, flat_st):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8)), path


class Exploit:
    """A pickle that would run a shell command when loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def torch_zip(path, payload: bytes, prefix: str = "archive", storages: dict | None = None) -> str:
    """A zip in torch's layout holding the pickle `payload`."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{prefix}/data.pkl", payload)
        z.writestr(f"{prefix}/version", "3\n")
        for key, data in (storages or {}).items():
            z.writestr(f"{prefix}/data/{key}", data)
    return str(path)


def refusal(path) -> str:
    with pytest.raises(EagleError) as info:
        read_torch_file(str(path))
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = torch_zip(tmp_path / "evil.bin", pickle.dumps({"w": Exploit(marker)}, protocol=2))
    message = refusal(path)
    assert "names posix.system" in message or "names os.system" in message
    assert not marker.exists()


@pytest.mark.parametrize("payload, says", [
    (pickle.dumps(collections.Counter(a=1), protocol=2), "collections.Counter"),
    (pickle.dumps(io.BytesIO, protocol=2), "_io.BytesIO"),
    (pickle.dumps({"w": [1, 2]}, protocol=2), "a state dict of named tensors"),
    (b"\x80\x02X\x01\x00\x00\x00a", "cannot read"),  # truncated: no STOP
])
def test_anything_but_a_state_dict_of_tensors_is_one_error(tmp_path, payload, says):
    assert says in refusal(torch_zip(tmp_path / "odd.bin", payload))


def test_damaged_archives_are_one_error(tmp_path):
    good = os.path.join(FIXTURES, "dtypes.bin")
    data = open(good, "rb").read()
    (tmp_path / "legacy.bin").write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2))  # torch < 1.6 starts so
    assert "not a torch zip archive" in refusal(tmp_path / "legacy.bin")
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 2])
    assert refusal(tmp_path / "cut.bin")
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(tmp_path / "short.bin", "w") as out:
        for item in z.infolist():
            content = z.read(item)
            out.writestr(item, content[:-2] if "/data/" in item.filename else content)
    assert "bytes, expected" in refusal(tmp_path / "short.bin")
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(tmp_path / "lost.bin", "w") as out:
        for item in z.infolist():
            if not item.filename.endswith("/data/0"):
                out.writestr(item, z.read(item))
    assert "storage 0 is missing" in refusal(tmp_path / "lost.bin")


def test_a_tensor_reaching_past_its_storage_is_refused(tmp_path):
    """Size and stride come from the file: a view past the storage's end would read other memory."""
    good = os.path.join(FIXTURES, "dtypes.bin")
    with zipfile.ZipFile(good) as z:
        prefix = z.namelist()[0].split("/")[0]
        pickled = z.read(f"{prefix}/data.pkl")
        storages = {n.split("/")[-1]: z.read(n) for n in z.namelist() if "/data/" in n}
    # f32 is (4, 6) with stride (6, 1): ask for stride (7, 1), whose last element lies past the 24
    patched = pickled.replace(b"K\x06K\x01\x86", b"K\x07K\x01\x86", 1)
    assert patched != pickled
    assert "reads element 26 of a storage of 24" in refusal(torch_zip(tmp_path / "far.bin", patched, prefix, storages))


def test_a_target_directory_of_bin_shards_loads_like_its_safetensors(tmp_path):
    """The target loader reads the same files (Vicuna ships only pytorch_model-*.bin)."""
    from eagle_jax.loading.hf import read_weights

    src = os.path.join(FIXTURES, "eagle1_bin")
    shutil.copytree(src, tmp_path / "model")
    index = json.loads((tmp_path / "model" / "pytorch_model.bin.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    tensors = read_weights(str(tmp_path / "model"))
    assert set(tensors) == set(index["weight_map"])
    os.remove(tmp_path / "model" / "pytorch_model-00002-of-00002.bin")
    with pytest.raises(EagleError, match="missing weight file .*00002-of-00002.bin \\(named in the index\\)"):
        read_weights(str(tmp_path / "model"))
