"""How often the shipped head's draft agrees with the target on the target's own greedy answers,
and what tau that gives chain trees, against the head quality tau 3 would need.

    .venv/bin/python scripts/benchmarks/draft_agreement.py --prompts data/sharegpt_tune.jsonl --out results/default_head/agreement.json

The target answers each prompt's first turn greedily (--max-new-tokens); then, teacher-forced on
prompt + answer, every TTT step of the head predicts each answer token, and the script counts how
often the target's token is the draft's top-1 and among its top-4, and how often it is in the draft
vocabulary at all (a token outside it can never be drafted), and how many of the answer's tokens
never occurred earlier in the context (where a tree's lookup has nothing to propose).

Greedy decoding is deterministic, so the rounds a tree of one draft chain (top_k 1) plus a lookup
chain takes to emit these answers follow from the same predictions: per round the draft chain is
steps 0..c-1 of the head at the root's parent (teacher-forced exactly as at inference, where a
chain token counts only after its ancestors were accepted) and the lookup chain is
`eagle_jax.decoding.lookup.lookup_proposals` on the context so far. Where it found nothing, the tree's
rerank gives the lookup's slots to drafted nodes as far as its depth reaches: `--chains C/L/F`
replays the tree top_k 1, depth F - 1, num_nodes C + 1, lookup L, whose chain holds F drafted
tokens there (C/L: F = C). `--chains` gives the tau of those trees with this head, and with
hypothetical heads whose every chain token is accepted with probability p (`--acceptance`,
independently; the lookup as it is), and for C/L/F trees the tau if lookups that match fewer than
m suffix tokens counted as not found (`this_head_by_min_match`). Per match length of the root's
lookup (0: nothing found), the output also gives the share of roots and how many tokens the
draft chain and the lookup chain get right there. No timing: verify cost per tree is
`scripts/benchmarks/profile_round.py`'s, speedup `eagle-jax bench`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import random

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.model import transformer as target_model
from eagle_jax.files import write_text_atomic
from eagle_jax.draft.checkpoint import load_draft
from eagle_jax.draft.model import draft_to_target_ids, project_features
from eagle_jax.errors import EagleError
from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import pad_prompts
from eagle_jax.infer.bench_report import describe_machine
from eagle_jax.infer.engine import Engine
from eagle_jax.infer.prompts import load_prompts, messages_for_turn
from eagle_jax.loading import load_target
from eagle_jax.loading.registry import DEFAULT_MODEL, default_head_dir
from eagle_jax.decoding.lookup import MAX_NGRAM, lookup_proposals
from eagle_jax.train.features import compute_target_features
from eagle_jax.train.ttt import unroll

TOP = 4


def leading_matches(proposed, truth) -> int:
    """How many of `proposed` equal `truth` from the start."""
    n = 0
    for a, b in zip(proposed, truth):
        if a != b:
            break
        n += 1
    return n


def chain_rounds(answer, draft_top1, lookups, found, chain: int, fallback: int, accept_p: float | None = None, rng=None) -> int:
    """Greedy rounds that emit answer[1:] (answer[0] comes from the prefill) with a draft chain of
    `chain` tokens and a lookup chain under each root. draft_top1 (A, steps): the head's top-1 per
    TTT step for the tokens after the root answer[t]; lookups (A, L): the lookup chain of that root;
    found (A,): whether it was found; where not, the draft chain holds `fallback` tokens (>= chain)
    and the lookup chain the rest of its slots. With accept_p, each chain token is accepted with
    that probability instead (rng: random.Random)."""
    t = rounds = 0  # t: the root's index in the answer
    while t < len(answer) - 1:
        truth = answer[t + 1 :]
        length = chain if found[t] else fallback
        if accept_p is None:
            drafted = leading_matches(draft_top1[t, :length], truth)
        else:
            drafted = 0
            while drafted < min(length, len(truth)) and rng.random() < accept_p:
                drafted += 1
        looked_up = lookups[t, : lookups.shape[1] - (length - chain)]
        t += max(drafted, leading_matches(looked_up, truth)) + 1
        rounds += 1
    return rounds


def parse_chains(text: str, ttt_steps: int) -> list[tuple[int, int, int]]:
    """'1/3,1/3/3' -> [(1, 3, 1), (1, 3, 3)]: draft chain tokens / lookup tokens [/ draft chain tokens
    where nothing is looked up, default the first]."""
    try:
        chains = [tuple(int(x) for x in item.split("/")) for item in text.split(",")]
    except ValueError:
        chains = []
    chains = [c + c[:1] if len(c) == 2 else c for c in chains]
    if not chains or any(len(c) != 3 or not 1 <= c[0] <= c[2] <= min(ttt_steps, c[0] + c[1]) or c[1] < 0 for c in chains):
        raise SystemExit(
            f"--chains wants C/L[/F],... with 1 <= C <= F <= C + L, F <= --ttt-steps ({ttt_steps}) and L >= 0, got {text!r}"
        )
    return chains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=8, help="the first N prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--ttt-steps", type=int, default=3)
    parser.add_argument("--head", default=None, help="draft head directory (default: the shipped head)")
    parser.add_argument("--chains", default="1/0,1/3,1/3/3,2/3,2/3/3,3/4", help=(
        "trees to simulate: draft chain tokens / lookup tokens [/ draft chain tokens where nothing is looked up], ..."))
    parser.add_argument("--acceptance", default="0.4,0.5,0.6,0.7,0.8,0.9", help="hypothetical per-token acceptance rates")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.limit < 1 or args.max_new_tokens < 2 or args.ttt_steps < 1:
        parser.error("--limit and --ttt-steps must be >= 1, --max-new-tokens >= 2")
    chains = parse_chains(args.chains, args.ttt_steps)
    try:
        rates = [float(x) for x in args.acceptance.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(0.0 <= p <= 1.0 for p in rates):
        parser.error(f"--acceptance wants probabilities in [0, 1], comma-separated, got {args.acceptance!r}")
    head = args.head or default_head_dir(DEFAULT_MODEL)
    target = load_target(DEFAULT_MODEL)
    cfg, params = target.cfg, target.params
    dcfg, dparams = load_draft(head, cfg)
    prompts = [Engine(target).encode_chat(messages_for_turn(p, [], 0)) for p in load_prompts(args.prompts)[: args.limit]]
    tokens, lengths = pad_prompts(prompts)
    out = generate_ar_jit(params, cfg, tokens, lengths, jax.random.key(0), max_new_tokens=args.max_new_tokens,
                          cache_len=tokens.shape[1] + args.max_new_tokens, stop_ids=target.stop_ids)
    answers = [np.asarray(out.tokens)[i, : int(out.num_tokens[i])] for i in range(len(prompts))]
    in_vocab = np.zeros(cfg.vocab_size, bool)
    in_vocab[np.asarray(draft_to_target_ids(dparams, dcfg, jnp.arange(dcfg.draft_vocab_size)))] = True

    @jax.jit
    def predictions(params, dparams, seq):  # (1, T) -> target argmax (1, T), per TTT step the draft's top-4 target ids (1, T, 4)
        feats = compute_target_features(params, cfg, dcfg, seq)
        steps = unroll(dparams, dcfg, params, project_features(dparams, dcfg, feats.as_forward_output()), seq, args.ttt_steps)
        tops = [draft_to_target_ids(dparams, dcfg, jax.lax.top_k(s.logits, TOP)[1]) for s in steps]
        return jnp.argmax(target_model.lm_head(params, feats.hidden), -1), tops

    max_lookup = max(lookup for _, lookup, _ in chains)
    counts = np.zeros((args.ttt_steps, 3), np.int64)  # top-1 hits, top-4 hits, predicted tokens
    in_vocab_count = answer_tokens = 0
    by_match = np.zeros((MAX_NGRAM + 1, 3), np.int64)  # per lookup match length: roots, draft chain tokens right, lookup tokens right
    rounds_inputs = []  # per prompt: answer, draft top-1 per root (A, steps), lookup chain per root (A, L)
    for prompt, answer in zip(prompts, answers):
        seq = np.asarray(prompt + answer.tolist(), np.int32)[None]
        greedy, tops = predictions(params, dparams, jnp.asarray(seq))  # weights as arguments, not folded constants
        greedy = np.asarray(greedy)[0]  # greedy[t]: the target's token at t + 1
        answer_tokens += len(answer)
        in_vocab_count += int(in_vocab[answer].sum())
        for k, top in enumerate(tops):  # step k at position t predicts the token at t + k + 2
            top = np.asarray(top)[0]
            t = np.arange(len(prompt) - 2, seq.shape[1] - k - 2)
            want = greedy[t + k + 1]
            counts[k] += [(top[t, 0] == want).sum(), (top[t] == want[:, None]).any(1).sum(), len(t)]
        roots = len(prompt) + np.arange(len(answer))  # the root answer[t] sits at position P + t
        draft_top1 = np.stack([np.asarray(top)[0, roots - 1, 0] for top in tops], axis=1)
        history = jnp.broadcast_to(jnp.asarray(seq), (len(answer), seq.shape[1]))  # nothing past the root is read
        lookups, match_length = (np.asarray(x) for x in lookup_proposals(history, jnp.asarray(roots + 1, jnp.int32), max(max_lookup, 1)))
        for t in range(len(answer) - 1):  # the roots of a round: all but the last token
            truth = answer[t + 1 :].tolist()
            by_match[match_length[t]] += [1, leading_matches(draft_top1[t], truth), leading_matches(lookups[t, :max_lookup], truth)]
        rounds_inputs.append((answer.tolist(), draft_top1, lookups[:, :max_lookup], match_length))
    emitted = sum(len(inputs[0]) - 1 for inputs in rounds_inputs)

    def tau(chain: int, lookup: int, fallback: int, accept_p: float | None = None, min_match: int = 1) -> float:
        rng = random.Random(0)
        rounds = sum(chain_rounds(a, d, lk[:, :lookup], m >= min_match, chain, fallback, accept_p, rng) for a, d, lk, m in rounds_inputs)
        return round(emitted / max(rounds, 1), 3)

    simulated = {
        f"{c}/{lookup}" + (f"/{fallback}" if fallback > c else ""): {
            "this_head": tau(c, lookup, fallback), "acceptance": {str(p): tau(c, lookup, fallback, p) for p in rates},
            # lookups matching fewer than m tokens treated as not found: their slots drafted
            **({"this_head_by_min_match": {str(m): tau(c, lookup, fallback, min_match=m) for m in range(2, MAX_NGRAM + 1)}} if fallback > c else {}),
        }
        for c, lookup, fallback in chains
    }
    result = {
        "top1_per_ttt_step": [round(float(c[0] / c[2]), 4) for c in counts],
        f"top{TOP}_per_ttt_step": [round(float(c[1] / c[2]), 4) for c in counts],
        "answer_tokens_in_draft_vocab": round(in_vocab_count / answer_tokens, 4),
        # roots (every answer token but the last) that never occurred earlier: nothing to look up
        "roots_with_nothing_to_look_up": round(float(by_match[0, 0] / max(by_match[:, 0].sum(), 1)), 4),
        "answer_tokens": answer_tokens,
        # per match length of the root's lookup (0: nothing found): its share of the roots and the
        # mean tokens right from the start of the draft chain (--ttt-steps) and of the lookup chain
        "by_lookup_match_length": {str(n): {"roots": round(float(r / max(by_match[:, 0].sum(), 1)), 4), "draft_tokens_right": round(float(d / max(r, 1)), 3),
                                            f"lookup_tokens_right_of_{max_lookup}": round(float(lk / max(r, 1)), 3)}
                                   for n, (r, d, lk) in enumerate(by_match)},
        "greedy_tau_of_chain_trees": simulated,  # "C/L[/F]": C drafted + L looked-up tokens under the root, F drafted where nothing is
        "config": {"model": DEFAULT_MODEL, "head": os.path.relpath(head), "prompts": args.prompts,
                   "limit": args.limit, "max_new_tokens": args.max_new_tokens},
        "machine": describe_machine(),
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("config", "machine")}))


if __name__ == "__main__":
    try:
        main()
    except EagleError as e:  # a missing prompt file or head, a head that does not fit the target
        raise SystemExit(f"draft_agreement: error: {e}") from None
