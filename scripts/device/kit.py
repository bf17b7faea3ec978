"""The device kit's entry point: the one script every call of docs/device.md runs. Standard library only
(it runs before anything is installed).

    python3 scripts/device/kit.py unpack .device-kit/part1            # early calls: copy a part into --kit-dir
    python3 scripts/device/kit.py run .device-kit/part3 --out "$OUT"   # last call: verify, install, phases a-f
    python scripts/device/kit.py smoke --work DIR                       # CPU: pack --smoke, then every call of the protocol

`run` copies its own part, checks every part against the manifest (naming the part of anything
missing: the machine was recycled between calls), joins the GGUF, installs the missing wheels and
this package offline into KIT/site, and runs the phases, each in its own process under its own cap,
inside one wall-clock budget: a env, b kernels, c generate, d-f distill (docs/device.md). Every
phase writes into OUT as it goes; this script adds OUT/results.json["kit"] (setup, per phase: cap,
seconds, exit status) and OUT/kit.log (everything printed, capped).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import manifest as manifest_lib
import protocol

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
LOG = "kit.log"
LOG_CAP = 4 * 2**20  # bytes of kit.log kept (the output tail holds the end)
EXIT_MARGIN_S = 10  # between the last phase's deadline and the budget's end
KILL_GRACE_S = 5  # a phase past its deadline by this much is killed
# Seconds per phase at most; distill's cap covers answering only (training gets what is left, less tau's).
CAPS = {
    "full": {"env": 15, "kernels": 40, "generate": 75, "distill": 120, "tau": 50},
    "smoke": {"env": 60, "kernels": 90, "generate": 150, "distill": 60, "tau": 90},
}


class Log:
    """Lines to stdout and (up to LOG_CAP bytes) to OUT/kit.log."""

    def __init__(self, out: str):
        self.file, self.size = open(os.path.join(out, LOG), "a", encoding="utf-8"), 0

    def __call__(self, text: str) -> None:
        line = text if text.endswith("\n") else text + "\n"
        sys.stdout.write(line)
        sys.stdout.flush()
        if self.size < LOG_CAP:
            self.file.write(line)
            self.file.flush()
            self.size += len(line.encode())


def unpack(part: str, kit_dir: str) -> list[str]:
    """Copy a part's files into kit_dir; returns their names."""
    if not os.path.isdir(part):
        raise SystemExit(f"kit: error: {part} is not a directory (was it named in carry?)")
    os.makedirs(kit_dir, exist_ok=True)
    names = sorted(os.listdir(part))
    for name in names:
        shutil.copyfile(os.path.join(part, name), os.path.join(kit_dir, name))
    return names


def record_kit(out: str, kit: dict) -> None:
    """results.json["kit"] = kit, keeping what the phases wrote."""
    path = os.path.join(out, "results.json")
    results = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    results["kit"] = kit
    manifest_lib.write_json_atomic(path, results)


def install(kit_dir: str, wheels: list[str], log: Log) -> tuple[str, str]:
    """(site directory, how this package got there): the wheels, then this repository, installed
    offline with pip into KIT/site; where pip cannot build it (no setuptools, or one too old for
    pyproject.toml), its sources are copied there as pyproject.toml's package-dir lays them out,
    which is all the package needs to import (nothing of it reads its own metadata)."""
    site = os.path.join(kit_dir, "site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir", "--upgrade", "--target", site]
    if wheels:
        subprocess.run([*pip, "--no-compile", *wheels], check=True)
    try:
        if importlib.util.find_spec("setuptools") is None:  # the build backend --no-build-isolation needs
            raise ImportError("setuptools")
        subprocess.run([*pip, "--no-build-isolation", REPO], check=True, cwd=kit_dir, capture_output=True, text=True)
    except (ImportError, subprocess.CalledProcessError) as error:
        why = "no setuptools" if isinstance(error, ImportError) else f"pip failed: {(error.stderr or '').strip()[-300:]}"
        copy_sources(site)
        log(f"copied eagle-jax's sources into {site} ({why})")
        return site, f"sources copied ({why})"
    log(f"installed the wheels and eagle-jax into {site}")
    return site, "pip install --no-deps --no-build-isolation"


def copy_sources(site: str) -> None:
    """This repository's packages into `site` at the import paths pyproject.toml's package-dir gives."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    for package, source in sorted(package_dir.items()):  # eagle_jax before eagle_jax.train and the others
        target = os.path.join(site, *package.split("."))
        shutil.copytree(os.path.join(REPO, source), target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def run_phase(name: str, argv: list[str], until: float, env: dict, log: Log) -> dict:
    """Run one phase's process until `until` (then kill it); its output goes to the log."""
    start = time.time()
    log(f"--- phase {name} (until +{until - start:.0f} s)")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    reader = threading.Thread(target=lambda: [log(line) for line in process.stdout], daemon=True)
    reader.start()
    killed = False
    try:
        process.wait(timeout=max(1.0, until + KILL_GRACE_S - time.time()))
    except subprocess.TimeoutExpired:  # past its cap: what it wrote into OUT stays
        process.kill()
        process.wait()
        killed = True
    reader.join(timeout=5)
    seconds = round(time.time() - start, 1)
    log(f"--- phase {name}: exit {process.returncode}{' (killed at its cap)' if killed else ''} after {seconds} s")
    return {"seconds": seconds, "exit": process.returncode, "killed": killed}


def run(part: str, kit_dir: str, out: str, budget_s: float, smoke: bool) -> int:
    start = time.time()
    end = start + budget_s - EXIT_MARGIN_S
    os.makedirs(out, exist_ok=True)
    log = Log(out)
    unpack(part, kit_dir)
    manifest = manifest_lib.read_manifest(os.path.join(kit_dir, "manifest.json"))
    problems = manifest_lib.verify(kit_dir, manifest)
    kit = {"part": os.path.basename(part.rstrip("/")), "budget_s": budget_s, "problems": problems}
    if problems:
        for problem in problems:
            log(f"kit: {problem}")
        record_kit(out, kit)
        return 1
    files = manifest_lib.assemble(kit_dir, manifest, os.path.join(kit_dir, "model"))
    site, kit["install"] = install(kit_dir, files["wheels"], log)
    kit["setup_s"] = round(time.time() - start, 1)
    path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", EAGLE_JAX_CACHE=os.path.join(kit_dir, "cache"))
    caps = CAPS["smoke" if smoke else "full"]
    python, phases_py = sys.executable, os.path.join(HERE, "phases.py")
    common = ["--kit", kit_dir, "--out", out] + (["--smoke"] if smoke else [])
    kit["phases"] = {}

    def phase(name: str, argv: list[str], cap: float) -> None:
        until = min(time.time() + cap, end)
        kit["phases"][name] = {"cap_s": cap, **run_phase(name, argv, until, env, log)}
        record_kit(out, kit)

    phase("env", [python, phases_py, "env", *common, "--until", str(time.time() + caps["env"])], caps["env"])
    kernels = [python, os.path.join(REPO, "scripts", "tools", "device_check_kernels.py"), "--out", os.path.join(out, "kernels.json"),
               "--budget-s", str(max(caps["kernels"] - 15, 5))] + (["--smoke"] if smoke else [])
    phase("kernels", kernels, caps["kernels"])
    phase("generate", [python, phases_py, "generate", *common, "--until", str(time.time() + caps["generate"])], caps["generate"])
    distill_until = time.time() + caps["distill"]
    phase("distill", [python, phases_py, "distill", *common, "--until", str(end - 5), "--distill-until", str(distill_until),
                      "--tau-s", str(caps["tau"])], end - time.time())
    kit["seconds"] = round(time.time() - start, 1)
    record_kit(out, kit)
    log(f"kit done in {kit['seconds']} s: {json.dumps(kit['phases'])}")
    return 0 if all(p["exit"] == 0 for p in kit["phases"].values()) else 1


def smoke(work: str) -> int:
    """The whole protocol on this CPU: a smoke kit, then each call's command as the device would run it."""
    kit_path = os.path.join(work, "device-kit")
    subprocess.run([sys.executable, os.path.join(HERE, "pack.py"), "--smoke", "--out", kit_path], check=True, cwd=REPO)
    manifest = manifest_lib.read_manifest(os.path.join(kit_path, "manifest.json"))
    out = os.path.join(work, "out")
    for call in protocol.calls(manifest, kit_path, kit_dir=os.path.join(work, "kit"), smoke=True):
        shutil.rmtree(out, ignore_errors=True)  # $OUT starts empty on every call
        os.makedirs(out)
        print(f"$ {call.command}", flush=True)
        done = subprocess.run(["bash", "-c", call.command], cwd=REPO, env=dict(os.environ, OUT=out), timeout=call.timeout_s, check=False)
        if done.returncode:
            return done.returncode
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("unpack", "run"):
        p = sub.add_parser(name)
        p.add_argument("part", help="the part this call carries, e.g. .device-kit/part1")
        p.add_argument("--kit-dir", default=protocol.KIT_DIR, help="where the parts gather on the warm machine")
    run_parser = sub.choices["run"]
    run_parser.add_argument("--out", required=True, help="$OUT: what comes back")
    run_parser.add_argument("--budget-s", type=float, default=protocol.BUDGET_S, help="wall-clock seconds for everything")
    run_parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU)")
    smoke_parser = sub.add_parser("smoke")
    smoke_parser.add_argument("--work", required=True, help="a scratch directory")
    args = parser.parse_args()
    if args.command == "unpack":
        names = unpack(args.part, args.kit_dir)
        print(f"unpacked {len(names)} files of {args.part} into {args.kit_dir}: {', '.join(names)}")
        return 0
    if args.command == "run":
        return run(args.part, args.kit_dir, args.out, args.budget_s, args.smoke)
    return smoke(args.work)


if __name__ == "__main__":
    raise SystemExit(main())
