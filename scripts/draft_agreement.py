"""How often the shipped head's draft agrees with the target on the target's own greedy answers.

    .venv/bin/python scripts/draft_agreement.py --prompts data/sharegpt_tune.jsonl --out results/default_head/agreement.json

The target answers each prompt's first turn greedily (--max-new-tokens); then, teacher-forced on
prompt + answer, every TTT step of the head predicts each answer token, and the script counts how
often the target's token is the draft's top-1 and among its top-4, and how often it is in the draft
vocabulary at all (a token outside it can never be drafted). This is the head alone: tau also
depends on the tree and the lookup chain (`eagle-jax bench`).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax import model as target_model
from eagle_jax.atomic import write_text_atomic
from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.draft.model import draft_to_target_ids, project_features
from eagle_jax.generate_ar import generate_ar_jit, pad_prompts
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.infer.engine import Engine
from eagle_jax.infer.prompts import load_prompts, messages_for_turn
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL, default_head_dir
from eagle_jax.train.features import compute_target_features
from eagle_jax.train.ttt import unroll

TOP = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=8, help="the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.limit < 1 or args.max_new_tokens < 2 or args.ttt_steps < 1:
        parser.error("--limit and --ttt-steps must be >= 1, --max-new-tokens >= 2")
    target = load_target(DEFAULT_MODEL)
    cfg, params = target.cfg, target.params
    dcfg, dparams = load_draft(default_head_dir(DEFAULT_MODEL), cfg)
    prompts = [Engine(target).encode_chat(messages_for_turn(p, [], 0)) for p in load_prompts(args.prompts)[: args.limit]]
    tokens, lengths = pad_prompts(prompts)
    out = generate_ar_jit(params, cfg, tokens, lengths, jax.random.key(0), max_new_tokens=args.max_new_tokens,
                          cache_len=tokens.shape[1] + args.max_new_tokens, stop_ids=target.stop_ids)
    answers = [np.asarray(out.tokens)[i, : int(out.num_tokens[i])] for i in range(len(prompts))]
    in_vocab = np.zeros(cfg.vocab_size, bool)
    in_vocab[np.asarray(draft_to_target_ids(dparams, dcfg, jnp.arange(dcfg.draft_vocab_size)))] = True

    @jax.jit
    def predictions(seq):  # (1, T) -> target argmax (1, T), per TTT step the draft's top-4 target ids (1, T, 4)
        feats = compute_target_features(params, cfg, dcfg, seq)
        steps = unroll(dparams, dcfg, params, project_features(dparams, dcfg, feats.as_forward_output()), seq, args.ttt_steps)
        tops = [draft_to_target_ids(dparams, dcfg, jax.lax.top_k(s.logits, TOP)[1]) for s in steps]
        return jnp.argmax(target_model.lm_head(params, feats.hidden), -1), tops

    counts = np.zeros((args.ttt_steps, 3), np.int64)  # top-1 hits, top-4 hits, predicted tokens
    in_vocab_count = answer_tokens = 0
    for prompt, answer in zip(prompts, answers):
        seq = np.asarray(prompt + answer.tolist(), np.int32)[None]
        greedy, tops = predictions(jnp.asarray(seq))
        greedy = np.asarray(greedy)[0]  # greedy[t]: the target's token at t + 1
        answer_tokens += len(answer)
        in_vocab_count += int(in_vocab[answer].sum())
        for k, top in enumerate(tops):  # step k at position t predicts the token at t + k + 2
            top = np.asarray(top)[0]
            t = np.arange(len(prompt) - 2, seq.shape[1] - k - 2)
            want = greedy[t + k + 1]
            counts[k] += [(top[t, 0] == want).sum(), (top[t] == want[:, None]).any(1).sum(), len(t)]
    result = {
        "top1_per_ttt_step": [round(float(c[0] / c[2]), 4) for c in counts],
        f"top{TOP}_per_ttt_step": [round(float(c[1] / c[2]), 4) for c in counts],
        "answer_tokens_in_draft_vocab": round(in_vocab_count / answer_tokens, 4),
        "answer_tokens": answer_tokens,
        "config": {"model": DEFAULT_MODEL, "head": "eagle_jax/heads/smollm2-135m-instruct", "prompts": args.prompts,
                   "limit": args.limit, "max_new_tokens": args.max_new_tokens},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("config", "machine")}))


if __name__ == "__main__":
    main()
