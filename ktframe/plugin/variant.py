"""What a clustering variant plugin declares, and how a model is built from one."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ktframe.core.errors import InputError
from ktframe.core.names import closest
from ktframe.core.result import ClusteringResult
from ktframe.core.validation import check_gamma

if TYPE_CHECKING:
    from ktframe.transformer.model import KMeansTransformer

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class Variant:
    """A clustering algorithm as a transformer.

    - ``build(*, d, k, n_layers, gamma, **options)`` returns the hand-built model (``gamma=inf``
      is the hard limit, where the softmax maps become arg-max maps);
    - ``reference(X, C0, n_iter)`` runs the classical algorithm it must equal, written without
      attention (None when the variant has none); one that depends on the temperature also takes
      a ``gamma`` keyword;
    - ``tolerance(dtype, gamma)`` is the :class:`Tolerance` ``ktframe verify`` applies;
    - ``centers_are_points``: every center the algorithm returns is one of the data points
      (k-medoids), which ``ktframe verify`` then checks exactly;
    - ``training``: config overrides that ``ktframe fit variant=NAME`` applies on top of the
      preset (e.g. ``{"model": {"gamma": 100.0}}``): the setting at which a learnable version of
      the variant trains sensibly;
    - ``exact``: the setting at which the model equals its reference up to float rounding, which
      ``ktframe verify --variant NAME`` runs when no flag says otherwise: ``gamma`` (``math.inf``
      for the hard limit), ``dtype`` (``"float32"`` or ``"float64"``) and any build option, e.g.
      ``{"gamma": math.inf, "dtype": "float64"}``. None declares none: ``ktframe verify`` then
      runs ktframe's default (gamma=1e4, float32) and the conformance suite fails the variant.
      An unknown key or a bad value is an :class:`~ktframe.core.errors.InputError` when the Variant
      is created;
    - ``soft_memberships``: the assignments its model writes are soft memberships, each point's
      probabilities over the clusters (rows summing to 1; the responsibilities of soft k-means),
      which ``TransformerKMeans.predict_proba`` and ``memberships_`` return;
    - ``sample_weights``: its center update is a weighted mean of the points it reads (Lloyd's mean,
      soft k-means' responsibility-weighted mean), so a point of weight w counts as w copies of
      itself: ``TransformerKMeans.fit(X, sample_weight=w)`` passes the weights to the model, which
      weighs each point as a key of the center update (``KMeansTransformer.forward(...,
      sample_weight=)``).

    Build options that the reference also takes (``trim``, ``beta``, ``seed``, ...) are passed
    to it under the same name, so that both run the same algorithm.
    """

    name: str
    summary: str
    classical: str
    build: Callable[..., KMeansTransformer]
    reference: Callable[..., ClusteringResult] | None
    tolerance: Callable[[torch.dtype, float], Tolerance]
    centers_are_points: bool = False
    training: Mapping[str, Any] = field(default_factory=dict)
    exact: Mapping[str, Any] | None = None
    soft_memberships: bool = False
    sample_weights: bool = False

    def __post_init__(self) -> None:
        if self.exact is not None:
            object.__setattr__(self, "exact", check_exact(self, self.exact))

    def run_reference(self, X: torch.Tensor, C0: torch.Tensor, n_iter: int, gamma: float, options: Mapping[str, Any] | None = None) -> ClusteringResult:
        """The reference from ``C0``, given the temperature and those build ``options`` it takes."""
        params = inspect.signature(self.reference).parameters
        kwargs = {key: value for key, value in (options or {}).items() if key in params}
        if "gamma" in params:
            kwargs["gamma"] = gamma
        return self.reference(X, C0, n_iter, **kwargs)

    def options(self) -> list[str]:
        """The keyword options of ``build`` beyond d, k and n_layers (gamma among them)."""
        params = inspect.signature(self.build).parameters
        return [p for p in params if p not in ("d", "k", "n_layers")]


@dataclass(frozen=True)
class Tolerance:
    """How close ``ktframe verify`` requires a model to its reference: the largest center error
    over all layers, and the smallest fraction of points with the reference's final label."""

    center_error: float
    agreement: float = 1.0

    def accepts(self, center_error: float, agreement: float) -> bool:
        return center_error <= self.center_error and agreement >= self.agreement


def exact_tolerance(dtype: torch.dtype, gamma: float) -> Tolerance:
    """For constructions exact in the hard limit: float rounding there. At finite gamma a softmax
    cannot separate a point whose two nearest centers are within about 1/gamma in squared distance
    (at the default verify setting, 254 of 10 000 points are within 10/gamma), so such points keep soft
    assignments and the centers drift by up to ~1e-3: see docs/exactness.md."""
    if math.isinf(gamma):
        return Tolerance(1e-9 if dtype == torch.float64 else 1e-4)
    return Tolerance(1e-3, agreement=0.99)


def resolve_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise InputError(f"unsupported dtype {dtype!r}; expected one of: {', '.join(DTYPES)}")


def check_exact(variant: Variant, exact: Mapping[str, Any]) -> dict[str, Any]:
    """``exact`` as a new dict, once its keys are ``dtype`` or build options of ``variant`` and
    its ``gamma`` and ``dtype`` valid; otherwise a one-line :class:`InputError`."""
    if not isinstance(exact, Mapping):
        raise InputError(f"variant {variant.name!r} declares exact={exact!r}; expected a dict such as {{'gamma': math.inf, 'dtype': 'float64'}}")
    valid = ["dtype", *variant.options()]
    for key in exact:
        if key not in valid:
            hint = closest(str(key), valid)
            suggestion = f" (did you mean {hint!r}?)" if hint else ""
            raise InputError(
                f"variant {variant.name!r} declares an exact setting with unknown key {key!r}; expected dtype or a build option: {', '.join(valid)}{suggestion}"
            )
    exact = dict(exact)
    if "gamma" in exact:
        exact["gamma"] = check_gamma(exact["gamma"])
    if "dtype" in exact:
        resolve_dtype(exact["dtype"])
    return exact


def setting_text(setting: Mapping[str, Any]) -> str:
    """``gamma=inf dtype=float64 trim=0.1``: a setting as the command line shows it."""
    return " ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={dtype_name(value)}" for key, value in setting.items())


def setting_json(setting: Mapping[str, Any]) -> dict[str, Any]:
    """A setting as JSON can hold it: infinite floats as ``"inf"``, dtypes by name."""
    return {key: ("inf" if value > 0 else "-inf") if isinstance(value, float) and math.isinf(value) else dtype_name(value) for key, value in setting.items()}


def dtype_name(value: Any) -> Any:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def check_options(variant: Variant, options: dict[str, Any]) -> None:
    valid = variant.options()
    for key in options:
        if key not in valid:
            hint = closest(key, valid)
            suggestion = f" (did you mean {hint!r}?)" if hint else ""
            raise InputError(f"unknown option {key!r} for variant {variant.name!r}; expected one of: {', '.join(valid) or '(none)'}{suggestion}")
