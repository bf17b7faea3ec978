"""Timed runs of the benchmark: conversations turn by turn at batch 1, and fixed-size batches.

Every shape bucket is compiled ahead of time by the Engine (compile time reported apart); the first
run of a freshly compiled bucket is a warm-up and is repeated for the timing.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tqdm import tqdm

from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.errors import EagleError
from eagle_jax.infer.engine import Engine, RunResult
from eagle_jax.infer.prompts import Prompt, messages_for_turn


@dataclasses.dataclass
class Conversation:
    """One decoding mode's answers to a prompt, one batch-1 RunResult per turn."""

    results: list[RunResult]
    answers: list[str]
    prompt_tokens: list[int]  # input tokens of each turn (earlier turns and answers included)


@dataclasses.dataclass
class PromptRecord:
    prompt: Prompt
    spec: Conversation | None
    plain: Conversation | None
    greedy: bool

    @property
    def identical_to_ar(self) -> bool | None:
        """Speculative tokens equal plain tokens turn by turn; None unless greedy with both modes run."""
        if not self.greedy or self.spec is None or self.plain is None:
            return None
        return all(s.tokens == p.tokens for s, p in zip(self.spec.results, self.plain.results))


def merge(results: list[RunResult]) -> RunResult:
    """Runs concatenated row-wise: tokens, rounds, histogram rows and finish reasons appended, times summed."""
    histograms = [r.accept_histogram for r in results if r.accept_histogram.size]
    return RunResult(
        tokens=[row for r in results for row in r.tokens],
        wall_s=sum(r.wall_s for r in results),
        compile_s=sum(r.compile_s for r in results),
        rounds=[n for r in results for n in r.rounds],
        accept_histogram=np.concatenate(histograms) if histograms else np.zeros((0, 0), np.int32),
        finish_reasons=[reason for r in results for reason in r.finish_reasons],
    )


def timed_run(engine: Engine, prompts: list[list[int]], tree: TreeConfig | None, seed: int) -> RunResult:
    """engine.run with `tree` (None: plain), repeated once when it had to compile (the first run of
    a bucket is the warm-up: on XLA:CPU a compiled program's first call runs 0.5-0.9 s slower)."""
    result = engine.run(prompts, tree=tree, seed=seed)
    if result.compile_s > 0:
        result = dataclasses.replace(engine.run(prompts, tree=tree, seed=seed), compile_s=result.compile_s)
    return result


def check_fits(engine: Engine, prompt_len: int) -> None:
    """Refuse a prompt whose answer could not fit the cache or the model's positions."""
    need = prompt_len + engine.max_new_tokens
    if engine.cache_len is not None and need > engine.cache_len:
        raise EagleError(
            f"a prompt of {prompt_len} tokens plus {engine.max_new_tokens} new tokens does not fit --cache-len "
            f"{engine.cache_len}; raise --cache-len, or lower --long-context-tokens or --max-new-tokens"
        )
    if need > engine.target.cfg.max_position:
        raise EagleError(
            f"a prompt of {prompt_len} tokens plus {engine.max_new_tokens} new tokens exceeds the model's "
            f"{engine.target.cfg.max_position} positions; lower --long-context-tokens or --max-new-tokens"
        )


def run_conversation(engine: Engine, prompt: Prompt, tree: TreeConfig | None, seed: int) -> Conversation:
    """Ask the turns in order, each after this mode's own answers to the earlier ones (`tree` None: plain)."""
    conversation = Conversation([], [], [])
    for turn in range(len(prompt.turns)):
        ids = engine.encode_chat(messages_for_turn(prompt, conversation.answers, turn), raw=prompt.raw)
        check_fits(engine, len(ids))
        result = timed_run(engine, [ids], tree, seed)
        conversation.results.append(result)
        conversation.answers.append(engine.decode(result.tokens[0]))
        conversation.prompt_tokens.append(len(ids))
    return conversation


def measure_prompts(
    engine: Engine, prompts: list[Prompt], *, tree: TreeConfig | None, plain: bool = True, seed: int = 0, desc: str = "",
) -> list[PromptRecord]:
    """Speculative decoding with `tree` (None: none) and/or plain decoding of each prompt,
    interleaved prompt by prompt, batch 1."""
    records = []
    for index, prompt in enumerate(tqdm(prompts, desc=desc, unit="prompt", leave=False)):
        spec = None if tree is None else run_conversation(engine, prompt, tree, seed + index)
        ar = run_conversation(engine, prompt, None, seed + index) if plain else None
        records.append(PromptRecord(prompt, spec, ar, engine.sampling.greedy))
    return records


def fill_batches(prompts: list[list[int]], batch: int) -> list[list[list[int]]]:
    """ceil(N / batch) batches covering every prompt once; the last is filled by cycling from the start."""
    count = math.ceil(len(prompts) / batch) * batch
    rows = [prompts[i % len(prompts)] for i in range(count)]
    return [rows[i : i + batch] for i in range(0, count, batch)]


def measure_batches(engine: Engine, batches: list[list[list[int]]], tree: TreeConfig | None, seed: int, desc: str = "") -> RunResult:
    """All batches decoded with `tree` (None: plain), merged: throughput = new_tokens / wall_s."""
    for batch in batches:
        for ids in batch:
            check_fits(engine, len(ids))
    return merge([timed_run(engine, b, tree, seed + i) for i, b in enumerate(tqdm(batches, desc=desc, unit="batch", leave=False))])
