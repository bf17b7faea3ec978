"""A loaded target (and optional draft head) with compiled plain and speculative generate.

Used by the CLI, the benchmark harness and the notebook. `run(prompts, tree=...)` decodes with that
draft tree, or plainly when `tree` is None: the caller decides (for the head's saved settings,
`infer.settings.TreeChoice.for_batch`). Compilation is done ahead of time per tree and shape
bucket, so `run` reports compile time and decode wall time separately.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import NamedTuple

import jax
import jinja2
import numpy as np
from jax.sharding import Mesh

from eagle_jax.draft.config import DraftConfig
from eagle_jax.errors import EagleError
from eagle_jax.decoding.plain import generate_ar_jit
from eagle_jax.decoding.prompts import FINISH_REASONS, PAD, check_prompt_fits, pad_prompts
from eagle_jax.loading import TargetModel
from eagle_jax.mesh import compiled_bytes, device_memory, place, replicated, row_count, to_host
from eagle_jax.model.sharding import check_model_axis, draft_shardings, model_size, rows_sharding, target_shardings
from eagle_jax.model.cpu_layout import backend_layout
from eagle_jax.model.transformer import is_stacked, layer_form, stack_layers, unstack_layers
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
    finish_reasons: list[str]  # why each row ended: "stop", "max_new_tokens" or "cache_full" (FINISH_REASONS)

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tau(self) -> float:
        """Mean tokens per round (accepted + 1): the first token, from prefill, is not a round's."""
        rounds = sum(self.rounds)
        return (self.new_tokens - len(self.tokens)) / rounds if rounds else float("nan")


def _bytes_on_one_device(x) -> int:
    return x.addressable_shards[0].data.nbytes if isinstance(x, jax.Array) else x.nbytes


class LaidOutParams(NamedTuple):
    """Target and head params as decoding runs them, with the params they were made from: laid out
    for the backend (`backend_layout`), or placed in shards on a mesh."""

    source: dict
    params: dict
    draft_source: dict | None
    dparams: dict | None
    mesh: Mesh | None = None
    layers: str = "unrolled"  # the target's layer form (`transformer.layer_form`)

    @classmethod
    def of(cls, target: TargetModel, draft: tuple[DraftConfig, dict] | None, mesh: Mesh | None, layers: str) -> "LaidOutParams":
        """Scanned layers (accelerators) are stacked, else on CPU the target keeps (in, out) copies
        for verify steps only where a head will verify. On a mesh every device receives only its
        shards (`eagle_jax.model.sharding`); a target loaded into them is used as it is. Params
        loaded in the other layer form are converted, a copy (`load_target(layers=)` avoids it)."""
        params, dparams = target.params, None if draft is None else draft[1]
        scan = layers == "scan"
        if is_stacked(params) != scan:
            params = stack_layers(params) if scan else unstack_layers(params)
        if mesh is not None:
            placed_head = None if draft is None else place(dparams, draft_shardings(mesh, *draft))
            placed = place(params, target_shardings(mesh, target.cfg, params))
            return cls(target.params, placed, dparams, placed_head, mesh, layers)
        laid_out_head = None if dparams is None else backend_layout(dparams)
        laid_out = params if scan else backend_layout(params, block_copies=dparams is not None)
        return cls(target.params, laid_out, dparams, laid_out_head, None, layers)

    def holds(self, params: dict, dparams: dict | None, mesh: Mesh | None, layers: str) -> bool:
        return self.source is params and self.draft_source is dparams and self.mesh is mesh and self.layers == layers


@dataclasses.dataclass
class Engine:
    target: TargetModel
    draft: tuple[DraftConfig, dict] | None = None  # (config, params); None: plain decoding only
    sampling: SamplingConfig = SamplingConfig()
    max_new_tokens: int = 256
    cache_len: int | None = None  # None: the smallest bucket that fits prompt + max_new_tokens
    attention: str = "auto"  # the attention implementation of target and head (`ModelConfig.attention`)
    mesh: Mesh | None = None  # a ("data", "model") mesh (`eagle_jax.mesh.make_mesh`); None: one device
    layers: str = "auto"  # the target's layers unrolled or scanned over (`transformer.layer_form`; auto: scan on GPU/TPU)
    # the params as decoding runs them (`backend_layout`), made once by the first engine and carried
    # over by dataclasses.replace, so engines that differ in settings share them (remade when the
    # replacement brings another target or head)
    laid_out: "LaidOutParams | None" = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise EagleError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft is not None:
            self.draft[0].check_target(self.target.cfg)
        if self.mesh is not None:
            check_model_axis(self.target.cfg, model_size(self.mesh))
        dparams = None if self.draft is None else self.draft[1]
        layers = layer_form(self.layers)
        if self.laid_out is None or not self.laid_out.holds(self.target.params, dparams, self.mesh, layers):
            self.laid_out = LaidOutParams.of(self.target, self.draft, self.mesh, layers)
        self._compiled = collections.OrderedDict()

    def release(self, *trees: TreeConfig | None) -> None:
        """Drop the compiled executables of `trees` (None among them: plain decoding's), or every one
        when no tree is given; they recompile on the next run."""
        for key in [k for k in self._compiled if not trees or k[0] in trees]:
            del self._compiled[key]

    def check_tree(self, tree: TreeConfig) -> None:
        """Refuse (EagleError) a tree this draft head and sampling cannot decode with."""
        if self.draft is None:
            raise EagleError("speculative decoding needs a draft head (--draft), or use --no-spec")
        check_draft(self.target.cfg, self.draft[0], tree, self.sampling)

    def encode_chat(self, messages: list[dict], raw: bool = False) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template, or of its raw text
        with what the tokenizer adds to a text of its own (Gemma's BOS)."""
        tok = self.target.tokenizer
        if raw:
            return tok.encode("".join(m["content"] for m in messages))
        if not tok.chat_template:
            raise EagleError(f"{self.target.source} has no chat template (a base model, such as gemma3-270m): "
                             "pass --raw to feed the prompt as raw text")
        try:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True)
        except jinja2.TemplateError as e:  # a broken template, or one that refuses this conversation
            line = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
            raise EagleError(f"the chat template of {tok.name_or_path} cannot render this conversation: "
                             f"{e.message}{line}; fix the template, or pass --raw for a raw-text prompt") from None
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def decode(self, ids: list[int]) -> str:
        return self.target.tokenizer.decode(ids, skip_special_tokens=True)

    def run(self, prompts: list[list[int]], *, tree: TreeConfig | None, seed: int = 0, pad_to: int = 64) -> RunResult:
        """Generate for a batch of token-id prompts, speculatively with draft tree `tree` (which
        needs a draft head), or plainly where `tree` is None. Prompts are padded to a multiple of
        `pad_to` (one compiled shape per multiple; pass the longest prompt's bound for one in all).
        On a mesh the batch is filled up to a multiple of its data axis with copies of the first
        prompt, whose answers are dropped."""
        n = len(prompts)
        tokens, lengths = pad_prompts(self._fill_rows(prompts), multiple=pad_to)
        cache_len = self._cache_len(tokens.shape[1], int(lengths.max()))
        check_prompt_fits(int(lengths.max()), cache_len)
        if tokens.shape[1] >= cache_len:  # the padding bucket would not fit: pad to the longest prompt
            tokens, lengths = pad_prompts(self._fill_rows(prompts), multiple=1)
        compile_s = self._compile(tree, tokens.shape, cache_len)
        inputs = (tokens, lengths, np.asarray(jax.random.key_data(jax.random.key(seed))))
        if self.mesh is not None:
            inputs = place(inputs, self._input_shardings())
        start = time.perf_counter()
        executable = self._compiled[(tree, tokens.shape, cache_len)]
        out = jax.block_until_ready(executable(*self._arguments(tree is not None), *inputs))
        wall = time.perf_counter() - start
        speculative = tree is not None
        out_tokens, counts, reasons, *spec = to_host((out.tokens, out.num_tokens, out.finish_reason)
                                                     + ((out.rounds, out.accept_histogram) if speculative else ()))
        rows = [out_tokens[i, : counts[i]].tolist() for i in range(n)]
        assert all(PAD not in r for r in rows)
        finished = [FINISH_REASONS[r] for r in reasons[:n]]
        if speculative:
            return RunResult(rows, wall, compile_s, spec[0][:n].tolist(), spec[1][:n], finished)
        return RunResult(rows, wall, compile_s, [0] * n, np.zeros((n, 0), np.int32), finished)

    def compile(self, tree: TreeConfig | None, batch: int, width: int) -> float:
        """Compile ahead of time what `run` uses for `batch` prompts padded to `width` tokens;
        returns the seconds it took (0 when it was compiled already)."""
        return self._compile(tree, (len(self._fill_rows([[0]] * batch)), width), self._cache_len(width, width))

    def _fill_rows(self, prompts: list[list[int]]) -> list[list[int]]:
        """The prompts and, on a mesh, copies of the first up to a multiple of its data axis."""
        ways = 1 if self.mesh is None else row_count(self.mesh)
        return prompts + [prompts[0]] * (-len(prompts) % ways)

    def _input_shardings(self) -> tuple:
        """Of prompt tokens (B, P), lengths (B,) and the key's data (2,): rows split over "data"."""
        return rows_sharding(self.mesh, 2), rows_sharding(self.mesh, 1), replicated(self.mesh)

    def _cache_len(self, width: int, longest: int) -> int:
        """Cache slots per row for prompts padded to `width` whose longest has `longest` tokens:
        `cache_len`, or the smallest bucket that holds `width` and max_new_tokens, within the
        model's positions. EagleError when prompt and answer cannot fit those positions."""
        limit = self.target.cfg.max_position
        where = f"the model's {limit} positions (max_position_embeddings)"
        if longest >= limit:
            raise EagleError(f"a prompt of {longest} tokens does not fit {where}; shorten it")
        if self.cache_len is not None:
            if self.cache_len > limit:
                raise EagleError(f"--cache-len {self.cache_len} exceeds {where}; give at most {limit}")
            return self.cache_len
        if longest + self.max_new_tokens > limit:
            raise EagleError(f"--max-new-tokens {self.max_new_tokens} after a prompt of {longest} tokens needs "
                             f"{longest + self.max_new_tokens} positions, more than {where}; give at most {limit - longest}")
        return min(-(-(width + self.max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET, limit)

    def _check_memory(self, tree: TreeConfig | None, batch: int, cache_len: int) -> None:
        """Refuse (EagleError), before compiling, caches that with the weights cannot fit one
        device's memory. An estimate from below: activations come on top."""
        cfg = self.target.cfg
        slots = cache_len + (tree.max_path if tree is not None else 0)
        per_slot = cfg.num_layers * cfg.num_kv_heads * cfg.head_dim  # K or V entries of one row's slot
        if tree is not None:  # the draft head's one-layer cache
            per_slot += self.draft[0].num_kv_heads * self.draft[0].head_dim
        ways = 1
        if self.mesh is not None:  # rows over "data", KV heads over "model" where it divides them
            ways = row_count(self.mesh) * (model_size(self.mesh) if cfg.num_kv_heads % model_size(self.mesh) == 0 else 1)
        itemsize = np.dtype(self.laid_out.params["embed"].dtype).itemsize
        cache = 2 * batch * slots * per_slot * itemsize // ways
        weights = sum(_bytes_on_one_device(x) for x in jax.tree.leaves((self.laid_out.params, self.laid_out.dparams)))
        memory = device_memory()
        if cache + weights > memory:
            gib = 2**30
            raise EagleError(
                f"the KV caches of {batch} row{'s' if batch > 1 else ''} x {slots} slots need {cache / gib:.1f} GiB per device and the weights "
                f"{weights / gib:.1f} GiB, more than the {memory / gib:.1f} GiB a device has; lower --max-new-tokens "
                "(or --cache-len) or --batch-size")

    def _compile(self, tree: TreeConfig | None, shape: tuple[int, int], cache_len: int) -> float:
        key = (tree, shape, cache_len)
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return 0.0
        if tree is not None:
            self.check_tree(tree)
        self._check_memory(tree, shape[0], cache_len)
        while len(self._compiled) >= MAX_COMPILED:
            self._compiled.popitem(last=False)
        start = time.perf_counter()
        inputs = (np.zeros(shape, np.int32), np.ones(shape[0], np.int32), np.asarray(jax.random.key_data(jax.random.key(0))))
        if self.mesh is not None:
            inputs = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s) for x, s in zip(inputs, self._input_shardings()))
        compiled = self._lower(tree, cache_len, *inputs).compile()
        need, memory = compiled_bytes(compiled), device_memory()
        if need is not None and need > memory:
            gib, rows = 2**30, f"{shape[0]} row{'s' if shape[0] > 1 else ''}"
            what = f"verifying {tree.size} tokens a round" if tree is not None else "plain decoding"
            flags = "--tree-nodes, --tree-lookup, " if tree is not None else ""
            raise EagleError(
                f"generating for {rows} with a cache of {cache_len} slots, {what}, needs {need / gib:.1f} GiB per device, "
                f"more than the {memory / gib:.1f} GiB a device has; lower {flags}--max-new-tokens (or --cache-len) or --batch-size")
        self._compiled[key] = compiled
        return time.perf_counter() - start

    def _arguments(self, speculative: bool) -> tuple:
        if speculative:
            return (self.laid_out.params, self.laid_out.dparams)
        return (self.laid_out.params,)

    def _lower(self, tree: TreeConfig | None, cache_len: int, tokens, lengths, key_data):
        static = dict(
            max_new_tokens=self.max_new_tokens, cache_len=cache_len, sampling=self.sampling,
            stop_ids=self.target.stop_ids, mesh=self.mesh,
        )
        cfg = dataclasses.replace(self.target.cfg, attention=self.attention)
        speculative = tree is not None
        if speculative:
            dcfg = dataclasses.replace(self.draft[0], attention=self.attention)
            fn = lambda p, dp, t, l, k: generate_spec_jit(p, cfg, dp, dcfg, t, l, jax.random.wrap_key_data(k), tree=tree, **static)  # noqa: E731
        else:
            fn = lambda p, t, l, k: generate_ar_jit(p, cfg, t, l, jax.random.wrap_key_data(k), **static)  # noqa: E731
        return jax.jit(fn).lower(*self._arguments(speculative), tokens, lengths, key_data)
