"""Command-line arguments shared by `eagle-jax generate`, `bench` and `train`: the --help format,
value types, renamed flags, the check for optional packages, and the model/draft/tree/sampling flags
with the engine and tree choice they build."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import re
import sys

from eagle_jax.dtypes import DTYPE_NAMES
from eagle_jax.errors import EagleError
from eagle_jax.model.config import ATTENTION_IMPLS, LAYER_FORMS

# TreeConfig field -> (its flag, the older spelling still accepted with a note)
TREE_FLAGS = {
    "top_k": ("--tree-top-k", "--top-k"),
    "depth": ("--tree-depth", "--depth"),
    "num_nodes": ("--tree-nodes", "--num-nodes"),
    "lookup": ("--tree-lookup", "--lookup"),
    "scoring": ("--tree-scoring", "--scoring"),
}
# older spellings that will later mean something else, as in other LLM tools
LATER_MEANING = {"--top-k": "top-k sampling (today --top-k-sampling)"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default, except where there is none to show (None, an off switch)
    or the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class RenamedFlag(argparse.Action):
    """A value flag spelled `option_strings[0]`; the later spellings are older names, still
    accepted with a one-line note on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = self.option_strings[0]
        if option_string != current:
            note = f"eagle-jax: note: {option_string} is deprecated, use {current}"
            if option_string in LATER_MEANING:
                note += f"; {option_string} will later mean {LATER_MEANING[option_string]}"
            print(note, file=sys.stderr)
        setattr(namespace, self.dest, values)


def require_extra(module: str, needed_for: str, extra: str) -> None:
    """Refuse (EagleError) before any work when `module`, which only the pyproject `extra` installs, is missing."""
    if importlib.util.find_spec(module) is None:
        raise EagleError(f"{needed_for} needs the {module} package, which a plain install leaves out: "
                         f'pip install -e ".[{extra}]" (from the eagle-jax checkout)')


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def utf8_text(text: str) -> str:
    """Text of the command line; bytes that are not UTF-8 arrive as lone surrogates, which no
    tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"expected UTF-8 text, got bytes that are not (at character {e.start + 1})") from None
    return text


MAX_SEED = 2**32 - 1


def seed_int(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {MAX_SEED}, got {text}")
    return value


BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def byte_size(text: str) -> int:
    """A size such as 2GB, 500MB, 1.5GiB or 1000000 (bytes), as Hugging Face writes max_shard_size."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMG]I?B|B)?\s*", text, re.IGNORECASE)
    value = float(match[1]) * BYTE_UNITS[(match[2] or "").upper()] if match else 0
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected a size such as 2GB, 500MB or 1GiB (at least 1 byte), got {text!r}")
    return int(value)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are the one `eagle-jax: error: ...` line (exit code 2) that
    every other error of the command line is, not argparse's usage block."""

    def error(self, message: str):
        print(f"eagle-jax: error: {message}", file=sys.stderr)
        sys.exit(2)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    from eagle_jax.decoding.tree import SCORINGS, TreeConfig
    from eagle_jax.loading.registry import DEFAULT_MODEL

    default = TreeConfig()

    p.add_argument("--model", default=DEFAULT_MODEL, help="target: built-in name, HF directory, .gguf file, or Hub id org/name[@rev] (org/name/FILE.gguf for GGUF repos)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template for the target's tokenizer, replacing its own; a base model has none (data/templates/gemma.jinja)")
    p.add_argument("--draft", default=None, help="draft head directory or Hub id org/name[@rev] (ours, EAGLE-1/2, EAGLE-3, speculators layouts); "
                                                 "default: the built-in head of --model")
    p.add_argument("--no-spec", action="store_true", help="plain autoregressive decoding, no draft head")
    p.add_argument("--max-new-tokens", type=positive_int, default=256, help="new tokens per answer at most")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="target-side sampling temperature; 0 = greedy")
    p.add_argument("--top-p", type=finite_float, default=1.0, help="target-side nucleus sampling: keep the smallest set of tokens "
                                                             "with this probability mass (1 = off)")
    p.add_argument("--top-k-sampling", type=non_negative_int, default=0, help="target-side top-k sampling (0 = off)")
    tree = p.add_argument_group(
        "draft tree", "Any of these flags replaces the head's tuned tree and batch policy (eagle-jax bench --auto-tune): the "
                      "tree speculates at every batch size. A shape flag (top-k, depth, nodes, lookup) replaces the tuned shape "
                      "as a whole, the unset ones taking their defaults; --tree-scoring alone keeps the tuned shape.")
    tree.add_argument(*TREE_FLAGS["top_k"], dest="tree_top_k", type=positive_int, default=None, action=RenamedFlag,
                      metavar="K", help="children per expanded node, and nodes expanded per level (the tree's branching; not "
                                        f"top-k sampling); default: the tuned tree's, else {default.top_k}")
    tree.add_argument(*TREE_FLAGS["depth"], dest="tree_depth", type=non_negative_int, default=None, action=RenamedFlag,
                      metavar="D", help=f"expansion passes after the first draft level; default: the tuned tree's, else {default.depth}")
    tree.add_argument(*TREE_FLAGS["num_nodes"], dest="tree_num_nodes", type=positive_int, default=None, action=RenamedFlag,
                      metavar="N", help=f"drafted nodes verified per round, root included; default: the tuned tree's, else {default.num_nodes}")
    tree.add_argument(*TREE_FLAGS["lookup"], dest="tree_lookup", type=non_negative_int, default=None, action=RenamedFlag,
                      metavar="L", help="also verify this many tokens looked up in the context (the continuation of the latest "
                                        "earlier occurrence of the last 1-3 tokens), one chain under the root; 0 = none; "
                                        f"default: the tuned tree's, else {default.lookup}")
    tree.add_argument(*TREE_FLAGS["scoring"], dest="tree_scoring", choices=SCORINGS, default=None, action=RenamedFlag,
                      help="'dynamic' (EAGLE-2: by cumulative draft confidence), 'static' (by rank: a fixed shape) or 'sampled' "
                           "(a fixed shape whose children are drawn from the draft; sampling only, where it accepts more drafted "
                           f"tokens than top-k children); default: the tuned tree's, else {default.scoring}")
    p.add_argument("--cache-len", type=positive_int, default=None, help="KV cache slots (default: fits prompt + max new tokens)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                   help="weights, activations and caches: auto = bfloat16 on GPU/TPU, float32 on CPU")
    p.add_argument("--attention", choices=ATTENTION_IMPLS, default="auto",
                   help="tree attention of the verify step: auto = Pallas on GPU/TPU, XLA on CPU")
    p.add_argument("--float32-activations", action="store_true",
                   help="with bfloat16 weights, keep activations and KV caches in float32: greedy speculative output then "
                        "equals plain output (bfloat16 alone parts from it at near-ties)")
    p.add_argument("--layers", choices=LAYER_FORMS, default="auto",
                   help="the target's layers: unrolled, or stacked and scanned over (compile time that does not grow with depth); "
                        "auto = scan on GPU/TPU, unrolled on CPU")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed of sampling")
    p.add_argument("--mesh", default=None, metavar="data=D,model=M",
                   help="decode on a device mesh: batch rows split over D devices, the model's heads, MLP and vocabulary over M "
                        "(tensor parallel); either axis may be left out (size 1); default: one device")
    add_distributed_arguments(p.add_argument_group("multi-process", "several hosts (or processes) decoding on one mesh"))


def add_distributed_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--distributed", action="store_true", help="multi-process, discovered by jax (TPU pods, SLURM)")
    p.add_argument("--coordinator", default=None, help="multi-process by hand: HOST:PORT of process 0")
    p.add_argument("--num-processes", type=int, default=None, help="multi-process by hand: how many processes take part")
    p.add_argument("--process-id", type=int, default=None, help="multi-process by hand: this process's index, 0 .. N-1")


def initialize_distributed(args: argparse.Namespace) -> None:
    """Join the multi-process run the distributed flags describe (none: a single process)."""
    from eagle_jax import mesh

    mesh.initialize_distributed(args.coordinator, args.num_processes, args.process_id, auto=args.distributed)


def sampling_config(args: argparse.Namespace):
    from eagle_jax.decoding.sampling import SamplingConfig

    return SamplingConfig(args.temperature, args.top_p, args.top_k_sampling)


def tree_choice(args: argparse.Namespace, draft_dir: str | None):
    """settings.choose_tree for the parsed tree and sampling flags (draft_dir None: plain decoding)."""
    from eagle_jax.infer.settings import choose_tree

    explicit = {field: getattr(args, f"tree_{field}") for field in TREE_FLAGS}
    return choose_tree(draft_dir, sampled=not sampling_config(args).greedy, **explicit)


def build_engine(args: argparse.Namespace):
    """(Engine, settings.TreeChoice) from parsed model/draft/tree/sampling arguments. The tree
    flags are checked before the model loads."""
    from eagle_jax.draft.checkpoint import load_draft
    from eagle_jax.dtypes import float32_activations, run_dtype
    from eagle_jax.infer.engine import Engine
    from eagle_jax.loading import load_target
    from eagle_jax.loading.hub import resolve_head_path
    from eagle_jax.loading.registry import default_head_dir

    from eagle_jax.mesh import make_mesh, parse_mesh
    from eagle_jax.model.sharding import target_shardings

    sizes = parse_mesh(args.mesh) if args.mesh else None
    initialize_distributed(args)  # before anything asks JAX for its devices
    draft_dir = None if args.no_spec else resolve_head_path(args.draft) if args.draft else default_head_dir(args.model)
    if draft_dir is None and not args.no_spec:
        raise EagleError(f"no draft head for {args.model}: pass --draft DIR, or --no-spec for plain decoding")
    choice = tree_choice(args, draft_dir)
    mesh = None if sizes is None else make_mesh(sizes)
    dtype = run_dtype(args.dtype)
    shardings = None if mesh is None else lambda cfg, params: target_shardings(mesh, cfg, params)
    target = load_target(args.model, dtype=dtype, shardings=shardings, layers=args.layers,  # straight into its shards and form
                         chat_template=args.chat_template)
    if args.float32_activations:
        target = dataclasses.replace(target, params=float32_activations(target.params))
    draft = None if draft_dir is None else load_draft(draft_dir, target.cfg, dtype=dtype)
    engine = Engine(target, draft, sampling_config(args), args.max_new_tokens, args.cache_len, args.attention, mesh, args.layers)
    if choice.tree is not None:
        engine.check_tree(choice.tree)
    return engine, choice
