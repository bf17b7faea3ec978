"""How much of held-out text a reduced EAGLE-3 draft vocabulary covers, per vocabulary size.

    python scripts/vocab_coverage.py runs/default_head/run3 --sizes 1024 2048 4096 8192 16384

Reads a training run's tokenized sets (RUN/data/train.npz, dev.npz), picks each draft vocabulary
from the training set's assistant tokens exactly as `eagle-jax train` does, and prints the fraction
of the dev set's assistant tokens inside it. A token outside the draft vocabulary can never be
drafted, so the dev coverage caps every draft step's acceptance rate.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from eagle_jax.train.data import TokenizedSet
from eagle_jax.train.vocab import select_draft_vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a training run directory (holds data/train.npz and data/dev.npz)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--target-vocab-size", type=int, default=49152)
    args = parser.parse_args()
    train = TokenizedSet.load(os.path.join(args.run, "data", "train.npz"))
    dev = TokenizedSet.load(os.path.join(args.run, "data", "dev.npz"))
    dev_tokens = dev.tokens[dev.loss_mask]
    rows = []
    for size in args.sizes:
        vocab = select_draft_vocab(train.tokens, train.loss_mask, args.target_vocab_size, size)
        rows.append({"size": size, "train_coverage": round(vocab.coverage, 5),
                     "dev_coverage": round(float(np.isin(dev_tokens, vocab.used).mean()), 5)})
    print(json.dumps({"train_assistant_tokens": int(train.loss_mask.sum()), "dev_assistant_tokens": len(dev_tokens), "sizes": rows}, indent=1))


if __name__ == "__main__":
    main()
