"""Reading ktframe's training checkpoints: weights-only and one line for every way a file can
fail to be one.

Reading is ``torch.load(..., weights_only=True)`` and nothing else, whoever asks (``ktframe eval``,
``resume=``, Lightning restoring a run, ``TransformerKMeans(checkpoint=...)``), so a checkpoint
that would need to run code to load is refused before any of it runs. Writing, which needs
Lightning's checkpoint I/O, is :mod:`ktframe.learning.checkpoint_io`'s.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from ktframe.core.errors import InputError

EXPECTED = "expected a .ckpt written by ktframe fit"


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
