"""Benchmark prompts: the JSON-lines file format, selection, multi-turn assembly and robustness variants.

A prompt file has one JSON object per line:
`{"question_id": int | str, "category": str, "turns": [str, ...], "system"?: str}`.
Turn i is asked after the model's own answers to turns 0..i-1.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
from typing import Any

from eagle_jax.errors import EagleError

# Robustness views of the same prompts: as given; with another system prompt; raw text without the
# chat template; behind a long unrelated context.
VARIANTS = ("as_given", "system", "raw", "long_context")
VARIANT_SYSTEM_PROMPT = "You are a meticulous expert. Think carefully, then answer precisely in well-structured prose."

# Unrelated text repeated, sentence by sentence, to build the long-context variant.
FILLER = (
    "The lighthouse stood on a spur of black rock where two currents met. "
    "Its keeper climbed one hundred and twelve steps every evening to trim the wick and wind the clockwork. "
    "In winter the spray froze on the lantern glass, and he scraped it clear with a wooden blade. "
    "Supply boats came twice a month when the sea allowed, bringing oil, flour, letters and newspapers weeks old. "
    "He kept a log of every ship that passed, its flag, its heading and the hour, in a careful slanting hand. "
    "On calm nights he listened to the bell buoy and counted the seconds between its strokes. "
    "Gulls nested in the cracks of the lower wall, and each spring he counted the chicks. "
    "The fog signal was a steam horn that needed an hour of firing before it could sound. "
)


@dataclasses.dataclass(frozen=True)
class Prompt:
    question_id: Any
    category: str
    turns: tuple[str, ...]
    system: str | None = None
    raw: bool = False  # feed the text without the chat template


def load_prompts(path: str) -> list[Prompt]:
    """All prompts of a JSON-lines file (blank lines skipped); one-line EagleError naming the line on bad input."""
    if not os.path.isfile(path):
        raise EagleError(f"prompt file {path} does not exist")
    prompts = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise EagleError(f"{path}:{number}: not UTF-8 text ({e.reason}: byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
            if line.strip():
                prompts.append(_parse_prompt(line, f"{path}:{number}"))
    if not prompts:
        raise EagleError(f"prompt file {path} holds no prompts")
    return prompts


def _parse_prompt(line: str, where: str) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise EagleError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise EagleError(f"{where}: expected a JSON object with question_id, category and turns")
    missing = [key for key in ("question_id", "category", "turns") if key not in record]
    if missing:
        raise EagleError(f"{where}: missing {', '.join(missing)}")
    turns, category, system = record["turns"], record["category"], record.get("system")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise EagleError(f"{where}: turns must be a non-empty list of non-empty strings")
    if not isinstance(category, str) or not category:
        raise EagleError(f"{where}: category must be a non-empty string")
    if system is not None and not isinstance(system, str):
        raise EagleError(f"{where}: system must be a string")
    return Prompt(record["question_id"], category, tuple(turns), system)


def select_prompts(prompts: list[Prompt], limit: int | None = None, categories: list[str] | None = None) -> list[Prompt]:
    """Prompts of the given categories (all when None), the first `limit` of each category, in file order."""
    if limit is not None and limit < 1:
        raise EagleError(f"--limit must be >= 1 (prompts per category), got {limit}")
    if categories:
        known = sorted({p.category for p in prompts})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise EagleError(f"unknown categories {', '.join(unknown)}; the prompt file has {', '.join(known)}")
        prompts = [p for p in prompts if p.category in categories]
    if limit is None:
        return list(prompts)
    taken: collections.Counter[str] = collections.Counter()
    selected = []
    for p in prompts:
        if taken[p.category] < limit:
            taken[p.category] += 1
            selected.append(p)
    return selected


def messages_for_turn(prompt: Prompt, answers: list[str], turn: int) -> list[dict]:
    """Chat messages that ask `prompt.turns[turn]` after the model's own answers to the earlier turns."""
    if len(answers) < turn:
        raise ValueError(f"turn {turn} needs the answers to turns 0..{turn - 1}, got {len(answers)}")
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for question, answer in zip(prompt.turns[:turn], answers):
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": prompt.turns[turn]}]


def apply_variant(prompt: Prompt, variant: str, *, system_prompt: str = VARIANT_SYSTEM_PROMPT, context: str = "") -> Prompt:
    """The prompt as seen by a robustness variant: as_given unchanged; system: `system_prompt`
    replaces the prompt's own; raw: no chat template; long_context: `context` (see `long_context`)
    precedes the first turn."""
    if variant == "as_given":
        return prompt
    if variant == "system":
        return dataclasses.replace(prompt, system=system_prompt)
    if variant == "raw":
        return dataclasses.replace(prompt, raw=True)
    if variant == "long_context":
        return dataclasses.replace(prompt, turns=(f"{context}\n\n{prompt.turns[0]}",) + prompt.turns[1:])
    raise EagleError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")


def parse_variants(text: str) -> list[str]:
    """`all` or a comma list of VARIANTS -> the variants in VARIANTS order, as_given always first."""
    names = VARIANTS if text == "all" else [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise EagleError(f"unknown variant {', '.join(unknown)}; expected 'all' or a comma list of {', '.join(VARIANTS)}")
    return [v for v in VARIANTS if v == "as_given" or v in names]


def long_context(tokenizer, num_tokens: int) -> str:
    """Unrelated text of about `num_tokens` tokens of `tokenizer`: whole sentences until their
    counted tokens reach `num_tokens` (counted one sentence at a time, so the joined text may differ
    by a few tokens)."""
    if num_tokens < 1:
        raise EagleError(f"--long-context-tokens must be >= 1, got {num_tokens}")
    sentences = [" " + s.strip() for s in re.findall(r"[^.]+\.", FILLER)]
    counts = [len(tokenizer.encode(s, add_special_tokens=False)) for s in sentences]
    repeats = math.ceil(num_tokens / sum(counts)) + 1
    text, total = [], 0
    for sentence, count in zip(sentences * repeats, counts * repeats):
        if total >= num_tokens:
            break
        text.append(sentence)
        total += count
    return "".join(text).strip()
