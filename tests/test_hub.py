"""Models and heads named by Hub id, through the real huggingface_hub client against a local Hub
(tests/hub_server.py, HF_ENDPOINT pointed at it): what is downloaded, that a local path wins, that a
cached repo loads offline, and one error line for each way it can fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import huggingface_hub.constants
import jax
import numpy as np
import pytest
from hub_server import TOKEN, Repo, TinyHub, repo_from_directory
from test_train_support import write_tiny_head, write_tiny_model

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.errors import EagleError
from eagle_jax.loading.registry import resolve_model_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_BIN = os.path.join(ROOT, "tests", "fixtures", "torch_bin")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    model = write_tiny_model(str(root / "model"))
    return model, write_tiny_head(str(root / "head"), model)


@pytest.fixture
def hub(tiny, tmp_path, monkeypatch):
    """The local Hub, and huggingface_hub pointed at it with an empty cache (as HF_ENDPOINT and
    HF_HOME would set it in a fresh process)."""
    model, head = tiny
    served = repo_from_directory(model)
    # a repo as the Hub has them: a README, the weights twice over (.bin beside safetensors), originals
    served.files |= {"README.md": b"# tiny", "pytorch_model.bin": b"not fetched", "original/consolidated.00.pth": b"nor this"}
    server = TinyHub({
        "tiny/model": served, "tiny/head": repo_from_directory(head), "tiny/gated": repo_from_directory(model, gated=True),
        "tiny/eagle1-bin": repo_from_directory(os.path.join(TORCH_BIN, "eagle1_bin")),
        "tiny/gguf": Repo({"tiny-Q4_K_M.gguf": b"GGUF tiny", "README.md": b"# gguf"}),
    })
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no token file of this machine's user
    yield server
    server.stop()


def error(fn, *args) -> str:
    with pytest.raises(EagleError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_only_the_files_eagle_jax_reads_are_downloaded(hub, tiny):
    path = resolve_model_path("tiny/model")
    assert sorted(os.listdir(path)) == sorted(os.listdir(tiny[0]))  # config, tokenizer, safetensors: no README, .bin, originals
    assert path.startswith(huggingface_hub.constants.HF_HUB_CACHE)
    for name in os.listdir(path):
        assert open(os.path.join(path, name), "rb").read() == open(os.path.join(tiny[0], name), "rb").read()
    assert resolve_model_path(f"tiny/model@{hub.repos['tiny/model'].sha}") == path  # a commit names the same snapshot


def test_a_head_published_as_pytorch_model_bin_shards_downloads_and_loads(hub):
    from conftest import tiny_config

    target = tiny_config(vocab_size=96)
    from_hub = load_draft("tiny/eagle1-bin", target, dtype=None)
    local = load_draft(os.path.join(TORCH_BIN, "eagle1_bin"), target, dtype=None)
    assert from_hub[0] == local[0]
    for a, b in zip(jax.tree.leaves(from_hub[1]), jax.tree.leaves(local[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_gguf_repo_is_named_by_file(hub):
    path = resolve_model_path("tiny/gguf/tiny-Q4_K_M.gguf")
    assert path.endswith("tiny-Q4_K_M.gguf") and open(path, "rb").read() == b"GGUF tiny"
    assert "holds GGUF files: name one, e.g. tiny/gguf/tiny-Q4_K_M.gguf" in error(resolve_model_path, "tiny/gguf")
    assert "has no such file" in error(resolve_model_path, "tiny/gguf/other.gguf")


def test_a_local_path_wins_over_a_hub_id(hub, tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny[0], tmp_path / "tiny" / "model")
    shutil.copytree(tiny[1], tmp_path / "tiny" / "head")
    assert resolve_model_path("tiny/model") == "tiny/model"
    load_draft("tiny/head")
    assert hub.requests == 0


def test_each_failure_is_one_line(hub, monkeypatch):
    assert "tiny/nothing: no such local path, and no such repository on http://127.0.0.1" in error(resolve_model_path, "tiny/nothing")
    assert "no such repository" in error(load_draft, "tiny/nothing")
    assert "tiny/gated is a gated repository: accept its terms on the Hub, then set HF_TOKEN" in error(resolve_model_path, "tiny/gated")
    assert "tiny/model@v2: the repository has no such revision" in error(resolve_model_path, "tiny/model@v2")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert os.path.isfile(os.path.join(resolve_model_path("tiny/gated"), "config.json"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert "tiny/model: HF_HUB_OFFLINE is set and the Hugging Face cache" in error(resolve_model_path, "tiny/model")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hub.stop()
    message = error(resolve_model_path, "tiny/model")
    assert f"{hub.url} cannot be reached and the Hugging Face cache" in message and "download it once with the network on" in message


def generate(env: dict, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "eagle_jax.infer.cli", "generate", "--prompt", "hi", "--raw", "--max-new-tokens", "6", "--json", *args]
    return subprocess.run(command, env=dict(os.environ, JAX_PLATFORMS="cpu", **env), capture_output=True, text=True, timeout=300)


def test_the_cli_downloads_once_then_runs_offline_with_the_same_answer(tiny, tmp_path):
    """A fresh process reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE as users set them."""
    model, head = tiny
    server = TinyHub({"org/model": repo_from_directory(model), "org/head": repo_from_directory(head)})
    env = {"HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
    try:
        online = generate(env, "--model", "org/model", "--draft", "org/head@main")
    finally:
        server.stop()
    assert online.returncode == 0, online.stderr
    assert "Fetching" in online.stderr  # huggingface_hub's progress bar
    offline = generate(env | {"HF_HUB_OFFLINE": "1"}, "--model", "org/model", "--draft", "org/head@main")
    local = generate({}, "--model", model, "--draft", head)
    assert offline.returncode == 0 and local.returncode == 0, offline.stderr + local.stderr
    answers = [json.loads(run.stdout)["tokens"] for run in (online, offline, local)]
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 6
