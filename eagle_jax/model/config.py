"""Static configuration of target models. Frozen dataclasses: hashable, passed to jit as static."""

from __future__ import annotations

import dataclasses

from eagle_jax.errors import EagleError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "linear", "llama3")
ATTENTION_IMPLS = ("auto", "xla", "pallas", "pallas_gpu_interpret", "pallas_tpu_interpret")  # see eagle_jax.model.attention
LAYER_FORMS = ("auto", "unrolled", "scan")  # how decoding runs the target's layers (`transformer.layer_form`)


def on_accelerator(platform: str | None = None) -> bool:
    """Whether `platform` (default: jax's default backend) is a GPU or a TPU."""
    if platform is None:
        import jax  # here, so that importing the configs (the CLI's flag parsing) does not load JAX

        platform = jax.default_backend()
    return platform in ("gpu", "cuda", "rocm", "tpu")


def check_attention(attention: str) -> None:
    if attention not in ATTENTION_IMPLS:
        raise EagleError(f"unknown attention implementation {attention!r}; expected one of {', '.join(ATTENTION_IMPLS)}")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base theta and optional scaling (HF `rope_scaling` semantics)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise EagleError(f"unsupported rope scaling type {self.rope_type!r}; supported: {', '.join(ROPE_TYPES)}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder-only target.

    family: llama (Llama 2/3/3.1, SmolLM2), mistral, qwen2 (qkv bias), qwen3 (q/k RMSNorm).
    attention: which implementation every attention call of the model runs (`eagle_jax.model.attention`);
    a switch of how to run, not of what is computed: replace it with `dataclasses.replace`.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    family: str = "llama"
    rms_norm_eps: float = 1e-5
    rope: RopeConfig = RopeConfig()
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position: int = 8192
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    attention: str = "auto"

    def __post_init__(self):
        check_attention(self.attention)
        if self.family not in FAMILIES:
            raise EagleError(f"unsupported model family {self.family!r}; supported: {', '.join(FAMILIES)}")
        if self.num_heads % self.num_kv_heads:
            raise EagleError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def eagle3_feature_layers(self) -> tuple[int, int, int]:
        """HF hidden-state indices fused by EAGLE-3: inputs of layers 2, N//2 and N-3."""
        n = self.num_layers
        return (2, n // 2, n - 3)
