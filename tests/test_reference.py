"""The classical reference (``ktframe.core.reference``) against scikit-learn, and its seeding."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import pairwise_distances_argmin

from ktframe.core import reference
from ktframe.core.reference import kmeans_plusplus, random_points
from ktframe.fast import seeding


def sklearn_one_iteration(X: np.ndarray, init: np.ndarray) -> KMeans:
    """One Lloyd iteration of scikit-learn from ``init`` (its ``labels_`` are then recomputed
    against the new centers)."""
    km = KMeans(n_clusters=init.shape[0], algorithm="lloyd", init=init, n_init=1, max_iter=1, tol=0)
    with warnings.catch_warnings():
        # max_iter=1 stops before convergence on purpose; scikit-learn may say so.
        warnings.simplefilter("ignore", ConvergenceWarning)
        km.fit(X)
    return km


@st.composite
def separable_problems(draw):
    B = draw(st.integers(1, 2))
    n = draw(st.integers(2, 80))
    d = draw(st.integers(1, 5))
    k = draw(st.integers(1, min(n, 6)))
    iters = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if draw(st.booleans()):
        X = torch.randn(B, n, d, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.01, 1.0, 100.0]))
    else:  # well-separated blobs, offset far from the origin (scikit-learn centres the data first)
        means = torch.rand(B, k, d, generator=g, dtype=torch.float64) * 20.0 + 50.0
        which = torch.randint(k, (B, n), generator=g)
        X = torch.gather(means, 1, which.unsqueeze(-1).expand(-1, -1, d)) + 0.3 * torch.randn(B, n, d, generator=g, dtype=torch.float64)
    C0 = random_points(X, k, g)  # distinct data points: no cluster is empty in the first iteration
    return X, C0, iters


@settings(max_examples=40, deadline=None)
@given(problem=separable_problems())
def test_reference_matches_sklearn_iteration_by_iteration(problem):
    X, C0, iters = problem
    ref = reference.lloyd(X, C0, iters)
    for t in range(iters):
        # scikit-learn relocates an empty cluster, ktframe keeps it: compare only where none empties.
        counts = reference.assign(X, ref.trajectory[:, t]).sum(dim=1)
        assume(bool((counts > 0).all()))
    k = C0.shape[1]
    for b in range(X.shape[0]):
        Xb = X[b].numpy()
        scale = max(1.0, float(np.abs(Xb).max()))
        for t in range(iters):
            init = ref.trajectory[b, t].numpy()
            km = sklearn_one_iteration(Xb, init)
            np.testing.assert_allclose(km.cluster_centers_, ref.trajectory[b, t + 1].numpy(), rtol=0, atol=1e-8 * scale)
            # Labels: the assignment step of iteration t + 1 is the nearest center of C_t ...
            step = reference.lloyd(X[b : b + 1], C0[b : b + 1], t + 1)
            np.testing.assert_array_equal(step.labels[0].numpy(), pairwise_distances_argmin(Xb, init))
            # ... and scikit-learn's labels_ are those of its new centers, i.e. C_{t+1}.
            np.testing.assert_array_equal(km.labels_, reference.assign(X[b : b + 1], ref.trajectory[b : b + 1, t + 1])[0].argmax(-1).numpy())
            assert km.cluster_centers_.shape == (k, X.shape[-1])


def test_reference_matches_sklearn_on_a_long_run():
    """Many iterations on clustered data, until convergence: the same fixed point as scikit-learn."""
    g = torch.Generator().manual_seed(4)
    means = torch.rand(1, 4, 2, generator=g, dtype=torch.float64) * 10
    which = torch.randint(4, (1, 500), generator=g)
    X = torch.gather(means, 1, which.unsqueeze(-1).expand(-1, -1, 2)) + torch.randn(1, 500, 2, generator=g, dtype=torch.float64)
    C0 = random_points(X, 4, g)
    ref = reference.lloyd(X, C0, 30)
    km = KMeans(n_clusters=4, algorithm="lloyd", init=C0[0].numpy(), n_init=1, max_iter=30, tol=0).fit(X[0].numpy())
    np.testing.assert_allclose(km.cluster_centers_, ref.centers[0].numpy(), rtol=0, atol=1e-8)
    np.testing.assert_array_equal(km.labels_, ref.labels[0].numpy())
    assert math.isclose(km.inertia_, reference.objective(X, ref.centers).item(), rel_tol=1e-10)


def test_reference_empty_cluster_keeps_its_center_where_sklearn_moves_it():
    X = torch.tensor([[[0.0, 0.0], [0.1, 0.0], [1.0, 1.0], [1.1, 1.0]]], dtype=torch.float64)
    C0 = torch.tensor([[[0.0, 0.0], [1.0, 1.0], [50.0, 50.0]]], dtype=torch.float64)
    ref = reference.lloyd(X, C0, 3)
    assert torch.equal(ref.trajectory[0, :, 2], C0[0, 2].expand(4, 2))
    torch.testing.assert_close(ref.centers[0, :2], torch.tensor([[0.05, 0.0], [1.05, 1.0]], dtype=torch.float64), atol=1e-15, rtol=0)
    km = sklearn_one_iteration(X[0].numpy(), C0[0].numpy())
    assert not np.allclose(km.cluster_centers_[2], [50.0, 50.0])  # the documented difference


def test_reference_tie_is_shared_and_labelled_like_sklearn():
    X = torch.tensor([[[-1.0], [0.0], [1.0]]], dtype=torch.float64)
    C0 = torch.tensor([[[-1.0], [1.0]]], dtype=torch.float64)
    ref = reference.lloyd(X, C0, 1)
    assert ref.assignments[0].tolist() == [[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]
    np.testing.assert_array_equal(ref.labels[0].numpy(), pairwise_distances_argmin(X[0].numpy(), C0[0].numpy()))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 60),
    d=st.integers(1, 5),
    k=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_objective_is_sklearn_inertia(n, d, k, seed):
    k = min(k, n)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, n, d, generator=g, dtype=torch.float64)
    C = torch.randn(2, k, d, generator=g, dtype=torch.float64)
    got = reference.objective(X, C)
    assert got.shape == (2,)
    for b in range(2):
        expected = float(((X[b, :, None, :] - C[b, None]) ** 2).sum(-1).min(-1).values.sum())
        assert math.isclose(got[b].item(), expected, rel_tol=1e-12, abs_tol=1e-12)
        # scikit-learn's inertia_ is the objective of its final centers (whatever they are: it
        # may relocate empty clusters here), and score(X) is minus the objective of X against them.
        km = sklearn_one_iteration(X[b].numpy(), C[b].numpy())
        fitted = torch.from_numpy(km.cluster_centers_).unsqueeze(0)
        assert math.isclose(reference.objective(X[b : b + 1], fitted).item(), km.inertia_, rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(reference.objective(X[b : b + 1], fitted).item(), -km.score(X[b].numpy()), rel_tol=1e-9, abs_tol=1e-12)


def test_objective_matches_fitted_inertia():
    g = torch.Generator().manual_seed(9)
    X = torch.rand(1, 300, 3, generator=g, dtype=torch.float64)
    km = KMeans(n_clusters=5, algorithm="lloyd", n_init=1, random_state=0).fit(X[0].numpy())
    C = torch.from_numpy(km.cluster_centers_).unsqueeze(0)
    assert math.isclose(reference.objective(X, C).item(), km.inertia_, rel_tol=1e-10)
    assert reference.objective(X, C).item() == pytest.approx(reference.sqdist(X, C).amin(-1).sum().item())


# --- seeding ------------------------------------------------------------------------------------

# The reference's exact seeding and the fast path's matrix-product one, which the estimator uses.
SEEDINGS = pytest.mark.parametrize("seed_with", [kmeans_plusplus, seeding.kmeans_plusplus], ids=["reference", "fast"])


def is_row_of(C: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """``(B, k)``: whether each center is (exactly) one of its task's points."""
    return (C[:, :, None, :] == X[:, None, :, :]).all(-1).any(-1)


@pytest.mark.parametrize("greedy", [False, True])
@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), n=st.integers(1, 50), d=st.integers(1, 4), k=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
@SEEDINGS
def test_kmeans_plusplus_returns_distinct_data_points(seed_with, greedy, B, n, d, k, seed):
    k = min(k, n)
    X = torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    C = seed_with(X, k, torch.Generator().manual_seed(seed + 1), greedy=greedy)
    assert C.shape == (B, k, d) and C.dtype == X.dtype
    assert bool(is_row_of(C, X).all())
    # A point already chosen has weight 0, so with distinct points the k centers are distinct.
    for b in range(B):
        assert torch.unique(C[b], dim=0).shape[0] == k


@pytest.mark.parametrize("greedy", [False, True])
@SEEDINGS
def test_kmeans_plusplus_is_deterministic_under_a_seeded_generator(seed_with, greedy):
    X = torch.rand(3, 200, 2, generator=torch.Generator().manual_seed(0))
    a = seed_with(X, 5, torch.Generator().manual_seed(42), greedy=greedy)
    b = seed_with(X, 5, torch.Generator().manual_seed(42), greedy=greedy)
    c = seed_with(X, 5, torch.Generator().manual_seed(43), greedy=greedy)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@SEEDINGS
def test_kmeans_plusplus_draws_proportionally_to_squared_distance(seed_with):
    # Points 0, 1, 3 on a line. Given the first center at 0, the second is 1 with probability
    # 1/10 and 3 with probability 9/10 (plain k-means++).
    B = 6000
    X = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64).expand(B, 3, 1).contiguous()
    C = seed_with(X, 2, torch.Generator().manual_seed(1))
    first, second = C[:, 0, 0], C[:, 1, 0]
    assert bool((first != second).all())
    from_zero = second[first == 0.0]
    assert from_zero.numel() > 1500  # the first center is uniform: about B/3
    p = (from_zero == 3.0).double().mean().item()
    sigma = math.sqrt(0.9 * 0.1 / from_zero.numel())
    assert abs(p - 0.9) < 4 * sigma
    # First center at 3: distances² 9 (to 0) and 4 (to 1).
    from_three = second[first == 3.0]
    p = (from_three == 0.0).double().mean().item()
    assert abs(p - 9 / 13) < 4 * math.sqrt((9 / 13) * (4 / 13) / from_three.numel())


@SEEDINGS
def test_greedy_and_plain_are_both_valid_and_greedy_seeds_better(seed_with):
    g = torch.Generator().manual_seed(5)
    means = torch.rand(200, 6, 2, generator=g, dtype=torch.float64) * 10
    which = torch.randint(6, (200, 120), generator=g)
    X = torch.gather(means, 1, which.unsqueeze(-1).expand(-1, -1, 2)) + 0.3 * torch.randn(200, 120, 2, generator=g, dtype=torch.float64)
    plain = seed_with(X, 6, torch.Generator().manual_seed(0))
    greedy = seed_with(X, 6, torch.Generator().manual_seed(0), greedy=True)
    uniform = random_points(X, 6, torch.Generator().manual_seed(0))
    for C in (plain, greedy):
        assert C.shape == (200, 6, 2)
        assert bool(is_row_of(C, X).all())
        assert torch.isfinite(C).all()
    assert not torch.equal(plain, greedy)
    # On average over 200 tasks: greedy k-means++ < plain k-means++ < uniform seeding.
    obj = {name: reference.objective(X, C).mean().item() for name, C in (("plain", plain), ("greedy", greedy), ("uniform", uniform))}
    assert obj["greedy"] < obj["plain"] < obj["uniform"]


@SEEDINGS
def test_kmeans_plusplus_explicit_local_trials(seed_with):
    X = torch.rand(2, 40, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    C = seed_with(X, 4, torch.Generator().manual_seed(3), n_local_trials=5)
    assert C.shape == (2, 4, 3) and bool(is_row_of(C, X).all())


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@SEEDINGS
def test_kmeans_plusplus_all_identical_points(seed_with, greedy, dtype):
    X = torch.full((2, 10, 3), 0.25, dtype=dtype)
    C = seed_with(X, 4, torch.Generator().manual_seed(0), greedy=greedy)
    assert C.shape == (2, 4, 3)
    assert torch.equal(C, torch.full((2, 4, 3), 0.25, dtype=dtype))
    # And Lloyd from there is a fixed point: no NaN, every center on the point.
    ref = reference.lloyd(X, C, 3)
    assert torch.equal(ref.trajectory, torch.full((2, 4, 4, 3), 0.25, dtype=dtype))
    assert torch.isfinite(ref.assignments).all()


@pytest.mark.parametrize("greedy", [False, True])
@SEEDINGS
def test_kmeans_plusplus_fewer_distinct_points_than_clusters(seed_with, greedy):
    # Three distinct points, five centers: once every point is a center the draw is uniform.
    X = torch.tensor([[[0.0], [1.0], [5.0], [1.0], [0.0], [5.0]]], dtype=torch.float64)
    C = seed_with(X, 5, torch.Generator().manual_seed(0), greedy=greedy)
    assert C.shape == (1, 5, 1)
    assert bool(is_row_of(C, X).all())
    assert set(C.flatten().tolist()) == {0.0, 1.0, 5.0}  # every distinct point was chosen first


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_fast_kmeans_plusplus_chooses_the_centers_of_the_exact_one(greedy, seed):
    # Matrix-product distances: the same draws and choices as the exact differences on float64
    # data without near-ties (blobs and noise, several tasks at once).
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(3, 12, 5, generator=g, dtype=torch.float64) * 10 + 40
    which = torch.randint(12, (3, 500), generator=g)
    X = torch.gather(means, 1, which.unsqueeze(-1).expand(-1, -1, 5)) + torch.randn(3, 500, 5, generator=g, dtype=torch.float64)
    fast = seeding.kmeans_plusplus(X, 12, torch.Generator().manual_seed(seed), greedy=greedy)
    exact = kmeans_plusplus(X, 12, torch.Generator().manual_seed(seed), greedy=greedy)
    assert torch.equal(fast, exact)


def test_fast_kmeans_plusplus_potential_is_within_rounding_on_float32():
    # float32 with duplicates: centers are distinct data points and the potential is that of the
    # exact seeding to within rounding (here the draws match, so the potentials are equal).
    g = torch.Generator().manual_seed(9)
    X = torch.randn(2, 300, 8, generator=g)
    X = torch.cat([X, X[:, :50]], dim=1)  # 50 duplicated points
    fast = seeding.kmeans_plusplus(X, 20, torch.Generator().manual_seed(1), greedy=True)
    exact = kmeans_plusplus(X, 20, torch.Generator().manual_seed(1), greedy=True)
    assert bool(is_row_of(fast, X).all())
    for b in range(2):
        assert torch.unique(fast[b], dim=0).shape[0] == 20
    torch.testing.assert_close(reference.objective(X, fast), reference.objective(X, exact), rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("greedy", [False, True])
def test_fast_kmeans_plusplus_kernels_choose_as_its_torch_operations(dtype, greedy, monkeypatch):
    # The CPU kernels (norms, the fused potentials pass, the settled column) and the torch
    # operations used elsewhere choose the same centers, on 1 thread and on 2 (the potentials'
    # sums are taken by blocks in a fixed order), with duplicated points among the data.
    g = torch.Generator().manual_seed(11)
    X = torch.randn(2, 9000, 6, generator=g, dtype=dtype) * 3
    X = torch.cat([X, X[:, :500]], dim=1)
    seeds = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            seeds.append(seeding.kmeans_plusplus(X, 40, torch.Generator().manual_seed(3), greedy=greedy))
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv("KTFRAME_NO_KERNELS", "1")
    seeds.append(seeding.kmeans_plusplus(X, 40, torch.Generator().manual_seed(3), greedy=greedy))
    assert torch.equal(seeds[0], seeds[1])
    assert torch.equal(seeds[0], seeds[2])
    for b in range(2):
        assert torch.unique(seeds[0][b], dim=0).shape[0] == 40


# --- the fast path's Lloyd, nearest centers and objective (ktframe.fast.lloyd) -----------------


def tied_problem(dtype: torch.dtype):
    """Points on a small integer grid (exact distances: many points exactly halfway between two
    centers) and a duplicate center (every point nearest to it ties)."""
    g = torch.Generator().manual_seed(4)
    X = torch.randint(0, 6, (3, 200, 3), generator=g).to(dtype)
    C0 = X[:, :6].clone()
    C0[:, 5] = C0[:, 4]
    return X, C0


@pytest.mark.parametrize("kernels", ["on", "off"])
def test_fast_lloyd_is_the_reference_lloyd(kernels, monkeypatch):
    from ktframe.fast import lloyd as fast_lloyd

    if kernels == "off":
        monkeypatch.setenv("KTFRAME_NO_KERNELS", "1")
    X, C0 = tied_problem(torch.float64)
    got, want = fast_lloyd.lloyd(X, C0, 6), reference.lloyd(X, C0, 6)
    torch.testing.assert_close(got.trajectory, want.trajectory, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.assignments, want.assignments, rtol=0, atol=0)
    one = fast_lloyd.lloyd(X, C0, 1)
    A = one.assignments
    assert torch.equal(A, reference.assign(X, C0))
    torch.testing.assert_close(one.centers, reference.lloyd_step(X, C0)[1], rtol=0, atol=1e-12)  # sums in another order
    assert bool(((A > 0) & (A < 1)).any())  # ties, shared
    torch.testing.assert_close(fast_lloyd.objective(X, got.centers), reference.objective(X, want.centers), rtol=1e-12, atol=0)
    assert torch.equal(fast_lloyd.nearest(X, want.centers), reference.sqdist(X, want.centers).argmin(-1))


def test_fast_lloyd_on_float32_is_the_reference_to_rounding():
    from ktframe.fast import lloyd as fast_lloyd

    X, C0 = tied_problem(torch.float32)
    got, want = fast_lloyd.lloyd(X, C0, 6), reference.lloyd(X, C0, 6)
    torch.testing.assert_close(got.trajectory, want.trajectory, rtol=0, atol=1e-5)
    torch.testing.assert_close(
        fast_lloyd.objective(X.double(), got.centers.double()), reference.objective(X.double(), want.centers.double()), rtol=1e-5, atol=0
    )
