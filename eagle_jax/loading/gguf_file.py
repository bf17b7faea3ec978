"""GGUF files (llama.cpp): read, dequantize every tensor, undo the q/k row permutation."""

from __future__ import annotations

import numpy as np

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.errors import EagleError
from eagle_jax.loading.params import assemble_params

# GGUF architecture -> (our family, whether llama.cpp permuted the q/k rows at conversion)
ARCHITECTURES = {"llama": ("llama", True), "mistral": ("mistral", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False)}


def open_gguf(path: str):
    import gguf

    try:
        return gguf.GGUFReader(path)
    except FileNotFoundError:
        raise EagleError(f"missing file {path}") from None
    except Exception as e:  # the reader raises ValueError/struct errors on truncated or foreign files
        raise EagleError(f"{path} is not a readable GGUF file: {e}") from None


def field(reader, name: str, default=None):
    f = reader.fields.get(name)
    return default if f is None else f.contents()


def config_from_gguf(reader, source: str) -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise EagleError(f"{source}: unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}")
    family, _ = ARCHITECTURES[arch]
    heads = field(reader, f"{arch}.attention.head_count")
    hidden = field(reader, f"{arch}.embedding_length")
    vocab = field(reader, f"{arch}.vocab_size") or len(field(reader, "tokenizer.ggml.tokens"))
    head_dim = field(reader, f"{arch}.attention.key_length") or hidden // heads
    names = {t.name for t in reader.tensors}
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=field(reader, f"{arch}.feed_forward_length"),
        num_layers=field(reader, f"{arch}.block_count"),
        num_heads=heads,
        num_kv_heads=field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        family=family,
        rms_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope=RopeConfig(theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0))),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        max_position=field(reader, f"{arch}.context_length", 8192),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (eos,),
    )


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's rotary row permutation of a q/k weight (out, in) for num_heads heads."""
    out = w.shape[0]
    return w.reshape(num_heads, out // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str, dtype) -> tuple[ModelConfig, dict]:
    """(config, params) from a .gguf file; every tensor dequantized to float32 first."""
    import gguf

    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    _, permuted = ARCHITECTURES[field(reader, "general.architecture")]
    tensors = {}
    for t in reader.tensors:
        try:
            tensors[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        except NotImplementedError:
            raise EagleError(f"{path}: tensor {t.name} has unsupported type {t.tensor_type.name}") from None

    def get(name):
        if name not in tensors:
            raise EagleError(f"{path}: missing tensor {name}")
        return tensors[name]

    names = {
        "attn_norm": "attn_norm", "mlp_norm": "ffn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
        "wo": "attn_output", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
        "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
    }
    layers = []
    for i in range(cfg.num_layers):
        layer = {}
        for key, name in names.items():
            full = f"blk.{i}.{name}" + ("" if name.endswith(".bias") else ".weight")
            if full not in tensors:
                continue
            w = tensors[full]  # numpy order: (out, in) for matrices
            if permuted and key in ("wq", "wk"):
                w = unpermute_rows(w, cfg.num_heads if key == "wq" else cfg.num_kv_heads)
            layer[key] = w
        layers.append(layer)
    lm_head = None if cfg.tie_embeddings else get("output.weight")
    params = assemble_params(cfg, get("token_embd.weight"), get("output_norm.weight"), lm_head, layers, dtype, path)
    return cfg, params
