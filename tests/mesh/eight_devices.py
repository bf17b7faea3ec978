"""Decoding on 8 simulated CPU devices; tests/test_mesh.py runs this file in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag must be set before JAX starts).

Meshes 1 x 8, 2 x 4, 4 x 2 and 8 x 1 (data x model) on a tiny random target with 8 heads and 4 KV
heads (so that at model 8 the KV heads are replicated), EAGLE-1 and EAGLE-3.1 heads, rows of
different lengths: sharded greedy speculative == sharded greedy plain == one device; sampled
speculative output follows the target's law under a mesh; every device holds only its share of a
split parameter or cache."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from conftest import tiny_config
from eagle_jax import mesh as mesh_lib
from eagle_jax.decoding.plain import generate_ar, generate_ar_jit
from eagle_jax.decoding.prompts import pad_prompts
from eagle_jax.decoding.sampling import SamplingConfig
from eagle_jax.decoding.speculative import SpecConfig, SpecModels, generate_spec, generate_spec_jit, speculative_round, start
from eagle_jax.decoding.tree import TreeConfig
from eagle_jax.draft import DraftConfig, init_draft_params
from eagle_jax.errors import EagleError
from eagle_jax.infer.engine import Engine
from eagle_jax.loading import TargetModel
from eagle_jax.model import attention, sharding
from eagle_jax.model.transformer import init_params, stack_layers
from test_speculative import chi_square_p, exact_law

assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"

CFG = tiny_config(vocab_size=8, num_heads=8, num_kv_heads=4)
PARAMS = init_params(jax.random.key(0), CFG, scale=0.3)
HEADS = {"eagle1": dict(kind="eagle1"), "eagle3.1": dict(kind="eagle3", fc_norm=True, norm_output=True)}
ROWS = [[1, 2, 3, 4, 5], [7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3], [3], [5, 6, 7]]
MESHES = [(1, 8), (2, 4), (4, 2), (8, 1)]
TREE = TreeConfig(4, 3, 16)
KW = dict(max_new_tokens=40, cache_len=64, stop_ids=(7,))


def make_mesh(data: int, model: int):
    return mesh_lib.make_mesh({"data": data, "model": model})


@functools.cache
def head(name: str):
    dcfg = DraftConfig.for_target(CFG, **HEADS[name])
    return dcfg, init_draft_params(jax.random.key(1), dcfg, scale=0.3)


def prompts(data: int):
    """The 4 rows, twice where 8 devices split the rows."""
    return pad_prompts(ROWS * (2 if data > len(ROWS) else 1), multiple=16)


def placed(mesh, dcfg=None, dparams=None, rows=None):
    """Params, head and prompt rows placed on the mesh."""
    params = mesh_lib.place(PARAMS, sharding.target_shardings(mesh, CFG, PARAMS))
    dp = None if dcfg is None else mesh_lib.place(dparams, sharding.draft_shardings(mesh, dcfg, dparams))
    tokens, lengths = mesh_lib.place(rows, (sharding.rows_sharding(mesh, 2), sharding.rows_sharding(mesh, 1)))
    return params, dp, tokens, lengths


@functools.cache
def one_device_plain(rows: int) -> np.ndarray:
    tokens, lengths = pad_prompts(ROWS * (rows // len(ROWS)), multiple=16)
    return np.asarray(generate_ar_jit(PARAMS, CFG, tokens, lengths, jax.random.key(0), **KW).tokens)


@functools.cache
def sharded_plain(data: int, model: int) -> np.ndarray:
    mesh = make_mesh(data, model)
    params, _, tokens, lengths = placed(mesh, rows=prompts(data))
    return np.asarray(generate_ar_jit(params, CFG, tokens, lengths, jax.random.key(0), mesh=mesh, **KW).tokens)


@pytest.mark.parametrize("head_name", HEADS)
@pytest.mark.parametrize("data, model", MESHES)
def test_sharded_greedy_speculative_equals_sharded_plain_equals_one_device(data, model, head_name):
    mesh = make_mesh(data, model)
    rows = prompts(data)
    params, dparams, tokens, lengths = placed(mesh, *head(head_name), rows)
    spec = generate_spec_jit(params, CFG, dparams, head(head_name)[0], tokens, lengths, jax.random.key(0), tree=TREE, mesh=mesh, **KW)
    reference = one_device_plain(rows[0].shape[0])
    np.testing.assert_array_equal(sharded_plain(data, model), reference)
    np.testing.assert_array_equal(np.asarray(spec.tokens), reference)
    assert np.asarray(spec.accept_histogram)[:, 1:].sum() > 0  # rounds accepted draft tokens
    assert spec.tokens.sharding.spec == (P("data") if data > 1 else P())  # the output stays split by rows


KERNEL_MESHES = [(2, 4), (1, 4), (2, 2)]


@pytest.mark.parametrize("kernel", ["pallas_gpu_interpret", "pallas_tpu_interpret"])
@pytest.mark.parametrize("data, model", KERNEL_MESHES)
def test_the_kernels_on_model_shards_give_the_tokens_of_one_device(data, model, kernel):
    """The Pallas kernels in interpret mode as every attention of target and head, run per model
    shard under shard_map: sharded greedy speculative and plain decoding == one device under XLA."""
    mesh = make_mesh(data, model)
    cfg, (dcfg, dparams) = dataclasses.replace(CFG, attention=kernel), head("eagle3.1")
    dcfg = dataclasses.replace(dcfg, attention=kernel)
    rows = prompts(data)
    params, dp, tokens, lengths = placed(mesh, dcfg, dparams, rows)
    kw = KW | dict(max_new_tokens=16)
    spec = generate_spec_jit(params, cfg, dp, dcfg, tokens, lengths, jax.random.key(0), tree=TREE, mesh=mesh, **kw)
    plain = generate_ar_jit(params, cfg, tokens, lengths, jax.random.key(0), mesh=mesh, **kw)
    reference = one_device_plain(rows[0].shape[0])[:, :16]
    np.testing.assert_array_equal(np.asarray(plain.tokens), reference)
    np.testing.assert_array_equal(np.asarray(spec.tokens), reference)
    assert np.asarray(spec.accept_histogram)[:, 1:].sum() > 0


@pytest.mark.parametrize("data, model", [(2, 4), (1, 8)])
def test_scanned_layers_on_a_mesh_give_the_tokens_of_one_device(data, model):
    """Stacked (L, ...) layers split as one layer's, the layer axis whole, and scanned over: each
    device holds its share, and sharded greedy speculative and plain decoding == one device."""
    mesh = make_mesh(data, model)
    dcfg, dparams = head("eagle3.1")
    stacked = stack_layers(PARAMS)
    params = mesh_lib.place(stacked, sharding.target_shardings(mesh, CFG, stacked))
    _, dp, tokens, lengths = placed(mesh, dcfg, dparams, prompts(data))
    kv_split = model if CFG.num_kv_heads % model == 0 else 1
    h, kv, d = CFG.num_heads * CFG.head_dim, CFG.num_kv_heads * CFG.head_dim, CFG.hidden_size
    assert shard_shapes(params["layers"]["wq"]) == {(CFG.num_layers, h // model, d)}
    assert shard_shapes(params["layers"]["wk"]) == {(CFG.num_layers, kv // kv_split, d)}
    assert shard_shapes(params["layers"]["w_down"]) == {(CFG.num_layers, d, CFG.intermediate_size // model)}
    spec = generate_spec_jit(params, CFG, dp, dcfg, tokens, lengths, jax.random.key(0), tree=TREE, mesh=mesh, **KW)
    plain = generate_ar_jit(params, CFG, tokens, lengths, jax.random.key(0), mesh=mesh, **KW)
    reference = one_device_plain(tokens.shape[0])
    np.testing.assert_array_equal(np.asarray(plain.tokens), reference)
    np.testing.assert_array_equal(np.asarray(spec.tokens), reference)


def test_a_kernel_is_refused_where_the_model_axis_does_not_split_the_kv_heads():
    mesh = make_mesh(1, 8)
    cfg = dataclasses.replace(CFG, attention="pallas_gpu_interpret")
    params, _, tokens, lengths = placed(mesh, rows=prompts(1))
    with pytest.raises(EagleError, match=r"attention 'pallas_gpu_interpret' on a model axis of 8 needs the axis to divide the 4 KV heads"):
        generate_ar_jit(params, cfg, tokens, lengths, jax.random.key(0), mesh=mesh, **KW)


def shard_shapes(x) -> set[tuple[int, ...]]:
    return {tuple(s.data.shape) for s in x.addressable_shards}


@pytest.mark.parametrize("data, model", [(2, 4), (1, 8)])
def test_no_device_holds_more_than_its_share_of_a_split_parameter(data, model):
    mesh = make_mesh(data, model)
    dcfg, dparams = head("eagle3.1")
    params, dp, _, _ = placed(mesh, dcfg, dparams, prompts(data))
    h, kv, d, f, v = CFG.num_heads * CFG.head_dim, CFG.num_kv_heads * CFG.head_dim, CFG.hidden_size, CFG.intermediate_size, CFG.vocab_size
    layer = params["layers"][0]
    kv_split = model if CFG.num_kv_heads % model == 0 else 1  # 4 KV heads: replicated over a model axis of 8
    expected = {"wq": (h // model, d), "wk": (kv // kv_split, d), "wv": (kv // kv_split, d), "wo": (d, h // model),
                "w_gate": (f // model, d), "w_up": (f // model, d), "w_down": (d, f // model), "attn_norm": (d,)}
    for key, shape in expected.items():
        assert shard_shapes(layer[key]) == {shape}, key
    assert shard_shapes(params["embed"]) == {(v // model, d)}
    assert shard_shapes(params["lm_head"]) == {(v // model, d)}
    assert shard_shapes(dp["layer"]["wq"]) == {(h // model, 2 * d)}
    assert shard_shapes(dp["lm_head"]) == {(v // model, d)}
    assert shard_shapes(dp["fc"]) == {(d, 3 * d)}  # replicated
    for x in jax.tree.leaves(params):  # each device holds one of model's distinct slices, or the whole of a replicated array
        assert len(x.addressable_shards) == 8


@pytest.mark.parametrize("data, model", [(2, 4), (4, 2), (1, 8)])
def test_the_caches_stay_split_by_rows_and_kv_heads_through_a_round(data, model):
    """start and one speculative round on each data shard: each device holds its rows' share of the
    target's and the draft's caches (the KV heads split where model divides them)."""
    mesh = make_mesh(data, model)
    dcfg, dparams = head("eagle3.1")
    rows = prompts(data)
    params, dp, tokens, lengths = placed(mesh, dcfg, dparams, rows)
    spec = SpecConfig(TREE, SamplingConfig(), KW["max_new_tokens"], KW["cache_len"], mesh=mesh)

    def first_round(shared, rows, key):
        models = SpecModels(*shared, CFG, dcfg)
        state = speculative_round(models, spec, start(models, spec, *rows, key))
        return state.cache, state.draft.cache

    caches = jax.jit(lambda *a: sharding.over_row_shards(mesh, first_round, *a))((params, dp), (tokens, lengths), jax.random.key(0))
    b, slots = rows[0].shape[0], KW["cache_len"] + TREE.max_path
    kv_split = model if CFG.num_kv_heads % model == 0 else 1
    for cache, heads in zip(caches, (CFG.num_kv_heads, dcfg.num_kv_heads)):
        for layer in cache.k + cache.v:
            assert layer.shape == (b, heads, slots, CFG.head_dim)
            assert shard_shapes(layer) == {(b // data, heads // kv_split, slots, CFG.head_dim)}
        assert shard_shapes(cache.lengths) == {(b // data,)}


COLLECTIVE = re.compile(r"= \(?([^=]*?)\)? (all-gather|all-to-all|collective-permute|all-reduce)\(")


@pytest.mark.parametrize("data, model, impl", [(2, 4, "xla"), (8, 1, "xla"), (2, 4, "pallas_gpu_interpret")])
def test_no_collective_of_the_compiled_generate_moves_a_whole_cache(data, model, impl):
    """Cache layers have cache_len + max_path slots (rounded up to whole blocks for a kernel); no
    collective's result has a dimension that long (rows never leave their data shard, the caches
    stay split by KV heads, and a kernel attends on each model shard's own heads)."""
    mesh = make_mesh(data, model)
    cfg, (dcfg, dparams) = dataclasses.replace(CFG, attention=impl), head("eagle1")
    dcfg = dataclasses.replace(dcfg, attention=impl)
    params, dp, tokens, lengths = placed(mesh, dcfg, dparams, prompts(data))
    slots = attention.cache_slots(KW["cache_len"] + TREE.max_path, impl)
    fn = jax.jit(lambda p, dp, t, l: generate_spec(p, cfg, dp, dcfg, t, l, jax.random.key(0), tree=TREE, mesh=mesh, **KW))
    hlo = fn.lower(params, dp, tokens, lengths).compile().as_text()
    results = [m.group(1) for m in COLLECTIVE.finditer(hlo)]
    if model == 1:
        assert results == []  # data parallel alone: the shards never talk
    else:
        assert results  # tensor parallel: the model shards do
    dims = {int(n) for r in results for n in re.findall(r"\d+", re.sub(r"\{[^}]*\}", "", r))}
    assert slots not in dims, f"a collective carries {slots} cache slots"


def test_sampled_speculative_follows_the_target_distribution_under_a_mesh():
    """The chi-square test of tests/test_speculative.py on a 2 x 4 mesh (4 heads, 2 KV heads:
    the KV heads replicated over model), 24,000 rows split over the data axis."""
    n_tokens, samples = 3, 24_000
    cfg = tiny_config(vocab_size=6)
    params = init_params(jax.random.key(5), cfg, scale=0.4)
    dcfg = DraftConfig.for_target(cfg, kind="eagle3", draft_vocab_size=6)
    dparams = init_draft_params(jax.random.key(6), dcfg, scale=0.4)
    mesh = make_mesh(2, 4)
    prompt = np.array([1, 4, 2], np.int32)
    tokens, lengths = mesh_lib.place((np.broadcast_to(prompt, (samples, 3)), np.full((samples,), 3, np.int32)),
                                     (sharding.rows_sharding(mesh, 2), sharding.rows_sharding(mesh, 1)))
    sampling = SamplingConfig(temperature=1.0)
    out = generate_spec_jit(mesh_lib.place(params, sharding.target_shardings(mesh, cfg, params)), cfg,
                            mesh_lib.place(dparams, sharding.draft_shardings(mesh, dcfg, dparams)), dcfg, tokens, lengths,
                            jax.random.key(11), max_new_tokens=n_tokens, cache_len=16, tree=TreeConfig(3, 1, 7), sampling=sampling, mesh=mesh)
    assert np.asarray(out.accept_histogram)[:, 1:].sum() > samples // 4
    seqs = np.asarray(out.tokens)
    counts = np.zeros((cfg.vocab_size,) * n_tokens)
    np.add.at(counts, tuple(seqs.T), 1)
    law = exact_law(params, cfg, prompt, sampling, n_tokens)
    assert chi_square_p(counts.ravel(), law.ravel()) > 1e-3
    half = samples // 2  # the two data shards drew apart: their rows are not copies of each other
    assert (seqs[:half] != seqs[half:]).any()


def test_generate_inside_a_users_jit_with_sharded_inputs():
    mesh = make_mesh(2, 4)
    dcfg, dparams = head("eagle3.1")
    rows = prompts(2)
    params, dp, tokens, lengths = placed(mesh, dcfg, dparams, rows)

    @jax.jit
    def users_program(params, dparams, tokens, lengths):
        out = generate_spec(params, CFG, dparams, dcfg, tokens, lengths, jax.random.key(0), tree=TREE, mesh=mesh, **KW)
        plain = generate_ar(params, CFG, tokens, lengths, jax.random.key(0), mesh=mesh, **KW)
        return out.tokens, jnp.all(out.tokens == plain.tokens)

    spec_tokens, same = users_program(params, dp, tokens, lengths)
    assert bool(same)
    np.testing.assert_array_equal(np.asarray(spec_tokens), one_device_plain(rows[0].shape[0]))


def test_engine_on_a_mesh_fills_the_batch_to_the_data_axis():
    """4 prompts on an 8 x 1 mesh: the Engine adds 4 copies of the first, decodes and drops them."""
    dcfg, dparams = head("eagle1")
    target = TargetModel(CFG, PARAMS, None, "tiny")
    one = Engine(target, (dcfg, dparams), max_new_tokens=KW["max_new_tokens"])
    sharded = Engine(target, (dcfg, dparams), max_new_tokens=KW["max_new_tokens"], mesh=make_mesh(8, 1))
    expected = one.run(ROWS, tree=TREE)
    got = sharded.run(ROWS, tree=TREE)
    assert got.tokens == expected.tokens and len(got.rounds) == len(ROWS)
    assert got.rounds == expected.rounds and (got.accept_histogram == expected.accept_histogram).all()
    assert sharded.run(ROWS, tree=None).tokens == expected.tokens


def test_engine_on_a_mesh_with_scanned_layers():
    """The Engine stacks the placed layers on the mesh (each device stacking its own shards)."""
    dcfg, dparams = head("eagle3.1")
    target = TargetModel(CFG, PARAMS, None, "tiny")
    engine = Engine(target, (dcfg, dparams), max_new_tokens=KW["max_new_tokens"], mesh=make_mesh(2, 4), layers="scan")
    assert shard_shapes(engine.laid_out.params["layers"]["w_up"]) == {(CFG.num_layers, CFG.intermediate_size // 4, CFG.hidden_size)}
    expected = Engine(target, (dcfg, dparams), max_new_tokens=KW["max_new_tokens"]).run(ROWS, tree=TREE).tokens
    assert engine.run(ROWS, tree=TREE).tokens == expected == engine.run(ROWS, tree=None).tokens
