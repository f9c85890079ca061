"""Whole-array work on the CPU done by NumPy, on the calling thread, instead of PyTorch.

A PyTorch CPU operation on more than about 32 000 numbers runs on PyTorch's OpenMP threads, which
then spin for several milliseconds waiting for more work. Where the kernels launched next run on a
pool of threads of their own (numba's tbb or workqueue layer, :mod:`ktframe.kernels.jit`), they need
those same cores, and ran at half speed or less in that window. The few whole-array operations a fit
makes between its kernel launches (the range check of its input, the zero-padded point stream and
the one-hot center stream, a fill, the ``tol`` bound, the center shifts, the trajectory) are made
here, by NumPy where it can: CPU tensors of a dtype it shares, without a gradient to record;
elsewhere by PyTorch (docs/performance.md, Threading). Where PyTorch runs on one thread it has no
other threads to spin, and where the kernels run on PyTorch's own threads (numba's omp layer) its
spinning keeps them ready for the next launch: there the arrays that come out the same from either
library (a padded stream, a join, a fill, the extremes) are PyTorch's, which allocates and fills
them faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

_NUMPY_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool)


# From this many numbers on, the work is PyTorch's: beside a pass over that many numbers the few
# milliseconds its threads spin after it cost little, where NumPy's single thread, or memory from
# its calloc (several times PyTorch's on first touch in a fresh process: docs/performance.md,
# benchmark (1)), would cost more.
LARGE = 1 << 24


def by_numpy(*tensors: torch.Tensor, numbers: int = 0) -> bool:
    """Whether NumPy does the work on these tensors: on the CPU, of a dtype NumPy shares, with no
    gradient to record, and fewer than :data:`LARGE` numbers among them and the ``numbers`` of
    the array made."""
    grad = torch.is_grad_enabled()
    fits = sum(t.numel() for t in tensors) + numbers < LARGE
    return fits and all(t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES and not (grad and t.requires_grad) for t in tensors)


# Whether the kernels run on a pool of threads beside PyTorch's; until they start, as if they did.
_kernels_own_pool = True


def kernels_run_on_own_pool(own: bool) -> None:
    """Say whether the kernels run on a pool of threads of their own, beside PyTorch's (told by
    :func:`ktframe.kernels.jit.load_numba` as it starts numba's threading layer)."""
    global _kernels_own_pool
    _kernels_own_pool = own


def _threads_spared(*tensors: torch.Tensor, numbers: int = 0) -> bool:
    """Whether NumPy makes an array that PyTorch would make the same: where it can
    (:func:`by_numpy`), PyTorch runs on more than one thread and the kernels on threads of
    their own, which PyTorch's spinning threads would keep from the cores."""
    return _kernels_own_pool and torch.get_num_threads() > 1 and by_numpy(*tensors, numbers=numbers)


def padded(X: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, n, width)``: ``X`` (B, n, d) in the first d coordinates and zeros after, new memory."""
    B, n, d = X.shape
    if not _threads_spared(X, numbers=B * n * width):
        tokens = X.new_zeros(B, n, width)
        tokens[..., :d] = X
        return tokens
    array = np.zeros((B, n, width), dtype=X.detach().numpy().dtype)
    array[..., :d] = X.detach().numpy()
    return torch.from_numpy(array)


def concatenated(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors side by side along their last axis (``torch.cat(tensors, dim=-1)``), new memory."""
    return _joined(tensors, -1, torch.cat, np.concatenate)


def stacked(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.stack(tensors, dim)``, new memory."""
    return _joined(tensors, dim, torch.stack, np.stack)


def _joined(tensors: Sequence[torch.Tensor], dim: int, torch_join: Callable, numpy_join: Callable) -> torch.Tensor:
    # NumPy's join where it is the faster one (tensors of one dtype on the CPU, not tracked).
    if not _threads_spared(*tensors) or len({t.dtype for t in tensors}) > 1:
        return torch_join(tensors, dim=dim)
    return torch.from_numpy(numpy_join([t.detach().numpy() for t in tensors], axis=dim))


def filled(shape: tuple[int, ...], value: int) -> torch.Tensor:
    """An int64 CPU tensor of ``shape`` holding ``value`` everywhere."""
    if not _threads_spared(numbers=math.prod(shape)):
        return torch.full(shape, value, dtype=torch.long)
    return torch.from_numpy(np.full(shape, value, dtype=np.int64))


def extremes(tensor: torch.Tensor) -> tuple[float, float]:
    """The least and the largest entry of a non-empty floating tensor, NaN where one is NaN."""
    if _threads_spared(tensor):
        array = tensor.detach().numpy()
        return float(array.min()), float(array.max())
    low, high = torch.aminmax(tensor)
    return low.item(), high.item()


def mean_square_deviation(X: torch.Tensor) -> torch.Tensor:
    """``(B,)``: the mean, over the points and coordinates of each task ``X`` (B, n, d), of the
    squared deviation from the task's mean point (the mean of the coordinates' variances)."""
    if not by_numpy(X):
        return (X - X.mean(dim=1, keepdim=True)).square().mean(dim=(1, 2))
    array = X.detach().numpy()
    B, n, d = array.shape
    # einsum's loops, not BLAS (NumPy's own threads) and not a reduction over the middle axis,
    # which NumPy takes a few numbers at a time where d is small.
    # Sums in float64, as PyTorch's cascaded sums stay accurate over millions of numbers.
    mean = np.einsum("bnd->bd", array, dtype=np.float64) / n
    deviations = (array - mean[:, None, :].astype(array.dtype)).reshape(B, n * d)
    return torch.from_numpy((np.einsum("bi,bi->b", deviations, deviations, dtype=np.float64) / (n * d)).astype(array.dtype))


def squared_shift(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``Σ (after − before)²`` over the last two axes (a step's centers (k, d))."""
    if not by_numpy(before, after):
        return (after - before).square().sum(dim=(-2, -1))
    return torch.from_numpy(np.square(after.detach().numpy() - before.detach().numpy()).sum(axis=(-2, -1)))
