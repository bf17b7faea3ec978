"""Static configuration of target models. Frozen dataclasses: hashable, passed to jit as static."""

from __future__ import annotations

import dataclasses

from eagle_jax.errors import EagleError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")  # of the gated MLP (`layers.gated_mlp`)
ROPE_TYPES = ("default", "linear", "llama3")
ATTENTION_IMPLS = ("auto", "xla", "pallas", "pallas_mosaic_gpu", "pallas_triton",  # see eagle_jax.model.attention
                   "pallas_mosaic_gpu_interpret", "pallas_gpu_interpret", "pallas_tpu_interpret")
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

    family: llama (Llama 2/3/3.1, SmolLM2), mistral, qwen2 (qkv bias), qwen3 (q/k RMSNorm), gemma3
    (q/k norms, norms after attention and MLP too, GeGLU, scaled embeddings, sliding-window and
    global layers with their own rope bases).
    sliding_window: the window of sliding layers (a query at position p sees keys above p - window);
    sliding_layers: which layers slide (None: every layer, as in Mistral); local_rope: the rope of
    sliding layers (None: `rope`).
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
    sliding_layers: tuple[int, ...] | None = None
    local_rope: RopeConfig | None = None
    query_scale: float | None = None  # attention score scale; None: head_dim ** -0.5
    embed_scale: float = 1.0  # the embeddings' multiplier (Gemma: sqrt(hidden_size))
    mlp_activation: str = "silu"
    sandwich_norms: bool = False  # norms of the attention and MLP outputs too (post_attn_norm, post_mlp_norm)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    attention: str = "auto"

    def __post_init__(self):
        check_attention(self.attention)
        if self.family not in FAMILIES:
            raise EagleError(f"unsupported model family {self.family!r}; supported: {', '.join(FAMILIES)}")
        if self.num_heads % self.num_kv_heads:
            raise EagleError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise EagleError(f"unsupported MLP activation {self.mlp_activation!r}; supported: {', '.join(MLP_ACTIVATIONS)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise EagleError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.sliding_layers is not None and any(not 0 <= i < self.num_layers for i in self.sliding_layers):
            raise EagleError(f"sliding layers {self.sliding_layers} out of range [0, {self.num_layers})")

    def layer_window(self, i: int) -> int | None:
        """The attention window of layer i, None where it attends to everything before it."""
        if self.sliding_window is None or (self.sliding_layers is not None and i not in self.sliding_layers):
            return None
        return self.sliding_window

    def layer_rope(self, i: int) -> RopeConfig:
        return self.local_rope if self.local_rope is not None and self.layer_window(i) is not None else self.rope

    @property
    def eagle3_feature_layers(self) -> tuple[int, int, int]:
        """HF hidden-state indices fused by EAGLE-3: inputs of layers 2, N//2 and N-3."""
        n = self.num_layers
        return (2, n // 2, n - 3)
