"""Store a draft head's float weights in another dtype: float16 or bfloat16 halve a float32 head.

    python scripts/tools/cast_head.py runs/stage12/v16k/draft --dtype float16 --out runs/stage12/v16k/draft_float16

Only the stored precision changes: `--draft` loads any float dtype into the compute dtype (float32
by default), and the draft vocabulary (d2t, t2d) is kept as it is. The output is a new directory
(config.json + model.safetensors in the layout `export_draft` writes, plus the head's saved tree
settings, tree.json, tree_sampled.json and batch_policy.json, copied as they are), written atomically.
The shipped SmolLM2 head was stored in bfloat16 this way (results/bf16-head).
"""

from __future__ import annotations

import argparse
import os
import shutil

import jax.numpy as jnp

from eagle_jax.draft.checkpoint import export_draft, load_draft
from eagle_jax.errors import EagleError
from eagle_jax.files import check_output_path, write_directory_atomic

SETTINGS_FILES = ("tree.json", "tree_sampled.json", "batch_policy.json")  # infer/settings.py's files


def cast(head: str, out: str, dtype: str) -> None:
    dcfg, params = load_draft(head, dtype=jnp.dtype(dtype))

    def fill(staging: str) -> None:
        weights = os.path.join(staging, "weights")
        export_draft(weights, dcfg, params)
        for name in os.listdir(weights):
            os.rename(os.path.join(weights, name), os.path.join(staging, name))
        os.rmdir(weights)
        for name in SETTINGS_FILES:
            if os.path.isfile(os.path.join(head, name)):
                shutil.copyfile(os.path.join(head, name), os.path.join(staging, name))

    write_directory_atomic(out, fill, replace=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("head", help="a draft head directory (any layout --draft loads)")
    parser.add_argument("--dtype", required=True, choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--out", required=True, help="directory to write the cast head to")
    args = parser.parse_args()
    if os.path.exists(args.out):
        raise SystemExit(f"cast_head: error: {args.out} exists; give a new directory")
    try:
        check_output_path(args.out, "--out", directory=True)
        cast(args.head, args.out, args.dtype)
    except EagleError as e:
        raise SystemExit(f"cast_head: error: {e}") from None
    print(f"{args.head} -> {args.out} ({args.dtype})")


if __name__ == "__main__":
    main()
