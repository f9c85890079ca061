"""Reading and writing training checkpoints: safely and atomically.

Reading is ``torch.load(..., weights_only=True)`` and nothing else, whoever asks (``ktframe eval``,
``resume=``, Lightning restoring a run), so a checkpoint that would need to run code to load is
refused before any of it runs; every way a file can fail to be a checkpoint is one line saying so.
Writing goes through a temporary file beside the destination, flushed to disk and renamed over it,
so a process killed at any moment leaves the previous checkpoint or the new one, never part of one.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ktframe.core.errors import InputError, KtframeError

EXPECTED = "expected a .ckpt written by ktframe fit"


class CheckpointWriteError(KtframeError):
    """A checkpoint could not be written (a full disk, a folder made read-only); the previous one
    is intact and the run stops, in one line."""


def _refusal(exc: Exception) -> str:
    """The unpickler's reason, without torch's advice to load with ``weights_only=False``."""
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation", "WeightsUnpickler error")
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith(boilerplate)), type(exc).__name__)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A ktframe training checkpoint: a dict with ``state_dict`` and ``hyper_parameters.config``."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such checkpoint file; {EXPECTED}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"{path}: refused to load: not plain weights and data ({_refusal(exc)}); ktframe loads checkpoints with weights_only=True, so nothing in one can run; {EXPECTED}"
        ) from None
    except (EOFError, OSError, RuntimeError, IndexError, ValueError, zipfile.BadZipFile) as exc:
        # torch reports an empty, cut-off or garbled file in all of these ways, some with no message
        detail = next(iter(str(exc).splitlines()), "").split(". ")[0] or type(exc).__name__
        raise InputError(f"{path}: not a readable checkpoint (empty, truncated or corrupt: {detail}); {EXPECTED}") from None
    config = checkpoint.get("hyper_parameters", {}).get("config") if isinstance(checkpoint, dict) else None
    if not isinstance(config, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise InputError(f"{path}: not a ktframe training checkpoint (no hyper_parameters.config and state_dict); {EXPECTED}")
    return checkpoint


def model_weights(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The model's own weights in a training checkpoint (the LightningModule's ``model.*``)."""
    return {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items() if key.startswith("model.")}


def load_weights(module: torch.nn.Module, state: dict[str, Any], path: str | os.PathLike) -> None:
    """``module.load_state_dict(state)``; weights of other shapes or names are a one-line error
    naming the first difference."""
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]  # a heading, then each difference
        first = lines[1] if len(lines) > 1 else lines[0]
        raise InputError(
            f"{path}: its weights do not fit the model its config describes ({first if len(first) <= 200 else first[:200] + '...'}); {EXPECTED}, unedited"
        ) from None


# The checkpoint's record of the d and k its model was built for (KMeansTransformerModule writes
# it): weights of the same shapes fit every (d, k) of the same d + k, so the shapes cannot tell.
DIMENSIONS = "model_dimensions"


def check_dimensions(checkpoint: dict[str, Any], model: torch.nn.Module, path: str | os.PathLike, described_by: str = "its config") -> None:
    """The weights of ``checkpoint``, loaded into ``model`` (so their shapes fit it), were trained
    for its d and k. A checkpoint that records none, written before the record existed, has had
    its weights' shapes checked alone."""
    trained = checkpoint.get(DIMENSIONS)
    if isinstance(trained, dict) and (trained.get("d"), trained.get("k")) != (model.d, model.k):
        raise InputError(
            f"{path}: its weights were trained for d={trained.get('d')}, k={trained.get('k')}, not for the d={model.d}, k={model.k} of the model {described_by} describes; {EXPECTED}, unedited"
        )


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
