"""Swaps (ktframe.fast.swaps): a local search after Lloyd's algorithm that moves its least useful
center to where the error is large, keeping a move only where it lowers the objective."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ktframe import TransformerKMeans
from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.fast.swaps import swap

RESULTS = Path(__file__).resolve().parents[1] / "results"
GENERAL, ANYK = str(RESULTS / "general.ckpt"), str(RESULTS / "anyk-seed0.ckpt")


def _blobs(generator: torch.Generator, B: int = 1) -> torch.Tensor:
    """``(B, 300, 2)``: three tight, well separated blobs of 100 points each."""
    middles = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    return middles.repeat_interleave(100, dim=0) + 0.1 * torch.randn(B, 300, 2, generator=generator, dtype=torch.float64)


def test_a_fixed_point_of_lloyd_with_two_centers_in_one_blob_is_left_for_the_optimum():
    """Two centers splitting the first blob and one between the other two are a fixed point of
    Lloyd's algorithm; one swap moves a center of the split blob to an empty one, and the
    objective falls to that of the three blobs' own means."""
    X = _blobs(torch.Generator().manual_seed(0))
    trap = torch.tensor([[[-0.05, 0.0], [0.05, 0.0], [5.0, 5.0]]], dtype=torch.float64)
    stuck = reference.lloyd(X, trap, 50).centers
    assert torch.equal(reference.lloyd(X, stuck, 1).centers, stuck)  # Lloyd stays put
    swapped = swap(X, stuck, 1, 20, torch.Generator().manual_seed(1))
    best = torch.stack([X[0, i * 100 : (i + 1) * 100].mean(dim=0) for i in range(3)])[None]
    assert swapped.kept.tolist() == [1]
    assert swapped.objective.item() == pytest.approx(reference.objective(X, best).item(), rel=1e-9)
    assert reference.objective(X, stuck).item() > 10 * swapped.objective.item()


def test_never_worse_than_the_centers_it_starts_from_and_its_objective_is_that_of_its_centers():
    generator = torch.Generator().manual_seed(2)
    X = torch.rand(16, 200, 3, generator=generator)
    C = reference.lloyd(X, reference.random_points(X, 8, generator), 20).centers
    swapped = swap(X, C, 4, 10, generator)
    before = reference.objective(X.double(), C.double())
    assert (swapped.objective <= before).all()
    assert swapped.objective == pytest.approx(reference.objective(X.double(), swapped.centers.double()), rel=1e-12)
    assert ((swapped.objective < before) == (swapped.kept > 0)).all()
    assert swapped.centers.dtype == X.dtype and 0 < int(swapped.kept.sum()) <= 16 * 4


def test_the_draws_come_from_the_generator_alone():
    generator = torch.Generator().manual_seed(3)
    X = torch.rand(4, 100, 2, generator=generator, dtype=torch.float64)
    C = reference.random_points(X, 6, generator)
    one, two = (swap(X, C, 3, 5, torch.Generator().manual_seed(9)) for _ in range(2))
    assert torch.equal(one.centers, two.centers)


def test_a_point_of_weight_zero_is_never_a_new_center():
    """Sample weights enter the cost of a center, the draw and the objective: a point of weight 0
    is never drawn, however far it lies."""
    X = _blobs(torch.Generator().manual_seed(4))
    X[0, 0] = torch.tensor([100.0, 100.0])
    weights = torch.ones(1, 300, dtype=torch.float64)
    weights[0, 0] = 0.0
    stuck = torch.tensor([[[-0.05, 0.0], [0.05, 0.0], [5.0, 5.0]]], dtype=torch.float64)

    def weighted_lloyd(C: torch.Tensor) -> torch.Tensor:  # the estimator's weighted Lloyd iterations
        fitted = TransformerKMeans(3, init=C[0].numpy(), max_iter=20, tol=0).fit(X[0].numpy(), sample_weight=weights[0].numpy())
        return torch.from_numpy(fitted.cluster_centers_)[None]

    swapped = swap(X, stuck, 5, 20, torch.Generator().manual_seed(5), weights, weighted_lloyd)
    assert not (swapped.centers == X[0, 0]).all(dim=-1).any()
    assert swapped.objective.item() == pytest.approx((reference.sqdist(X, swapped.centers).amin(dim=-1) * weights).sum().item(), rel=1e-12)


def test_one_center_has_nothing_to_swap():
    X = torch.rand(1, 10, 2, dtype=torch.float64)
    C = X[:, :1]
    swapped = swap(X, C, 3, 5)
    assert torch.equal(swapped.centers, C) and swapped.kept.tolist() == [0]


def test_the_estimators_swaps_are_reproducible_never_worse_and_counted_apart_from_n_iter():
    X = np.random.default_rng(0).random((400, 2))
    plain = TransformerKMeans(12, init="random", n_init=1, random_state=0).fit(X)
    swapped = TransformerKMeans(12, init="random", n_init=1, random_state=0, swaps=5).fit(X)
    again = TransformerKMeans(12, init="random", n_init=1, random_state=0, swaps=5).fit(X)
    assert swapped.inertia_ < plain.inertia_
    assert np.array_equal(swapped.cluster_centers_, again.cluster_centers_)
    assert swapped.n_iter_ == plain.n_iter_
    assert np.array_equal(swapped.labels_, swapped.predict(X))
    assert swapped.inertia_ == pytest.approx(-swapped.score(X), rel=1e-12)


def test_the_estimators_swaps_with_a_checkpoint_run_in_its_frame():
    """With a trained model the swaps run where its steps ran, in the checkpoint's frame, and the
    centers come back in the user's units."""
    from sklearn.datasets import load_wine

    X = load_wine().data
    finished = TransformerKMeans(10, checkpoint=GENERAL, init="random", n_init=1, random_state=0, lloyd_last=17, swaps=0).fit(X)
    swapped = TransformerKMeans(10, checkpoint=GENERAL, init="random", n_init=1, random_state=0, lloyd_last=17, swaps=5).fit(X)
    assert swapped.inertia_ < finished.inertia_
    assert swapped.cluster_centers_.shape == (10, 13)
    assert swapped.inertia_ == pytest.approx(((X[:, None] - swapped.cluster_centers_[None]) ** 2).sum(-1).min(-1).sum(), rel=1e-9)


def test_a_checkpoints_own_finish_is_the_estimators_default(tmp_path):
    """lloyd_last and swaps left at None take the checkpoint's eval.lloyd_last and eval.swaps (0
    where its config has none); lloyd_last within the steps asked for."""
    from sklearn.datasets import load_iris

    checkpoint = torch.load(ANYK, weights_only=True)
    checkpoint["hyper_parameters"]["config"]["eval"].update(lloyd_last=5, swaps=2)
    finished = str(tmp_path / "finished.ckpt")
    torch.save(checkpoint, finished)
    X = load_iris().data

    def centers(path: str, **options) -> np.ndarray:
        return TransformerKMeans(3, checkpoint=path, random_state=0, **options).fit(X).cluster_centers_

    assert np.array_equal(centers(finished), centers(ANYK, lloyd_last=5, swaps=2))
    assert np.array_equal(centers(finished, lloyd_last=0, swaps=0), centers(ANYK))
    assert np.array_equal(centers(finished, n_layers=3, swaps=0), centers(ANYK, n_layers=3, lloyd_last=3))
    assert not np.array_equal(centers(finished), centers(ANYK))


@pytest.mark.parametrize("swaps", [-1, 1.5, True, "3"])
def test_bad_swaps_are_one_line(swaps):
    with pytest.raises(InputError, match=r"^swaps must be an integer >= 0 \(how many swaps follow the steps; 0 for none\); got "):
        TransformerKMeans(3, swaps=swaps).fit(np.random.default_rng(0).random((20, 2)))
