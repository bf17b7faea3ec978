"""Training checkpoints with orbax: async, atomic, keep-N, restorable onto another mesh.

Orbax writes each step into a temporary directory and renames it into place once every process
has finished, so a run killed mid-save leaves the previous step as the latest; leftover temporary
directories are removed when the next run opens the manager.
"""

from __future__ import annotations

import os
import sys

import jax
import orbax.checkpoint as ocp

from eagle_jax.errors import EagleError


class Checkpointer:
    """state: a pytree of jax.Arrays (params, optimizer state, step); meta: a JSON-able dict."""

    def __init__(self, directory: str, keep: int, async_save: bool = True):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=True, cleanup_tmp_directories=True
        )
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

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

    def restore_latest(self, abstract_state, warn) -> tuple[int, object, dict] | None:
        """(step, state, meta) of the newest checkpoint that restores, or None when there is none.
        A checkpoint that does not restore (a truncated array file, garbled metadata) is reported
        through `warn(text)` and, once an older one has restored, deleted (its step is saved again
        later); EagleError when checkpoints exist but none restores (then nothing is deleted)."""
        failures = []
        _drop_abandoned_reads()
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                restored = self.restore(step, abstract_state)
            except Exception as e:  # orbax and tensorstore raise many types for a damaged file
                reason = " ".join(str(e).split(". See full TensorStore details")[0].split())[:200] or type(e).__name__
                failures.append((step, reason))
                warn(f"checkpoint {step} in {self.directory} does not restore ({reason}); skipping it")
                continue
            for bad, _ in failures:
                self.manager.delete(bad)
            return (step, *restored)
        if failures:
            step, reason = failures[0]
            raise EagleError(f"--resume: no checkpoint in {self.directory} restores (the newest, {step}: {reason}); "
                             "start a new run with another --out")
        return None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def _drop_abandoned_reads() -> None:
    """When a restore fails, orbax closes its event loop while tensorstore still has reads of the
    damaged checkpoint in flight; as they finish, each would print a traceback ('Event loop is
    closed', or the abandoned read coroutine's own error). Drop those, and only those."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_abandoned_reads", False):
        return

    def hook(unraisable):
        error, source = unraisable.exc_value, unraisable.object
        closed_loop = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
        abandoned_read = getattr(source, "cr_code", None) is not None and "orbax" in source.cr_code.co_filename
        if not (closed_loop or abandoned_read):
            previous(unraisable)

    hook.drops_abandoned_reads = True
    sys.unraisablehook = hook


def abstract_like(tree, shardings) -> object:
    """ShapeDtypeStructs of `tree` placed on `shardings` (the restore target)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
