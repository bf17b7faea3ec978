"""Target features for training: computed by the frozen target inside the train step (online), or
once for the whole data set into a memory-mapped file and read back every epoch (offline).

Per token the draft needs the target's post-norm final hidden state (the EAGLE-1/2 feature, and the
source of the soft labels through the target's lm_head) and, for EAGLE-3, the fused layers' states.
The offline store keeps them as one (N_tok, n, dt) array, n = len(feature_layers) + 1 with the
final hidden last, ragged over samples by the data set's own offsets; valid tokens only.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from eagle_jax.model import transformer as target_model
from eagle_jax.model.config import ModelConfig
from eagle_jax.draft.config import DraftConfig
from eagle_jax.errors import EagleError
from eagle_jax.files import read_json, write_json_atomic
from eagle_jax import mesh as mesh_lib
from eagle_jax.train.data import TokenizedSet
from eagle_jax.train.ttt import for_training


class TargetFeatures(NamedTuple):
    hidden: jax.Array  # (B, T, dt) post-norm final hidden state
    captured: jax.Array  # (n_fused, B, T, dt) HF hidden_states at dcfg.feature_layers (eagle1: n_fused = 0)

    def as_forward_output(self) -> target_model.ForwardOutput:
        """The view `project_features` reads (no KV)."""
        return target_model.ForwardOutput(self.hidden, self.captured, None, None)


def compute_target_features(target_params: dict, tcfg: ModelConfig, dcfg: DraftConfig, tokens: jax.Array) -> TargetFeatures:
    """Frozen target forward over right-padded tokens (B, T): causal, no cache, no gradient."""
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = target_model.forward(
        target_params, for_training(tcfg), tokens, positions, None, target_model.causal_mask(jnp.ones((b, t), bool)),
        capture=dcfg.feature_layers,
    )
    return jax.lax.stop_gradient(TargetFeatures(out.hidden, out.captured))


def pack(features: TargetFeatures) -> jax.Array:
    """(B, T, n, dt): the fused states, then the final hidden."""
    return jnp.concatenate([jnp.moveaxis(features.captured, 0, 2), features.hidden[:, :, None]], axis=2)


def unpack(packed: jax.Array) -> TargetFeatures:
    """Inverse of `pack`."""
    return TargetFeatures(packed[:, :, -1], jnp.moveaxis(packed[:, :, :-1], 2, 0))


class FeatureStore:
    """Offline features, read-only: `{path}.bin` (raw (N_tok, n, dt) array, memory-mapped) +
    `{path}.json` (layout and a digest of the data set's offsets). The JSON is written last, so a
    store without it is incomplete."""

    def __init__(self, path: str, offsets: np.ndarray, vectors: int, width: int, dtype: str):
        self.path, self.offsets = path, offsets
        self.array = np.memmap(path + ".bin", dtype=jnp.dtype(dtype), mode="r", shape=(max(int(offsets[-1]), 1), vectors, width))

    @staticmethod
    def describe(offsets: np.ndarray, vectors: int, width: int, dtype: str) -> dict:
        return {"tokens": int(offsets[-1]), "samples": len(offsets) - 1, "vectors": vectors, "width": width, "dtype": dtype,
                "offsets_digest": int(np.bitwise_xor.reduce(offsets * np.arange(1, len(offsets) + 1)))}

    @classmethod
    def open_complete(cls, path: str, offsets: np.ndarray, vectors: int, width: int, dtype: str) -> "FeatureStore | None":
        """The finished store at `path` if it matches this data set and layout, else None."""
        if not os.path.exists(path + ".json"):
            return None
        meta = read_json(path + ".json", what="an offline feature store's layout")
        if meta != cls.describe(offsets, vectors, width, dtype):
            raise EagleError(f"{path}.json describes other features than this run needs; remove {path}.* to recompute")
        return cls(path, offsets, vectors, width, dtype)

    def rows(self, indices: np.ndarray, seq_len: int) -> np.ndarray:
        """(b, L, n, dt) features of samples `indices`, zero past each sample's end."""
        out = np.zeros((len(indices), seq_len, *self.array.shape[1:]), self.array.dtype)
        for row, i in enumerate(indices):
            lo, hi = self.offsets[i], min(self.offsets[i + 1], self.offsets[i] + seq_len)
            out[row, : hi - lo] = self.array[lo:hi]
        return out


def build_feature_store(
    path: str,
    dataset: TokenizedSet,
    features_fn,  # jitted (frozen target params, tokens (B, L)) -> packed (B, L, n, dt), batch-sharded
    target_params: dict,
    mesh: Mesh,
    batch_size: int,
    seq_len: int,
    vectors: int,
    width: int,
    dtype: str,
    reuse: bool,
) -> FeatureStore:
    """Compute the offline features of `dataset` (with `reuse`, keep a complete matching store).

    All processes run the sharded target over the data set in order, batch by batch, and each
    writes the rows its devices hold into one file with positioned writes (no shared mapping, so
    hosts never rewrite each other's bytes); the file must be on a filesystem shared by all hosts,
    as the checkpoint directory is.
    """
    store = FeatureStore.open_complete(path, dataset.offsets, vectors, width, dtype) if reuse else None
    if store is not None:
        return store
    meta = FeatureStore.describe(dataset.offsets, vectors, width, dtype)
    token_bytes = vectors * width * jnp.dtype(dtype).itemsize

    def create():
        if os.path.exists(path + ".json"):
            os.remove(path + ".json")  # incomplete until its JSON is written again
        with open(path + ".bin", "wb") as f:
            f.truncate(max(int(dataset.offsets[-1]), 1) * token_bytes)

    mesh_lib.on_main_process(create, "features-create")
    rows = mesh_lib.local_rows(mesh, batch_size)
    fd = os.open(path + ".bin", os.O_WRONLY)
    try:
        for start in range(0, len(dataset), batch_size):
            samples = np.minimum(np.arange(start, start + batch_size)[rows], len(dataset) - 1)  # past the end: repeats, not written
            tokens, _, _ = dataset.rows(samples, seq_len)
            packed = features_fn(target_params, mesh_lib.global_batch(mesh, tokens, rows, batch_size))
            for shard in packed.addressable_shards:
                values = np.asarray(shard.data)  # (rows of this device, L, n, dt)
                for offset, global_row in enumerate(range(*shard.index[0].indices(batch_size))):
                    sample = start + global_row
                    if sample < len(dataset):
                        lo, hi = dataset.offsets[sample], dataset.offsets[sample + 1]
                        os.pwrite(fd, np.ascontiguousarray(values[offset, : hi - lo]).tobytes(), int(lo) * token_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    mesh_lib.barrier("features-written")

    mesh_lib.on_main_process(lambda: write_json_atomic(path + ".json", meta, indent=None), "features-done")
    return FeatureStore(path, dataset.offsets, vectors, width, dtype)
