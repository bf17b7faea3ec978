"""The device kit (docs/device.md) on CPU: the whole protocol with a smoke kit, every phase run with
tiny sizes on the real model, and the dry run's limit checks."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DEVICE = REPO / "scripts" / "device"
sys.path.insert(0, str(DEVICE))

import protocol  # noqa: E402 (a script directory, on its own path)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from eagle_jax.loading import resolve_model_path

    resolve_model_path("smollm2-135m-instruct")  # the real GGUF is a test dependency: a clear error if absent
    work = tmp_path_factory.mktemp("kit")
    done = subprocess.run([sys.executable, str(DEVICE / "kit.py"), "smoke", "--work", str(work)],
                          capture_output=True, text=True, timeout=600, check=False, cwd=REPO)
    return work, done


def test_smoke_protocol_runs_every_phase_and_returns_what_fits(smoke_run):
    work, done = smoke_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = work / "out"
    results = json.loads((out / "results.json").read_text())
    kit = results["kit"]
    assert kit["problems"] == [] and set(kit["phases"]) == {"env", "kernels", "generate", "distill"}
    assert all(p["exit"] == 0 and not p["killed"] for p in kit["phases"].values()), kit["phases"]
    rows = results["generate"]["rows"]
    assert rows and all(r["rows_equal_to_plain"] == r["rows"] for r in rows)  # float32: lossless, token for token
    assert results["generate"]["layers"] == "scan"  # the GPU's layer form, round split included
    assert kit["install"] in ("pip install --no-deps --no-build-isolation", "sources copied (no setuptools)"), kit["install"]
    assert set(results["round_split"]["ms"]) == {"draft_tree", "verify_with_logits", "accept_greedy", "commit_and_draft_context"}
    assert results["distill"]["prompts_answered"] > 0 and results["distill"]["new_tokens"] > 0
    assert results["train"]["steps"] > 0 and all(np.isfinite(r["loss"]) for r in results["train"]["log"])
    assert {r["head"] for r in results["tau"]["rows"]} == {"shipped", "trained"}
    assert json.loads((out / "kernels.json").read_text())["rows"]
    files = {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}
    assert protocol.check_outputs(files) == [], files
    from eagle_jax.draft.checkpoint import load_draft
    from eagle_jax.loading import load_target

    target = load_target("smollm2-135m-instruct", with_tokenizer=False)
    dcfg, params = load_draft(str(out / "head"), target.cfg)  # loadable by --draft
    assert dcfg.fc_norm and dcfg.norm_output and params["lm_head"].shape[0] == dcfg.draft_vocab_size


def test_dry_run_passes_on_the_smoke_kit_and_each_call_fits(smoke_run):
    work, _ = smoke_run
    calls, problems, sizes = protocol.check(str(work / "device-kit"))
    assert problems == [], problems
    assert len(calls) >= 2 and all(len(c.command) <= protocol.COMMAND_CHARS for c in calls)
    assert calls[-1].command.startswith("python3 scripts/device/kit.py run") and all("unpack" in c.command for c in calls[:-1])
    assert all(b <= protocol.TRAVEL_BYTES for b in sizes["travel_bytes"].values())


def test_run_names_the_missing_part_when_the_machine_was_recycled(smoke_run, tmp_path):
    work, _ = smoke_run
    kit = work / "device-kit"
    parts = sorted(p.name for p in kit.iterdir() if p.is_dir())
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(DEVICE / "kit.py"), "run", str(kit / parts[-1]), "--out", str(out), "--kit-dir", str(tmp_path / "fresh")],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert done.returncode == 1
    problems = json.loads((out / "results.json").read_text())["kit"]["problems"]
    for number in range(1, len(parts)):  # every earlier part is named, with the call that should have brought it
        assert any(f"(part {number}) is missing" in p and f"call {number} did not run" in p for p in problems), problems
    assert not any(f"(part {len(parts)})" in p for p in problems), problems


def test_output_check_refuses_what_would_not_come_back():
    ok = {"results.json": 10, "head/config.json": 10}
    assert protocol.check_outputs(ok) == []
    assert any("files would come back" in p for p in protocol.check_outputs({f"f{i}": 1 for i in range(9)}))
    assert any("at most" in p for p in protocol.check_outputs({"big.bin": 17 * 2**20}))
    assert any("too deep" in p for p in protocol.check_outputs({"a/b/c/d.json": 1}))
    assert any("too deep" in p for p in protocol.check_outputs({"bad name.json": 1}))


def test_calls_carry_one_part_each_and_only_the_last_runs():
    manifest = {"parts": [{"name": f"part{i}", "files": []} for i in (1, 2, 3)]}
    calls = protocol.calls(manifest)
    assert [c.carry for c in calls] == [(".device-kit/part1",), (".device-kit/part2",), (".device-kit/part3",)]
    assert [c.timeout_s for c in calls] == [protocol.UNPACK_TIMEOUT_S] * 2 + [protocol.FINAL_TIMEOUT_S]
    assert calls[-1].command == 'python3 scripts/device/kit.py run .device-kit/part3 --out "$OUT"'
    assert os.path.basename(protocol.KIT_DIR) == "eagle-kit"
