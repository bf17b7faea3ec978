"""Decoding on a device mesh (`eagle_jax.mesh`, `eagle_jax.model.sharding`): the mesh spec and its
errors, which parameter splits how, and, each in fresh processes with simulated CPU devices, the
sharded decode on 8 devices (tests/mesh/eight_devices.py), the real SmolLM2 on 3
(tests/mesh/smollm2_three_devices.py) and generate over two jax.distributed processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec as P

from conftest import tiny_config
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.draft.checkpoint import export_draft
from eagle_jax.errors import EagleError
from eagle_jax.mesh import make_mesh, parse_mesh, training_mesh
from eagle_jax.model.sharding import check_model_axis, draft_specs, fsdp_spec, target_specs
from eagle_jax.model.transformer import init_params
from test_train_support import ROOT, write_tiny_model


def test_a_mesh_spec_names_data_and_model_sizes():
    assert parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
    assert parse_mesh("model=3") == {"data": 1, "model": 3}
    assert parse_mesh(" model=2 , data=3") == {"data": 3, "model": 2}


@pytest.mark.parametrize("text", ["data=2,model", "data=0", "model=x", "pipe=2", "data=2,data=2", "", "data=-1", "data=2;model=2"])
def test_a_malformed_mesh_spec_is_one_error(text):
    with pytest.raises(EagleError, match=r"malformed mesh .*expected data=D,model=M"):
        parse_mesh(text)


def test_a_mesh_larger_than_the_devices_is_refused():
    with pytest.raises(EagleError, match=f"mesh data=2,model=4 needs 8 devices, but only {jax.device_count()} are available"):
        make_mesh({"data": 2, "model": 4})


def test_the_training_mesh_is_built_by_the_same_code():
    mesh = training_mesh(1)
    assert mesh.axis_names == ("data", "fsdp") and mesh.devices.size == jax.device_count()
    with pytest.raises(EagleError, match="--fsdp 3 does not divide"):
        training_mesh(3, jax.devices() * 2)


def test_a_model_axis_must_divide_the_heads():
    cfg = tiny_config(num_heads=9, num_kv_heads=3, head_dim=4)
    for model in (1, 3, 9):
        check_model_axis(cfg, model)
    with pytest.raises(EagleError, match="a model axis of 2 divides neither the 9 attention heads nor the 3 KV heads of the target; "
                                         "model sizes that would: 1, 3, 9"):
        check_model_axis(cfg, 2)


def test_target_specs_split_heads_kv_heads_mlp_and_vocabulary():
    cfg = tiny_config(num_heads=8, num_kv_heads=2, qkv_bias=True, qk_norm=True, vocab_size=96)
    params = init_params(jax.random.key(0), cfg)
    layer = target_specs(cfg, params, 2)["layers"][0]
    assert layer["wq"] == P("model", None) and layer["wo"] == P(None, "model") and layer["bq"] == P("model")
    assert layer["wk"] == layer["wv"] == P("model", None) and layer["bk"] == P("model")
    assert layer["w_gate"] == layer["w_up"] == P("model", None) and layer["w_down"] == P(None, "model")
    assert layer["attn_norm"] == layer["q_norm"] == P()
    at_four = target_specs(cfg, params, 4)
    assert at_four["layers"][0]["wq"] == P("model", None)
    assert at_four["layers"][0]["wk"] == at_four["layers"][0]["bv"] == P()  # 2 KV heads: replicated over 4
    assert at_four["embed"] == at_four["lm_head"] == P("model", None) and at_four["final_norm"] == P()
    odd_vocab = tiny_config(num_heads=8, num_kv_heads=2, vocab_size=97)  # 97 tokens: split by the hidden dimension
    assert target_specs(odd_vocab, init_params(jax.random.key(0), odd_vocab), 4)["embed"] == P(None, "model")
    assert all(s == P() for s in jax.tree.leaves(target_specs(cfg, params, 1), is_leaf=lambda x: isinstance(x, P)))


def test_draft_specs_split_the_layer_like_the_target():
    cfg = tiny_config(num_heads=8, num_kv_heads=4)
    dcfg = DraftConfig.for_target(cfg, kind="eagle3", fc_norm=True, draft_vocab_size=32)
    specs = draft_specs(dcfg, init_draft_params(jax.random.key(0), dcfg), 4)
    assert specs["layer"]["wq"] == specs["layer"]["wk"] == P("model", None) and specs["layer"]["wo"] == P(None, "model")
    assert specs["lm_head"] == P("model", None) and specs["fc"] == specs["d2t"] == specs["fc_norm"] == P()


def test_fsdp_splits_the_largest_divisible_axis():
    assert fsdp_spec((6, 8), 4) == P(None, "fsdp")
    assert fsdp_spec((8, 8), 4) == P(None, "fsdp")  # the last of equals
    assert fsdp_spec((6, 3), 4) == P()
    assert fsdp_spec((8,), 1) == P()


def run_pytest_on_devices(module: str, devices: int) -> None:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join("tests", "mesh", module)],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


def test_decoding_on_eight_simulated_devices():
    run_pytest_on_devices("eight_devices.py", 8)


def test_smollm2_on_three_simulated_devices():
    run_pytest_on_devices("smollm2_three_devices.py", 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model_and_head(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-processes")
    model = write_tiny_model(str(root / "model"))
    dcfg = DraftConfig.for_target(tiny_config(), kind="eagle3", fc_norm=True, norm_output=True)
    export_draft(str(root / "head"), dcfg, init_draft_params(jax.random.key(3), dcfg, scale=0.3))
    return model, str(root / "head")


def generate_args(model: str, head: str) -> list[str]:
    return [sys.executable, "-m", "eagle_jax.infer.cli", "generate", "--model", model, "--draft", head, "--prompt", "w1 w2 w3 w4",
            "--max-new-tokens", "24", "--tree-top-k", "2", "--tree-depth", "2", "--tree-nodes", "5", "--json"]


@pytest.mark.parametrize("mesh", ["data=2", "model=2"])
def test_two_processes_generate_the_tokens_of_one(tiny_model_and_head, mesh):
    """Two jax.distributed processes on localhost, one CPU device each: rows split over the two
    processes (data=2), or the heads (model=2, collectives between the processes)."""
    args = generate_args(*tiny_model_and_head)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    single = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([*args, "--mesh", mesh, "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    answers = [[line for line in out.splitlines() if line.startswith("{")] for out, _ in outputs]  # gloo logs lines of its own
    assert len(answers[0]) == 1 and answers[1] == []  # process 0 answers for both
    one, two = json.loads(single.stdout), json.loads(answers[0][0])
    assert two["mesh"] == parse_mesh(mesh) and two["mode"] == "speculative"
    assert two["tokens"] == one["tokens"] and len(one["tokens"]) > 4
