"""Slices of ShareGPT for training the default head and for a held-out benchmark.

    python scripts/sharegpt_slice.py --start 0 --count 3000 --first-turn --out data/sharegpt_train.jsonl
    python scripts/sharegpt_slice.py --start 16000 --count 40 --format bench --out data/sharegpt_dev.jsonl

--format train writes conversations ({"id", "conversations": [{"from", "value"}]}) for
`eagle-jax train --data`; --first-turn keeps only the first user/assistant exchange (the cheapest
unit to regenerate with the target). --format bench writes the prompt-file format of
`eagle-jax bench` ({"question_id", "category": "sharegpt", "turns": [first user turn]}), with
prompts between --min-chars and --max-chars characters. Usable conversations are counted from
--start (the loader reads 17,346 usable ones from the ShareGPT file; data/sharegpt_dev.jsonl sits at
16000-16048, data/sharegpt_tune.jsonl at 12000-12012). --exclude drops every conversation that is
one of the given prompt files' questions, by id or by the text of its first user turn (ShareGPT
repeats some questions word for word), so a training slice may run past held-out questions:

    python scripts/sharegpt_slice.py --start 14300 --count 3000 --first-turn \
        --exclude data/sharegpt_dev.jsonl data/sharegpt_tune.jsonl --out runs/stage10/sharegpt_14300.jsonl
"""

from __future__ import annotations

import argparse
import json
import os

from eagle_jax.atomic import write_text_atomic
from eagle_jax.errors import EagleError
from eagle_jax.infer.prompts import load_prompts
from eagle_jax.train.data import SHAREGPT, load_conversations

FROM = {"system": "system", "user": "human", "assistant": "gpt"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=SHAREGPT, help="'sharegpt' (the installed ShareGPT file) or a .json/.jsonl path")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--format", choices=("train", "bench"), default="train")
    parser.add_argument("--first-turn", action="store_true")
    parser.add_argument("--min-chars", type=int, default=20)
    parser.add_argument("--max-chars", type=int, default=1500)
    parser.add_argument("--exclude", nargs="+", default=[], metavar="PROMPTS", help="bench prompt files whose questions to leave out")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
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
            kept = conv.messages[: conv.messages.index(messages[1]) + 1] if args.first_turn else conv.messages
            lines.append({"id": conv.id, "conversations": [{"from": FROM[m["role"]], "value": m["content"]} for m in kept]})
        if len(lines) == args.count:
            break
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text_atomic(args.out, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    print(f"wrote {len(lines)} {args.format} records to {args.out}" + (f" ({excluded} held-out conversations left out)" if args.exclude else ""))


if __name__ == "__main__":
    try:
        main()
    except EagleError as e:  # a missing data or prompt file, a prompt file in the wrong format
        raise SystemExit(f"sharegpt_slice: error: {e}") from None
