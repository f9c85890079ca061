"""Reading ktframe's training checkpoints: weights-only and one line for every way a file can
fail to be one.

Reading is ``torch.load(..., weights_only=True)`` and nothing else, whoever asks (``ktframe eval``,
``resume=``, Lightning restoring a run, ``TransformerKMeans(checkpoint=...)``), so a checkpoint
that would need to run code to load is refused before any of it runs. Writing, which needs
Lightning's checkpoint I/O, is :mod:`ktframe.learning.checkpoint_io`'s.
"""

from __future__ import annotations

import math
import os
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ktframe.core.errors import InputError
from ktframe.core.limits import MAX_ITERATIONS, check_integer

# The largest d or k a checkpoint may record: far beyond any model ktframe trains, and small enough
# that building it cannot exhaust memory before its weights are compared.
MAX_SIZE = 10**5
# The sections of a training config every reader takes, and in each the keys it needs with their bound.
SECTIONS = {"model": {"variant": None, "n_layers": MAX_ITERATIONS}, "data": {"d": MAX_SIZE, "k": MAX_SIZE}, "eval": {"steps": MAX_ITERATIONS}}

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
        with warnings.catch_warnings():  # torch's advice on a refused load is not ktframe's one line
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError as exc:
        raise InputError(f"{path}: cannot read the checkpoint ({exc.strerror}); expected a readable file in a folder with execute permission") from None
    except pickle.UnpicklingError as exc:
        raise InputError(
            f"{path}: refused to load: not plain weights and data ({_refusal(exc)}); ktframe loads checkpoints with weights_only=True, so nothing in one can run; {EXPECTED}"
        ) from None
    except (EOFError, OSError, RuntimeError, IndexError, ValueError, zipfile.BadZipFile) as exc:
        # torch reports an empty, cut-off or garbled file in all of these ways, some with no message
        detail = next(iter(str(exc).splitlines()), "").split(". ")[0] or type(exc).__name__
        raise InputError(f"{path}: not a readable checkpoint (empty, truncated or corrupt: {detail}); {EXPECTED}") from None
    check_contents(checkpoint, path)
    return checkpoint


def _not_ours(path: Path, what: str) -> InputError:
    return InputError(f"{path}: not a checkpoint of ktframe fit: {what}; {EXPECTED}, with a state_dict of tensors and config sections {', '.join(SECTIONS)}")


def check_contents(checkpoint: Any, path: Path) -> None:
    """Every part of ``checkpoint`` a reader takes is there, of its type and within its bound,
    before anything is built from it: one line naming the file and the first part that is not."""
    if not isinstance(checkpoint, Mapping):
        raise _not_ours(path, f"it holds a {type(checkpoint).__name__}, not a mapping")
    hyper = checkpoint.get("hyper_parameters")
    config = hyper.get("config") if isinstance(hyper, Mapping) else None
    if not isinstance(config, Mapping):
        raise _not_ours(path, "it has no hyper_parameters.config mapping")
    state = checkpoint.get("state_dict")
    if not isinstance(state, Mapping):
        raise _not_ours(path, "it has no state_dict mapping")
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise _not_ours(path, f"its state_dict[{key!r}] is a {type(value).__name__}, not a tensor")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise InputError(f"{path}: its weights are not finite (state_dict[{key!r}] holds NaN or inf); expected the finite weights of a ktframe fit run")
    if not isinstance(config.get("run_id"), str):
        raise _not_ours(path, "its hyper_parameters.config has no 'run_id' string")
    for name, keys in SECTIONS.items():
        section = config.get(name)
        if not isinstance(section, Mapping):
            what = f"has no '{name}' section" if section is None else f"has a {type(section).__name__} as its '{name}' section, not a mapping"
            raise _not_ours(path, f"its hyper_parameters.config {what}")
        for key, bound in keys.items():
            if key not in section:
                raise _not_ours(path, f"its hyper_parameters.config.{name} has no '{key}'")
            if bound is None:
                if not isinstance(section[key], str):
                    raise _not_ours(path, f"its {name}.{key} is {section[key]!r}, not a name")
                continue
            try:
                check_integer(section[key], f"its {name}.{key}", 1, bound)
            except InputError as exc:
                raise _not_ours(path, str(exc)) from None
    gamma = config["model"].get("gamma")
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or math.isnan(gamma) or gamma <= 0):
        raise _not_ours(path, f"its model.gamma is {gamma!r}, not a positive number")
    for key in ("lloyd_last", "swaps"):
        if key in config["eval"]:
            try:
                check_integer(config["eval"][key], f"its eval.{key}", 0, MAX_ITERATIONS)
            except InputError as exc:
                raise _not_ours(path, str(exc)) from None
    ev = config["eval"]
    if isinstance(ev.get("lloyd_last"), int) and ev["lloyd_last"] > ev["steps"]:
        raise _not_ours(path, f"its eval.lloyd_last={ev['lloyd_last']} exceeds its eval.steps={ev['steps']}")


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
