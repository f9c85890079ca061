"""All the steps of Lloyd's layer in one kernel call (ktframe.fast.steps) against the same layer
run step by step (its plan's ``one_kernel_call`` off): the same centers, assignments, trajectory and n_iter, bit
for bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ktframe
from ktframe.core import host, reference
from ktframe.core.tasks import mixture
from ktframe.fast import model as fast_model
from ktframe.kernels import cpu as kernels

FIELDS = ("centers", "assignments", "trajectory", "n_iter")


def counted(monkeypatch, owner, name):
    """The calls of ``owner.name`` from now on, as a list of their arguments that grows with each."""
    calls = []
    real = getattr(owner, name)

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(owner, name, counting)
    return calls


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernels.hard_steps calls so far."""
    return counted(monkeypatch, kernels, "hard_steps")


def assert_same(fused, plain):
    for field in FIELDS:
        a, b = getattr(fused, field), getattr(plain, field)
        assert a.dtype == b.dtype and a.shape == b.shape, field
        assert torch.equal(a, b), field


def one_by_one(model, X, C0, **options):
    """The model's run with its steps one by one (its plan's ``one_kernel_call`` off)."""
    plan = model.plan
    model.plan = dataclasses.replace(plan, one_kernel_call=False)
    try:
        return model(X, C0, **options)
    finally:
        model.plan = plan


def lloyd(d, k, n_layers=10, dtype=torch.float64, **options):
    return ktframe.build_model("lloyd", d=d, k=k, n_layers=n_layers, reset="identity", dtype=dtype, **options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("B", "n", "d", "k", "n_layers"), [(1, 5, 1, 2, 1), (64, 100, 2, 8, 10), (9, 256, 8, 5, 30), (33, 40, 3, 40, 4)])
@torch.no_grad()
def test_one_call_equals_the_steps_one_by_one(dtype, B, n, d, k, n_layers, kernel_calls):
    generator = torch.Generator().manual_seed(B * n + d)
    X, _ = mixture(B, n, d, k, generator=generator, dtype=dtype)
    C0 = reference.kmeans_plusplus(X, k, generator)
    model = lloyd(d, k, n_layers, dtype)
    fused = model(X, C0)
    assert len(kernel_calls) >= 1
    assert_same(fused, one_by_one(model, X, C0))
    assert (fused.n_iter <= n_layers).all()


@pytest.fixture
def cuts(monkeypatch):
    """The calls, so far, of the fast model's cut of tasks past their tol stop."""
    return counted(monkeypatch, fast_model, "_cut_at_tolerance")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tol", [0.0, 1e-4, 1e-2, 0.3])
@torch.no_grad()
def test_the_kernel_stops_a_task_within_its_tol_as_the_steps_one_by_one_do(dtype, tol, kernel_calls, cuts):
    X, _ = mixture(64, 100, 2, 8, generator=torch.Generator().manual_seed(10), dtype=dtype)
    C0 = reference.kmeans_plusplus(X, 8, torch.Generator().manual_seed(11))
    model = lloyd(2, 8, dtype=dtype)
    fused = model(X, C0, tol=tol)
    assert len(kernel_calls) == 1 and cuts == []  # every stop decided in the kernel
    assert_same(fused, one_by_one(model, X, C0, tol=tol))
    if tol >= 1e-2:
        assert (fused.n_iter < model(X, C0).n_iter).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@torch.no_grad()
def test_a_shift_at_its_bound_is_left_to_the_rule_in_the_tensors_dtype(dtype, cuts):
    # tol chosen so that task 0's bound is its first step's shift, as rounded in the tensors'
    # dtype: within the kernel's rounding of it, which cannot tell the two apart.
    X, _ = mixture(16, 100, 2, 8, generator=torch.Generator().manual_seed(12), dtype=dtype)
    C0 = reference.kmeans_plusplus(X, 8, torch.Generator().manual_seed(13))
    model = lloyd(2, 8, dtype=dtype)
    trajectory = model(X, C0).trajectory
    tol = (host.squared_shift(trajectory[:1, 0], trajectory[:1, 1]) / host.mean_square_deviation(X[:1])).item()
    fused = model(X, C0, tol=tol)
    assert len(cuts) == 1
    assert_same(fused, one_by_one(model, X, C0, tol=tol))


@torch.no_grad()
def test_ties_are_left_to_the_layer_for_those_tasks(kernel_calls):
    # Points and centers on a small integer grid: many points lie halfway between two centers,
    # which the kernel cannot decide; the layer's map shares them, task by task.
    generator = torch.Generator().manual_seed(1)
    X = torch.randint(0, 4, (48, 60, 2), generator=generator).double()
    C0 = X[:, :6].clone()
    model = lloyd(2, 6)
    fused = model(X, C0)
    assert len(kernel_calls) == 2  # the steps, and the trajectories filled after the layer's
    assert_same(fused, one_by_one(model, X, C0))
    assert fused.assignments.max(dim=-1).values.lt(1).any()  # some point is shared between centers


@torch.no_grad()
def test_an_emptied_cluster_keeps_its_center(kernel_calls):
    X, _ = mixture(8, 50, 2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    C0 = reference.kmeans_plusplus(X, 3, torch.Generator().manual_seed(3))
    C0[:, 2] = 100.0  # no point is nearest to it
    model = lloyd(2, 3)
    fused = model(X, C0)
    assert len(kernel_calls) == 1
    assert_same(fused, one_by_one(model, X, C0))
    assert (fused.centers[:, 2] == 100.0).all()


@torch.no_grad()
def test_any_number_of_threads_gives_the_same_result(kernel_calls):
    X, _ = mixture(40, 80, 2, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float32)
    C0 = reference.kmeans_plusplus(X, 4, torch.Generator().manual_seed(5))
    model = lloyd(2, 4, dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = model(X, C0)
        torch.set_num_threads(2)
        shared = model(X, C0)
    finally:
        torch.set_num_threads(threads)
    assert len(kernel_calls) == 2
    assert_same(alone, shared)


@torch.no_grad()
def test_the_any_k_model_takes_it_too(kernel_calls):
    X, _ = mixture(16, 64, 3, 3, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    C0 = reference.kmeans_plusplus(X, 3, torch.Generator().manual_seed(7))
    model = lloyd(3, 5, any_k=True)
    fused = model(X, C0)
    assert len(kernel_calls) == 1
    assert_same(fused, one_by_one(model, X, C0))


@pytest.mark.parametrize(
    "case",
    ["asked to", "long tasks", "wide points", "layers of their own", "every step on every task", "autograd", "finite gamma"],
)
def test_where_it_does_not_apply_the_steps_run_one_by_one(case, kernel_calls):
    n = kernels.DIRECT_TILE + 1 if case == "long tasks" else 50
    d = kernels.DIRECT_MAX_WIDTH + 1 if case == "wide points" else 2
    X, _ = mixture(4, n, d, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    C0 = reference.kmeans_plusplus(X, 3, torch.Generator().manual_seed(9))
    if case == "finite gamma":
        model = ktframe.build_model("lloyd", d=d, k=3, n_layers=5, gamma=50.0, dtype=torch.float64)
    else:
        model = lloyd(d, 3, 5, share_weights=case != "layers of their own")
    if case in ("asked to", "every step on every task"):
        model.plan = dataclasses.replace(model.plan, **{"one_kernel_call" if case == "asked to" else "skip_settled": False})
    with torch.set_grad_enabled(case == "autograd"):
        result = model(X.requires_grad_(case == "autograd"), C0)
    assert kernel_calls == []
    expected = reference.lloyd(X.detach(), C0, 5) if case != "finite gamma" else None
    if expected is not None:
        assert torch.allclose(result.centers, expected.centers)
