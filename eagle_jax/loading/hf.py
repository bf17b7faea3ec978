"""Local Hugging Face model directories: config.json + one or many *.safetensors (with index)."""

from __future__ import annotations

import os

import numpy as np
from safetensors import safe_open

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json
from eagle_jax.loading.config_dict import ConfigDict
from eagle_jax.loading.params import assemble_params

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def rope_from_hf(c: ConfigDict) -> RopeConfig:
    """RopeConfig from HF's `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5)."""
    key = "rope_parameters" if c.get("rope_parameters") is not None else "rope_scaling"
    scaling = ConfigDict(c.get(key, {}), f"{c.where} {key}")
    theta = scaling.number("rope_theta", c.number("rope_theta", 10000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
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


REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def config_from_hf(config: dict, source: str) -> ModelConfig:
    supported = ", ".join(ARCHITECTURES)
    c = ConfigDict(config, f"{source}/config.json")
    architectures = c.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise EagleError(f"{c.where} names no architecture (expected \"architectures\": [NAME] with one of {supported})")
    arch = architectures[0]
    if arch not in ARCHITECTURES:
        raise EagleError(f"{c.where}: unsupported architecture {arch}; supported: {supported}")
    vocab, hidden, intermediate, layers, heads = (c.integer(key) for key in REQUIRED_KEYS)
    family = ARCHITECTURES[arch]
    uses_window = family == "mistral" or c.flag("use_sliding_window", False)
    window = c.integer("sliding_window", None)
    bos = c.token_ids("bos_token_id", vocab)
    if len(bos) > 1:
        raise c.refuse("bos_token_id", f"one token id from 0 to {vocab - 1}")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=c.integer("num_key_value_heads", heads),
        head_dim=c.integer("head_dim", max(hidden // heads, 1)),
        family=family,
        rms_norm_eps=c.number("rms_norm_eps", 1e-6),
        rope=rope_from_hf(c),
        tie_embeddings=c.flag("tie_word_embeddings", False),
        qkv_bias=family == "qwen2" or c.flag("attention_bias", False),
        qk_norm=family == "qwen3",
        max_position=c.integer("max_position_embeddings", 8192),
        sliding_window=window if uses_window else None,
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=c.token_ids("eos_token_id", vocab),
    )


def read_safetensors(directory: str) -> dict[str, np.ndarray]:
    """All tensors of a directory's *.safetensors files (sharded via model.safetensors.index.json)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(read_json(index, what="a safetensors index")["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise EagleError(f"{directory}: no *.safetensors weights found")
    tensors = {}
    for name in files:
        path = os.path.join(directory, name)
        try:
            with safe_open(path, framework="numpy") as f:
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except FileNotFoundError:
            raise EagleError(f"missing weight file {path} (named in the index)") from None
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise EagleError(f"cannot read {path}: {e}") from None
    return tensors


def load_hf_directory(directory: str, dtype) -> tuple[ModelConfig, dict]:
    """(config, params) of a Llama-family HF checkpoint directory, without torch."""
    source = directory
    cfg = config_from_hf(read_json(os.path.join(directory, "config.json"), what="a Hugging Face model config"), source)
    tensors = read_safetensors(directory)
    tensors = {k.removeprefix("model."): v for k, v in tensors.items()}

    def get(name):
        if name not in tensors:
            raise EagleError(f"{source}: missing weight {name}")
        return np.asarray(tensors[name], np.float32)

    names = {
        "attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
        "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
        "wo": "self_attn.o_proj.weight", "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
        "w_down": "mlp.down_proj.weight", "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias",
        "bv": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    }
    layers = []
    for i in range(cfg.num_layers):
        prefix = f"layers.{i}."
        layers.append({k: get(prefix + n) for k, n in names.items() if prefix + n in tensors})
    lm_head = None if cfg.tie_embeddings else get("lm_head.weight")
    params = assemble_params(cfg, get("embed_tokens.weight"), get("norm.weight"), lm_head, layers, dtype, source)
    return cfg, params
