"""Device meshes of training and inference, from one CPU to a TPU pod, and arrays placed on them.

Inference runs on a ("data", "model") mesh: batch rows over "data", attention heads, the MLP and the
vocabulary over "model" (tensor parallel; which parameter splits how: `eagle_jax.model.sharding`).
Training runs on a ("data", "fsdp") mesh: batch rows over both axes, params sharded over "fsdp".
Both are built by `make_mesh`. In a multi-process run each process holds the rows and shards of its
own devices; `place`, `global_batch` and `to_host` move arrays between hosts and the mesh.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from eagle_jax.errors import EagleError

INFERENCE_AXES = ("data", "model")
TRAINING_AXES = ("data", "fsdp")
ROW_AXES = ("data", "fsdp")  # the axes that split batch rows, where a mesh has them


def parse_mesh(text: str) -> dict[str, int]:
    """{"data": D, "model": M} from "data=D,model=M" (either may be left out: size 1)."""
    sizes = dict.fromkeys(INFERENCE_AXES, 1)
    seen = set()
    for part in text.split(","):
        name, _, value = part.strip().partition("=")
        if name not in sizes or name in seen or not value.isdigit() or int(value) < 1:
            raise EagleError(f"malformed mesh {text!r}: expected data=D,model=M with positive sizes, e.g. data=2,model=4")
        seen.add(name)
        sizes[name] = int(value)
    return sizes


def make_mesh(sizes: dict[str, int], devices: list | None = None) -> Mesh:
    """A mesh with these axis sizes (in their order) over the first devices of `devices` (default:
    every device of every process)."""
    devices = jax.devices() if devices is None else devices
    need = int(np.prod(list(sizes.values())))
    if need > len(devices):
        shape = ",".join(f"{name}={size}" for name, size in sizes.items())
        raise EagleError(f"mesh {shape} needs {need} devices, but only {len(devices)} are available")
    return jax.make_mesh(tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes), devices=devices[:need])


def training_mesh(fsdp: int = 1, devices: list | None = None) -> Mesh:
    """The (num_devices // fsdp, fsdp) ("data", "fsdp") mesh over every device."""
    devices = jax.devices() if devices is None else devices
    if fsdp < 1 or len(devices) % fsdp:
        raise EagleError(f"--fsdp {fsdp} does not divide the {len(devices)} devices")
    return make_mesh({"data": len(devices) // fsdp, "fsdp": fsdp}, devices)


def describe(mesh: Mesh | None) -> dict[str, int] | None:
    """{axis: size} of a mesh, as the bench JSON records it (None: one device, no mesh)."""
    return None if mesh is None else {name: int(size) for name, size in mesh.shape.items()}


def row_axes(mesh: Mesh) -> tuple[str, ...]:
    return tuple(a for a in mesh.axis_names if a in ROW_AXES)


def row_count(mesh: Mesh) -> int:
    """How many ways batch rows are split."""
    return int(np.prod([mesh.shape[a] for a in row_axes(mesh)]))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the row axes."""
    return NamedSharding(mesh, PartitionSpec(row_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def check_batch_size(mesh: Mesh, batch_size: int) -> None:
    if batch_size % row_count(mesh):
        raise EagleError(f"--batch-size {batch_size} must be a multiple of the {row_count(mesh)} devices that split batch rows")


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
    """Put host or single-device arrays (the same values on every process) onto global shardings;
    each device receives only its own shard."""

    def put(x, sharding):
        if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
            return x  # already there (loaded straight into its shards)
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


def device_memory(device: jax.Device | None = None) -> int:
    """Bytes of memory `device` (default: this process's first) has: its allocator's limit on an
    accelerator, the host's RAM on a CPU."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def compiled_bytes(compiled) -> int | None:
    """Bytes one device holds while `compiled` runs, by XLA's accounting (temporaries, arguments
    and outputs, the donated ones once), or None on a backend without the accounting."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
