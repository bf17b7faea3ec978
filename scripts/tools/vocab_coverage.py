"""How much of held-out text a reduced EAGLE-3 draft vocabulary covers, per vocabulary size.

    python scripts/tools/vocab_coverage.py runs/default_head/run4 --sizes 2048 4096 8192 16384 --out coverage.json
    python scripts/tools/vocab_coverage.py runs/stage10/stage10 --pick-from runs/stage8/stage8 runs/stage9/stage9 \
        --head eagle_jax/heads/smollm2-135m-instruct --sizes 8192 16384

Reads a training run's tokenized sets (RUN/data/train.npz, dev.npz), picks each draft vocabulary
from the training set's assistant tokens exactly as `eagle-jax train` does (or from the training sets
of the --pick-from runs together), and prints the fraction of the dev set's assistant tokens inside
it; --head adds the coverage of that head's own vocabulary. A token outside the draft vocabulary can
never be drafted, so the dev coverage caps every draft step's acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from eagle_jax.files import write_json_atomic
from eagle_jax.errors import EagleError
from eagle_jax.train.data import TokenizedSet
from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.train.vocab import DraftVocab, select_draft_vocab, used_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a training run directory (holds data/train.npz and data/dev.npz)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--pick-from", nargs="+", default=None, metavar="RUN", help="pick from these runs' training sets (default: RUN's)")
    parser.add_argument("--head", help="also report the coverage of this draft head's vocabulary")
    parser.add_argument("--target-vocab-size", type=int, help="default: the run's own (RUN/vocab.npz)")
    parser.add_argument("--out", help="also write the report here (atomically)")
    args = parser.parse_args()
    pick_from = args.pick_from or [args.run]
    paths = [os.path.join(run, "data", "train.npz") for run in pick_from] + [os.path.join(args.run, "data", "dev.npz")]
    if args.target_vocab_size is None:
        paths.append(os.path.join(args.run, "vocab.npz"))
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"vocab_coverage: error: not a training run directory: missing {', '.join(missing)}")
    trains = [TokenizedSet.load(p) for p in paths[: len(pick_from)]]
    tokens, loss_mask = np.concatenate([t.tokens for t in trains]), np.concatenate([t.loss_mask for t in trains])
    dev = TokenizedSet.load(paths[len(pick_from)])
    target_vocab_size = args.target_vocab_size or DraftVocab.load(paths[-1]).target_vocab_size
    dev_tokens = dev.tokens[dev.loss_mask]
    rows = []
    for size in args.sizes:
        try:
            vocab = select_draft_vocab(tokens, loss_mask, target_vocab_size, size)
        except EagleError as e:
            raise SystemExit(f"vocab_coverage: error: {e}") from None
        rows.append({"size": size, "train_coverage": round(vocab.coverage, 5),
                     "dev_coverage": round(float(np.isin(dev_tokens, vocab.used).mean()), 5)})
    report = {"train_assistant_tokens": int(loss_mask.sum()), "dev_assistant_tokens": len(dev_tokens), "sizes": rows}
    if args.head:
        try:
            dcfg, params = load_draft(args.head)
        except EagleError as e:
            raise SystemExit(f"vocab_coverage: error: {e}") from None
        head_used = used_ids(np.asarray(params["d2t"]))
        coverage = lambda t, m: round(DraftVocab.from_used(head_used, t, m, target_vocab_size).coverage, 5)  # noqa: E731
        report["head"] = {"path": args.head, "size": dcfg.draft_vocab_size,
                          "train_coverage": coverage(tokens, loss_mask), "dev_coverage": coverage(dev.tokens, dev.loss_mask)}
    if args.out:
        write_json_atomic(args.out, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
