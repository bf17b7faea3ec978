"""Store a draft head's float weights in another dtype: float16 or bfloat16 halve a float32 head.

    python scripts/tools/cast_head.py runs/stage12/v16k/draft --dtype float16 --out runs/stage12/v16k/draft_float16

Only the stored precision changes: `--draft` loads any float dtype into the compute dtype (float32
by default), and the draft vocabulary (d2t, t2d) is kept as it is. The output is a new directory
(config.json + model.safetensors in the layout `export_draft` writes), written atomically.
"""

from __future__ import annotations

import argparse
import os

import jax.numpy as jnp

from eagle_jax.draft.checkpoint import export_draft, load_draft
from eagle_jax.errors import EagleError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("head", help="a draft head directory (any layout --draft loads)")
    parser.add_argument("--dtype", required=True, choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--out", required=True, help="directory to write the cast head to")
    args = parser.parse_args()
    if os.path.exists(args.out):
        raise SystemExit(f"cast_head: error: {args.out} exists; give a new directory")
    try:
        dcfg, params = load_draft(args.head, dtype=jnp.dtype(args.dtype))
        export_draft(args.out, dcfg, params)
    except EagleError as e:
        raise SystemExit(f"cast_head: error: {e}") from None
    print(f"{args.head} -> {args.out} ({args.dtype})")


if __name__ == "__main__":
    main()
