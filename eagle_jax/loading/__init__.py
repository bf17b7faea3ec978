"""Loading target models (HF directories, GGUF files, built-in names) and their tokenizers."""

from eagle_jax.loading.registry import TargetModel, load_target, resolve_model_path

__all__ = ["TargetModel", "load_target", "resolve_model_path"]
