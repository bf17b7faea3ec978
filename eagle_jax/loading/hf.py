"""Local Hugging Face model directories: config.json + safetensors or pytorch_model.bin weights (sharded with an index or not)."""

from __future__ import annotations

import contextlib
import functools
import json
import os

import numpy as np
from safetensors import safe_open

from eagle_jax.model.config import ROPE_TYPES, ModelConfig, RopeConfig
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json
from eagle_jax.loading.config_dict import PRETRAINED_CONFIG_KEYS, ConfigDict
from eagle_jax.loading.params import HostTensor, assemble_params
from eagle_jax.loading.torch_pickle import read_torch_file

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
}
MODEL_TYPES = {"gemma3": "gemma3_text"}  # a family's model_type where it is not the family's name


# rope_scaling / rope_parameters keys: what each implemented type reads, and the type's own name
ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                       "original_max_position_embeddings", "partial_rotary_factor"})


def rope_of(scaling: ConfigDict, theta: float) -> RopeConfig:
    """RopeConfig of one HF rope dict (`rope_scaling` or `rope_parameters`), theta where it has none;
    a rope type or key we do not compute (yarn, dynamic, longrope, mrope_section...) is refused."""
    theta = scaling.number("rope_theta", theta)
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise EagleError(f"{scaling.where}: rope type {json.dumps(rope_type)} is not supported (eagle-jax implements {', '.join(ROPE_TYPES)})")
    scaling.expect("partial_rotary_factor", 1.0, 1.0)
    scaling.refuse_unknown(ROPE_KEYS)
    if rope_type == "default":
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=scaling.number("factor", 1.0),
        low_freq_factor=scaling.number("low_freq_factor", 1.0),
        high_freq_factor=scaling.number("high_freq_factor", 4.0),
        original_max_position=scaling.integer("original_max_position_embeddings", 8192),
    )


def rope_from_hf(c: ConfigDict) -> RopeConfig:
    """RopeConfig from HF's `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5)."""
    key = "rope_parameters" if c.get("rope_parameters") is not None else "rope_scaling"
    c.get("rope_scaling")  # beside rope_parameters: the same setting under its transformers-4 name
    c.expect("partial_rotary_factor", 1.0, 1.0)
    return rope_of(ConfigDict(c.get(key, {}), f"{c.where} {key}"), c.number("rope_theta", 10000.0))


GEMMA_THETAS = {"full_attention": 1e6, "sliding_attention": 1e4}  # transformers' Gemma 3 defaults


def gemma_ropes_from_hf(c: ConfigDict) -> tuple[RopeConfig, RopeConfig]:
    """(global, local) ropes of a Gemma 3 config: `rope_parameters` per layer type (transformers 5),
    else rope_theta with `rope_scaling` for the global layers and rope_local_base_freq for the local."""
    thetas = {"full_attention": c.number("rope_theta", GEMMA_THETAS["full_attention"]),
              "sliding_attention": c.number("rope_local_base_freq", GEMMA_THETAS["sliding_attention"])}
    per_type = c.get("rope_parameters")
    if per_type is None:
        per_type = {"full_attention": c.get("rope_scaling") or {}}
    elif not isinstance(per_type, dict) or set(per_type) - set(GEMMA_THETAS):
        raise c.refuse("rope_parameters", f"a rope dict per layer type ({', '.join(GEMMA_THETAS)})")
    else:
        c.get("rope_scaling")
    ropes = {kind: rope_of(ConfigDict(per_type.get(kind) or {}, f"{c.where} rope_parameters.{kind}"), theta)
             for kind, theta in thetas.items()}
    return ropes["full_attention"], ropes["sliding_attention"]


REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Keys that do not change what a target computes: transformers' generic config attributes, and
# initializer_range, use_cache, attention_dropout (training), pretraining_tp (only slices the matmuls),
# max_window_layers (which layers slide: every layer is given the window, see sliding_window_of),
# SmolLM2's is_llama_config and transformers.js_config (metadata for other libraries).
TARGET_HARMLESS_KEYS = PRETRAINED_CONFIG_KEYS | {
    "initializer_range", "use_cache", "attention_dropout", "pretraining_tp", "max_window_layers",
    "is_llama_config", "transformers.js_config", "cache_implementation",
}
# Known keys of features we do not compute, refused when set (null or false is their absence).
UNIMPLEMENTED_KEYS = {
    "attn_logit_softcapping": "attention logit softcapping",
    "final_logit_softcapping": "final logit softcapping",
    "quantization_config": "quantized weights (load an unquantized checkpoint)",
    "use_mrope": "multimodal rotary embeddings",
    "rope_interleaved": "interleaved rotary embeddings",
    "logits_scaling": "scaled logits",
}


def sliding_window_of(c: ConfigDict, family: str, num_layers: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(window, sliding layers) as `ModelConfig` takes them: (None, None) for full attention. The
    layers are those layer_types names sliding_attention; without layer_types, Mistral slides in
    every layer (None) when sliding_window is set, Qwen2/3 (only with use_sliding_window) from
    layer max_window_layers on, Gemma 3 in all but every sliding_window_pattern-th layer."""
    layer_types = c.get("layer_types", None)
    kinds = ("full_attention", "sliding_attention")
    if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) != num_layers
                                    or any(t not in kinds for t in layer_types)):
        raise c.refuse("layer_types", f"a list of {num_layers} entries, each {' or '.join(kinds)}")
    window = c.integer("sliding_window", None)
    # transformers 5 writes Gemma's pattern as _sliding_window_pattern beside the layer_types it made of it
    pattern = c.integer("sliding_window_pattern", c.integer("_sliding_window_pattern", 6)) if family == "gemma3" else None
    qwen = family in ("qwen2", "qwen3")
    max_window_layers = c.integer("max_window_layers", num_layers, minimum=0) if qwen else None
    if qwen and not c.flag("use_sliding_window", False):  # transformers drops Qwen's window then, layer_types or not
        return None, None
    if layer_types is not None:
        sliding = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    elif family == "mistral":
        sliding = None
    elif family == "gemma3":
        sliding = tuple(i for i in range(num_layers) if (i + 1) % pattern)
    elif qwen:
        sliding = tuple(range(max_window_layers, num_layers))
    else:
        sliding = ()
    if sliding == ():
        return None, None
    if window is None:
        if layer_types is not None or family == "gemma3":
            raise c.refuse("sliding_window", "the window size of the sliding_attention layers")
        return None, None
    return window, sliding


def config_from_hf(config: dict, source: str) -> ModelConfig:
    """ModelConfig of a HF config.json. Every key is read, refused, or known to be harmless: a key
    that would change the model and that we do not compute is one error line naming it."""
    supported = ", ".join(ARCHITECTURES)
    c = ConfigDict(config, f"{source}/config.json")
    architectures = c.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise EagleError(f"{c.where} names no architecture (expected \"architectures\": [NAME] with one of {supported})")
    arch = architectures[0]
    if arch not in ARCHITECTURES:
        raise EagleError(f"{c.where}: unsupported architecture {arch}; supported: {supported}")
    family = ARCHITECTURES[arch]
    expected_type = MODEL_TYPES.get(family, family)
    model_type = c.get("model_type", expected_type)
    if model_type != expected_type:
        raise EagleError(f"{c.where}: model_type {json.dumps(model_type)} does not match architecture {arch} (model_type {expected_type})")
    vocab, hidden, intermediate, layers, heads = (c.integer(key) for key in REQUIRED_KEYS)
    gemma = family == "gemma3"
    if gemma:
        for key in ("hidden_activation", "hidden_act"):
            c.expect(key, "gelu_pytorch_tanh", "gelu_pytorch_tanh")
        c.expect("use_bidirectional_attention", False, False)
        c.expect("partial_rotary_factor", 1.0, 1.0)
        rope, local_rope = gemma_ropes_from_hf(c)
        head_dim = c.integer("head_dim", 256)
        query_scale = c.number("query_pre_attn_scalar", 256) ** -0.5
    else:
        c.expect("hidden_act", "silu", "silu")
        rope, local_rope = rope_from_hf(c), None
        head_dim = c.integer("head_dim", max(hidden // heads, 1))
        query_scale = None
    c.expect("mlp_bias", False, False)
    if family != "qwen2":  # Qwen2 always has q/k/v biases and no attention_bias key
        c.expect("attention_bias", False, False)  # it would also put a bias on o_proj
    for key, feature in UNIMPLEMENTED_KEYS.items():
        if c.get(key) not in (None, False):
            raise EagleError(f"{c.where}: {key}={json.dumps(c.values[key])} asks for {feature}, which eagle-jax does not implement")
    window, sliding_layers = sliding_window_of(c, family, layers)
    bos = c.token_ids("bos_token_id", vocab)
    if len(bos) > 1:
        raise c.refuse("bos_token_id", f"one token id from 0 to {vocab - 1}")
    cfg = ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=c.integer("num_key_value_heads", heads),
        head_dim=head_dim,
        family=family,
        rms_norm_eps=c.number("rms_norm_eps", 1e-6),
        rope=rope,
        local_rope=local_rope,
        query_scale=query_scale,
        embed_scale=hidden**0.5 if gemma else 1.0,
        mlp_activation="gelu_tanh" if gemma else "silu",
        sandwich_norms=gemma,
        tie_embeddings=c.flag("tie_word_embeddings", gemma),
        qkv_bias=family == "qwen2",
        qk_norm=family in ("qwen3", "gemma3"),
        max_position=c.integer("max_position_embeddings", 131072 if gemma else 8192),
        sliding_window=window,
        sliding_layers=sliding_layers,
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=c.token_ids("eos_token_id", vocab),
    )
    c.refuse_unknown(TARGET_HARMLESS_KEYS)
    return cfg


def weight_files(directory: str, suffix: str, index_name: str) -> list[str]:
    """The directory's weight files ending in suffix: those its index names, else all of them."""
    index = os.path.join(directory, index_name)
    if os.path.exists(index):
        weight_map = read_json(index, what="a weight index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise EagleError(f"{index}: expected a \"weight_map\" from weight names to file names")
        return sorted(set(weight_map.values()))
    return sorted(f for f in os.listdir(directory) if f.endswith(suffix))


def weight_sources(directory: str) -> dict[str, HostTensor]:
    """Every tensor of a directory, unread: its *.safetensors files (each tensor read on its own when
    asked), else its pytorch_model*.bin files (read without torch, a whole file at a time), each set
    sharded by an index or not."""
    files = weight_files(directory, ".safetensors", "model.safetensors.index.json")
    bins = not files
    if bins:
        files = weight_files(directory, ".bin", "pytorch_model.bin.index.json")
    if not files:
        raise EagleError(f"{directory}: no weights found (expected *.safetensors or pytorch_model*.bin files)")
    sources = {}
    for name in files:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise EagleError(f"missing weight file {path} (named in the index)")
        found = {k: HostTensor.of(v) for k, v in read_torch_file(path).items()} if bins else safetensors_sources(path)
        for key, source in found.items():
            if key in sources:
                raise EagleError(f"{directory}: weight {key} appears in two files")
            sources[key] = source
    return sources


def read_weights(directory: str) -> dict[str, np.ndarray]:
    """All tensors of a directory (see weight_sources), read, in their files' dtypes."""
    return {key: source.read() for key, source in weight_sources(directory).items()}


def safetensors_sources(path: str) -> dict[str, HostTensor]:
    def read(key: str) -> np.ndarray:
        with safetensors_file(path) as f:
            return f.get_tensor(key)

    with safetensors_file(path) as f:
        return {key: HostTensor(tuple(f.get_slice(key).get_shape()), functools.partial(read, key)) for key in f.keys()}


@contextlib.contextmanager
def safetensors_file(path: str):
    try:
        with safe_open(path, framework="numpy") as f:
            yield f
    except EagleError:
        raise
    except Exception as e:  # safetensors raises its own error types for corrupt headers and data
        raise EagleError(f"cannot read {path}: {e}") from None


def load_hf_directory(directory: str) -> tuple[ModelConfig, dict]:
    """(config, params of unread HostTensors) of a HF checkpoint directory, without torch."""
    source = directory
    cfg = config_from_hf(read_json(os.path.join(directory, "config.json"), what="a Hugging Face model config"), source)
    tensors = {k.removeprefix("model."): v for k, v in weight_sources(directory).items()}

    def get(name):
        if name not in tensors:
            raise EagleError(f"{source}: missing weight {name}")
        return tensors[name]

    names = {
        "attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
        "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
        "wo": "self_attn.o_proj.weight", "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
        "w_down": "mlp.down_proj.weight", "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
        "bv": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    }
    if cfg.sandwich_norms:  # Gemma: post_attention_layernorm is the attention output's, the MLP's input norm is pre_
        names |= {"post_attn_norm": "post_attention_layernorm.weight", "mlp_norm": "pre_feedforward_layernorm.weight",
                  "post_mlp_norm": "post_feedforward_layernorm.weight"}
    norm = plus_one if cfg.family == "gemma3" else (lambda t: t)
    layers = []
    for i in range(cfg.num_layers):
        prefix = f"layers.{i}."
        layers.append({k: norm(get(prefix + n)) if k.endswith("norm") else get(prefix + n)
                       for k, n in names.items() if prefix + n in tensors})
    lm_head = None if cfg.tie_embeddings else get("lm_head.weight")
    return cfg, assemble_params(cfg, get("embed_tokens.weight"), norm(get("norm.weight")), lm_head, layers, source)


def plus_one(norm: HostTensor) -> HostTensor:
    """A Gemma norm weight w as the scale it stands for, 1 + w (in float32)."""
    return HostTensor(norm.shape, lambda: norm.read().astype(np.float32) + 1.0)
