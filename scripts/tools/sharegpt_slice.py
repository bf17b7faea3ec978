"""Slices of ShareGPT for training the default head and for a held-out benchmark.

    python scripts/tools/sharegpt_slice.py --start 0 --count 3000 --first-turn --out data/sharegpt_train.jsonl
    python scripts/tools/sharegpt_slice.py --start 16000 --count 40 --format bench --out data/sharegpt_dev.jsonl

--format train writes conversations ({"id", "conversations": [{"from", "value"}]}) for
`eagle-jax train --data`; --turns N keeps the first N user/assistant exchanges of the conversations
that have N (--first-turn: N = 1, the cheapest unit to regenerate with the target). --answers takes
the answers of the earlier exchanges from regenerated conversations (the part files of `eagle-jax
train --regenerate`), so that `eagle-jax train --regenerate --regen-keep-turns N-1` answers only the
last exchange, in a conversation that is the target's own so far; conversations without them are
left out. --format bench writes the prompt-file format of
`eagle-jax bench` ({"question_id", "category": "sharegpt", "turns": [first user turn]}), with
prompts between --min-chars and --max-chars characters. Usable conversations are counted from
--start (the loader reads 17,346 usable ones from the ShareGPT file; data/sharegpt_dev.jsonl sits at
16000-16048, data/sharegpt_tune.jsonl at 12000-12012). --exclude drops every conversation that is
one of the given prompt files' questions, by id or by the text of its first user turn (ShareGPT
repeats some questions word for word), so a training slice may run past held-out questions:

    python scripts/tools/sharegpt_slice.py --start 14300 --count 3000 --first-turn \
        --exclude data/sharegpt_dev.jsonl data/sharegpt_tune.jsonl --out runs/stage10/sharegpt_14300.jsonl
    python scripts/tools/sharegpt_slice.py --start 8800 --count 3000 --turns 2 --answers data/regenerated/*_first_turn.jsonl \
        --exclude data/sharegpt_dev.jsonl data/sharegpt_tune.jsonl --out runs/second_turns.jsonl

(data/regenerated/*_first_turn.jsonl are in the history only since 2026-12-04: restore them first as
data/regenerated/README.md says.)
"""

from __future__ import annotations

import argparse
import os

from eagle_jax.files import write_jsonl_atomic
from eagle_jax.errors import EagleError
from eagle_jax.infer.prompts import load_prompts
from eagle_jax.train.data import SHAREGPT, Conversation, load_conversations
from eagle_jax.train.regenerate import read_done

FROM = {"system": "system", "user": "human", "assistant": "gpt"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=SHAREGPT, help="'sharegpt' (the installed ShareGPT file) or a .json/.jsonl path")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--format", choices=("train", "bench"), default="train")
    parser.add_argument("--turns", type=int, default=None, metavar="N", help="keep the first N exchanges of conversations that have N")
    parser.add_argument("--first-turn", dest="turns", action="store_const", const=1, help="--turns 1")
    parser.add_argument("--answers", nargs="+", default=[], metavar="REGENERATED",
                        help="regenerated conversations whose answers replace those of the first N-1 exchanges")
    parser.add_argument("--min-chars", type=int, default=20)
    parser.add_argument("--max-chars", type=int, default=1500)
    parser.add_argument("--exclude", nargs="+", default=[], metavar="PROMPTS", help="bench prompt files whose questions to leave out")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.turns is not None and args.turns < 1 or args.answers and not args.turns:
        parser.error("--turns must be >= 1, and --answers needs --turns")
    answers = {cid: conv for path in args.answers for cid, conv in read_answers(path).items()} if args.answers else None
    held_out = [p for path in args.exclude for p in load_prompts(path)]
    held_out_ids = {str(p.question_id).removeprefix("sharegpt-") for p in held_out}
    held_out_questions = {p.turns[0].strip() for p in held_out}
    excluded = 0
    conversations, _ = load_conversations(args.data, args.start + 4 * args.count)
    lines = []
    for conv in conversations[args.start :]:
        messages = [m for m in conv.messages if m["role"] != "system"]
        question = messages[0]["content"].strip()
        if conv.id in held_out_ids or question in held_out_questions:
            excluded += 1
            continue
        if args.format == "bench":
            if args.min_chars <= len(question) <= args.max_chars:
                lines.append({"question_id": f"sharegpt-{conv.id}", "category": "sharegpt", "turns": [question]})
        else:
            kept = conv.messages if args.turns is None else first_exchanges(conv, args.turns, answers)
            if kept is None:
                continue
            lines.append({"id": conv.id, "conversations": [{"from": FROM[m["role"]], "value": m["content"]} for m in kept]})
        if len(lines) == args.count:
            break
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_jsonl_atomic(args.out, lines)
    print(f"wrote {len(lines)} {args.format} records to {args.out}" + (f" ({excluded} held-out conversations left out)" if args.exclude else ""))


def read_answers(path: str) -> dict[str, Conversation]:
    if not os.path.isfile(path):
        raise EagleError(f"--answers {path} does not exist")
    return read_done(path)


def first_exchanges(conv: Conversation, turns: int, answers: dict[str, Conversation] | None) -> list[dict] | None:
    """The system prompt (if any) and the first `turns` user/assistant exchanges, the answers of all but
    the last taken from `answers[conv.id]` when given; None when the conversation has fewer exchanges,
    or `answers` lacks them or asks other questions."""
    system = [m for m in conv.messages[:1] if m["role"] == "system"]
    exchanges = list(conv.messages[len(system):][: 2 * turns])
    if len(exchanges) < 2 * turns:
        return None
    if answers is not None:
        answered = [m for m in answers[conv.id].messages if m["role"] != "system"] if conv.id in answers else []
        earlier = 2 * (turns - 1)
        if len(answered) < earlier or answered[:earlier:2] != exchanges[:earlier:2]:
            return None
        exchanges[:earlier] = answered[:earlier]
    return system + exchanges


if __name__ == "__main__":
    try:
        main()
    except EagleError as e:  # a missing data or prompt file, a prompt file in the wrong format
        raise SystemExit(f"sharegpt_slice: error: {e}") from None
