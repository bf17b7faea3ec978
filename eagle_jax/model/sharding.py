"""How the target, the draft head and their caches split over a mesh (`eagle_jax.mesh`).

Inference, a ("data", "model") mesh, tensor parallel over "model" (matrices are (out, in)):
  * wq and wo by attention heads, wk and wv by KV heads (replicated where "model" does not divide
    the KV heads), w_gate, w_up and w_down by the MLP's hidden units;
  * the embedding and lm_head by the vocabulary, or by the hidden dimension where "model" does not
    divide the vocabulary; norms and the draft vocabulary map are replicated;
  * the draft head's layer the same way by its own heads, its embedding and lm_head by their
    vocabulary; its fc is replicated (split by its outputs it made XLA's SPMD partitioner abort at
    a model axis of 8 on CPU, jax 0.12.1);
  * KV caches (B, KV, S, D) by batch rows over "data" and by KV heads over "model"; every other
    per-row array of the decode loop by rows.
Training, a ("data", "fsdp") mesh: every param along its largest axis that "fsdp" divides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from eagle_jax.draft.config import DraftConfig
from eagle_jax.errors import EagleError
from eagle_jax.mesh import row_axes, row_count
from eagle_jax.model.config import ModelConfig
from eagle_jax.model.kv_cache import KVCache

MODEL = "model"
REPLICATED = PartitionSpec()


def model_size(mesh: Mesh) -> int:
    return int(mesh.shape.get(MODEL, 1))


def check_model_axis(cfg: ModelConfig, model: int) -> None:
    """Refuse (EagleError) a model axis that divides neither the heads nor the KV heads (since the
    heads are a multiple of the KV heads, one that does not divide the heads)."""
    if cfg.num_heads % model:
        fits = [m for m in range(1, cfg.num_heads + 1) if cfg.num_heads % m == 0]
        raise EagleError(f"a model axis of {model} divides neither the {cfg.num_heads} attention heads nor the "
                         f"{cfg.num_kv_heads} KV heads of the target; model sizes that would: {', '.join(map(str, fits))}")


def _split(axis: int, ndim: int) -> PartitionSpec:
    return PartitionSpec(*(MODEL if a == axis else None for a in range(ndim)))


def _layer_specs(layer: dict, heads: int, kv_heads: int, mlp: int, model: int, stacked: bool = False) -> dict:
    """Specs of one decoder layer's weights (the target's or the draft's); stacked: (L, ...) arrays
    of every layer (`transformer.stack_layers`), split as one layer's, the layer axis whole."""
    by = {"heads": heads % model == 0, "kv": kv_heads % model == 0, "mlp": mlp % model == 0}
    rules = {"wq": ("heads", 0), "bq": ("heads", 0), "wo": ("heads", 1), "wk": ("kv", 0), "bk": ("kv", 0), "wv": ("kv", 0),
             "bv": ("kv", 0), "w_gate": ("mlp", 0), "w_up": ("mlp", 0), "w_down": ("mlp", 1)}
    specs = {}
    for key, w in layer.items():
        unit, axis = rules.get(key, (None, None))
        if not (unit and model > 1 and by[unit]):
            specs[key] = REPLICATED
        else:
            specs[key] = PartitionSpec(None, *_split(axis, w.ndim - 1)) if stacked else _split(axis, w.ndim)
    return specs


def _vocabulary_spec(w, model: int) -> PartitionSpec:
    """A (V, d) embedding or lm_head: by the vocabulary, else by the hidden dimension."""
    for axis in (0, 1):
        if model > 1 and w.shape[axis] % model == 0:
            return _split(axis, 2)
    return REPLICATED


def target_specs(cfg: ModelConfig, params: dict, model: int) -> dict:
    """A PartitionSpec for every target parameter (the params pytree's structure)."""
    specs = {key: _vocabulary_spec(w, model) if key in ("embed", "lm_head") else REPLICATED
             for key, w in params.items() if key != "layers"}
    layer_specs = functools.partial(_layer_specs, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads, mlp=cfg.intermediate_size, model=model)
    layers = params["layers"]
    specs["layers"] = layer_specs(layers, stacked=True) if isinstance(layers, dict) else [layer_specs(layer) for layer in layers]
    return specs


def draft_specs(dcfg: DraftConfig, dparams: dict, model: int) -> dict:
    """A PartitionSpec for every draft-head parameter."""
    specs = {}
    for key, w in dparams.items():
        if key == "layer":
            specs[key] = _layer_specs(w, dcfg.num_heads, dcfg.num_kv_heads, dcfg.intermediate_size, model)
        elif key in ("embed", "lm_head"):
            specs[key] = _vocabulary_spec(w, model)
        else:
            specs[key] = REPLICATED
    return specs


def named(mesh: Mesh, specs) -> object:
    """NamedShardings on `mesh` for a pytree of PartitionSpecs."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def target_shardings(mesh: Mesh, cfg: ModelConfig, params: dict) -> dict:
    check_model_axis(cfg, model_size(mesh))
    return named(mesh, target_specs(cfg, params, model_size(mesh)))


def draft_shardings(mesh: Mesh, dcfg: DraftConfig, dparams: dict) -> dict:
    return named(mesh, draft_specs(dcfg, dparams, model_size(mesh)))


def check_rows(mesh: Mesh | None, batch: int) -> None:
    """Refuse (EagleError) a batch that the mesh's row axes do not split evenly."""
    ways = 1 if mesh is None else row_count(mesh)
    if batch % ways:
        raise EagleError(f"a batch of {batch} rows does not split over the mesh's {ways} data devices: "
                         f"pad it to a multiple of {ways} rows (the Engine does)")


def rows_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """A per-row array (B, ...) split by rows (a scalar: replicated)."""
    return NamedSharding(mesh, PartitionSpec(row_axes(mesh)) if ndim else REPLICATED)


def heads_spec(mesh: Mesh, kv_heads: int) -> PartitionSpec:
    """A cache layer (B, KV, S, D) by KV heads where "model" divides them; rows as they come."""
    return PartitionSpec(None, MODEL if model_size(mesh) > 1 and kv_heads % model_size(mesh) == 0 else None, None, None)


def _per_layer(cache: KVCache, spec: PartitionSpec, mesh: Mesh, lengths: NamedSharding) -> KVCache:
    """A KVCache of shardings: `spec` for each layer (B, KV, S, D), or for the stacked (L, ...) array."""
    if cache.stacked:
        layers = NamedSharding(mesh, PartitionSpec(None, *spec))
        return KVCache(layers, layers, lengths)
    layer = NamedSharding(mesh, spec)
    return KVCache(tuple(layer for _ in cache.k), tuple(layer for _ in cache.v), lengths)


def _kv_heads(cache: KVCache) -> int:
    return cache.k[0].shape[-3] if len(cache.k) else 0


def cache_shardings(mesh: Mesh, cache: KVCache) -> KVCache:
    """A KV cache (each layer (B, KV, S, D)) by rows over "data" and by KV heads over "model"."""
    spec = heads_spec(mesh, _kv_heads(cache))
    return _per_layer(cache, PartitionSpec(row_axes(mesh), *spec[1:]), mesh, rows_sharding(mesh, 1))


def constrain_caches(mesh: Mesh | None, tree):
    """Keep the KV caches in `tree` (a decode loop's state) split by KV heads over "model"
    (`heads_spec`); rows are split before, by `over_row_shards`. The identity without a mesh."""
    if mesh is None or model_size(mesh) == 1:
        return tree

    def constrain(x):
        if not isinstance(x, KVCache):
            return x
        shardings = _per_layer(x, heads_spec(mesh, _kv_heads(x)), mesh, NamedSharding(mesh, REPLICATED))
        return jax.lax.with_sharding_constraint(x, shardings)

    return jax.tree.map(constrain, tree, is_leaf=lambda x: isinstance(x, KVCache))


def over_row_shards(mesh: Mesh | None, fn: Callable, shared, rows, key: jax.Array):
    """fn(shared, rows, key) run on each "data" shard's rows alone, the "model" axis left to GSPMD.

    shared (params) is replicated over "data"; rows, every array (B, ...), and the outputs split by
    rows; a scalar output is the largest over the shards. Each shard draws from its own key (`key`
    folded with the shard's index), so sampled output follows the same law as on one device, not
    the same draws. Decoding runs its rows here so that nothing per row (the tree's top-k, which
    XLA's partitioner would gather across rows, acceptance, commit) leaves its shard. Without a
    mesh: fn(shared, rows, key); with one data shard, the same traced under the mesh, where the
    attention kernels find its "model" axis (`eagle_jax.model.attention`)."""
    if mesh is None:
        return fn(shared, rows, key)
    if row_count(mesh) == 1:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(shared, rows, key)
    check_rows(mesh, jax.tree.leaves(rows)[0].shape[0])
    axes = row_axes(mesh)
    traced = {}  # the output's structure and which leaves are scalars, recorded as fn is traced

    def local(shared, rows, key):
        out, traced["structure"] = jax.tree.flatten(fn(shared, rows, jax.random.fold_in(key, jax.lax.axis_index(axes))))
        traced["scalar"] = [x.ndim == 0 for x in out]
        return [jax.lax.pmax(x, axes)[None] if x.ndim == 0 else x for x in out]

    run = jax.shard_map(local, mesh=mesh, in_specs=(REPLICATED, PartitionSpec(axes), REPLICATED), out_specs=PartitionSpec(axes),
                        axis_names=set(axes), check_vma=False)
    out = run(shared, rows, key)
    return jax.tree.unflatten(traced["structure"], [x[0] if s else x for x, s in zip(out, traced["scalar"])])


def fsdp_spec(shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    """Training: the largest axis that "fsdp" divides (the last of equals); replicated where none does."""
    candidates = [(size, axis) for axis, size in enumerate(shape) if fsdp > 1 and size % fsdp == 0]
    if not candidates:
        return REPLICATED
    axis = max(candidates)[1]
    return PartitionSpec(*(("fsdp" if a == axis else None) for a in range(len(shape))))


def fsdp_shardings(mesh: Mesh, tree) -> object:
    """Training: NamedShardings for every leaf of a params-like pytree (arrays or ShapeDtypeStructs)."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, fsdp_spec(tuple(x.shape), fsdp)), tree)
