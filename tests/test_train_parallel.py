"""Training on a device mesh and across processes, and its interruptions, each in fresh processes:
8 simulated CPU devices and 2 jax.distributed processes give the single-device run's losses and
head; kill -9 and SIGTERM followed by --resume reach the uninterrupted run's result; a checkpoint
restores onto another mesh; an interrupted save never becomes the latest checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.train.checkpoint import Checkpointer, abstract_like
from test_train_support import ROOT, read_metrics, run_cli, write_conversations, write_tiny_model

STEPS = 60


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    model = write_tiny_model(str(root / "model"))
    data = write_conversations(str(root / "convs.json"), 200)
    # every subprocess compiles the same programs: share them through JAX's persistent cache
    env = {"JAX_COMPILATION_CACHE_DIR": str(root / "jax-cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    return root, model, data, env


def args(setup, out: str, *extra: str) -> list[str]:
    _, model, data, _ = setup
    return ["--model", model, "--data", data, "--out", out, "--seq-len", "64", "--batch-size", "8", "--grad-accum", "1", "--ttt-steps", "2",
            "--draft-vocab", "80", "--lr", "1e-2", "--warmup-steps", "2", "--max-steps", str(STEPS), "--save-every", "10",
            "--log-every", "1", "--dev-fraction", "0", "--no-progress", *extra]


def losses(out: str) -> np.ndarray:
    return np.array([r["loss"] for r in read_metrics(out) if r["split"] == "train"])


def head(out: str) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(load_draft(os.path.join(out, "draft"), dtype=None)[1])]


def assert_same_run(out: str, reference: str, rtol: float) -> None:
    np.testing.assert_allclose(losses(out), losses(reference), rtol=rtol)
    for x, y in zip(head(out), head(reference), strict=True):
        np.testing.assert_allclose(x, y, atol=rtol)


def check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def reference(setup):
    """The uninterrupted single-device run."""
    root, *_, env = setup
    out = str(root / "reference")
    check(run_cli(args(setup, out), env=env))
    assert len(losses(out)) == STEPS and losses(out)[-1] < 0.6 * losses(out)[0]
    return out


@pytest.fixture(scope="module")
def mesh_run(setup):
    """The same run on 8 simulated devices: a (data 2, fsdp 4) mesh."""
    root, *_, env = setup
    out = str(root / "mesh8")
    check(run_cli(args(setup, out, "--fsdp", "4"), env=env, devices=8))
    return out


def test_eight_devices_match_one(mesh_run, reference):
    np.testing.assert_allclose(losses(mesh_run)[:2], losses(reference)[:2], rtol=1e-6)  # the first update: same loss, same step
    assert_same_run(mesh_run, reference, rtol=1e-4)


def test_checkpoint_restores_onto_another_mesh(setup, mesh_run, reference):
    """Resume the 8-device run's step-40 checkpoint on one device: the rest of the run is the same."""
    root, *_, env = setup
    out = str(root / "remeshed")
    shutil.copytree(mesh_run, out)
    for step in ("50", "60"):
        shutil.rmtree(os.path.join(out, "checkpoints", step))
    result = run_cli(args(setup, out, "--resume"), env=env)
    check(result)
    assert "resumed from step 40" in result.stdout
    assert_same_run(out, reference, rtol=1e-4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(setup, reference):
    """Two jax.distributed processes on localhost (gloo CPU collectives), one device each, each
    feeding its own half of every batch, from offline features both wrote into one store."""
    root, *_, env = setup
    out = str(root / "two-processes")
    coordinator = f"127.0.0.1:{free_port()}"
    full_env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", **env)
    procs = [
        subprocess.Popen([sys.executable, "-m", "eagle_jax.train", *args(setup, out, "--offline-features", "--coordinator", coordinator,
                                                                         "--num-processes", "2", "--process-id", str(i))],
                         env=full_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    assert_same_run(out, reference, rtol=1e-4)


def start_and_interrupt(setup, out: str, sig: int, after_steps: int = 25) -> subprocess.Popen:
    """Start the reference run in `out` and send `sig` once it has logged `after_steps` steps."""
    *_, env = setup
    full_env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu", **env)
    proc = subprocess.Popen([sys.executable, "-m", "eagle_jax.train", *args(setup, out)], env=full_env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 240
    while not (os.path.exists(log) and len(open(log).readlines()) >= after_steps):
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be interrupted"
        time.sleep(0.005)
    proc.send_signal(sig)
    proc.communicate(timeout=120)
    return proc


def test_kill_9_then_resume_reaches_the_uninterrupted_result(setup, reference):
    root, *_, env = setup
    out = str(root / "killed")
    proc = start_and_interrupt(setup, out, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert len(losses(out)) < STEPS and not os.path.exists(os.path.join(out, "draft"))
    finished = sorted(int(n) for n in os.listdir(os.path.join(out, "checkpoints")) if n.isdigit())
    assert finished and finished[-1] % 10 == 0  # only completed saves carry a plain step name
    result = run_cli(args(setup, out, "--resume"), env=env)
    check(result)
    assert f"resumed from step {finished[-1]}" in result.stdout
    assert_same_run(out, reference, rtol=1e-6)


def test_sigterm_saves_then_resume_reaches_the_uninterrupted_result(setup, reference):
    root, *_, env = setup
    out = str(root / "preempted")
    proc = start_and_interrupt(setup, out, signal.SIGTERM)
    assert proc.returncode == 143
    stopped = len(losses(out))
    assert stopped < STEPS and os.path.isdir(os.path.join(out, "checkpoints", str(stopped)))  # saved where it stopped
    result = run_cli(args(setup, out, "--resume"), env=env)
    check(result)
    assert f"resumed from step {stopped}" in result.stdout
    assert_same_run(out, reference, rtol=1e-6)


def test_an_interrupted_save_is_never_the_latest(tmp_path):
    state = {"w": jnp.arange(6.0), "step": jnp.int32(0)}
    shardings = jax.tree.map(lambda x: x.sharding, state)
    ckpt = Checkpointer(str(tmp_path), keep=2)
    for step in (1, 2):
        ckpt.save(step, {"w": state["w"] * step, "step": jnp.int32(step)}, {"step": step})
    ckpt.wait()
    ckpt.close()
    # what a save killed halfway leaves behind: orbax's temporary directory, never renamed into place
    partial = tmp_path / "3.orbax-checkpoint-tmp-1700000000000000"
    (partial / "state").mkdir(parents=True)
    (partial / "state" / "junk").write_bytes(b"\0" * 10)
    ckpt = Checkpointer(str(tmp_path), keep=2)
    assert ckpt.latest_step() == 2
    restored, meta = ckpt.restore(2, abstract_like(state, shardings))
    np.testing.assert_array_equal(restored["w"], np.arange(6.0) * 2)
    assert meta == {"step": 2} and not partial.exists()  # and the leftover is cleaned up
