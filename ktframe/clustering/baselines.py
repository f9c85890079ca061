"""Classical k-means methods that ``ktframe eval`` can report beside the model (``eval.baselines``).

Unlike Lloyd and the seeded Lloyds of the protocol, these run to convergence with their own
restarts, so they have no per-step trajectory: each gives one set of final centers per task. Each
function takes tasks ``X`` ``(B, n, d)``, the number of clusters ``k`` and one seed per task, and
returns the centers ``(B, k, d)`` in float64. They run task by task in scikit-learn, which is
imported only when a baseline is asked for (``pip install 'ktframe[baselines]'``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from types import ModuleType

import torch
from threadpoolctl import threadpool_limits

from ktframe.core.errors import InputError

# Which package each module a baseline imports comes from.
_PACKAGES = {"sklearn.cluster": "scikit-learn", "bkmeans": "bkmeans"}


def _module(name: str) -> ModuleType:
    """``name`` imported, or a one-line error naming the package to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise InputError(
            f"eval.baselines needs the {_PACKAGES[name]} package, which is not installed; expected it installed: pip install 'ktframe[baselines]'"
        ) from None


def _per_task(X: torch.Tensor, seeds: Sequence[int], fit: Callable) -> torch.Tensor:
    """``fit(points, seed)`` (a fitted scikit-learn estimator) on every task, in float64; the
    centers ``(B, k, d)``. One thread each: on tasks of hundreds of points scikit-learn's OpenMP
    and BLAS threads gain nothing on an idle 2-core CPU, and beside another busy process (a
    training run) they wait for each other: ``best-of-10`` on n = 512, d = 32, k = 16 took 30
    times longer on two threads than on one there."""
    tasks = X.detach().cpu().double().numpy()
    with threadpool_limits(limits=1):
        return torch.stack([torch.from_numpy(fit(points, seed).cluster_centers_) for points, seed in zip(tasks, seeds, strict=True)])


def breathing_kmeans(X: torch.Tensor, k: int, seeds: Sequence[int]) -> torch.Tensor:
    """Breathing k-means (Fritzke 2020, the ``bkmeans`` package): greedy k-means++ and Lloyd, then
    centers added where the error is large and removed where they are least useful, while that helps.
    It breathes in up to 5 centers (the package's default depth), at most as many as there are
    points beyond k: scikit-learn refuses more centers than points (n = k: no breathing)."""
    BKMeans = _module("bkmeans").BKMeans
    depth = min(5, X.shape[1] - k)
    return _per_task(X, seeds, lambda points, seed: BKMeans(m=depth, n_clusters=k, random_state=seed, n_init=1).fit(points))


def best_of_10(X: torch.Tensor, k: int, seeds: Sequence[int]) -> torch.Tensor:
    """scikit-learn's ``KMeans`` with ``n_init=10``: greedy k-means++ and Lloyd to convergence, ten
    times, the run of least inertia kept."""
    KMeans = _module("sklearn.cluster").KMeans
    return _per_task(X, seeds, lambda points, seed: KMeans(n_clusters=k, n_init=10, random_state=seed).fit(points))


BASELINES: dict[str, Callable[[torch.Tensor, int, Sequence[int]], torch.Tensor]] = {
    "breathing-kmeans": breathing_kmeans,
    "best-of-10": best_of_10,
}

# The modules each baseline imports (bkmeans subclasses scikit-learn's KMeans).
_NEEDS = {"breathing-kmeans": ("sklearn.cluster", "bkmeans"), "best-of-10": ("sklearn.cluster",)}


def require(names: Sequence[str]) -> None:
    """Import what the baselines ``names`` need now, so that a missing package stops an evaluation
    before it computes or writes anything."""
    for name in names:
        for module in _NEEDS[name]:
            _module(module)
