"""Every layer of the exact (gamma = inf) transformers is one iteration of Lloyd's algorithm.

The models are compared with ``ktframe.core.reference.lloyd`` layer by layer (the whole trajectory),
plus the documented conventions outside the theorem's assumptions (docs/exactness.md): an empty
cluster keeps its center, duplicate points are ordinary points, an exactly tied point is shared
equally (hard label: the lowest index).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ktframe
from ktframe.core import reference
from ktframe.core.reference import random_points
from ktframe.core.tasks import mixture

# (variant, options): every exact construction the package offers.
EXACT_MODELS = [
    pytest.param("lloyd", {"reset": "attention"}, id="lloyd"),  # the default in the hard limit is "identity"
    pytest.param("lloyd", {"center_update": "argmax"}, id="lloyd-argmax"),
    pytest.param("lloyd", {"reset": "identity"}, id="lloyd-identity"),
    pytest.param("lloyd-dot", {}, id="lloyd-dot"),
]

ATOL64 = 1e-9


def run_model(variant, options, X, C0, n_layers, *, dtype=torch.float64, gamma=math.inf):
    model = ktframe.build_model(variant, d=X.shape[-1], k=C0.shape[1], n_layers=n_layers, gamma=gamma, dtype=dtype, **options)
    with torch.no_grad():
        return model(X, C0)


def assert_same_run(got, want, atol=ATOL64):
    """Same trajectory (every layer), same assignments, same hard labels."""
    assert got.trajectory.shape == want.trajectory.shape
    torch.testing.assert_close(got.trajectory, want.trajectory, atol=atol, rtol=0)
    torch.testing.assert_close(got.centers, want.centers, atol=atol, rtol=0)
    torch.testing.assert_close(got.assignments, want.assignments, atol=atol, rtol=0)
    assert torch.equal(got.labels, want.labels)


@st.composite
def problems(draw):
    """Continuous random data (no exact ties with probability 1) of many shapes."""
    B = draw(st.integers(1, 3))
    n = draw(st.integers(1, 60))
    d = draw(st.integers(1, 6))
    k = draw(st.integers(1, min(n, 6)))
    layers = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    data = draw(st.sampled_from(["randn", "rand", "blobs"]))
    init = draw(st.sampled_from(["points", "random"]))
    share = draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    if data == "randn":
        X = torch.randn(B, n, d, generator=g, dtype=torch.float64) * 3.0
    elif data == "rand":
        X = torch.rand(B, n, d, generator=g, dtype=torch.float64)
    else:  # clustered, so that several iterations move the centers far
        means = torch.rand(B, k, d, generator=g, dtype=torch.float64) * 10.0
        which = torch.randint(k, (B, n), generator=g)
        X = torch.gather(means, 1, which.unsqueeze(-1).expand(-1, -1, d)) + 0.5 * torch.randn(B, n, d, generator=g, dtype=torch.float64)
    if init == "points":
        C0 = random_points(X, k, g)
    else:  # centers anywhere, some of which may get no point (an empty cluster keeps its center)
        C0 = torch.randn(B, k, d, generator=g, dtype=torch.float64) * 3.0
    return X, C0, layers, share


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
@settings(max_examples=40, deadline=None)
@given(problem=problems())
def test_every_layer_is_a_lloyd_iteration(variant, options, problem):
    X, C0, layers, share = problem
    got = run_model(variant, {**options, "share_weights": share}, X, C0, layers)
    want = reference.lloyd(X, C0, layers)
    B, n, d = X.shape
    k = C0.shape[1]
    assert got.trajectory.shape == (B, layers + 1, k, d)
    assert got.assignments.shape == (B, n, k)
    assert torch.equal(got.trajectory[:, 0], C0)  # the initial centers come first, untouched
    assert_same_run(got, want)
    # No ties in continuous data: every assignment row is one-hot.
    assert torch.equal(got.assignments.sum(-1), torch.ones(B, n, dtype=X.dtype))
    assert bool(((got.assignments == 0) | (got.assignments == 1)).all())


# --- explicit cases -----------------------------------------------------------------------------


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_empty_cluster_keeps_its_center(variant, options):
    g = torch.Generator().manual_seed(11)
    X = torch.rand(2, 30, 2, generator=g, dtype=torch.float64)
    C0 = torch.cat([random_points(X, 2, g), torch.full((2, 1, 2), 100.0, dtype=torch.float64)], dim=1)
    C0[1, 2] = torch.tensor([-50.0, 75.0], dtype=torch.float64)  # a different far center per task
    got = run_model(variant, options, X, C0, 4)
    want = reference.lloyd(X, C0, 4)
    assert_same_run(got, want)
    # The far center never receives a point and never moves, in the model and in the reference.
    for result in (got, want):
        assert torch.equal(result.trajectory[:, :, 2], C0[:, None, 2].expand(-1, 5, -1))
        assert not bool((result.labels == 2).any())
        assert torch.equal(result.assignments[..., 2], torch.zeros(2, 30, dtype=torch.float64))
    # ... while the other centers did move (the comparison is not trivial).
    assert not torch.equal(got.trajectory[:, -1, :2], C0[:, :2])


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_cluster_that_empties_later_keeps_its_center(variant, options):
    # 1-D: first the clusters are {5, 9}, {10, 11}, {3, 4}; the centers move to 7, 10.5, 3.5, and
    # then 5 is nearer 3.5 and 9 nearer 10.5: center 0 loses every point and must stay at 7.
    X = torch.tensor([[[5.0], [4.0], [11.0], [9.0], [10.0], [3.0]]], dtype=torch.float64)
    C0 = torch.tensor([[[9.0], [10.5], [0.5]]], dtype=torch.float64)
    got = run_model(variant, options, X, C0, 4)
    want = reference.lloyd(X, C0, 4)
    expected = torch.tensor([[9.0, 10.5, 0.5], [7.0, 10.5, 3.5], [7.0, 10.0, 4.0], [7.0, 10.0, 4.0], [7.0, 10.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(want.trajectory[0, :, :, 0], expected, atol=1e-15, rtol=0)
    assert_same_run(got, want, atol=1e-12)
    assert not bool((got.labels == 0).any())


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_duplicate_points_are_ordinary_points(variant, options):
    g = torch.Generator().manual_seed(3)
    Y = torch.randn(2, 20, 3, generator=g, dtype=torch.float64)
    X = torch.cat([Y, Y[:, :8], Y[:, :3]], dim=1)  # some points two or three times
    X = X[:, torch.randperm(X.shape[1], generator=g)]
    C0 = random_points(Y, 4, g)  # the initial centers themselves coincide with (duplicated) points
    got = run_model(variant, options, X, C0, 5)
    want = reference.lloyd(X, C0, 5)
    assert_same_run(got, want)
    assert not torch.equal(want.trajectory[:, 1], C0)
    # Duplicates carry identical assignments.
    for b in range(2):
        for i in range(X.shape[1]):
            same = (X[b] == X[b, i]).all(-1)
            assert bool((got.assignments[b, same] == got.assignments[b, i]).all())


def tie_problem():
    """1-D: the point 0 is exactly equidistant from the centers at -1 and 1, and stays so (the
    centers move to -2/3 and 2/3, symmetrically)."""
    X = torch.tensor([[[-1.0], [0.0], [1.0]]], dtype=torch.float64)
    C0 = torch.tensor([[[-1.0], [1.0]]], dtype=torch.float64)
    return X, C0


# The argmax center update is exact only without ties (the theorem's assumption): see
# test_argmax_center_update_leaves_tied_points_out for what it does with them.
TIE_MODELS = [m for m in EXACT_MODELS if m.id != "lloyd-argmax"]


@pytest.mark.parametrize("variant, options", TIE_MODELS)
def test_exact_tie_is_shared_equally(variant, options):
    X, C0 = tie_problem()
    got = run_model(variant, options, X, C0, 3)
    want = reference.lloyd(X, C0, 3)
    # The convention itself, in the reference ...
    half = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert torch.equal(want.assignments[0, 1], half)
    torch.testing.assert_close(want.trajectory[0, 1:, :, 0], torch.tensor([[-2 / 3, 2 / 3]] * 3, dtype=torch.float64), atol=1e-15, rtol=0)
    assert want.labels.tolist() == [[0, 0, 1]]  # the tied point's hard label is the lowest index
    # ... and in the model, layer by layer.
    assert torch.equal(got.assignments[0, 1], half)
    assert got.labels.tolist() == [[0, 0, 1]]
    assert_same_run(got, want, atol=1e-15)


def test_argmax_center_update_leaves_tied_points_out():
    # An arg-max over the index part gives a fully assigned point the score 0 and a point shared
    # 1/2-1/2 the score -1/2, so the shared point takes no part in the mean (documented in
    # docs/exactness.md); Lloyd counts it with weight 1/2.
    X, C0 = tie_problem()
    got = run_model("lloyd", {"center_update": "argmax"}, X, C0, 3)
    torch.testing.assert_close(got.trajectory[0, :, :, 0], torch.tensor([[-1.0, 1.0]] * 4, dtype=torch.float64), atol=1e-15, rtol=0)
    assert torch.equal(got.assignments[0, 1], torch.tensor([0.5, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("variant, options", TIE_MODELS)
def test_three_way_tie_is_shared_equally(variant, options):
    # The origin is at distance 1 from three centers (and the other points pin those centers).
    X = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    C0 = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    got = run_model(variant, options, X, C0, 1)
    want = reference.lloyd(X, C0, 1)
    third = torch.full((3,), 1 / 3, dtype=torch.float64)
    torch.testing.assert_close(want.assignments[0, 0], third, atol=1e-15, rtol=0)
    torch.testing.assert_close(got.assignments[0, 0], third, atol=1e-15, rtol=0)
    assert got.labels[0, 0].item() == 0
    assert_same_run(got, want, atol=1e-12)


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_hard_limit(variant, options, seed):
    g = torch.Generator().manual_seed(seed)
    X64, _ = mixture(2, 400, 3, 4, generator=g, dtype=torch.float64)
    C064 = random_points(X64, 4, g)
    X, C0 = X64.float(), C064.float()
    got = run_model(variant, options, X, C0, 6, dtype=torch.float32)
    assert got.trajectory.dtype == torch.float32
    want = reference.lloyd(X, C0, 6)
    torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-4, rtol=0)
    assert torch.equal(got.labels, want.labels)
    # And against float64 Lloyd from the same (rounded) start: float32 rounding, nothing more.
    want64 = reference.lloyd(X.double(), C0.double(), 6)
    torch.testing.assert_close(got.trajectory.double(), want64.trajectory, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_shared_and_per_layer_weights_agree(variant, options):
    g = torch.Generator().manual_seed(7)
    X = torch.randn(2, 50, 3, generator=g, dtype=torch.float64)
    C0 = random_points(X, 5, g)
    shared = ktframe.build_model(variant, d=3, k=5, n_layers=4, dtype=torch.float64, share_weights=True, **options)
    separate = ktframe.build_model(variant, d=3, k=5, n_layers=4, dtype=torch.float64, share_weights=False, **options)
    assert len(shared.layers) == 1 and len(separate.layers) == 4
    with torch.no_grad():
        a, b = shared(X, C0), separate(X, C0)
    assert torch.equal(a.trajectory, b.trajectory)
    assert torch.equal(a.assignments, b.assignments)
    assert_same_run(a, reference.lloyd(X, C0, 4))


def batch_of_special_tasks():
    """Three tasks of the same shape: an exact tie, an empty cluster, plain random data."""
    g = torch.Generator().manual_seed(21)
    X = torch.stack(
        [
            torch.tensor([[-1.0], [0.0], [1.0], [-3.0], [3.0]], dtype=torch.float64),
            torch.tensor([[0.1], [0.2], [0.3], [0.4], [0.5]], dtype=torch.float64),
            torch.randn(5, 1, generator=g, dtype=torch.float64),
        ]
    )
    C0 = torch.stack(
        [
            torch.tensor([[-2.0], [2.0]], dtype=torch.float64),
            torch.tensor([[0.2], [100.0]], dtype=torch.float64),
            X[2, :2].clone(),
        ]
    )
    return X, C0


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_batch_equals_one_task_at_a_time(variant, options):
    g = torch.Generator().manual_seed(13)
    X = torch.randn(3, 40, 2, generator=g, dtype=torch.float64)
    C0 = random_points(X, 4, g)
    together = run_model(variant, options, X, C0, 5)
    for b in range(3):
        alone = run_model(variant, options, X[b : b + 1], C0[b : b + 1], 5)
        torch.testing.assert_close(together.trajectory[b : b + 1], alone.trajectory, atol=1e-12, rtol=0)
        torch.testing.assert_close(together.assignments[b : b + 1], alone.assignments, atol=1e-12, rtol=0)
        assert torch.equal(together.labels[b : b + 1], alone.labels)
    assert_same_run(together, reference.lloyd(X, C0, 5))


@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_batch_mixing_tie_empty_and_plain_tasks(variant, options):
    # A tie or an empty cluster in one task switches code paths (dense weights, 'stay' mass) for
    # the whole batch; the other tasks must not notice.
    X, C0 = batch_of_special_tasks()
    together = run_model(variant, options, X, C0, 3)
    for b in range(3):
        alone = run_model(variant, options, X[b : b + 1], C0[b : b + 1], 3)
        torch.testing.assert_close(together.trajectory[b : b + 1], alone.trajectory, atol=1e-12, rtol=0)
        torch.testing.assert_close(together.assignments[b : b + 1], alone.assignments, atol=1e-12, rtol=0)
        assert torch.equal(together.labels[b : b + 1], alone.labels)
    assert together.assignments[0, 1].tolist() == [0.5, 0.5]  # the tie really is one
    assert torch.equal(together.trajectory[1, :, 1], C0[1, 1].expand(4, 1))  # the empty cluster stays
    # Against Lloyd: the tasks without a tie (the tie itself: test_exact_tie_is_shared_equally).
    want = reference.lloyd(X[1:], C0[1:], 3)
    torch.testing.assert_close(together.trajectory[1:], want.trajectory, atol=1e-12, rtol=0)
    assert torch.equal(together.labels[1:], want.labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("variant, options", EXACT_MODELS)
def test_skipping_converged_tasks_changes_nothing(variant, options, dtype):
    # A task whose step left its streams as they were is skipped by the remaining steps of the
    # same (shared) layer: every output must be what running every step on it gives, bit for bit.
    g = torch.Generator().manual_seed(11)
    X, _ = mixture(48, 60, 2, 5, generator=g, dtype=dtype)
    C0 = random_points(X, 5, g)
    X[0, 7] = X[0, 3]  # a duplicate point
    C0[1, 1] = C0[1, 0]  # two equal centers: their points tie at every step, and the map decides
    model = ktframe.build_model(variant, d=2, k=5, n_layers=25, dtype=dtype, **options)
    with torch.no_grad():
        skipping = model(X, C0)
        model.plan = dataclasses.replace(model.plan, skip_settled=False)  # every step on every task
        every = model(X, C0)
    assert torch.equal(skipping.trajectory, every.trajectory)
    assert torch.equal(skipping.assignments, every.assignments)
    assert torch.equal(every.n_iter, torch.full((48,), 25))
    assert_same_run(skipping, reference.lloyd(X, C0, 25), atol=ATOL64 if dtype == torch.float64 else 1e-5)
    n_iter = skipping.n_iter
    if options.get("reset") != "identity":  # only the assignment by cluster tells (LayerPlan.assign)
        assert torch.equal(n_iter, every.n_iter)
        return
    # Rows that the map writes are not compared, so the tied task never counts as settled; the
    # others converge well within 25 steps.
    assert n_iter[1] == 25 and bool((n_iter[torch.arange(48) != 1] < 25).all()), n_iter
    for b in range(48):  # from the step that changed nothing on, the centers stay put
        tail = skipping.trajectory[b, n_iter[b] - 1 :]
        assert torch.equal(tail, tail[:1].expand_as(tail)), b


def test_layers_of_their_own_skip_no_task():
    # Per-step layers are different functions: a fixed point of one says nothing of the next.
    g = torch.Generator().manual_seed(12)
    X, _ = mixture(6, 40, 2, 3, generator=g, dtype=torch.float64)
    C0 = random_points(X, 3, g)
    separate = ktframe.build_model("lloyd", d=2, k=3, n_layers=12, dtype=torch.float64, share_weights=False, reset="identity")
    with torch.no_grad():
        got = separate(X, C0)
        separate.plan = dataclasses.replace(separate.plan, skip_settled=False)
        every = separate(X, C0)
    assert torch.equal(got.trajectory, every.trajectory)
    assert torch.equal(got.n_iter, torch.full((6,), 12))
