"""Pallas tree-attention kernels: interpret-mode results against the jnp reference, and lowering.

Interpret mode runs each kernel's own block logic on CPU (grid, prefix skipping, bit-packed mask),
so these compare numerics. The lowering tests check that each kernel gets through its real
backend lowering (Mosaic for an abstract TPU v5e, Triton for an abstract H200) and that the emitted
kernel module passes the MLIR verifier. Where the `triton` package is installed, the Triton module
is also built to an sm_90 cubin; the Mosaic module cannot be compiled without a TPU.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager
from jaxlib.mosaic.python import tpu as tpu_dialect
from jaxlib.triton import dialect as triton_dialect

from eagle_jax.kernels_pallas import tree_attention_gpu, tree_attention_mosaic_gpu, tree_attention_reference, tree_attention_tpu
from eagle_jax.errors import EagleError
from eagle_jax.model import attention

TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}  # atol and rtol, per input dtype
REPO = pathlib.Path(__file__).resolve().parents[1]


class Case(NamedTuple):
    batch: int
    queries: int  # Tq
    keys: int  # Tk
    heads: int  # H
    kv_heads: int  # KV
    head_dim: int  # D
    cache: int  # S
    lengths: tuple[int, ...]  # one per row, 0..S
    mask: str  # "tree" | "causal" | "random" | "padded"
    dtype: type


def random_tree_mask(rng: np.random.Generator, nodes: int) -> np.ndarray:  # (T, T) bool
    """Ancestor-or-self mask of a random tree whose node i has a parent among nodes 0..i-1."""
    mask = np.eye(nodes, dtype=bool)
    for i in range(1, nodes):
        mask[i] |= mask[rng.integers(0, i)]
    return mask


def block_mask(rng: np.random.Generator, case: Case) -> np.ndarray:  # (B, Tq, Tk) bool
    shape = (case.batch, case.queries, case.keys)
    if case.mask == "causal":
        return np.broadcast_to(np.tri(case.queries, case.keys, dtype=bool), shape).copy()
    if case.mask == "random":
        return rng.random(shape) < 0.4
    mask = np.stack([random_tree_mask(rng, case.queries) for _ in range(case.batch)])
    if case.mask == "padded":
        # The last third of the nodes are padding: they see no new key, only the prefix.
        mask[:, -(case.queries // 3) :] = False
    return mask


def make_inputs(case: Case, seed: int = 0) -> tuple[jax.Array, ...]:
    rng = np.random.default_rng(seed)
    b, tq, tk, h, kv, d, s = case[:7]

    def normal(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), case.dtype)

    return (
        normal(b, tq, h, d),
        normal(b, kv, s, d),  # head-major cache
        normal(b, kv, s, d),  # head-major cache
        jnp.asarray(case.lengths, jnp.int32),
        normal(b, tk, kv, d),
        normal(b, tk, kv, d),
        jnp.asarray(block_mask(rng, case)),
    )


F32, BF16 = jnp.float32, jnp.bfloat16
CASES = {
    # verify: 5-node tree, GQA 4:1, an empty prefix next to a full cache
    "verify_gqa4_empty_and_full_prefix": Case(2, 5, 5, 8, 2, 64, 64, (0, 64), "tree", F32),
    "verify_gqa4_empty_and_full_prefix_bf16": Case(2, 5, 5, 8, 2, 64, 64, (0, 64), "tree", BF16),
    # verify: 31 nodes (not a power of two), MHA 1:1, D 128, S not a multiple of any block
    "verify_31_nodes_mha_d128": Case(2, 31, 31, 2, 2, 128, 100, (37, 100), "tree", F32),
    "verify_31_nodes_mha_d128_bf16": Case(2, 31, 31, 2, 2, 128, 100, (37, 100), "tree", BF16),
    # verify: 60 nodes, SmolLM2-like heads (9 query / 3 kv, D 64), lengths differ per row
    "verify_60_nodes_gqa3_d64_bf16": Case(2, 60, 60, 9, 3, 64, 128, (128, 70), "tree", BF16),
    # decode: one node per row
    "decode_one_node": Case(3, 1, 1, 8, 2, 128, 64, (5, 0, 64), "tree", F32),
    # padded tree nodes; in row 0 (empty prefix) they see nothing at all and must return zeros
    "padded_nodes": Case(2, 16, 16, 4, 1, 64, 32, (0, 19), "padded", F32),
    # prefill chunk: causal block after a prefix
    "prefill_causal": Case(2, 16, 16, 4, 4, 64, 48, (0, 33), "causal", F32),
    # draft-tree expansion: K = 4 nodes against K * 3 tree keys
    "draft_expansion": Case(2, 4, 12, 8, 2, 128, 64, (10, 64), "random", F32),
    # degenerate sizes: no cache slots at all; no new keys (attention over the prefix only)
    "empty_cache": Case(1, 6, 6, 4, 2, 64, 0, (0,), "causal", F32),
    "no_new_keys": Case(2, 3, 0, 4, 2, 64, 40, (40, 7), "random", F32),
}
KERNELS = {"gpu": tree_attention_gpu, "tpu": tree_attention_tpu, "mosaic_gpu": tree_attention_mosaic_gpu}
# Small blocks so that the small cases still cross several prefix, query and new-key blocks (the
# Mosaic GPU kernel's smallest, 64, are its defaults).
SMALL = {"block_q": 16, "block_k": 32, "block_new": 32}
SMALL_BLOCKS = {"gpu": SMALL, "tpu": SMALL, "mosaic_gpu": {}}


def assert_matches_reference(case: Case, out: jax.Array, args: tuple[jax.Array, ...]) -> None:
    expected = tree_attention_reference(*args)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    tol = TOLERANCE[case.dtype]
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(expected, np.float32), atol=tol, rtol=tol
    )


def naive_attention(q, k_cache, v_cache, lengths, k_new, v_new, mask, starts=None, scale=None) -> np.ndarray:
    """The contract written out query by query and head by head in float64 numpy."""
    q, k_cache, v_cache, k_new, v_new = (np.asarray(x, np.float64) for x in (q, k_cache, v_cache, k_new, v_new))
    b, tq, h, d = q.shape
    kv = k_cache.shape[1]
    scale = d**-0.5 if scale is None else scale
    starts = np.zeros((b, tq), int) if starts is None else np.asarray(starts)
    out = np.zeros((b, tq, h, d))
    for row in range(b):
        for t in range(tq):
            for head in range(h):
                g = head // (h // kv)
                prefix = slice(starts[row, t], lengths[row])
                keys = np.concatenate([k_cache[row, g, prefix], k_new[row, np.asarray(mask)[row, t], g]])
                values = np.concatenate([v_cache[row, g, prefix], v_new[row, np.asarray(mask)[row, t], g]])
                if len(keys):
                    scores = keys @ q[row, t, head] * scale
                    weights = np.exp(scores - scores.max())
                    out[row, t, head] = weights @ values / weights.sum()
    return out


@pytest.mark.parametrize("name", CASES)
def test_reference_matches_the_contract_written_out(name: str) -> None:
    """The oracle itself, against a per-query float64 loop over the head-major cache."""
    case = CASES[name]
    args = make_inputs(case, seed=3)
    expected = naive_attention(*args)
    tol = TOLERANCE[case.dtype]
    np.testing.assert_allclose(np.asarray(tree_attention_reference(*args), np.float64), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("backend", KERNELS)
def test_interpret_matches_reference(backend: str, name: str) -> None:
    case = CASES[name]
    args = make_inputs(case)
    out = KERNELS[backend](*args, interpret=True, **SMALL_BLOCKS[backend])
    assert_matches_reference(case, out, args)


@pytest.mark.parametrize("backend", KERNELS)
def test_interpret_default_blocks_many_new_keys(backend: str) -> None:
    """Default block sizes; 70 new keys span two new-key blocks of two mask words each."""
    case = Case(2, 6, 70, 8, 2, 64, 256, (200, 3), "random", F32)
    args = make_inputs(case, seed=1)
    assert_matches_reference(case, KERNELS[backend](*args, interpret=True), args)


@pytest.mark.parametrize("backend", KERNELS)
def test_query_that_sees_nothing_is_zero(backend: str) -> None:
    case = CASES["padded_nodes"]
    args = make_inputs(case)
    out = KERNELS[backend](*args, interpret=True, **SMALL_BLOCKS[backend])
    padded = case.queries // 3
    assert case.lengths[0] == 0 and not np.asarray(args[-1])[0, -padded:].any()
    np.testing.assert_array_equal(np.asarray(out[0, -padded:]), 0.0)
    assert np.all(np.abs(np.asarray(out[1, -padded:])) > 0.0)  # row 1 still sees its prefix


WINDOWED = {  # sliding windows: each query sees the cache from its own start slot on
    "verify_after_a_long_prefix": Case(2, 7, 7, 8, 2, 64, 160, (150, 97), "tree", F32),
    "prefill_chunk_gqa3_bf16": Case(2, 16, 16, 9, 3, 64, 96, (96, 40), "causal", BF16),
}


def window_starts(case: Case, seed: int) -> jax.Array:
    """(B, Tq) starts from 0 up to past the row's length (a query whose window holds no cached key)."""
    rng = np.random.default_rng(seed)
    return jnp.asarray(np.stack([rng.integers(0, n + 2, case.queries) for n in case.lengths]), jnp.int32)


@pytest.mark.parametrize("name", WINDOWED)
@pytest.mark.parametrize("backend", [None, *KERNELS])
def test_window_starts_hide_the_cache_before_them(backend: str | None, name: str) -> None:
    """Reference (against the contract written out) and both kernels with per-query starts; the
    starts change the result, so they are not ignored."""
    case = WINDOWED[name]
    args = make_inputs(case, seed=4)
    starts = window_starts(case, seed=5)
    tol = TOLERANCE[case.dtype]
    expected = naive_attention(*args, starts)
    if backend is None:
        out = tree_attention_reference(*args, starts)
    else:
        out = KERNELS[backend](*args, starts, interpret=True, **SMALL_BLOCKS[backend])
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, atol=tol, rtol=tol)
    assert np.abs(expected - naive_attention(*args)).max() > 10 * tol


def test_custom_scale() -> None:
    case = CASES["verify_gqa4_empty_and_full_prefix"]
    args = make_inputs(case, seed=2)
    expected = tree_attention_reference(*args, scale=0.3)
    for backend, kernel in KERNELS.items():
        out = kernel(*args, scale=0.3, interpret=True, **SMALL_BLOCKS[backend])
        np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


# ---- lowering --------------------------------------------------------------------------------

def abstract_shapes(case: Case) -> tuple[jax.ShapeDtypeStruct, ...]:
    b, tq, tk, h, kv, d, s = case[:7]
    sds = jax.ShapeDtypeStruct
    return (
        sds((b, tq, h, d), case.dtype),
        sds((b, kv, s, d), case.dtype),
        sds((b, kv, s, d), case.dtype),
        sds((b,), jnp.int32),
        sds((b, tk, kv, d), case.dtype),
        sds((b, tk, kv, d), case.dtype),
        sds((b, tq, tk), jnp.bool_),
    )


def custom_call(lowered: jax.stages.Lowered, target: str) -> ir.Operation:
    """The one stablehlo.custom_call with call_target_name `target` in a lowered module."""
    found = []

    def walk(op: ir.Operation) -> None:
        if op.name == "stablehlo.custom_call":
            if ir.StringAttr(op.attributes["call_target_name"]).value == target:
                found.append(op)
        for region in op.regions:
            for block in region:
                for inner in block:
                    walk(inner.operation)

    walk(lowered.compiler_ir("stablehlo").operation)
    assert len(found) == 1, f"expected one {target} call, found {len(found)}"
    return found[0]


def verify_mosaic_module(op: ir.Operation) -> str:
    """Deserialises the Mosaic kernel carried by a tpu_custom_call and runs the MLIR verifier."""
    config = json.loads(ir.StringAttr(op.attributes["backend_config"]).value_bytes)
    body = base64.b64decode(config["custom_call_config"]["body"])
    context = jax_mlir.make_ir_context()
    tpu_dialect.register_dialect(context)
    with context, ir.Location.unknown():
        context.allow_unregistered_dialects = True  # needed only while the serde pass runs
        module = ir.Module.parse(body)
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
        context.allow_unregistered_dialects = False
        assert module.operation.verify()
        return str(module)


def verify_triton_module(op: ir.Operation) -> str:
    """Parses the Triton kernel carried by a __gpu$xla.gpu.triton call and runs the verifier."""
    config = ir.DictAttr(op.attributes["mhlo.backend_config"])
    context = jax_mlir.JaxIrContext()
    context.append_dialect_registry(jax_mlir.upstream_dialects)
    triton_dialect.register_dialect(context)
    context.load_all_available_dialects()
    with context, ir.Location.unknown():
        module = ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)
        assert module.operation.verify()
        return str(module)


LOWERING_CASES = {
    "verify_t64_gqa4_d128_bf16": Case(4, 64, 64, 32, 8, 128, 2048, (0,) * 4, "tree", BF16),
    "verify_t60_gqa3_d64_f32": Case(2, 60, 60, 9, 3, 64, 1024, (0,) * 2, "tree", F32),
    "decode_d64_mha_bf16": Case(2, 1, 1, 8, 8, 64, 8192, (0,) * 2, "tree", BF16),
    "prefill_300_s1000_f32": Case(1, 300, 300, 4, 1, 128, 1000, (0,), "causal", F32),
}


def shard_cases(impl: str) -> dict[str, Case]:
    """What one model shard's kernel sees, its cache allocated as `cache_slots` rounds it for `impl`:
    Llama-3.1-8B (32 heads / 8 KV, D 128) at model 4 verifying a 60-node tree over 2048 + 7 slots,
    Llama-3.1-70B (64 / 8) at model 8 decoding over 8192 + 1, SmolLM2 (9 / 3, D 64) at model 3."""
    slots = functools.partial(attention.cache_slots, impl=impl)
    return {
        "shard_llama8b_tp4_verify60_bf16": Case(2, 60, 60, 8, 2, 128, slots(2055), (0, 2055), "tree", BF16),
        "shard_llama70b_tp8_decode_bf16": Case(8, 1, 1, 8, 1, 128, slots(8193), (8193,) * 8, "tree", BF16),
        "shard_smollm2_tp3_verify60_f32": Case(1, 60, 60, 3, 1, 64, slots(1031), (1031,), "tree", F32),
    }


GPU_LOWERING = LOWERING_CASES | shard_cases("pallas_gpu_interpret")
TPU_LOWERING = LOWERING_CASES | shard_cases("pallas_tpu_interpret")


def assert_cache_not_padded(lowered: jax.stages.Lowered, case: Case) -> None:
    """No stablehlo.pad in the wrapper takes an operand as long as the cache (were the cache padded
    to the kernel's block, that would copy it)."""
    text = lowered.as_text()
    pads = re.findall(r"stablehlo\.pad.*?: \((tensor<[^>]*>)", text)
    assert not [t for t in pads if f"x{case.cache}x" in t], pads


def abstract_mesh(device_kind: str, platform: str) -> jax.sharding.AbstractMesh:
    device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=1, platform=platform)
    return jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)


@pytest.mark.parametrize("name", TPU_LOWERING)
def test_tpu_kernel_lowers_for_tpu(name: str) -> None:
    with jax.sharding.use_abstract_mesh(abstract_mesh("TPU v5 lite", "tpu")):
        lowered = tree_attention_tpu.trace(*abstract_shapes(TPU_LOWERING[name])).lower(
            lowering_platforms=("tpu",)
        )
    kernel = verify_mosaic_module(custom_call(lowered, "tpu_custom_call"))
    assert "tpu.dimension_semantics<arbitrary>" in kernel and "scalar_prefetch = 1" in kernel
    if name.startswith("shard_"):
        assert_cache_not_padded(lowered, TPU_LOWERING[name])


def lower_gpu_kernel(case: Case) -> jax.stages.Lowered:
    """The GPU kernel's wrapper lowered for an abstract H200."""
    with warnings.catch_warnings():
        # jax 0.12 marks the Pallas Triton backend deprecated (Mosaic GPU replaces it); it is
        # still the default GPU lowering of pallas_call in jax 0.11 and 0.12.
        warnings.simplefilter("ignore", DeprecationWarning)
        with jax.sharding.use_abstract_mesh(abstract_mesh("NVIDIA H200", "cuda")):
            return tree_attention_gpu.trace(*abstract_shapes(case)).lower(lowering_platforms=("cuda",))


def triton_kernel(case: Case) -> str:
    """The verified Triton IR of the GPU kernel's custom call for `case`."""
    return verify_triton_module(custom_call(lower_gpu_kernel(case), "__gpu$xla.gpu.triton"))


@pytest.mark.parametrize("name", GPU_LOWERING)
def test_gpu_kernel_lowers_for_cuda(name: str) -> None:
    kernel = triton_kernel(GPU_LOWERING[name])
    assert "tt.dot" in kernel and "scf.for" in kernel
    if name.startswith("shard_"):
        assert_cache_not_padded(lower_gpu_kernel(GPU_LOWERING[name]), GPU_LOWERING[name])


def lower_mosaic_gpu_kernel(case: Case) -> jax.stages.Lowered:
    """The Mosaic GPU kernel lowered for an abstract H200: Pallas to the Mosaic GPU dialect, its
    layout inference and verifier run here; the passes to PTX run in the CUDA plugin at compile
    time, which needs a GPU (docs/device.md)."""
    with jax.sharding.use_abstract_mesh(abstract_mesh("NVIDIA H200", "cuda")):
        return tree_attention_mosaic_gpu.trace(*abstract_shapes(case)).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("name", GPU_LOWERING)
def test_mosaic_gpu_kernel_lowers_for_cuda(name: str) -> None:
    lowered = lower_mosaic_gpu_kernel(GPU_LOWERING[name])
    assert "mosaic_gpu_v2" in lowered.as_text()
    if name.startswith("shard_"):
        assert_cache_not_padded(lowered, GPU_LOWERING[name])


COMPILE_TTIR = """
import sys, triton
from triton.backends.compiler import GPUTarget
for path in sys.argv[1:]:
    kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    assert kernel.asm["cubin"], path
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs the triton package (ships ptxas)"
)
def test_gpu_kernel_compiles_to_sm90_cubin(tmp_path: pathlib.Path) -> None:
    """Builds the lowered Triton IR down to an sm_90 cubin with Triton's own compiler and ptxas.

    That is OpenAI Triton, not the Triton fork inside XLA that compiles it on a real GPU, so a
    pass here is strong evidence, not proof. It runs in a subprocess to keep Triton's LLVM out of
    this process, and needs no GPU.
    """
    paths = []
    for name in ("verify_t64_gqa4_d128_bf16", "verify_t60_gqa3_d64_f32", *shard_cases("pallas_gpu_interpret")):
        path = tmp_path / f"{name}.ttir"
        path.write_text(triton_kernel(GPU_LOWERING[name]))
        paths.append(str(path))
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache"), "TRITON_DEFAULT_FP_FUSION": "1"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE_TTIR, *paths],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]


def test_device_check_script_smoke(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "kernels_gpu.json"
    script = REPO / "scripts" / "tools" / "device_check_kernels.py"
    run = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rows"] and all(row["max_abs_err"] <= row["tolerance"] for row in report["rows"])


def test_the_entry_point_picks_a_kernel_per_platform_and_model_axis() -> None:
    """"auto": the kernel on GPU/TPU where the model shards split the KV heads, else XLA; a named
    kernel on shards that do not split them is refused in one line."""
    assert attention.mesh_impl("auto", 4, 2, platform="gpu") == "pallas"
    assert attention.mesh_impl("auto", 4, 1, platform="tpu") == "pallas"
    assert attention.mesh_impl("auto", 4, 8, platform="gpu") == "xla"  # the KV heads replicated over 8 shards
    assert attention.mesh_impl("auto", 4, 2, platform="cpu") == "xla"
    assert attention.mesh_impl("xla", 4, 8) == "xla"
    with pytest.raises(EagleError, match=r"^attention 'pallas_tpu_interpret' on a model axis of 8 needs the axis to divide the 3 KV heads"):
        attention.mesh_impl("pallas_tpu_interpret", 3, 8)


@pytest.mark.parametrize("impl, block", [("xla", 1), ("pallas_gpu_interpret", 64), ("pallas_tpu_interpret", 128)])
def test_caches_are_allocated_in_whole_kernel_blocks(impl: str, block: int) -> None:
    for slots in (1, 63, 64, 100, 1031):
        allocated = attention.cache_slots(slots, impl)
        assert allocated % block == 0 and slots <= allocated < slots + block


def test_each_gpu_kernel_has_a_name_and_the_mosaic_one_refuses_heads_it_cannot_take() -> None:
    assert [attention.kernel_backend(name) for name in ("pallas_mosaic_gpu", "pallas_triton", "pallas_mosaic_gpu_interpret",
                                                       "pallas_gpu_interpret", "pallas_tpu_interpret")] == [
        "mosaic_gpu", "triton", "mosaic_gpu", "triton", "tpu"]
    assert attention.cache_slots(65, "pallas_mosaic_gpu_interpret") == 128 == attention.cache_slots(65, "pallas_gpu_interpret")
    args = make_inputs(Case(1, 2, 2, 2, 1, 32, 8, (3,), "causal", F32))
    with pytest.raises(EagleError, match=r"^attention 'pallas_mosaic_gpu_interpret' needs a head size that is a multiple of 64 "
                                         r"\(at most 128 in float32\), the model's is 32 in float32"):
        attention.attend(*args, impl="pallas_mosaic_gpu_interpret")
