"""Training checkpoints with orbax: async, atomic, keep-N, restorable onto another mesh.

Orbax writes each step into a temporary directory and renames it into place once every process
has finished, so a run killed mid-save leaves the previous step as the latest; leftover temporary
directories are removed when the next run opens the manager.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """state: a pytree of jax.Arrays (params, optimizer state, step); meta: a JSON-able dict."""

    def __init__(self, directory: str, keep: int, async_save: bool = True):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=True, cleanup_tmp_directories=True
        )
        self.manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, meta: dict) -> None:
        """Start saving `step` in the background (waits for the previous save first)."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        self.manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state) -> tuple[object, dict]:
        """Restore `step` onto the shardings of `abstract_state` (jax.ShapeDtypeStruct leaves)."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        return restored["state"], restored["meta"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def abstract_like(tree, shardings) -> object:
    """ShapeDtypeStructs of `tree` placed on `shardings` (the restore target)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
