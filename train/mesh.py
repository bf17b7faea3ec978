"""The device mesh of training: axes ("data", "fsdp"), from one CPU to a TPU pod.

Batches are split over both axes (every device holds B / num_devices rows); params (draft, frozen
target, optimizer moments) are sharded over "fsdp" along their largest divisible axis and
replicated over "data". Each process supplies only the batch rows its own devices hold.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from eagle_jax.errors import EagleError

AXES = ("data", "fsdp")
BATCH_AXES = ("data", "fsdp")


def initialize_distributed(coordinator: str | None, num_processes: int | None, process_id: int | None, auto: bool = False) -> None:
    """Join a multi-process run, before any other JAX call: explicitly (coordinator HOST:PORT, the
    number of processes and this one's id), or with `auto` through the cluster's own discovery
    (TPU pods, SLURM, ...). Neither: a single process."""
    if auto:
        jax.distributed.initialize()
    elif coordinator is not None or num_processes is not None or process_id is not None:
        if coordinator is None or num_processes is None or process_id is None:
            raise EagleError("a multi-process run needs --coordinator HOST:PORT, --num-processes and --process-id (or --distributed)")
        jax.distributed.initialize(coordinator, num_processes, process_id)


def make_mesh(fsdp: int = 1, devices: list | None = None) -> Mesh:
    """A (num_devices // fsdp, fsdp) mesh over `devices` (default: all devices of all processes)."""
    devices = jax.devices() if devices is None else devices
    if fsdp < 1 or len(devices) % fsdp:
        raise EagleError(f"--fsdp {fsdp} does not divide the {len(devices)} devices")
    return jax.make_mesh((len(devices) // fsdp, fsdp), AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def param_spec(shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    """Shard the largest axis that "fsdp" divides (the last of equals); replicate what fits none."""
    candidates = [(size, axis) for axis, size in enumerate(shape) if fsdp > 1 and size % fsdp == 0]
    if not candidates:
        return PartitionSpec()
    axis = max(candidates)[1]
    return PartitionSpec(*(("fsdp" if a == axis else None) for a in range(len(shape))))


def param_shardings(mesh: Mesh, tree) -> object:
    """NamedShardings for every leaf of a params-like pytree (arrays or ShapeDtypeStructs)."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, param_spec(tuple(x.shape), fsdp)), tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over every device."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_batch_size(mesh: Mesh, batch_size: int) -> None:
    if batch_size % mesh.size:
        raise EagleError(f"--batch-size {batch_size} must be a multiple of the {mesh.size} devices")


def local_rows(mesh: Mesh, batch_size: int) -> np.ndarray:
    """Sorted indices of the global batch rows held by this process's devices."""
    index_map = batch_sharding(mesh).addressable_devices_indices_map((batch_size,))
    rows = {i for index in index_map.values() for i in range(*index[0].indices(batch_size))}
    return np.asarray(sorted(rows), np.int64)


def global_batch(mesh: Mesh, local: np.ndarray, rows: np.ndarray, batch_size: int) -> jax.Array:
    """The (batch_size, ...) global array whose rows `rows` are `local` (len(rows), ...) on this process."""
    where = {int(r): i for i, r in enumerate(rows)}

    def shard(index: tuple[slice, ...]) -> np.ndarray:
        picked = [where[r] for r in range(*index[0].indices(batch_size))]
        return local[picked][(slice(None),) + tuple(index[1:])]

    return jax.make_array_from_callback((batch_size, *local.shape[1:]), batch_sharding(mesh), shard)


def place(tree, shardings) -> object:
    """Put host or single-device arrays (the same values on every process) onto global shardings."""

    def put(x, sharding):
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(put, tree, shardings)


def to_host(tree) -> object:
    """Full numpy copies of (possibly sharded, multi-process) arrays, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def any_process(flag: bool) -> bool:
    """True if `flag` is set on any process (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def on_main_process(fn: Callable[[], object], name: str) -> None:
    """Run `fn` on process 0 only (e.g. write a shared file), then wait for every process."""
    if jax.process_index() == 0:
        fn()
    barrier(name)
