"""Conformance checks for variant plugins, in the spirit of scikit-learn's ``check_estimator``.

A plugin's own test suite runs them on its registered variant::

    import pytest
    from ktframe.plugin.testing import check_variant, variant_checks

    @pytest.mark.parametrize("check", variant_checks("my-variant"), ids=str)
    def test_conformance(check):
        check()

    # or all at once: check_variant("my-variant")

Each check builds the variant through the registry (so through its entry point) on small random
tasks and fails with an ``AssertionError`` that names the check and says what was expected:

- ``registered``: the variant is registered under its own name, its ``build`` takes the keyword
  arguments ``d``, ``k`` and ``n_layers``, it declares a classical reference, and the setting at
  which it equals that reference (``Variant.exact``, which ``ktframe verify`` runs by default);
- ``shapes``: centers ``(B, k, d)``, assignments ``(B, n, k)`` (non-negative rows summing to 1),
  trajectory ``(B, layers + 1, k, d)`` starting at the initial centers, all finite;
- ``dtypes``: a float32 model returns float32 and a float64 model float64, and so does the reference;
- ``batching``: a task's result does not depend on the other tasks of its batch, and a
  deterministic variant's batched result equals running every task alone;
- ``determinism``: two models built alike, run twice each, return identical results (a
  randomized variant takes a ``seed`` build option and is reproducible under it);
- ``reference``: the model agrees with the variant's declared classical reference within the
  variant's own tolerance, on the whole trajectory and the labels (and its centers are data
  points where the variant says so);
- ``trainable``: :func:`ktframe.transformer.construction.learnable` makes it a model with parameters that
  receive finite gradients from the training loss, as ``ktframe fit`` needs.

Where its text is silent, a check uses the variant's defaults; ``options`` and ``gamma`` set any
other setting (``gamma=inf``, the hard limit, by default).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ktframe.core import reference
from ktframe.core.loss import softmin_bound
from ktframe.core.result import ClusteringResult
from ktframe.core.tasks import mixture
from ktframe.plugin.build import build_model, get_variant
from ktframe.plugin.variant import Variant
from ktframe.plugin.verify import centers_are_points
from ktframe.transformer.construction import learnable

CHECKS = ("registered", "shapes", "dtypes", "batching", "determinism", "reference", "trainable")


@dataclass(frozen=True)
class Problem:
    """The small tasks the checks run on."""

    batch: int = 3
    n: int = 48
    d: int = 2
    k: int = 3
    layers: int = 3
    seed: int = 0


@dataclass(frozen=True)
class Check:
    variant: str
    name: str
    run: Callable[[], None]

    def __call__(self) -> None:
        try:
            self.run()
        except AssertionError as exc:
            raise AssertionError(f"ktframe conformance check {self}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.variant}:{self.name}"


def variant_checks(variant: str, *, options: Mapping[str, Any] | None = None, gamma: float = math.inf, problem: Problem = Problem()) -> list[Check]:
    """Every conformance check of ``variant`` (a registered name), one :class:`Check` each."""
    suite = _Suite(variant, dict(options or {}), gamma, problem)
    return [Check(variant, name, getattr(suite, name)) for name in CHECKS]


def check_variant(variant: str, **kwargs: Any) -> list[str]:
    """Run every check of ``variant``; the first failure raises. Returns the checks' names."""
    checks = variant_checks(variant, **kwargs)
    for check in checks:
        check()
    return [check.name for check in checks]


class _Suite:
    def __init__(self, variant: str, options: dict[str, Any], gamma: float, problem: Problem) -> None:
        self.variant, self.options, self.gamma, self.p = variant, options, gamma, problem

    # --- helpers ------------------------------------------------------------------------------

    @property
    def spec(self) -> Variant:
        return get_variant(self.variant)

    def tasks(self, dtype: torch.dtype = torch.float64, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.p.seed if seed is None else seed)
        X, _ = mixture(self.p.batch, self.p.n, self.p.d, self.p.k, generator=g, dtype=torch.float64)
        return X.to(dtype), reference.random_points(X, self.p.k, g).to(dtype)

    def model(self, dtype: torch.dtype = torch.float64):
        return build_model(self.variant, d=self.p.d, k=self.p.k, n_layers=self.p.layers, gamma=self.gamma, dtype=dtype, **self.options)

    def run(self, X: torch.Tensor, C0: torch.Tensor, model=None) -> ClusteringResult:
        with torch.no_grad():
            return (model or self.model(X.dtype))(X, C0)

    def expected(self, X: torch.Tensor, C0: torch.Tensor) -> ClusteringResult:
        """The declared classical reference on the same tasks."""
        return self.spec.run_reference(X, C0, self.p.layers, self.gamma, self.options)

    @property
    def randomized(self) -> bool:
        return "seed" in self.spec.options()

    # --- the checks ---------------------------------------------------------------------------

    def registered(self) -> None:
        spec = self.spec
        assert isinstance(spec, Variant), f"registered {type(spec).__name__}, expected a ktframe.Variant"
        assert spec.name == self.variant, f"registered as {self.variant!r} but names itself {spec.name!r}"
        params = inspect.signature(spec.build).parameters
        missing = [name for name in ("d", "k", "n_layers") if name not in params]
        assert not missing, f"build() lacks the keyword argument(s) {', '.join(missing)}"
        assert spec.reference is not None, "declares no classical reference (Variant.reference is None)"
        assert spec.classical, "declares no name for its classical algorithm (Variant.classical)"
        assert spec.exact is not None, (
            "declares no exact setting (Variant.exact), the setting at which it equals its reference and which "
            "`ktframe verify` runs by default; e.g. exact={'gamma': math.inf, 'dtype': 'float64'}"
        )

    def shapes(self) -> None:
        B, n, d, k, L = self.p.batch, self.p.n, self.p.d, self.p.k, self.p.layers
        X, C0 = self.tasks()
        out = self.run(X, C0)
        assert isinstance(out, ClusteringResult), f"the model returned {type(out).__name__}, expected a ClusteringResult"
        for name, tensor, shape in (
            ("centers", out.centers, (B, k, d)),
            ("assignments", out.assignments, (B, n, k)),
            ("trajectory", out.trajectory, (B, L + 1, k, d)),
        ):
            assert tuple(tensor.shape) == shape, f"{name} has shape {tuple(tensor.shape)}, expected {shape}"
            assert bool(torch.isfinite(tensor).all()), f"{name} holds non-finite values"
        assert torch.equal(out.trajectory[:, 0], C0), "the trajectory does not start at the initial centers"
        assert torch.equal(out.trajectory[:, -1], out.centers), "the trajectory does not end at the returned centers"
        assert bool((out.assignments >= -1e-12).all()), "assignments hold negative weights"
        torch.testing.assert_close(out.assignments.sum(-1), torch.ones(B, n, dtype=X.dtype), atol=1e-9, rtol=0, msg="assignment rows do not sum to 1")

    def dtypes(self) -> None:
        for dtype in (torch.float32, torch.float64):
            X, C0 = self.tasks(dtype)
            out, want = self.run(X, C0), self.expected(X, C0)
            for name, tensor in (("model centers", out.centers), ("model assignments", out.assignments), ("reference centers", want.centers)):
                assert tensor.dtype == dtype, f"{name} are {tensor.dtype} for {dtype} input"

    def batching(self) -> None:
        X, C0 = self.tasks()
        Y, D0 = self.tasks(seed=self.p.seed + 1)
        together = self.run(X, C0)
        # Replace every task but the first: the first task's result must not move.
        swapped = self.run(torch.cat([X[:1], Y[1:]]), torch.cat([C0[:1], D0[1:]]))
        assert torch.equal(together.trajectory[0], swapped.trajectory[0]), "a task's centers changed when the other tasks of its batch did"
        assert torch.equal(together.assignments[0], swapped.assignments[0]), "a task's assignments changed when the other tasks of its batch did"
        if self.randomized:
            return  # its noise is drawn for the whole batch: alone, a task draws other numbers
        for b in range(self.p.batch):
            alone = self.run(X[b : b + 1], C0[b : b + 1])
            torch.testing.assert_close(alone.trajectory[0], together.trajectory[b], atol=1e-12, rtol=0, msg=f"task {b} alone differs from task {b} in a batch")

    def determinism(self) -> None:
        X, C0 = self.tasks()
        first, second = self.model(), self.model()
        runs = [self.run(X, C0, first), self.run(X, C0, first), self.run(X, C0, second)]
        for i, other in enumerate(runs[1:], start=1):
            what = "a second run of the same model" if i == 1 else "a second model built alike"
            assert torch.equal(runs[0].trajectory, other.trajectory), f"{what} returned other centers"
            assert torch.equal(runs[0].assignments, other.assignments), f"{what} returned other assignments"

    def reference(self) -> None:
        for dtype in (torch.float64, torch.float32):
            X, C0 = self.tasks(dtype)
            got, want = self.run(X, C0), self.expected(X, C0)
            assert want.trajectory.shape == got.trajectory.shape, (
                f"the reference's trajectory has shape {tuple(want.trajectory.shape)}, the model's {tuple(got.trajectory.shape)}"
            )
            tolerance = self.spec.tolerance(dtype, self.gamma)
            error = (got.trajectory - want.trajectory).abs().max().item()
            agreement = (got.labels == want.labels).to(torch.float64).mean().item()
            assert tolerance.accepts(error, agreement), (
                f"{dtype}: center error {error:.3e} (at most {tolerance.center_error:g}) and label agreement {agreement:.4f} "
                f"(at least {tolerance.agreement:g}) against the reference, {self.spec.classical}"
            )
            if self.spec.centers_are_points:
                assert centers_are_points(X, got.trajectory[:, 1:]), f"{dtype}: a center is not one of the data points"

    def trainable(self) -> None:
        X, C0 = self.tasks(torch.float32)
        model = learnable(self.model(torch.float32)).train()
        params = [p for p in model.parameters() if p.requires_grad]
        assert params, "learnable() left the model without trainable parameters"
        loss = softmin_bound(X, model(X, C0, n_steps=1).centers, 10.0)
        assert bool(torch.isfinite(loss)), f"the training loss is {loss.item()}"
        loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        assert grads, "no parameter received a gradient from the training loss"
        assert all(bool(torch.isfinite(g).all()) for g in grads), "a gradient is not finite"
        assert any(bool((g != 0).any()) for g in grads), "every gradient is zero"
