"""What eagle-jax keeps on disk between runs, under $EAGLE_JAX_CACHE (default ~/.cache/eagle-jax;
EAGLE_JAX_CACHE=off keeps nothing):

  converted/  GGUF models converted to float32 weights (eagle_jax.loading.converted);
  xla/        compiled programs: JAX's persistent compilation cache, which the command line turns on.
"""

from __future__ import annotations

import os

import jax


def cache_root() -> str | None:
    root = os.environ.get("EAGLE_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "eagle-jax"))
    return None if root == "off" else root


def enable_compilation_cache() -> str | None:
    """Keep compiled programs (those that took at least jax_persistent_cache_min_compile_time_secs,
    1 s by default, to compile) in cache_root()/xla, so that a later run with the same model, head,
    tree and shapes loads its executables instead of compiling them again.

    A cache directory already configured for JAX (JAX_COMPILATION_CACHE_DIR) is kept. Returns the
    directory in use, or None when there is none. JAX reads an entry cut short by a killed process
    as a miss (it warns and compiles); deleting the directory clears the cache.
    """
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return configured
    root = cache_root()
    if root is None:
        return None
    path = os.path.join(root, "xla")
    jax.config.update("jax_compilation_cache_dir", path)
    return path
