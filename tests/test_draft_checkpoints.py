"""Draft-head checkpoint I/O: one-line errors for bad heads, export -> import round trips, atomic export.

Checkpoints are built with the public key names by the helpers of test_draft_heads (numpy +
safetensors, no torch).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from safetensors import safe_open
from test_draft_heads import CASES, checkpoint, make_raw, write_checkpoint

from eagle_jax.draft import checkpoint as ckpt
from eagle_jax.draft.checkpoint import export_draft, load_draft
from eagle_jax.draft.config import DraftConfig
from eagle_jax.draft.model import init_draft_params
from eagle_jax.model.config import RopeConfig
from eagle_jax.errors import EagleError

TARGET = tiny_config()


def head(tmp_path, name: str, edit_config=None, edit_tensors=None) -> str:
    """Write CASES[name] as a checkpoint, after optional edits of its config and tensors."""
    case = CASES[name]
    config, tensors = checkpoint(case, make_raw(case, TARGET), TARGET)
    if edit_config:
        edit_config(config)
    if edit_tensors:
        edit_tensors(tensors)
    return write_checkpoint(tmp_path / name, config, tensors)


def load_error(path, target=TARGET, **kwargs) -> str:
    with pytest.raises(EagleError) as info:
        load_draft(path, target, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------- bad heads


def test_hidden_size_mismatch(tmp_path):
    message = load_error(head(tmp_path, "eagle1"), tiny_config(hidden_size=48, head_dim=12))
    assert "hidden size 32" in message and "48" in message


def test_eagle3_target_hidden_size_mismatch(tmp_path):
    message = load_error(head(tmp_path, "eagle3"), tiny_config(hidden_size=48, head_dim=12))
    assert "hidden size" in message and "48" in message


def test_vocab_mismatch(tmp_path):
    message = load_error(head(tmp_path, "eagle3"), tiny_config(vocab_size=128))
    assert "vocab" in message and "96" in message and "128" in message


def test_wrong_number_of_fused_layers_in_config(tmp_path):
    path = head(tmp_path, "eagle3", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3, 4]))
    assert "fuse exactly 3" in load_error(path)


def test_wrong_number_of_fused_layers_in_fc(tmp_path):
    def four_layers(tensors):
        tensors["fc.weight"] = np.zeros((32, 4 * 32), np.float32)

    message = load_error(head(tmp_path, "eagle3", edit_tensors=four_layers))
    assert "takes 4 fused" in message and "exactly 3" in message


def test_fused_layer_outside_target(tmp_path):
    # HF index 6 = the output of the last of 6 layers: vLLM can capture it, our target cannot
    path = head(tmp_path, "eagle3", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 6]))
    assert "6 layers" in load_error(path)


def test_fused_layers_need_a_target_when_unnamed(tmp_path):
    assert "pass target_cfg" in load_error(head(tmp_path, "eagle3"), target=None)


def test_fused_layer_conventions_disagree(tmp_path):
    def both(config):
        config["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}  # outputs: HF (2, 4, 5)

    assert "different target layers" in load_error(head(tmp_path, "eagle3", both))


def test_unknown_flag(tmp_path):
    message = load_error(head(tmp_path, "eagle3", lambda c: c.update(frobnicate_hidden=True)))
    assert "unknown config key(s) frobnicate_hidden" in message


def test_unknown_flag_in_speculators_layer_config(tmp_path):
    path = head(tmp_path, "norm_before_fc", lambda c: c["transformer_layer_config"].update(attn_logit_softcapping=30.0))
    assert "attn_logit_softcapping" in load_error(path)


@pytest.mark.parametrize("key, value, name, expected", [
    ("attention_bias", True, "eagle3", "attention_bias=true is not supported"),
    ("num_hidden_layers", 2, "eagle3", "2 decoder layers"),
    ("hidden_act", "gelu", "eagle1", 'hidden_act="gelu" is not supported'),
    ("tie_word_embeddings", True, "eagle3", "tie_word_embeddings=true"),
    ("use_sliding_window", True, "eagle1", "use_sliding_window=true"),
    ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "eagle1", 'rope_scaling: rope type "dynamic" is not supported'),
    ("bias", True, "eagle3", "bias=true"),
])
def test_refused_flag_values(tmp_path, key, value, name, expected):
    assert expected in load_error(head(tmp_path, name, lambda c: c.update({key: value})))


def test_refused_eagle_config_value(tmp_path):
    path = head(tmp_path, "eagle3_norm_output", lambda c: c["eagle_config"].update(use_last_layernorm=False))
    assert "use_last_layernorm" in load_error(path)


def test_speculators_eagle3_must_state_norm_before_residual(tmp_path):
    path = head(tmp_path, "norm_before_residual", lambda c: c.pop("norm_before_residual"))
    assert "norm_before_residual" in load_error(path)


def test_speculators_eagle_extra_layernorms_refused(tmp_path):
    assert "layernorms" in load_error(head(tmp_path, "eagle1_speculators", lambda c: c.update(layernorms=True)))


def test_eagle1_input_layernorm_is_unexpected(tmp_path):
    path = head(tmp_path, "eagle1", edit_tensors=lambda t: t.update({"layers.0.input_layernorm.weight": np.ones(32, np.float32)}))
    assert "unexpected weight(s) layers.0.input_layernorm.weight" in load_error(path)


def test_missing_weight(tmp_path):
    path = head(tmp_path, "eagle3_fc_norm", edit_tensors=lambda t: t.pop("model.fc_norm.2.weight"))
    assert "missing weight(s) fc_norm.2.weight" in load_error(path)


def test_missing_fc_bias_when_config_says_bias(tmp_path):
    assert "fc.bias" in load_error(head(tmp_path, "eagle1", edit_tensors=lambda t: t.pop("fc.bias")))


def test_wrong_weight_shape(tmp_path):
    path = head(tmp_path, "eagle3", edit_tensors=lambda t: t.update({"lm_head.weight": np.zeros((41, 32), np.float32)}))
    assert "lm_head.weight has shape (41, 32), expected (40, 32)" in load_error(path)


def test_d2t_length_mismatch(tmp_path):
    path = head(tmp_path, "eagle3", edit_tensors=lambda t: t.update(d2t=np.zeros(39, np.int64)))
    assert "d2t has shape (39,), expected (40,)" in load_error(path)


def test_t2d_inconsistent_with_d2t(tmp_path):
    def flip(tensors):
        tensors["t2d"] = ~tensors["t2d"]

    assert "t2d does not mark" in load_error(head(tmp_path, "eagle3", edit_tensors=flip))


def test_d2t_outside_target_vocab(tmp_path):
    def shift(tensors):
        tensors["d2t"] = tensors["d2t"] + 200
        tensors.pop("t2d")

    assert "outside the target vocabulary" in load_error(head(tmp_path, "eagle3", edit_tensors=shift))


def test_corrupted_safetensors(tmp_path):
    path = head(tmp_path, "eagle1")
    with open(os.path.join(path, "model.safetensors"), "r+b") as f:
        f.write(b"\xff" * 16)
    assert "cannot read" in load_error(path)


def test_missing_config(tmp_path):
    path = head(tmp_path, "eagle1")
    os.remove(os.path.join(path, "config.json"))
    assert "config.json" in load_error(path)


def test_missing_directory(tmp_path):
    assert "not a directory" in load_error(str(tmp_path / "nowhere"))


def test_no_weights(tmp_path):
    path = head(tmp_path, "eagle1")
    os.remove(os.path.join(path, "model.safetensors"))
    assert "no weights found" in load_error(path)


def test_unsupported_architecture(tmp_path):
    path = head(tmp_path, "eagle1", lambda c: c.update(architectures=["MixtralForCausalLM"]))
    assert "MixtralForCausalLM" in load_error(path)


# ----------------------------------------------------------------------------- import details


def test_fused_layer_conventions(tmp_path):
    """Top-level ids are HF hidden-state indices (vLLM); eagle_config ids are layer outputs (SGLang, +1)."""
    top = load_draft(head(tmp_path, "eagle3_fc_norm"), TARGET)[0]
    assert top.feature_layers == (1, 3, 4)
    nested = load_draft(head(tmp_path, "eagle3_norm_output"), TARGET)[0]
    assert nested.feature_layers == (1, 3, 4)  # eagle_config [0, 2, 3] + 1
    default = load_draft(head(tmp_path, "eagle3"), TARGET)[0]
    assert default.feature_layers == TARGET.eagle3_feature_layers


def test_speculators_layer_config_defaults(tmp_path):
    """speculators writes transformer_layer_config as a diff: omitted keys are LlamaConfig defaults."""
    def diff_dict(config):
        tl = config["transformer_layer_config"]
        tl.pop("rope_theta")  # default 10000
        tl.pop("num_key_value_heads")  # default: num_attention_heads
        tl.pop("head_dim")  # default: hidden_size // num_attention_heads
        tl["num_attention_heads"] = 2
        tl.pop("rms_norm_eps")  # default 1e-6

    path = head(tmp_path, "norm_before_fc", diff_dict, lambda t: t.update({
        "layers.0.self_attn.q_proj.weight": np.zeros((32, 64), np.float32), "layers.0.self_attn.k_proj.weight": np.zeros((32, 64), np.float32),
        "layers.0.self_attn.v_proj.weight": np.zeros((32, 64), np.float32), "layers.0.self_attn.o_proj.weight": np.zeros((32, 32), np.float32)}))
    dcfg, _ = load_draft(path, TARGET)
    assert (dcfg.num_heads, dcfg.num_kv_heads, dcfg.head_dim, dcfg.rms_norm_eps, dcfg.rope.theta) == (2, 2, 16, 1e-6, 10000.0)


def test_dtype_option(tmp_path):
    path = head(tmp_path, "eagle3")
    _, params = load_draft(path, TARGET, dtype=jnp.bfloat16)
    assert params["fc"].dtype == jnp.bfloat16 and params["d2t"].dtype == jnp.int32
    _, params = load_draft(path, TARGET, dtype=None)
    assert params["fc"].dtype == jnp.float32


# ----------------------------------------------------------------------------- export


def reduced_vocab_params(dcfg: DraftConfig, dtype, seed: int) -> dict:
    """init_draft_params with random (non-unit) norms and, for a reduced vocabulary, a real d2t."""
    params = init_draft_params(jax.random.key(seed), dcfg, dtype, scale=0.5)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda x: (x + jnp.asarray(0.1 * rng.standard_normal(x.shape), x.dtype)) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    if dcfg.kind == "eagle3" and dcfg.maps_vocab:
        used = np.sort(rng.choice(dcfg.target_vocab_size, dcfg.draft_vocab_size, replace=False))
        params["d2t"] = jnp.asarray(used - np.arange(dcfg.draft_vocab_size), jnp.int32)
    return params


EXPORT_CONFIGS = {
    "eagle1": dict(kind="eagle1", fc_bias=True, rope=RopeConfig(theta=500000.0)),
    "eagle3_3.1": dict(kind="eagle3", draft_vocab_size=40, fc_norm=True, norm_output=True, feature_layers=(1, 3, 4)),
    "eagle3_speculators_flags": dict(kind="eagle3", draft_vocab_size=40, norm_before_fc=True, norm_before_residual=True,
                                     rope=RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, original_max_position=64)),
    "eagle3_narrow": dict(kind="eagle3", hidden_size=24, intermediate_size=48, num_heads=3, num_kv_heads=1, draft_vocab_size=96),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(EXPORT_CONFIGS))
def test_export_import_round_trip_is_bit_exact(tmp_path, name, dtype):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS[name])
    params = reduced_vocab_params(dcfg, dtype, seed=len(name))
    export_draft(str(tmp_path / "head"), dcfg, params)
    for load_dtype in (dtype, None):
        loaded_cfg, loaded = load_draft(str(tmp_path / "head"), TARGET, dtype=load_dtype)
        assert loaded_cfg == dcfg
        assert jax.tree.structure(loaded) == jax.tree.structure(params)
        for (path, want), got in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(loaded)):
            assert got.dtype == want.dtype, path
            np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8), err_msg=str(path))


def test_sharded_export_keeps_every_shard_under_its_limit_and_loads_bit_exact(tmp_path):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle3_3.1"])
    params = reduced_vocab_params(dcfg, jnp.float32, seed=5)
    limit = 16 * 1024  # several shards for this tiny head
    export_draft(str(tmp_path / "head"), dcfg, params, max_shard_bytes=limit)
    files = sorted(os.listdir(tmp_path / "head"))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 2 and "model.safetensors.index.json" in files and "model.safetensors" not in files
    index = json.loads((tmp_path / "head" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    for shard in shards:
        with safe_open(str(tmp_path / "head" / shard), framework="numpy") as f:
            assert sum(f.get_tensor(k).nbytes for k in f.keys()) <= limit
    loaded_cfg, loaded = load_draft(str(tmp_path / "head"), TARGET, dtype=None)
    assert loaded_cfg == dcfg
    for (path, want), got in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(path))
    with pytest.raises(EagleError, match="more than a shard"):
        export_draft(str(tmp_path / "small"), dcfg, params, max_shard_bytes=64)
    assert not os.path.exists(tmp_path / "small")


def test_cast_head_script_stores_a_head_in_half_precision(tmp_path):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle3_3.1"])
    params = reduced_vocab_params(dcfg, jnp.float32, seed=4)
    export_draft(str(tmp_path / "head"), dcfg, params)
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "tools" / "cast_head.py"

    def cast(head, out):
        return subprocess.run([sys.executable, str(script), str(head), "--dtype", "float16", "--out", str(out)],
                              capture_output=True, text=True, timeout=120, check=False)

    assert cast(tmp_path / "head", tmp_path / "half").returncode == 0
    loaded_cfg, loaded = load_draft(str(tmp_path / "half"), TARGET, dtype=None)
    assert loaded_cfg == dcfg
    for (path, want), got in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(loaded)):
        if path[-1].key == "d2t":
            np.testing.assert_array_equal(got, want)
        else:
            assert got.dtype == jnp.float16, path
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(np.float16), err_msg=str(path))
    assert json.loads((tmp_path / "half" / "config.json").read_text())["torch_dtype"] == "float16"
    again = cast(tmp_path / "head", tmp_path / "half")  # never replaces a directory
    assert again.returncode != 0 and "exists" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    missing = cast(tmp_path / "nowhere", tmp_path / "other")
    assert missing.returncode != 0 and "cast_head: error:" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "other")


def test_export_layout_is_what_engines_read(tmp_path):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle3_3.1"])
    params = reduced_vocab_params(dcfg, jnp.bfloat16, seed=3)
    export_draft(str(tmp_path / "head"), dcfg, params)
    assert sorted(os.listdir(tmp_path)) == ["head"]
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["draft_vocab_size"], config["vocab_size"], config["target_hidden_size"]) == (40, 96, 32)
    assert (config["fc_norm"], config["norm_output"], config["norm_before_fc"], config["norm_before_residual"]) == (True, True, False, False)
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]
    assert config["torch_dtype"] == "bfloat16" and config["num_hidden_layers"] == 1
    with safe_open(str(tmp_path / "head" / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert set(tensors) == {
        "fc.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
        *(f"midlayer.{n}" for n in ("hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
                                    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")),
    }
    assert tensors["fc.weight"].shape == (32, 96) and tensors["lm_head.weight"].shape == (40, 32)
    assert tensors["d2t"].dtype == np.int64 and tensors["t2d"].dtype == bool
    target_ids = np.arange(40) + tensors["d2t"]
    assert tensors["t2d"].sum() == 40 and tensors["t2d"][target_ids].all()


def test_export_eagle1_layout(tmp_path):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle1"])
    export_draft(str(tmp_path / "head"), dcfg, reduced_vocab_params(dcfg, jnp.float32, seed=1))
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["bias"] is True and config["rope_theta"] == 500000.0
    with safe_open(str(tmp_path / "head" / "model.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("input_layernorm" in k or "midlayer" in k for k in keys)


def test_export_replaces_an_existing_directory(tmp_path):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle1"])
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "stale.txt").write_text("old")
    export_draft(str(tmp_path / "head"), dcfg, reduced_vocab_params(dcfg, jnp.float32, seed=1))
    assert sorted(os.listdir(tmp_path / "head")) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["head"]


def test_failed_export_leaves_the_old_directory_and_no_debris(tmp_path, monkeypatch):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle1"])
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "stale.txt").write_text("old")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(ckpt, "save_file", disk_full)
    with pytest.raises(OSError):
        export_draft(str(tmp_path / "head"), dcfg, reduced_vocab_params(dcfg, jnp.float32, seed=1))
    assert sorted(os.listdir(tmp_path)) == ["head"]
    assert (tmp_path / "head" / "stale.txt").read_text() == "old"


def test_export_refuses_params_that_do_not_fit_the_config(tmp_path):
    dcfg = DraftConfig.for_target(TARGET, **EXPORT_CONFIGS["eagle3_3.1"])
    params = reduced_vocab_params(dcfg, jnp.float32, seed=2)
    del params["fc_norm"]
    with pytest.raises(EagleError, match="fc_norm"):
        export_draft(str(tmp_path / "head"), dcfg, params)
    assert not os.path.exists(tmp_path / "head")
