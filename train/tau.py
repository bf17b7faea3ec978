"""Acceptance length on held-out prompts through the real speculative generate: an eval hook."""

from __future__ import annotations

import jax
import numpy as np

from eagle_jax.decoding.prompts import pad_prompts
from eagle_jax.decoding.speculative import generate_spec_jit
from eagle_jax.train.metrics import EvalContext, EvalHook
from eagle_jax.decoding.tree import TreeConfig


def dev_prompts(ctx: EvalContext, count: int) -> list[list[int]]:
    """The first `count` dev samples cut before their first assistant token (the question)."""
    prompts = []
    for i in range(len(ctx.dev)):
        lo, hi = ctx.dev.offsets[i], ctx.dev.offsets[i + 1]
        answer = np.flatnonzero(ctx.dev.loss_mask[lo:hi])
        if len(answer) and answer[0] > 0:
            prompts.append(ctx.dev.tokens[lo : lo + answer[0]].tolist())
        if len(prompts) == count:
            break
    return prompts


def tau_hook(num_prompts: int, max_new_tokens: int = 48, tree: TreeConfig = TreeConfig(4, 4, 16)) -> EvalHook:
    """tau = tokens per round (accepted + 1) of greedy speculative decoding of dev questions."""

    def hook(ctx: EvalContext) -> dict[str, float]:
        prompts = dev_prompts(ctx, num_prompts)
        if not prompts:
            return {}
        tokens, lengths = pad_prompts(prompts)
        dparams = jax.tree.map(jax.numpy.asarray, ctx.draft_params)
        out = generate_spec_jit(
            ctx.target.params, ctx.target.cfg, dparams, ctx.dcfg, tokens, lengths, jax.random.key(0),
            max_new_tokens=max_new_tokens, cache_len=tokens.shape[1] + max_new_tokens, tree=tree, stop_ids=ctx.target.stop_ids,
        )
        rounds = int(np.sum(out.rounds))
        return {"tau": float((np.sum(out.num_tokens) - len(prompts)) / max(rounds, 1))}

    return hook
