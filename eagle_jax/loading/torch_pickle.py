"""torch.save files (pytorch_model.bin) read without torch and without unpickling arbitrary objects.

A torch checkpoint (torch >= 1.6) is a zip archive: DIR/data.pkl, a pickle of the state dict, and
DIR/data/KEY, the raw bytes of each storage. The pickle names its tensors as calls of a few torch
functions on persistent storage ids. A pickle can name any importable callable and so run any code;
this reader's unpickler resolves only the names a state dict of tensors uses (the tensor and
parameter rebuilders, the storage types, OrderedDict) to numpy stand-ins, and refuses every other
name in one error line before anything is called.
"""

from __future__ import annotations

import collections
import pickle
import zipfile

import ml_dtypes
import numpy as np

from eagle_jax.errors import EagleError

# torch's storage class names (what torch.save writes for each tensor dtype) -> numpy dtype
STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class StorageType:
    """The stand-in for torch.FloatStorage etc.: which dtype a storage's bytes hold."""

    def __init__(self, name: str):
        self.name, self.dtype = name, np.dtype(STORAGE_DTYPES[name])


def rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, requires_grad=False,
                   backward_hooks=None, metadata=None) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2: a strided view of a 1-D storage, checked to lie inside it."""
    if not (all(isinstance(v, int) and v >= 0 for v in (offset, *size, *stride)) and len(size) == len(stride)):
        raise EagleError(f"a tensor of size {size}, stride {stride} and offset {offset} is malformed")
    if 0 not in size:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= storage.size:
            raise EagleError(f"a tensor of size {tuple(size)} reads element {last} of a storage of {storage.size}")
    view = np.lib.stride_tricks.as_strided(storage[offset:] if storage.size else storage, shape=tuple(size),
                                           strides=tuple(s * storage.itemsize for s in stride), writeable=False)
    return np.ascontiguousarray(view)  # C order, as safetensors gives and jnp.asarray expects


def rebuild_parameter(data: np.ndarray, requires_grad=False, backward_hooks=None) -> np.ndarray:
    """torch._utils._rebuild_parameter: an nn.Parameter is its tensor."""
    return data


ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): rebuild_parameter,
} | {("torch", name): StorageType(name) for name in STORAGE_DTYPES}


class TensorUnpickler(pickle.Unpickler):
    """Unpickles a state dict whose storages are read from `archive` under `prefix`/data/."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str, where: str, byteorder: str):
        super().__init__(file)
        self.archive, self.prefix, self.where, self.byteorder = archive, prefix, where, byteorder
        self.storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise EagleError(
                f"{self.where}: the pickle names {module}.{name}, which a file of tensors never needs; "
                "refusing to unpickle it (a pickle can run code)"
            )
        return ALLOWED[module, name]

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], StorageType)):
            raise EagleError(f"{self.where}: the pickle refers to {str(pid)[:80]}, not to a tensor storage")
        _, storage_type, key, _location, numel = pid
        key = str(key)
        if key not in self.storages:
            try:
                data = self.archive.read(f"{self.prefix}/data/{key}")
            except KeyError:
                raise EagleError(f"{self.where}: storage {key} is missing from the archive") from None
            dtype = storage_type.dtype.newbyteorder("<" if self.byteorder == "little" else ">")
            if len(data) != numel * dtype.itemsize:
                raise EagleError(f"{self.where}: storage {key} holds {len(data)} bytes, "
                                 f"expected {numel} {storage_type.name} elements ({numel * dtype.itemsize} bytes)")
            self.storages[key] = np.frombuffer(data, dtype).astype(storage_type.dtype, copy=False)
        return self.storages[key]


def read_torch_file(path: str) -> dict[str, np.ndarray]:
    """The tensors of a torch.save'd state dict, as numpy arrays (bfloat16 as ml_dtypes.bfloat16)."""
    if not zipfile.is_zipfile(path):
        raise EagleError(f"{path}: not a torch zip archive (torch < 1.6 wrote another format; "
                         "load and save it with torch >= 1.6, or convert it to safetensors)")
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise EagleError(f"{path}: expected one DIR/data.pkl in the archive, found {len(pickles)}")
            prefix = pickles[0].split("/")[0]
            names = set(archive.namelist())
            byteorder = archive.read(f"{prefix}/byteorder").decode().strip() if f"{prefix}/byteorder" in names else "little"
            with archive.open(pickles[0]) as file:
                state = TensorUnpickler(file, archive, prefix, path, byteorder).load()
    except EagleError:
        raise
    except Exception as e:  # zipfile, pickle and numpy raise many types for damaged files
        raise EagleError(f"cannot read {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'damaged file'}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in state.items()):
        raise EagleError(f"{path}: expected a state dict of named tensors")
    return dict(state)
