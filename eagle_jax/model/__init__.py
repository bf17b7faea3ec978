"""The target model: static config, layers, the attention entry point, the KV cache, the transformer."""
