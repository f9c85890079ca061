"""Checks on what users hand to ktframe, each failing with one line: what is wrong, what is expected."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ktframe.core import host
from ktframe.core.errors import InputError


def as_tensor(data: Any, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A floating tensor from a tensor, a numpy array or nested lists of numbers."""
    if isinstance(data, torch.Tensor):
        tensor = data
    else:
        try:
            array = np.asarray(data)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{name} must be an array of numbers; could not read it as one ({exc})") from None
        if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise InputError(f"{name} must contain only numbers; got values of type {array.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    if tensor.is_complex():
        raise InputError(f"{name} must be real numbers; got a complex {tensor.dtype}")
    if not tensor.is_floating_point():
        tensor = tensor.to(torch.get_default_dtype())
    return tensor if dtype is None else tensor.to(dtype)


def magnitude_limit(d: int, dtype: torch.dtype) -> float:
    """The largest coordinate magnitude ``M`` of ``d``-dimensional points whose squared distances
    stay finite in ``dtype``: two such points are at most ``d·(2M)²`` apart, squared."""
    return math.sqrt(torch.finfo(dtype).max / d) / 2


def peak_magnitude(tensor: torch.Tensor) -> float:
    """The largest ``|x|`` of a floating ``tensor`` in one pass, without a copy as large as it (0
    for an empty one); NaN where an entry is NaN (min and max propagate it), inf where one is inf."""
    if not tensor.numel():
        return 0.0
    low, high = host.extremes(tensor)
    return max(-low, high) if not (math.isnan(low) or math.isnan(high)) else math.nan


def check_magnitude(peak: float, d: int, dtype: torch.dtype, name: str) -> None:
    """Refuse points of largest magnitude ``peak`` whose squared distances overflow ``dtype`` (then
    every distance compares as inf or NaN, and k-means returns garbage without an error)."""
    limit = magnitude_limit(d, dtype)
    if peak > limit:
        raise InputError(
            f"{name}: points reach magnitude {peak:.3g}, whose squared distances overflow {str(dtype).removeprefix('torch.')}; "
            f"expected magnitudes up to {limit:.3g} in {d} dimensions: rescale the data (e.g. standardise it)"
        )


def check_values(tensor: torch.Tensor, name: str) -> None:
    """Every entry finite, and none so large that squared distances between such points (or
    centers) overflow the dtype: one pass over ``tensor``; only a failure looks at every entry
    again, to report where."""
    if not tensor.is_floating_point():
        return
    peak = peak_magnitude(tensor)
    if not math.isfinite(peak):
        where = tuple(int(i) for i in (~torch.isfinite(tensor)).nonzero()[0])
        value = tensor[where].item()
        raise InputError(f"{name} must be finite; found {value} at index {where} (remove or impute NaN/inf values first)")
    check_magnitude(peak, tensor.shape[-1], tensor.dtype, name)


def check_rank(tensor: torch.Tensor, name: str, ranks: tuple[int, ...], shape_text: str) -> None:
    if tensor.dim() not in ranks:
        raise InputError(f"{name} must have shape {shape_text}; got {tuple(tensor.shape)} ({tensor.dim()} dimensions)")


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def check_gamma(gamma: Any) -> float:
    try:
        gamma = float(gamma)
    except (TypeError, ValueError):
        raise InputError(f"gamma must be a positive number or inf; got {gamma!r}") from None
    if math.isnan(gamma) or gamma <= 0:
        raise InputError(f"gamma must be a positive number or inf; got {gamma!r}")
    return gamma


def check_n_clusters(k: Any, n: int) -> int:
    k = check_positive_int(k, "the number of clusters k")
    if k > n:
        raise InputError(f"the number of clusters k={k} exceeds the number of points n={n}; expected k <= n")
    return k


def check_model_inputs(X: Any, C0: Any, *, d: int, k: int, dtype: torch.dtype, any_k: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``X (B, n, d)`` and ``C0 (B, k, d)`` for a model built for ``(d, k)``, cast to its dtype;
    with ``any_k``, ``C0 (B, k', d)`` for any 1 <= k' <= k."""
    X = as_tensor(X, "X", dtype)
    C0 = as_tensor(C0, "C0", dtype)
    check_rank(X, "X", (3,), f"(B, n, {d})")
    check_rank(C0, "C0", (3,), f"(B, {k}, {d})")
    if X.shape[-1] != d:
        raise InputError(f"X has {X.shape[-1]} coordinates per point but the model was built for d={d}; expected X of shape (B, n, {d})")
    if C0.shape[0] != X.shape[0] or C0.shape[-1] != d or (not any_k and C0.shape[1] != k):
        raise InputError(f"C0 must have shape ({X.shape[0]}, {k}, {d}) to match X {tuple(X.shape)} and the model's k={k}; got {tuple(C0.shape)}")
    if any_k and not 1 <= C0.shape[1] <= k:
        raise InputError(f"C0 holds {C0.shape[1]} centers per task but the model takes 1 to {k}; expected C0 of shape ({X.shape[0]}, k, {d}) with k <= {k}")
    k = C0.shape[1]
    if X.shape[1] < k:
        raise InputError(f"the number of clusters k={k} exceeds the number of points n={X.shape[1]}; expected k <= n")
    check_values(X, "X")
    check_values(C0, "C0")
    return X, C0
