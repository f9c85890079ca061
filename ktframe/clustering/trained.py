"""A trained checkpoint's model on a user's data: the layer as it was evaluated, the data in the frame
it was trained in.

:func:`load_trained` reads a checkpoint of ``ktframe fit`` weights-only
(:mod:`ktframe.core.checkpoint`) and rebuilds its model from its config. :class:`Frame` takes a
user's points ``(B, n, D)`` to the model's ``d`` coordinates and the scaling of its training tasks,
and centers back to the user's units:

- **dimensions**: narrower data (D < d) is zero-padded to d coordinates (as the general task
  distribution's ``data.subspace`` draws it); wider data (D > d) is reduced to its first d principal
  components, the PCA fitted on the data itself (each task its own), centers mapped back into the
  user's space within those components;
- **scaling**: the checkpoint's ``data.scaling``, per task: ``minmax`` (the paper's tasks: each
  coordinate to [0, 1]), ``isotropic`` (each coordinate's minimum to 0, one factor for all to a
  largest span of 1), ``rms`` (to the mean, one factor for all to an RMS distance of 1) or ``none``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ktframe.core.checkpoint import check_dimensions, load_weights, model_weights, read_checkpoint
from ktframe.core.errors import InputError
from ktframe.plugin.build import model_from_config
from ktframe.transformer.model import KMeansTransformer

SCALINGS = ("minmax", "isotropic", "rms", "none")


@dataclass(frozen=True)
class Trained:
    """A checkpoint's model (in eval mode) and what its config says of using it: ``steps``, the
    re-embedded steps it was evaluated with (``eval.steps``), ``scaling``, that of its training
    tasks (``data.scaling``), and the finish it is evaluated with: ``lloyd_last`` of the steps
    Lloyd's (``eval.lloyd_last``), then ``swaps`` swaps (``eval.swaps``); 0 where its config has
    none. ``k`` is the model's k, the largest it takes where ``any_k``."""

    path: str
    model: KMeansTransformer
    steps: int
    scaling: str
    lloyd_last: int = 0
    swaps: int = 0

    @property
    def d(self) -> int:
        return self.model.d

    @property
    def k(self) -> int:
        return self.model.k

    @property
    def any_k(self) -> bool:
        return self.model.embedding.any_k

    def check_k(self, k: int) -> int:
        """``k`` where the model takes it; otherwise a one-line :class:`InputError`."""
        if self.any_k and not 1 <= k <= self.k:
            raise InputError(f"{self.path}: its model takes any k up to {self.k}; got n_clusters={k}; expected 1 <= n_clusters <= {self.k}")
        if not self.any_k and k != self.k:
            raise InputError(f"{self.path}: its model was trained for k={self.k} only; got n_clusters={k}; expected n_clusters={self.k}")
        return k


def load_trained(path: str | os.PathLike) -> Trained:
    """The trained model of a checkpoint of ``ktframe fit``, read with ``weights_only=True``."""
    checkpoint = read_checkpoint(path)
    config = checkpoint["hyper_parameters"]["config"]
    model = model_from_config(config)
    load_weights(model, model_weights(checkpoint), path)
    check_dimensions(checkpoint, model, path)
    scaling = config["data"].get("scaling", "minmax")
    if scaling not in SCALINGS:
        raise InputError(f"{path}: its config says data.scaling={scaling!r}; expected one of: {', '.join(SCALINGS)}")
    ev = config["eval"]
    return Trained(str(Path(path)), model.eval(), int(ev["steps"]), scaling, int(ev.get("lloyd_last", 0)), int(ev.get("swaps", 0)))


@dataclass(frozen=True)
class Frame:
    """Points ``(B, n, D)`` as a model of ``d`` coordinates sees them: ``(x − mean) @ components``
    (a PCA, where D > d) or ``x`` zero-padded (where D <= d), then ``(y − low) / factor`` (the
    scaling). ``to_model`` applies it, ``to_user`` maps centers back."""

    features: int
    d: int
    mean: torch.Tensor | None  # (B, 1, D), where a PCA reduces the data
    components: torch.Tensor | None  # (B, D, d)
    low: torch.Tensor  # (B, 1, d)
    factor: torch.Tensor  # (B, 1, d) or (B, 1, 1)

    @classmethod
    def fit(cls, X: torch.Tensor, d: int, scaling: str) -> Frame:
        """The frame of the tasks ``X`` for a model of ``d`` coordinates trained on tasks scaled by
        ``scaling``."""
        B, n, D = X.shape
        mean = components = None
        if D > d:
            mean = X.mean(dim=1, keepdim=True)
            _, _, vh = torch.linalg.svd(X - mean, full_matrices=False)  # (B, min(n, D), D)
            components = vh[:, :d].transpose(1, 2)
            # One sign per component, so that the frame does not depend on the SVD's: its largest
            # loading positive.
            signs = torch.gather(components, 1, components.abs().argmax(dim=1, keepdim=True)).sign()
            components = components * torch.where(signs == 0, torch.ones_like(signs), signs)
            if components.shape[-1] < d:  # fewer points than d: the components they span, then zeros
                components = torch.nn.functional.pad(components, (0, d - components.shape[-1]))
        frame = cls(D, d, mean, components, X.new_zeros(B, 1, d), X.new_ones(B, 1, 1))
        Y = frame.reduce(X)
        if scaling in ("minmax", "isotropic"):
            low = Y.amin(dim=1, keepdim=True)
            span = Y.amax(dim=1, keepdim=True) - low
            span = span if scaling == "minmax" else span.amax(dim=-1, keepdim=True)
            return cls(D, d, mean, components, low, torch.where(span > 0, span, torch.ones_like(span)))
        if scaling == "rms":
            low = Y.mean(dim=1, keepdim=True)
            rms = (Y - low).square().sum(dim=-1).mean(dim=-1)[:, None, None].sqrt()
            return cls(D, d, mean, components, low, torch.where(rms > 0, rms, torch.ones_like(rms)))
        return frame

    @property
    def reduced(self) -> bool:
        return self.components is not None

    def reduce(self, X: torch.Tensor) -> torch.Tensor:
        """``X`` in d coordinates: its principal components, or zero-padded."""
        if self.reduced:
            return torch.bmm(X - self.mean, self.components)
        return torch.nn.functional.pad(X, (0, self.d - self.features)) if self.features < self.d else X

    def to_model(self, X: torch.Tensor) -> torch.Tensor:
        return (self.reduce(X) - self.low) / self.factor

    def to_user(self, C: torch.Tensor) -> torch.Tensor:
        """Centers ``(B, k, d)`` of the model's frame in the user's units ``(B, k, D)``."""
        Y = C * self.factor + self.low
        if self.reduced:
            return torch.bmm(Y, self.components.transpose(1, 2)) + self.mean
        return Y[..., : self.features]
