"""Reading and writing training checkpoints: safely and atomically.

Reading is :mod:`ktframe.core.checkpoint`'s (``torch.load(..., weights_only=True)`` and nothing
else, whoever asks; its functions are named here too, where the run and the evaluation look for
them). Writing goes through a temporary file beside the destination, flushed to disk and renamed
over it, so a process killed at any moment leaves the previous checkpoint or the new one, never part of one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ktframe.core.checkpoint import DIMENSIONS, EXPECTED, check_dimensions, load_weights, model_weights, read_checkpoint
from ktframe.core.errors import KtframeError

__all__ = [
    "DIMENSIONS",
    "EXPECTED",
    "AtomicCheckpointIO",
    "CheckpointWriteError",
    "check_dimensions",
    "load_weights",
    "model_weights",
    "read_checkpoint",
    "write_checkpoint",
]


class CheckpointWriteError(KtframeError):
    """A checkpoint could not be written (a full disk, a folder made read-only); the previous one
    is intact and the run stops, in one line."""


def write_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``checkpoint`` to ``path`` atomically. The temporary file has one fixed name per
    destination, so a write cut short by a kill leaves at most one behind, replaced by the next."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on disk before the name points at them
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if os.name == "posix":  # the rename itself survives a power cut once the folder is synced
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O with :func:`write_checkpoint` and :func:`read_checkpoint`.
    (Lightning's own writes through a temporary file in the system's temporary folder, which is
    a copy, not a rename, when that folder is on another file system, and never syncs it.)"""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        try:
            write_checkpoint(checkpoint, path)
        except OSError as exc:
            raise CheckpointWriteError(
                f"{path}: cannot write the checkpoint of step {checkpoint.get('global_step')} ({exc.strerror or exc}); the previous checkpoint is intact"
                "; expected free space and a writable run folder, then resume=auto"
            ) from None

    def load_checkpoint(self, path, map_location: Optional[Callable] = None, weights_only: Optional[bool] = None) -> dict[str, Any]:
        return read_checkpoint(path)  # weights_only=True whatever the caller asked
