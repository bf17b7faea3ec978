"""Loading targets: the converted-GGUF cache and the weight layout checks."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from eagle_jax.errors import EagleError
from eagle_jax.loading import load_target
from eagle_jax.loading.gguf_file import unpermute_rows


@pytest.mark.slow
def test_converted_gguf_cache_round_trip(tmp_path, monkeypatch, smollm2_target):
    monkeypatch.setenv("EAGLE_JAX_CACHE", str(tmp_path))
    first = load_target("smollm2-135m-instruct")  # converts and stores
    entries = os.listdir(tmp_path / "converted")
    assert len(entries) == 1 and not entries[0].startswith(".")  # no staging directory left beside the entry
    second = load_target("smollm2-135m-instruct")  # reads the entry back
    assert second.cfg == first.cfg == smollm2_target.cfg
    jax.tree.map(np.testing.assert_array_equal, second.params, smollm2_target.params)
    text = "<|im_start|>user\nHow are you 2day?<|im_end|>"
    assert second.tokenizer.encode(text) == smollm2_target.tokenizer.encode(text)
    assert second.tokenizer.chat_template == smollm2_target.tokenizer.chat_template


def flip_last_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [
    lambda entry: (entry / "params.safetensors").write_bytes((entry / "params.safetensors").read_bytes()[:1000]),  # truncated
    lambda entry: flip_last_byte(entry / "tokenizer" / "tokenizer.json"),  # same size, other bytes
    lambda entry: (entry / "checksums.json").unlink(),  # an entry without checksums
])
def test_a_damaged_converted_cache_is_removed_and_rebuilt_with_a_warning(tmp_path, monkeypatch, capsys, smollm2_target, damage):
    import pathlib

    monkeypatch.setenv("EAGLE_JAX_CACHE", str(tmp_path))
    load_target("smollm2-135m-instruct")
    (entry,) = (pathlib.Path(tmp_path) / "converted").iterdir()
    damage(entry)
    capsys.readouterr()
    healed = load_target("smollm2-135m-instruct")
    err = capsys.readouterr().err
    assert err.count(f"eagle-jax: warning: the converted-model cache {entry} is damaged (") == 1, err
    assert "removing it and converting" in err
    jax.tree.map(np.testing.assert_array_equal, healed.params, smollm2_target.params)
    assert [e.name for e in entry.parent.iterdir()] == [entry.name]  # rebuilt in place
    load_target("smollm2-135m-instruct")
    assert capsys.readouterr().err == ""  # and read back without a word


def test_unpermute_inverts_llama_cpp_rotary_permutation():
    heads, head_dim, d_in = 3, 8, 5
    w = np.arange(heads * head_dim * d_in, dtype=np.float32).reshape(heads * head_dim, d_in)
    # llama.cpp's conversion: per head, interleave the two rotary halves
    permuted = w.reshape(heads, 2, head_dim // 2, d_in).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_rows(permuted, heads), w)


def test_wrong_weight_shape_is_named(tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    src = os.path.join(os.path.dirname(__file__), "fixtures", "llama")
    shutil.copy(os.path.join(src, "config.json"), tmp_path / "config.json")
    tensors = load_file(os.path.join(src, "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:, :-1].copy()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(EagleError, match=r"layers.1.w_up has shape \(64, 31\), expected \(64, 32\)"):
        load_target(str(tmp_path), with_tokenizer=False)


def test_scanned_layers_load_straight_into_their_stacked_arrays():
    """load_target(layers="scan") gives the stacked form's arrays (those of stack_layers over the
    per-layer load), and an Engine that decodes in that form uses them as they are: the layers are
    held once. An Engine in the other form converts them, and both decode the same tokens."""
    from conftest import FIXTURES
    from eagle_jax.infer.engine import Engine
    from eagle_jax.model.transformer import stack_layers

    directory = os.path.join(FIXTURES, "qwen3")  # q_norm and k_norm stacked too
    unrolled = load_target(directory, with_tokenizer=False)
    scanned = load_target(directory, with_tokenizer=False, layers="scan")
    expected = stack_layers(unrolled.params)
    assert jax.tree.structure(scanned.params) == jax.tree.structure(expected)
    assert scanned.params["layers"]["q_norm"].shape == (scanned.cfg.num_layers, scanned.cfg.head_dim)
    for a, b in zip(jax.tree.leaves(scanned.params), jax.tree.leaves(expected)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    engine = Engine(scanned, max_new_tokens=8, layers="scan")
    assert engine.laid_out.params is scanned.params
    rows = [[1, 2, 3], [4, 5]]
    tokens = Engine(unrolled, max_new_tokens=8).run(rows, tree=None).tokens
    assert engine.run(rows, tree=None).tokens == tokens == Engine(scanned, max_new_tokens=8).run(rows, tree=None).tokens
    with pytest.raises(EagleError, match="unknown layer form 'stacked'"):
        load_target(directory, with_tokenizer=False, layers="stacked")
