"""Whole-array work on the CPU by NumPy (ktframe.core.host): the same numbers as PyTorch's
operations, PyTorch's own where NumPy cannot (autograd, other dtypes), and, where the kernels run
on a pool of threads of their own (numba's tbb or workqueue layer), a fit on the kernels that makes
no PyTorch operation large enough for PyTorch's OpenMP threads, which would then spin on the cores
the kernels need (docs/performance.md, Threading). In numba's omp layer the kernels' threads are
PyTorch's own, and PyTorch makes the arrays that come out the same from either library."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ktframe
from ktframe.core import host, reference
from ktframe.core.tasks import mixture
from ktframe.kernels import jit


@contextlib.contextmanager
def torch_threads(count: int):
    """PyTorch on ``count`` threads inside, its own count again after."""
    budget = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(budget)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """PyTorch's thread count for the test (NumPy makes the arrays only on more than one)."""
    with torch_threads(request.param):
        yield request.param


@pytest.fixture
def two_threads():
    with torch_threads(2):
        yield


@contextlib.contextmanager
def kernels_pool(own: bool):
    """The host told that the kernels run on a pool of their own (``own``) or on PyTorch's, as
    ktframe.kernels.jit tells it once it has started numba's threading layer; as it was after."""
    jit.load_numba()  # numba's layer started, and the host told of it
    told = host._kernels_own_pool
    host.kernels_run_on_own_pool(own)
    try:
        yield own
    finally:
        host.kernels_run_on_own_pool(told)


@pytest.fixture(params=[True, False], ids=["own-pool", "pytorchs-pool"])
def own_pool(request):
    """Whether the kernels run on a pool of their own for the test."""
    with kernels_pool(request.param):
        yield request.param


@pytest.fixture
def beside_pytorchs_pool(two_threads):
    """PyTorch on two threads, and the kernels on a pool of their own beside it."""
    with kernels_pool(True):
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_function_gives_pytorchs_numbers(dtype, threads, own_pool):
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(3, 50, 4, generator=generator, dtype=dtype) * 5 + 2
    tokens = host.padded(X, 9)
    assert tokens.dtype == dtype and tokens.shape == (3, 50, 9)
    assert torch.equal(tokens[..., :4], X) and not tokens[..., 4:].any()
    eye = torch.eye(5, dtype=dtype).expand(3, 5, 5)
    C = X[:, :5]
    assert torch.equal(host.concatenated(C, eye), torch.cat([C, eye], dim=-1))
    assert torch.equal(host.stacked([C, 2 * C, 3 * C], dim=1), torch.stack([C, 2 * C, 3 * C], dim=1))
    assert torch.equal(host.filled((2, 3), -1), torch.full((2, 3), -1, dtype=torch.long))
    assert host.extremes(X) == (X.min().item(), X.max().item())
    expected = (X.double() - X.double().mean(dim=1, keepdim=True)).square().mean(dim=(1, 2))
    torch.testing.assert_close(host.mean_square_deviation(X).double(), expected, rtol=1e-6, atol=0)
    before, after = torch.randn(3, 6, 5, 4, dtype=dtype), torch.randn(3, 6, 5, 4, dtype=dtype)
    torch.testing.assert_close(host.squared_shift(before, after), (after - before).square().sum(dim=(-2, -1)))


def test_a_large_stream_made_by_pytorch_holds_the_same_numbers():
    X = torch.rand(1, host.LARGE // 8 + 1, 4)
    tokens = host.padded(X, 8)  # 2^24 numbers and more: PyTorch's own allocation and fill, the same numbers
    assert torch.equal(tokens[..., :4], X) and not tokens[..., 4:].any()
    small = host.padded(X[:, :8], 8)
    assert tokens.is_contiguous() and small.is_contiguous()


def test_extremes_propagate_nan_and_inf(threads, own_pool):
    X = torch.zeros(10)
    X[3] = math.inf
    assert host.extremes(X)[1] == math.inf
    X[5] = math.nan
    assert all(math.isnan(v) for v in host.extremes(X))


def test_pytorch_does_the_work_under_autograd_and_for_other_dtypes():
    X = torch.randn(2, 10, 3, requires_grad=True)
    host.padded(X, 5).sum().backward()
    assert torch.equal(X.grad, torch.ones_like(X))
    half = torch.randn(2, 10, 3).to(torch.bfloat16)
    assert host.padded(half, 4).dtype == torch.bfloat16
    assert host.concatenated(half, half).shape == (2, 10, 6)
    assert host.by_numpy(torch.zeros(3)) and not host.by_numpy(half)
    assert not host.by_numpy(torch.zeros(3), numbers=host.LARGE)


# Past this many numbers a PyTorch CPU operation runs on PyTorch's OpenMP threads (its grain size).
GRAIN = 32768
_NOT_WORK = ("detach", "alias", "lift_fresh", "empty", "new_empty", "_to_copy")  # no pass over the numbers in these


class LargeOperations(TorchDispatchMode):
    """Records the PyTorch operations, other than views, that read or write GRAIN numbers or more."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in (*args, *(kwargs or {}).values(), out) if isinstance(t, torch.Tensor)]
        name = func.__name__
        if not func.is_view and not name.startswith(_NOT_WORK) and tensors and max(t.numel() for t in tensors) >= GRAIN:
            self.seen.append(f"{name} {[t.numel() for t in tensors]}")
        return out


@pytest.mark.parametrize("batch, n, d, k", [(1, 50_000, 2, 16), (1, 20_000, 32, 100), (1024, 100, 2, 8)])
def test_a_fit_on_the_kernels_leaves_pytorchs_threads_idle(batch, n, d, k, beside_pytorchs_pool):
    generator = torch.Generator().manual_seed(0)
    X, _ = mixture(batch, n, d, k, generator=generator)
    C0 = reference.kmeans_plusplus(X, k, generator)
    data, start = (X.numpy(), C0.numpy()) if batch > 1 else (X[0].numpy(), C0[0].numpy())
    estimator = ktframe.TransformerKMeans(k, n_layers=10, init=start)
    estimator.fit(data)  # compiles (or loads) the kernels outside the record
    with LargeOperations() as record:
        estimator.fit(data)
    assert record.seen == [], record.seen
    assert np.isfinite(estimator.inertia_).all()


@torch.no_grad()
def test_the_model_steps_one_by_one_on_the_kernels_leave_pytorchs_threads_idle(kernels_by_ktframe_rule, beside_pytorchs_pool):
    # 256 tasks of 100 points in 2-D, by ktframe's size rule: the projected queries alone are
    # below the kernels' size, the step's token streams are not, and the step's arg-max runs on
    # the kernels with the rest of it.
    generator = torch.Generator().manual_seed(0)
    X, _ = mixture(256, 100, 2, 8, generator=generator)
    C0 = reference.kmeans_plusplus(X, 8, generator)
    model = ktframe.build_model("lloyd", d=2, k=8, n_layers=10, reset="identity")
    model.plan = dataclasses.replace(model.plan, one_kernel_call=False)
    model(X, C0)
    with LargeOperations() as record:
        result = model(X, C0)
    assert record.seen == [], record.seen
    torch.testing.assert_close(result.centers, reference.lloyd(X, C0, 10).centers)


def test_pytorch_makes_the_arrays_that_come_out_the_same_unless_its_threads_are_spared(threads, own_pool):
    # A stream of GRAIN numbers and more: PyTorch's own allocation and fill on one thread, where
    # it has no other threads to spin, and where the kernels run on its threads; NumPy's on two
    # beside a pool of the kernels' own. The arithmetic (the tol bound, a shift) stays NumPy's
    # either way, so that its rounding does not depend on the thread count.
    X = torch.rand(2, GRAIN, 2)
    with LargeOperations() as record:
        tokens = host.padded(X, 6)
        host.concatenated(X, X)
        host.stacked([X, X], dim=1)
        host.extremes(X)
        host.mean_square_deviation(X)
    assert torch.equal(tokens[..., :2], X) and not tokens[..., 2:].any()
    made = {entry.split()[0] for entry in record.seen}
    spared = threads == 2 and own_pool
    if not spared:
        assert {"new_zeros.default", "cat.default", "stack.default", "aminmax.default"} <= made, made
    assert not any(name.startswith(("sub", "mean", "pow", "square")) for name in made), made
    if spared:
        assert record.seen == [], record.seen
