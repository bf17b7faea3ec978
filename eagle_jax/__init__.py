"""eagle-jax: lossless speculative decoding with EAGLE draft heads, in JAX.

The public API, importable from here (each name is loaded on first use, so that importing
`eagle_jax` stays cheap):

    target = eagle_jax.load_target("smollm2-135m-instruct")
    dcfg, dparams = eagle_jax.load_draft(eagle_jax.default_head_dir("smollm2-135m-instruct"), target.cfg)
    out = eagle_jax.generate_spec_jit(target.params, target.cfg, dparams, dcfg, tokens, lengths, rng, ...)

On a device mesh (docs/mesh.md): `mesh = eagle_jax.make_mesh(eagle_jax.parse_mesh("data=2,model=4"))`,
params placed with `eagle_jax.place(params, eagle_jax.target_shardings(mesh, cfg, params))`, prompts
with `eagle_jax.rows_sharding`, and `mesh=mesh` passed to `generate_spec` / `generate_ar`.

Subpackages: `model` (the target: config, layers, attention, KV cache, sharding, transformer), `decoding`
(plain, tree, lookup, acceptance, sampling, speculative), `draft` (heads and their checkpoints),
`loading` (targets from built-in names, HF directories and GGUF files), `infer` (engine, CLI,
benchmark), `train`, `kernels_pallas`; `mesh` (device meshes and placing arrays on them).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EagleError": "eagle_jax.errors",
    "ModelConfig": "eagle_jax.model.config",
    "RopeConfig": "eagle_jax.model.config",
    "DraftConfig": "eagle_jax.draft.config",
    "TreeConfig": "eagle_jax.decoding.tree",
    "SamplingConfig": "eagle_jax.decoding.sampling",
    "TargetModel": "eagle_jax.loading.registry",
    "load_target": "eagle_jax.loading.registry",
    "default_head_dir": "eagle_jax.loading.registry",
    "load_draft": "eagle_jax.draft.checkpoint",
    "export_draft": "eagle_jax.draft.checkpoint",
    "pad_prompts": "eagle_jax.decoding.prompts",
    "generate_ar": "eagle_jax.decoding.plain",
    "generate_ar_jit": "eagle_jax.decoding.plain",
    "GenerateOutput": "eagle_jax.decoding.plain",
    "generate_spec": "eagle_jax.decoding.speculative",
    "generate_spec_jit": "eagle_jax.decoding.speculative",
    "backend_layout": "eagle_jax.model.cpu_layout",
    "SpecOutput": "eagle_jax.decoding.speculative",
    "Engine": "eagle_jax.infer.engine",
    "make_mesh": "eagle_jax.mesh",
    "parse_mesh": "eagle_jax.mesh",
    "place": "eagle_jax.mesh",
    "target_shardings": "eagle_jax.model.sharding",
    "draft_shardings": "eagle_jax.model.sharding",
    "rows_sharding": "eagle_jax.model.sharding",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'eagle_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
