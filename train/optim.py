"""Optimizer: AdamW (b1 0.9, b2 0.95) with linear warmup then linear or cosine decay to zero (or none),
global-norm clipping, and gradient accumulation through optax.MultiSteps."""

from __future__ import annotations

import dataclasses

import optax

from eagle_jax.errors import EagleError

SCHEDULES = ("linear", "cosine", "constant")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 5e-5  # EAGLE-3 reference peak
    total_steps: int = 1000  # optimizer updates; the schedule reaches zero here
    warmup_steps: int = 50
    schedule: str = "linear"
    b1: float = 0.9
    b2: float = 0.95
    weight_decay: float = 0.0
    clip_norm: float = 0.5  # 0 = no clipping
    grad_accum: int = 1  # micro-batches per update

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise EagleError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.lr <= 0 or self.total_steps < 1 or not 0 <= self.warmup_steps <= self.total_steps or self.grad_accum < 1:
            raise EagleError(
                f"need lr > 0, max steps >= 1, 0 <= warmup <= max steps and grad accumulation >= 1 "
                f"(got lr={self.lr}, steps={self.total_steps}, warmup={self.warmup_steps}, accum={self.grad_accum})"
            )


def learning_rate(cfg: OptimConfig) -> optax.Schedule:
    """Linear warmup from 0 to cfg.lr, then decay to 0 at cfg.total_steps (or, constant, none)."""
    decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
    if cfg.schedule == "constant":
        decay = optax.constant_schedule(cfg.lr)
    elif cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(cfg.lr, decay_steps)
    else:
        decay = optax.linear_schedule(cfg.lr, 0.0, decay_steps)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), decay], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Clip -> AdamW; with grad_accum > 1, wrapped so it applies the mean gradient every grad_accum calls."""
    chain = optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm) if cfg.clip_norm > 0 else optax.identity(),
        optax.adamw(learning_rate(cfg), b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay),
    )
    return optax.MultiSteps(chain, every_k_schedule=cfg.grad_accum) if cfg.grad_accum > 1 else chain
