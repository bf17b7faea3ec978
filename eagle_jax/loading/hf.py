"""Local Hugging Face model directories: config.json + one or many *.safetensors (with index)."""

from __future__ import annotations

import os

import numpy as np
from safetensors import safe_open

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json
from eagle_jax.loading.params import assemble_params

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def rope_from_hf(config: dict) -> RopeConfig:
    """RopeConfig from HF's `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5)."""
    scaling = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(scaling.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(scaling.get("factor", 1.0)),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position=int(scaling.get("original_max_position_embeddings", 8192)),
    )


REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def config_from_hf(config: dict, source: str) -> ModelConfig:
    supported = ", ".join(ARCHITECTURES)
    architectures = config.get("architectures")
    if not architectures or not isinstance(architectures, list):
        raise EagleError(f"{source}: config.json names no architecture (expected \"architectures\": [NAME] with one of {supported})")
    arch = architectures[0]
    if arch not in ARCHITECTURES:
        raise EagleError(f"{source}: unsupported architecture {arch}; supported: {supported}")
    missing = [key for key in REQUIRED_KEYS if not isinstance(config.get(key), int) or isinstance(config.get(key), bool)
               or config[key] < 1]
    if missing:
        raise EagleError(f"{source}: config.json lacks a positive integer {missing[0]!r}, which a {arch} config must give")
    family = ARCHITECTURES[arch]
    heads = config["num_attention_heads"]
    window = config.get("sliding_window")
    uses_window = family == "mistral" or config.get("use_sliding_window", False)
    eos = config.get("eos_token_id")
    return ModelConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        family=family,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope=rope_from_hf(config),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        max_position=config.get("max_position_embeddings", 8192),
        sliding_window=window if uses_window else None,
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
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
