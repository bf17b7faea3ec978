"""The device protocol (docs/device.md): the calls, what each carries, its command and timeout, and
the dry run that checks every limit of the device tool before any device time is spent.

    python scripts/device/protocol.py [--kit .device-kit]     # prints the calls; exit 1 if a limit is broken

One call per part of the kit that `scripts/device/pack.py` wrote: the early ones copy their part into
KIT_DIR on the warm machine, the last one also runs everything (`kit.py run`). The calls must follow
each other at once: the machine is given back after 30 s idle, and with it what KIT_DIR holds.
Standard library only at import (kit.py imports it on the device); the dry run's output estimate
exports the shipped head with eagle_jax, as the training phase does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

import manifest as manifest_lib

KIT_DIR = "/tmp/eagle-kit"
BUDGET_S = 530  # kit.py run's wall clock: phases a-c about 2 minutes, d-f about 7
FINAL_TIMEOUT_S = 590
UNPACK_TIMEOUT_S = 120
SMOKE_BUDGET_S = 600
MiB = 2**20
# The device tool's limits (/work/.library/device/README.md) and our estimates of its overheads.
TRAVEL_BYTES = 64 * MiB
COMMAND_CHARS = 2000
CARRY_PATHS, CARRY_CHARS = 8, 200
TIMEOUT_S = 600
OUT_FILES, OUT_FILE_BYTES, OUT_BYTES, OUT_DEPTH = 8, 16 * MiB, 64 * MiB, 2
DEVICE_S = 900  # device time in all, the start included
START_S, TRANSFER_S, UNPACK_S = 150, 40, 15  # a cold start; sending one call's tree and part; copying a part
# Upper bounds of the files that come back besides the head (kit.py caps its log).
RESULT_FILES = {"results.json": 1 * MiB, "kernels.json": 1 * MiB, "kit.log": 4 * MiB + 64 * 1024}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Call:
    carry: tuple[str, ...]
    command: str
    timeout_s: int


def calls(manifest: dict, kit_path: str = ".device-kit", kit_dir: str = KIT_DIR, smoke: bool = False) -> list[Call]:
    """The calls in order: one per part, the last one running the kit."""
    parts = [part["name"] for part in manifest["parts"]]
    extra = "" if kit_dir == KIT_DIR else f" --kit-dir {kit_dir}"
    result = []
    for i, name in enumerate(parts):
        path = f"{kit_path}/{name}"
        if i < len(parts) - 1:
            result.append(Call((path,), f"python3 scripts/device/kit.py unpack {path}{extra}", UNPACK_TIMEOUT_S))
        else:
            tail = f" --smoke --budget-s {SMOKE_BUDGET_S}" if smoke else ""
            result.append(Call((path,), f'python3 scripts/device/kit.py run {path} --out "$OUT"{extra}{tail}', FINAL_TIMEOUT_S))
    return result


def git_bytes(repo: str, *args: str) -> int:
    """Bytes of the files `git ls-files ARGS` lists (missing ones count 0)."""
    names = subprocess.run(["git", "ls-files", "-z", *args], cwd=repo, capture_output=True, check=True).stdout.split(b"\0")
    paths = (os.path.join(repo, n.decode()) for n in names if n)
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def head_files() -> dict[str, int]:
    """OUT/head's files and sizes: the shipped head exported as the training phase exports it."""
    import jax.numpy as jnp
    from phases import HEAD_DIR, export_head

    from eagle_jax.draft.checkpoint import load_draft
    from eagle_jax.loading.registry import DEFAULT_MODEL, default_head_dir

    dcfg, params = load_draft(default_head_dir(DEFAULT_MODEL), dtype=jnp.float32)
    d2t = params.pop("d2t")
    with tempfile.TemporaryDirectory() as out:
        export_head(out, dcfg, params, d2t)
        directory = os.path.join(out, HEAD_DIR)
        return {f"{HEAD_DIR}/{name}": os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)}


def check_outputs(files: dict[str, int]) -> list[str]:
    """What would come back from OUT against the tool's limits on files, sizes and names."""
    problems = []
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files would come back from $OUT, at most {OUT_FILES} do")
    if sum(files.values()) > OUT_BYTES:
        problems.append(f"{sum(files.values())} bytes would come back from $OUT, at most {OUT_BYTES} do")
    for name, size in files.items():
        if size > OUT_FILE_BYTES:
            problems.append(f"$OUT/{name} would hold {size} bytes, at most {OUT_FILE_BYTES} come back")
        parts = name.split("/")
        if len(parts) > OUT_DEPTH + 1 or not all(re.fullmatch(r"[A-Za-z0-9._-]+", p) for p in parts):
            problems.append(f"$OUT/{name}: too deep or a name with other characters than letters, digits, '.', '_', '-'")
    return problems


def check(kit_path: str, repo: str = REPO) -> tuple[list[Call], list[str], dict]:
    """(calls, problems, sizes) of the kit in kit_path against every limit."""
    manifest = manifest_lib.read_manifest(os.path.join(kit_path, "manifest.json"))
    problems = manifest_lib.verify(kit_path, manifest, by_part=True)
    tree = git_bytes(repo) + git_bytes(repo, "--others", "--exclude-standard")
    the_calls = calls(manifest, os.path.relpath(kit_path, repo) if kit_path.startswith(repo) else kit_path)
    travel = {}
    for part, call in zip(manifest["parts"], the_calls):
        travel[part["name"]] = tree + sum(f["bytes"] for f in part["files"])
        if travel[part["name"]] > TRAVEL_BYTES:
            problems.append(f"call with {part['name']} would send {travel[part['name']]} bytes, at most {TRAVEL_BYTES} travel")
        if len(call.command) > COMMAND_CHARS:
            problems.append(f"command of {part['name']} has {len(call.command)} characters, at most {COMMAND_CHARS}")
        if len(call.carry) > CARRY_PATHS or any(len(c) > CARRY_CHARS for c in call.carry) or call.timeout_s > TIMEOUT_S:
            problems.append(f"call with {part['name']}: carry or timeout past the tool's limits")
    outputs = dict(RESULT_FILES, **head_files())
    problems += check_outputs(outputs)
    estimate = START_S + (len(the_calls) - 1) * (TRANSFER_S + UNPACK_S) + TRANSFER_S + the_calls[-1].timeout_s
    if estimate > DEVICE_S:
        problems.append(f"the protocol would hold the machine about {estimate} s, {DEVICE_S} s are lent")
    sizes = {"tree_bytes": tree, "travel_bytes": travel, "outputs": outputs, "device_s_estimate": estimate}
    return the_calls, problems, sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", default=os.path.join(REPO, ".device-kit"), help="the folder pack.py wrote")
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.kit, "manifest.json")):
        raise SystemExit(f"protocol: error: {args.kit} holds no kit (no manifest.json); run scripts/device/pack.py first")
    the_calls, problems, sizes = check(os.path.abspath(args.kit))
    for i, call in enumerate(the_calls, 1):
        print(json.dumps({"call": i, "carry": list(call.carry), "timeout_s": call.timeout_s, "command": call.command}))
    print(json.dumps(sizes))
    for problem in problems:
        print(f"protocol: error: {problem}", file=sys.stderr)
    print("dry run: every limit holds" if not problems else f"dry run: {len(problems)} limit(s) broken")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
