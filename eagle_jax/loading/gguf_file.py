"""GGUF files (llama.cpp): read, dequantize each tensor when it is placed, undo the q/k row permutation."""

from __future__ import annotations

import functools

import numpy as np

from eagle_jax.model.config import ModelConfig, RopeConfig
from eagle_jax.errors import EagleError
from eagle_jax.loading.params import HostTensor, assemble_params

# GGUF architecture -> (our family, whether llama.cpp permuted the q/k rows at conversion)
DEQUANTIZE_BYTES = 8 << 20  # quantized bytes dequantized at once
ARCHITECTURES = {"llama": ("llama", True), "mistral": ("mistral", True), "qwen2": ("qwen2", False), "qwen3": ("qwen3", False),
                 "gemma3": ("gemma3", False)}
# What llama.cpp fixes for Gemma 3 rather than writing into the file: every sixth layer global, the
# others sliding with rope base 10000; the query scale 1/sqrt(head_dim), but 1/sqrt(hidden / heads)
# for the 27B (62 layers). Its norm weights are stored as the scale (1 + w), as our params hold them.
GEMMA3_GLOBAL_EVERY, GEMMA3_LOCAL_THETA, GEMMA3_27B_LAYERS = 6, 10000.0, 62


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
    layers = field(reader, f"{arch}.block_count")
    gemma = family == "gemma3"
    scaling = field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise EagleError(f"{source}: rope scaling {scaling!r} is not supported (eagle-jax reads linear scaling from GGUF files)")
    rope = RopeConfig(theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)))
    if scaling == "linear":
        rope = RopeConfig(theta=rope.theta, rope_type="linear", factor=float(field(reader, f"{arch}.rope.scaling.factor", 1.0)))
    window = field(reader, f"{arch}.attention.sliding_window")
    family_fields = {}
    if gemma:
        family_fields = dict(
            sliding_window=window, sliding_layers=tuple(i for i in range(layers) if (i + 1) % GEMMA3_GLOBAL_EVERY),
            local_rope=RopeConfig(theta=GEMMA3_LOCAL_THETA), embed_scale=hidden**0.5, mlp_activation="gelu_tanh",
            sandwich_norms=True, query_scale=(hidden / heads if layers == GEMMA3_27B_LAYERS else head_dim) ** -0.5,
        )
    elif window is not None:
        family_fields = dict(sliding_window=window)
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=field(reader, f"{arch}.feed_forward_length"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        family=family,
        rms_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope=rope,
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        max_position=field(reader, f"{arch}.context_length", 8192),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (eos,),
        **family_fields,
    )


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's rotary row permutation of a q/k weight (out, in) for num_heads heads."""
    out = w.shape[0]
    return w.reshape(num_heads, out // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str) -> tuple[ModelConfig, dict]:
    """(config, params of unread HostTensors) of a .gguf file: each tensor is dequantized to float32
    (and its q/k rows unpermuted) when it is read."""
    import gguf

    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    _, permuted = ARCHITECTURES[field(reader, "general.architecture")]
    tensors = {t.name: t for t in reader.tensors}

    def dequantized(t, heads: int | None) -> np.ndarray:
        shape = tuple(int(n) for n in reversed(t.shape))  # numpy order: (out, in)
        w = np.empty(shape, np.float32)
        step = max(1, DEQUANTIZE_BYTES // max(1, t.data[:1].nbytes)) if t.data.ndim > 1 else len(t.data)
        try:  # a block of rows at a time: the dequantizer's temporaries are several times its output
            for start in range(0, max(len(t.data), 1), step):
                w[start:start + step] = gguf.quants.dequantize(t.data[start:start + step], t.tensor_type).reshape(w[start:start + step].shape)
        except NotImplementedError:
            raise EagleError(f"{path}: tensor {t.name} has unsupported type {t.tensor_type.name}") from None
        return w if heads is None else unpermute_rows(w, heads)

    def get(name: str, heads: int | None = None) -> HostTensor:
        if name not in tensors:
            raise EagleError(f"{path}: missing tensor {name}")
        t = tensors[name]
        return HostTensor(tuple(int(n) for n in reversed(t.shape)), functools.partial(dequantized, t, heads))

    names = {
        "attn_norm": "attn_norm", "mlp_norm": "ffn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
        "wo": "attn_output", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
        "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
        "post_attn_norm": "post_attention_norm", "post_mlp_norm": "post_ffw_norm",
    }
    layers = []
    for i in range(cfg.num_layers):
        layer = {}
        for key, name in names.items():
            full = f"blk.{i}.{name}" + ("" if name.endswith(".bias") else ".weight")
            if full in tensors:
                heads = {"wq": cfg.num_heads, "wk": cfg.num_kv_heads}.get(key) if permuted else None
                layer[key] = get(full, heads)
        layers.append(layer)
    lm_head = None if cfg.tie_embeddings else get("output.weight")
    return cfg, assemble_params(cfg, get("token_embd.weight"), get("output_norm.weight"), lm_head, layers, path)
