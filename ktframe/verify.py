"""The paper's numerical-equivalence check: a variant's hand-built model against its classical
reference, layer by layer, on the paper's data (or any other setting)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ktframe import reference
from ktframe.errors import InputError
from ktframe.reference import random_points
from ktframe.tasks import mixture
from ktframe.validation import check_gamma, check_n_clusters, check_positive_int
from ktframe.variant import build_model, get_variant, resolve_dtype


ONE_HOT_ATOL = 1e-6


@dataclass(frozen=True)
class Setting:
    """The paper's check: 10 000 points, 2 000 per component, 2-D, scaled to [0, 1], gamma = 1e4, float32."""

    n: int = 10_000
    d: int = 2
    k: int = 5
    layers: int = 10
    gamma: float = 1e4
    seed: int = 5487
    dtype: str = "float32"
    options: dict[str, Any] = field(default_factory=dict)


def verify(variant: str, setting: Setting = Setting()) -> dict[str, Any]:
    """Run the model and the reference from the same initial centers; report how far apart."""
    spec = get_variant(variant)
    if spec.reference is None:
        raise InputError(f"variant {variant!r} declares no classical reference to verify against")
    n = check_positive_int(setting.n, "n")
    d = check_positive_int(setting.d, "d")
    k = check_n_clusters(setting.k, n)
    layers = check_positive_int(setting.layers, "layers")
    gamma = check_gamma(setting.gamma)
    seed = check_positive_int(setting.seed, "seed", minimum=0)
    dtype = resolve_dtype(setting.dtype)

    generator = torch.Generator().manual_seed(seed)
    X, _ = mixture(1, n, d, k, sizes="equal", generator=generator, dtype=torch.float64)
    X = X.to(dtype)
    C0 = random_points(X, k, generator)
    model = build_model(variant, d=d, k=k, n_layers=layers, gamma=gamma, dtype=dtype, **setting.options)
    with torch.no_grad():
        got = model(X, C0)
    want = spec.run_reference(X, C0, layers, gamma, setting.options)

    errors = (got.trajectory - want.trajectory).abs().amax(dim=(0, 2, 3))  # per layer
    agreement = (got.labels == want.labels).to(torch.float64).mean().item()
    one_hot = ((got.assignments - got.assignments.round()).abs() <= ONE_HOT_ATOL).all(dim=-1).sum().item()
    tolerance = spec.tolerance(dtype, gamma)
    max_error = errors.max().item()
    passed = tolerance.accepts(max_error, agreement)
    extra = {}
    if spec.centers_are_points:
        extra["centers_are_data_points"] = centers_are_points(X, got.trajectory[:, 1:])
        passed = passed and extra["centers_are_data_points"]
    return {
        "variant": variant,
        "classical": spec.classical,
        "n": n,
        "d": d,
        "k": k,
        "layers": layers,
        "gamma": gamma if math.isfinite(gamma) else "inf",
        "seed": seed,
        "dtype": setting.dtype if isinstance(setting.dtype, str) else str(dtype).removeprefix("torch."),
        "max_center_error": max_error,
        "center_error_per_layer": errors.tolist(),
        "assignment_agreement": agreement,
        "one_hot_rows": int(one_hot),
        "log_objective_transformer": _log_objectives(X, got.trajectory),
        "log_objective_reference": _log_objectives(X, want.trajectory),
        "tolerance": {"center_error": tolerance.center_error, "agreement": tolerance.agreement},
        **extra,
        "passed": passed,
    }


def centers_are_points(X: torch.Tensor, trajectory: torch.Tensor) -> bool:
    """Whether every center of every step ``(B, T, k, d)`` equals one of its task's points exactly."""
    centers = trajectory.flatten(1, 2)  # (B, T k, d)
    return all(bool((centers[b, :, None, :] == X[b, None, :, :]).all(-1).any(-1).all()) for b in range(X.shape[0]))


def _log_objectives(X: torch.Tensor, trajectory: torch.Tensor) -> list[float]:
    return [math.log(reference.objective(X, trajectory[:, t]).mean().item()) for t in range(trajectory.shape[1])]


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"ktframe verify: {report['variant']} against {report['classical']}",
        f"n={report['n']} d={report['d']} k={report['k']} layers={report['layers']} gamma={report['gamma']} seed={report['seed']} dtype={report['dtype']}",
        "",
        f"{'layer':>5}  {'log obj (model)':>16}  {'log obj (ref)':>14}  {'max |center error|':>19}",
    ]
    for t, (a, b, e) in enumerate(zip(report["log_objective_transformer"], report["log_objective_reference"], report["center_error_per_layer"])):
        lines.append(f"{t:>5}  {a:>16.8f}  {b:>14.8f}  {e:>19.3e}")
    lines += [
        "",
        f"max center error     {report['max_center_error']:.3e} (at most {report['tolerance']['center_error']:.0e})",
        f"assignment agreement {report['assignment_agreement']:.6f} (at least {report['tolerance']['agreement']:g})",
        f"one-hot rows         {report['one_hot_rows']} of {report['n']} (within {ONE_HOT_ATOL:g})",
        *([f"centers are data points: {'yes' if report['centers_are_data_points'] else 'NO'}"] if "centers_are_data_points" in report else []),
        "PASS" if report["passed"] else "FAIL",
    ]
    return "\n".join(lines)
