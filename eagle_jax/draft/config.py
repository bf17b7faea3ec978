"""Static configuration of a draft head."""

from __future__ import annotations

import dataclasses

from eagle_jax.model.config import ModelConfig, RopeConfig, check_attention
from eagle_jax.errors import EagleError

KINDS = ("eagle1", "eagle3")


@dataclasses.dataclass(frozen=True)
class DraftConfig:
    """One-decoder-layer draft head.

    kind "eagle1" (EAGLE-1/2): fc(concat(embed, post-norm target feature)) -> decoder layer without
    input norm -> the target's lm_head, no final norm.
    kind "eagle3": fc(concat(low, mid, high target features)) -> attention over
    concat(norm(embed), norm(hidden)) -> own final norm and lm_head over a draft vocabulary that
    d2t maps back to target ids. EAGLE-3.1: fc_norm (an RMSNorm per fused feature before fc) and
    norm_output (the post-norm hidden is fed back and read by lm_head).
    """

    kind: str
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    target_hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope: RopeConfig = RopeConfig()
    feature_layers: tuple[int, ...] = ()  # eagle3: HF hidden-state indices fused, low -> high
    fc_bias: bool = False  # eagle1: the fc has a bias (EAGLE-1 default true, LLaMA-3 heads false)
    fc_norm: bool = False  # EAGLE-3.1: RMSNorm on each fused feature before fc
    norm_before_fc: bool = False  # speculators: one RMSNorm over the whole fused concat
    norm_output: bool = False  # EAGLE-3.1: feed back the post-norm hidden
    norm_before_residual: bool = False  # speculators: the residual is the normed hidden
    attention: str = "auto"  # how its attention runs, as `ModelConfig.attention`; not saved with the head

    def __post_init__(self):
        check_attention(self.attention)
        if self.kind not in KINDS:
            raise EagleError(f"unknown draft kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if self.fc_norm and self.norm_before_fc:
            raise EagleError("fc_norm and norm_before_fc are mutually exclusive")
        if self.kind == "eagle1":
            if self.draft_vocab_size != self.target_vocab_size:
                raise EagleError("an eagle1 head uses the target's lm_head: draft_vocab_size must equal target_vocab_size")
            if self.hidden_size != self.target_hidden_size:
                raise EagleError("an eagle1 head must have the target's hidden size")
            if self.fc_norm or self.norm_before_fc or self.norm_output or self.norm_before_residual or self.feature_layers:
                raise EagleError("fc_norm, norm_before_fc, norm_output, norm_before_residual and feature_layers apply to eagle3 heads only")
        elif len(self.feature_layers) != 3:
            raise EagleError(f"an eagle3 head fuses 3 target layers, got feature_layers={self.feature_layers}")

    @property
    def maps_vocab(self) -> bool:
        """True when draft ids differ from target ids (a reduced draft vocabulary)."""
        return self.draft_vocab_size != self.target_vocab_size

    def check_target(self, target: ModelConfig) -> None:
        """Raise a one-line error if this head cannot serve `target`."""
        if self.target_hidden_size != target.hidden_size:
            raise EagleError(f"draft head expects target hidden size {self.target_hidden_size}, target has {target.hidden_size}")
        if self.target_vocab_size != target.vocab_size:
            raise EagleError(f"draft head expects target vocab {self.target_vocab_size}, target has {target.vocab_size}")
        if any(not 0 <= i < target.num_layers for i in self.feature_layers):
            raise EagleError(f"draft head fuses target layers {self.feature_layers}, target has {target.num_layers} layers")

    @classmethod
    def for_target(cls, target: ModelConfig, kind: str = "eagle3", draft_vocab_size: int | None = None, **overrides) -> "DraftConfig":
        """A head sized like the target (one of its decoder layers); EAGLE-3 fuses layers 2, N//2, N-3."""
        fields = dict(
            kind=kind,
            hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            target_hidden_size=target.hidden_size,
            target_vocab_size=target.vocab_size,
            draft_vocab_size=target.vocab_size if kind == "eagle1" else (draft_vocab_size or target.vocab_size),
            rms_norm_eps=target.rms_norm_eps,
            rope=RopeConfig(theta=target.rope.theta) if kind == "eagle1" else RopeConfig(),
            feature_layers=target.eagle3_feature_layers if kind == "eagle3" else (),
        )
        fields.update(overrides)
        return cls(**fields)
