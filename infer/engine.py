"""A loaded target (and optional draft head) with compiled plain and speculative generate.

Used by the CLI, the benchmark harness and the notebook. Compilation is done ahead of time per
shape bucket, so `run` reports compile time and decode wall time separately.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from eagle_jax.draft.config import DraftConfig
from eagle_jax.errors import EagleError
from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import PAD, check_prompt_fits, pad_prompts
from eagle_jax.infer.bench_policy import tree_for_batch
from eagle_jax.loading import TargetModel
from eagle_jax.model.transformer import with_block_copies
from eagle_jax.decoding.sampling import SamplingConfig
from eagle_jax.decoding.speculative import check_draft, generate_spec_jit
from eagle_jax.decoding.tree import TreeConfig

CACHE_BUCKET = 256
# Executables an engine keeps (least recently used dropped first). On XLA:CPU each compiled generate
# of the default model holds about 1.5k memory maps and Linux allows 65,530 per process: a process
# that kept every shape of a long tree sweep compiled ran out of them.
MAX_COMPILED = 8


@dataclasses.dataclass
class RunResult:
    tokens: list[list[int]]  # generated ids per row (a stop token included)
    wall_s: float  # decode wall time, compile excluded
    compile_s: float  # 0 when the shape bucket was already compiled
    rounds: list[int]  # speculative rounds per row (0 for plain decoding)
    accept_histogram: np.ndarray  # (B, tree.max_path) rounds by accepted draft tokens; empty for plain

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tau(self) -> float:
        """Mean tokens per round (accepted + 1): the first token, from prefill, is not a round's."""
        rounds = sum(self.rounds)
        return (self.new_tokens - len(self.tokens)) / rounds if rounds else float("nan")


@dataclasses.dataclass
class Engine:
    target: TargetModel
    draft: tuple[DraftConfig, dict] | None = None
    tree: TreeConfig = TreeConfig()
    sampling: SamplingConfig = SamplingConfig()
    max_new_tokens: int = 256
    cache_len: int | None = None  # None: the smallest bucket that fits prompt + max_new_tokens
    attn_impl: str = "auto"
    batch_policy: list[dict] | None = None  # measured by `eagle-jax bench --batch-sizes` (bench_policy)
    speculate: bool = True  # False: the head's tuned setting found plain decoding faster (run decodes plainly)
    # target.params with the verify step's (in, out) copies (`with_block_copies`), made once by the
    # first engine with a draft and carried over by dataclasses.replace, so engines that differ in
    # tree or settings share them (remade when the replacement brings another target)
    spec_params: dict | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise EagleError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft is not None:
            check_draft(self.target.cfg, self.draft[0], self.tree, self.sampling)
            if self.spec_params is None or self.spec_params["layers"] is not self.target.params["layers"]:
                self.spec_params = with_block_copies(self.target.params)
        self._compiled = collections.OrderedDict()

    def release(self) -> None:
        """Drop every compiled executable (they recompile on the next run)."""
        self._compiled.clear()

    def encode_chat(self, messages: list[dict], raw: bool = False) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template (or raw text)."""
        tok = self.target.tokenizer
        if raw:
            return tok.encode("".join(m["content"] for m in messages), add_special_tokens=False)
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def decode(self, ids: list[int]) -> str:
        return self.target.tokenizer.decode(ids, skip_special_tokens=True)

    def run(self, prompts: list[list[int]], speculative: bool = True, seed: int = 0) -> RunResult:
        """Generate for a batch of token-id prompts; speculative needs a draft head."""
        if speculative and self.draft is None:
            raise EagleError("speculative decoding needs a draft head (--draft), or use --no-spec")
        tree = self.tree_for(len(prompts)) if speculative else None
        speculative = tree is not None
        tokens, lengths = pad_prompts(prompts)
        cache_len = self.cache_len or -(-(tokens.shape[1] + self.max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
        check_prompt_fits(int(lengths.max()), cache_len)
        if tokens.shape[1] >= cache_len:  # the padding bucket would not fit: pad to the longest prompt
            tokens, lengths = pad_prompts(prompts, multiple=1)
        key = (tree, tokens.shape, cache_len)
        args = (tokens, lengths, jax.random.key(seed))
        compile_s = 0.0
        if key in self._compiled:
            self._compiled.move_to_end(key)
        else:
            while len(self._compiled) >= MAX_COMPILED:
                self._compiled.popitem(last=False)
            start = time.perf_counter()
            self._compiled[key] = self._lower(tree, cache_len, *args).compile()
            compile_s = time.perf_counter() - start
        start = time.perf_counter()
        out = jax.block_until_ready(self._compiled[key](*self._arguments(speculative), *args))
        wall = time.perf_counter() - start
        out_tokens, counts = np.asarray(out.tokens), np.asarray(out.num_tokens)
        rows = [out_tokens[i, : counts[i]].tolist() for i in range(len(prompts))]
        assert all(PAD not in r for r in rows)
        if speculative:
            return RunResult(rows, wall, compile_s, np.asarray(out.rounds).tolist(), np.asarray(out.accept_histogram))
        return RunResult(rows, wall, compile_s, [0] * len(rows), np.zeros((len(rows), 0), np.int32))

    def _arguments(self, speculative: bool) -> tuple:
        if speculative:
            return (self.spec_params, self.draft[1])
        return (self.target.params,)

    def tree_for(self, batch: int) -> TreeConfig | None:
        """The draft tree for a batch of this size; None when the measured settings turn speculation off."""
        if not self.speculate:
            return None
        if self.batch_policy is None:
            return self.tree
        return tree_for_batch(self.tree, batch, self.batch_policy)

    def _lower(self, tree: TreeConfig | None, cache_len: int, tokens, lengths, rng):
        static = dict(
            max_new_tokens=self.max_new_tokens, cache_len=cache_len, sampling=self.sampling,
            stop_ids=self.target.stop_ids, attn_impl=self.attn_impl,
        )
        cfg = self.target.cfg
        speculative = tree is not None
        if speculative:
            dcfg = self.draft[0]
            fn = lambda p, dp, t, l, r: generate_spec_jit(p, cfg, dp, dcfg, t, l, r, tree=tree, **static)  # noqa: E731
        else:
            fn = lambda p, t, l, r: generate_ar_jit(p, cfg, t, l, r, **static)  # noqa: E731
        return jax.jit(fn).lower(*self._arguments(speculative), jnp.asarray(tokens), jnp.asarray(lengths), rng)
