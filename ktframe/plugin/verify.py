"""The paper's numerical-equivalence check: a variant's hand-built model against its classical
reference, layer by layer, on the paper's data (or any other setting), by default at the setting
the variant declares exact (:attr:`ktframe.Variant.exact`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.core.reference import random_points
from ktframe.core.tasks import mixture
from ktframe.core.validation import check_gamma, check_n_clusters, check_positive_int
from ktframe.plugin.build import build_model, get_variant
from ktframe.plugin.variant import Variant, dtype_name, resolve_dtype, setting_json, setting_text

ONE_HOT_ATOL = 1e-6
#: The paper's temperature and precision: what a variant that declares no exact setting runs at.
PAPER_GAMMA = 1e4
PAPER_DTYPE = "float32"


@dataclass(frozen=True)
class Setting:
    """What ``ktframe verify`` runs, on the paper's data: 10 000 points, 2 000 per component,
    2-D, scaled to [0, 1], 10 layers, seed 5487.

    ``gamma``, ``dtype`` and ``options`` left unset (None, empty) take the variant's declared exact
    setting (:attr:`ktframe.Variant.exact`); each one given here overrides that key. A variant
    that declares none runs at the paper's gamma = 1e4 in float32."""

    n: int = 10_000
    d: int = 2
    k: int = 5
    layers: int = 10
    gamma: float | None = None
    seed: int = 5487
    dtype: str | torch.dtype | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    """The temperature, precision and build options a run uses, and how they relate to the
    variant's declared exact setting: ``overridden`` names the keys given with another value."""

    gamma: float
    dtype: torch.dtype
    options: dict[str, Any]
    exact: dict[str, Any] | None
    overridden: list[str]

    @property
    def at_exact_setting(self) -> bool:
        return self.exact is not None and not self.overridden


_UNSET = object()


def resolve_setting(spec: Variant, setting: Setting = Setting()) -> Resolved:
    """``setting``'s gamma, dtype and options over the variant's declared exact setting (where a
    key is declared in neither, the build's own default; gamma 1e4 and float32 when the variant
    declares nothing)."""
    defaults = {name: p.default for name, p in inspect.signature(spec.build).parameters.items() if p.default is not inspect.Parameter.empty}
    if spec.exact is None:
        base = {"gamma": PAPER_GAMMA, "dtype": PAPER_DTYPE}
    else:
        base = {"gamma": defaults.get("gamma", PAPER_GAMMA), "dtype": PAPER_DTYPE, **spec.exact}
    given = dict(setting.options)
    if setting.gamma is not None:
        given["gamma"] = check_gamma(setting.gamma)
    if setting.dtype is not None:
        given["dtype"] = resolve_dtype(setting.dtype)
    overridden = [key for key, value in given.items() if not _same(key, value, base.get(key, defaults.get(key, _UNSET)))]
    chosen = {**base, **given}
    options = {key: value for key, value in chosen.items() if key not in ("gamma", "dtype")}
    exact = None if spec.exact is None else dict(spec.exact)
    return Resolved(check_gamma(chosen["gamma"]), resolve_dtype(chosen["dtype"]), options, exact, overridden)


def _same(key: str, value: Any, declared: Any) -> bool:
    if declared is _UNSET:
        return False
    if key == "dtype":
        return resolve_dtype(value) == resolve_dtype(declared)
    try:
        return bool(value == declared)
    except Exception:  # noqa: BLE001 - values that do not compare are not the same
        return False


def verify(variant: str, setting: Setting = Setting(), progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the model and the reference from the same initial centers; report how far apart.
    Unless ``setting`` says otherwise, at the variant's declared exact setting. ``progress(done,
    total)`` hears when each of the two runs (the model's, the reference's) has finished."""
    spec = get_variant(variant)
    if spec.reference is None:
        raise InputError(f"variant {variant!r} declares no classical reference to verify against")
    n = check_positive_int(setting.n, "n")
    d = check_positive_int(setting.d, "d")
    k = check_n_clusters(setting.k, n)
    layers = check_positive_int(setting.layers, "layers")
    resolved = resolve_setting(spec, setting)
    gamma, dtype, options = resolved.gamma, resolved.dtype, resolved.options
    seed = check_positive_int(setting.seed, "seed", minimum=0)

    generator = torch.Generator().manual_seed(seed)
    X, _ = mixture(1, n, d, k, sizes="equal", generator=generator, dtype=torch.float64)
    X = X.to(dtype)
    C0 = random_points(X, k, generator)
    model = build_model(variant, d=d, k=k, n_layers=layers, gamma=gamma, dtype=dtype, **options)
    with torch.no_grad():
        got = model(X, C0)
    if progress is not None:
        progress(1, 2)
    want = spec.run_reference(X, C0, layers, gamma, options)
    if progress is not None:
        progress(2, 2)

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
        "dtype": dtype_name(dtype),
        "options": setting_json(options),
        "exact_setting": None if resolved.exact is None else setting_json(resolved.exact),
        "at_exact_setting": resolved.at_exact_setting,
        "overridden": resolved.overridden,
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


def setting_line(report: dict[str, Any]) -> str:
    """One line: whether the run used the variant's declared exact setting, and which it is."""
    name, exact = report["variant"], report["exact_setting"]
    if exact is None:
        return f"setting: {name} declares no exact setting (Variant.exact); what no flag sets is ktframe's default, gamma={PAPER_GAMMA:g} {PAPER_DTYPE}"
    if report["at_exact_setting"]:
        return f"setting: {setting_text(exact)}, the declared exact setting of {name}"
    return f"setting: not the declared exact setting of {name} ({setting_text(exact)}); overridden: {', '.join(report['overridden'])}"


def centers_are_points(X: torch.Tensor, trajectory: torch.Tensor) -> bool:
    """Whether every center of every step ``(B, T, k, d)`` equals one of its task's points exactly."""
    centers = trajectory.flatten(1, 2)  # (B, T k, d)
    return all(bool((centers[b, :, None, :] == X[b, None, :, :]).all(-1).any(-1).all()) for b in range(X.shape[0]))


def _log_objectives(X: torch.Tensor, trajectory: torch.Tensor) -> list[float]:
    return [math.log(reference.objective(X, trajectory[:, t]).mean().item()) for t in range(trajectory.shape[1])]


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"ktframe verify: {report['variant']} against {report['classical']}",
        f"n={report['n']} d={report['d']} k={report['k']} layers={report['layers']} gamma={report['gamma']} seed={report['seed']} dtype={report['dtype']}"
        + "".join(f" {key}={value}" for key, value in report["options"].items()),
        setting_line(report),
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
