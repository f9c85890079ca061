"""``TransformerKMeans`` behaves as a scikit-learn k-means estimator and computes Lloyd's algorithm."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.metrics import adjusted_rand_score
from sklearn.utils.validation import check_is_fitted

import ktframe
from ktframe import KtframeError, NotFittedError, TransformerKMeans


def blobs(n_per: int = 30, d: int = 2, k: int = 3, spread: float = 0.3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``k`` blobs whose means are 12 apart along the first axis, shuffled; the points and true labels."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 3, (k, d))
    means[:, 0] = 12.0 * np.arange(k)
    truth = np.repeat(np.arange(k), n_per)
    X = means[truth] + rng.normal(0, spread, (k * n_per, d))
    order = rng.permutation(len(X))
    return X[order], truth[order]


def objective(X: np.ndarray, C: np.ndarray) -> float:
    """The k-means objective, computed here with numpy alone."""
    return float(((X[:, None, :] - C[None, :, :]) ** 2).sum(-1).min(1).sum())


def one_point_per_blob(X: np.ndarray, truth: np.ndarray, k: int) -> np.ndarray:
    return np.stack([X[np.flatnonzero(truth == j)[0]] for j in range(k)])


X, TRUTH = blobs()


@pytest.mark.parametrize("init", ["k-means++", "array"])  # "random" may seed two centers in one blob
def test_recovers_well_separated_blobs(init: str) -> None:
    start = one_point_per_blob(X, TRUTH, 3) if init == "array" else init
    estimator = TransformerKMeans(3, init=start, random_state=0).fit(X)
    assert adjusted_rand_score(TRUTH, estimator.labels_) == 1.0
    assert adjusted_rand_score(TRUTH, estimator.predict(X)) == 1.0
    assert adjusted_rand_score(TRUTH, TransformerKMeans(3, init=start, random_state=0).fit_predict(X)) == 1.0


def test_fitted_attributes() -> None:
    estimator = TransformerKMeans(3, max_iter=7, random_state=1).fit(X)
    assert estimator.cluster_centers_.shape == (3, 2)
    assert estimator.labels_.shape == (len(X),)
    assert isinstance(estimator.n_iter_, int) and 1 <= estimator.n_iter_ < 7  # converged early
    assert estimator.n_features_in_ == 2
    np.testing.assert_array_equal(estimator.labels_, estimator.predict(X))
    # each center is the mean of its points (the blobs converge within 7 Lloyd steps)
    for j in range(3):
        np.testing.assert_allclose(estimator.cluster_centers_[j], X[estimator.labels_ == j].mean(0), atol=1e-12)


def test_inertia_is_the_objective_of_the_centers() -> None:
    estimator = TransformerKMeans(3, random_state=0).fit(X)
    assert estimator.inertia_ == pytest.approx(objective(X, estimator.cluster_centers_), rel=1e-12)
    assert estimator.score(X) == pytest.approx(-estimator.inertia_, rel=1e-12)


def test_transform_gives_distances_to_the_centers() -> None:
    estimator = TransformerKMeans(3, random_state=0).fit(X)
    new = np.random.default_rng(5).normal(5, 10, (11, 2))
    distances = estimator.transform(new)
    assert distances.shape == (11, 3)
    expected = np.linalg.norm(new[:, None, :] - estimator.cluster_centers_[None], axis=-1)
    np.testing.assert_allclose(distances, expected, rtol=1e-12)
    np.testing.assert_array_equal(estimator.predict(new), expected.argmin(1))
    assert estimator.score(new) == pytest.approx(-objective(new, estimator.cluster_centers_), rel=1e-12)


@pytest.mark.parametrize(
    "n_per, d, k, spread, max_iter",
    [(40, 2, 3, 4.0, 10), (25, 5, 4, 6.0, 6), (15, 3, 6, 8.0, 12)],
)
def test_equals_scikit_learn_lloyd(n_per: int, d: int, k: int, spread: float, max_iter: int) -> None:
    # overlapping blobs, so that Lloyd's algorithm takes several steps to settle
    points, truth = blobs(n_per, d, k, spread, seed=k)
    C0 = one_point_per_blob(points, truth, k)
    ours = TransformerKMeans(k, init=C0, max_iter=max_iter, tol=0, gamma=math.inf).fit(points)
    theirs = KMeans(k, algorithm="lloyd", init=C0, n_init=1, max_iter=max_iter, tol=0).fit(points)
    assert len(np.unique(theirs.labels_)) == k, "a cluster emptied: scikit-learn would move its center"
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-8)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_n_iter_counts_the_lloyd_iterations_as_scikit_learn_does(seed: int) -> None:
    # From the same start, scikit-learn stops once an iteration leaves the labels as they were;
    # the model stops at the same layer, and counts it as scikit-learn counts that iteration.
    points, _ = blobs(40, 2, 4, 2.5, seed=seed)
    C0 = points[:4]
    ours = TransformerKMeans(4, init=C0, max_iter=30, tol=0).fit(points)
    theirs = KMeans(4, algorithm="lloyd", init=C0, n_init=1, max_iter=30, tol=0).fit(points)
    assert ours.n_iter_ == theirs.n_iter_ < 30
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-12)


def test_fewer_layers_stop_early_like_max_iter() -> None:
    points, truth = blobs(40, 2, 3, 2.0, seed=3)
    C0 = points[:3]  # a poor start, so that one step is not enough
    one = TransformerKMeans(3, init=C0, max_iter=1).fit(points)
    theirs = KMeans(3, algorithm="lloyd", init=C0, n_init=1, max_iter=1, tol=0).fit(points)
    np.testing.assert_allclose(one.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-8)
    assert one.n_iter_ == 1


def test_random_state_reproduces_and_seeds_differ() -> None:
    uniform = np.random.default_rng(2).uniform(size=(60, 2))
    runs = {}
    for seed in range(4):
        a = TransformerKMeans(5, init="random", max_iter=1, random_state=seed).fit(uniform)
        b = TransformerKMeans(5, init="random", max_iter=1, random_state=seed).fit(uniform)
        np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
        np.testing.assert_array_equal(a.labels_, b.labels_)
        runs[seed] = a.cluster_centers_
    assert any(not np.array_equal(runs[0], runs[s]) for s in range(1, 4))
    # k-means++ too
    pp = [TransformerKMeans(5, max_iter=1, random_state=s).fit(uniform).cluster_centers_ for s in (7, 7, 8)]
    np.testing.assert_array_equal(pp[0], pp[1])
    assert not np.array_equal(pp[0], pp[2])


def test_a_torch_generator_is_a_random_state() -> None:
    centers = [TransformerKMeans(3, random_state=torch.Generator().manual_seed(4)).fit(X).cluster_centers_ for _ in range(2)]
    np.testing.assert_array_equal(*centers)


def test_numpy_in_numpy_out() -> None:
    estimator = TransformerKMeans(3, random_state=0).fit(X)
    for value in (estimator.cluster_centers_, estimator.labels_, estimator.predict(X), estimator.transform(X)):
        assert isinstance(value, np.ndarray)
    assert estimator.cluster_centers_.dtype == np.float64
    assert np.issubdtype(estimator.labels_.dtype, np.integer)
    assert isinstance(estimator.inertia_, float) and isinstance(estimator.score(X), float)


def test_tensor_in_tensor_out() -> None:
    tensor = torch.tensor(X)
    before = tensor.clone()
    estimator = TransformerKMeans(3, random_state=0).fit(tensor)
    assert torch.equal(tensor, before), "fit must not change its input"
    for value in (estimator.cluster_centers_, estimator.labels_, estimator.predict(tensor), estimator.transform(tensor)):
        assert isinstance(value, torch.Tensor)
    assert not estimator.labels_.is_floating_point()
    reference = TransformerKMeans(3, random_state=0).fit(X)
    np.testing.assert_array_equal(estimator.labels_.numpy(), reference.labels_)
    np.testing.assert_allclose(estimator.cluster_centers_.numpy(), reference.cluster_centers_, rtol=0, atol=0)
    # lists of numbers and float32 tensors are accepted too
    as_list = TransformerKMeans(3, random_state=0).fit(X.tolist())
    np.testing.assert_array_equal(as_list.labels_, reference.labels_)
    as_float32 = TransformerKMeans(3, random_state=0).fit(tensor.float())
    assert as_float32.cluster_centers_.dtype == torch.float32  # the input's float dtype stays


def test_float32_dtype() -> None:
    single = TransformerKMeans(3, random_state=0, dtype="float32").fit(X)
    double = TransformerKMeans(3, random_state=0).fit(X)
    assert single.cluster_centers_.dtype == np.float32
    assert single.transform(X).dtype == np.float32
    np.testing.assert_array_equal(single.labels_, double.labels_)
    np.testing.assert_allclose(single.cluster_centers_, double.cluster_centers_, rtol=0, atol=1e-4)
    assert single.inertia_ == pytest.approx(double.inertia_, rel=1e-4)
    tensor = TransformerKMeans(3, random_state=0, dtype="float32").fit(torch.tensor(X))
    assert tensor.cluster_centers_.dtype == torch.float32


def test_params_round_trip_and_clone() -> None:
    C0 = X[:3]
    params = dict(
        n_clusters=3,
        variant="lloyd-dot",
        max_iter=4,
        n_layers=None,
        tol=1e-3,
        gamma=50.0,
        init=C0,
        n_init=1,
        random_state=3,
        dtype="float32",
        variant_options={"share_weights": False},
        checkpoint=None,
        lloyd_last=2,
        swaps=1,
    )
    estimator = TransformerKMeans(**params)
    got = estimator.get_params()
    assert set(got) == set(params)
    assert all(got[name] is value for name, value in params.items())
    other = TransformerKMeans().set_params(**got)
    assert all(other.get_params()[name] is value for name, value in params.items())
    assert estimator.set_params(max_iter=6) is estimator and estimator.max_iter == 6
    assert "max_iter=6" in repr(estimator)

    fitted = TransformerKMeans(3, max_iter=3, random_state=0).fit(X)
    copy = clone(fitted)
    assert copy is not fitted and copy.get_params() == fitted.get_params()
    with pytest.raises(KtframeError, match="not fitted"):
        copy.predict(X)
    np.testing.assert_array_equal(copy.fit(X).labels_, fitted.labels_)


def test_lloyd_dot_equals_lloyd() -> None:
    points, truth = blobs(25, 3, 4, 5.0, seed=9)
    C0 = one_point_per_blob(points, truth, 4)
    lloyd = TransformerKMeans(4, init=C0, max_iter=8).fit(points)
    dot = TransformerKMeans(4, variant="lloyd-dot", init=C0, max_iter=8).fit(points)
    np.testing.assert_array_equal(dot.labels_, lloyd.labels_)
    np.testing.assert_allclose(dot.cluster_centers_, lloyd.cluster_centers_, rtol=0, atol=1e-8)
    assert dot.inertia_ == pytest.approx(lloyd.inertia_, rel=1e-10)
    # with random seeding too: the same seed draws the same start for both variants
    a = TransformerKMeans(4, random_state=2).fit(points)
    b = TransformerKMeans(4, variant="lloyd-dot", random_state=2).fit(points)
    np.testing.assert_array_equal(a.labels_, b.labels_)


def test_finite_gamma_is_close_to_the_hard_limit_on_separated_blobs() -> None:
    hard = TransformerKMeans(3, random_state=0).fit(X)
    soft = TransformerKMeans(3, random_state=0, gamma=100.0).fit(X)
    np.testing.assert_array_equal(soft.labels_, hard.labels_)
    np.testing.assert_allclose(soft.cluster_centers_, hard.cluster_centers_, atol=1e-6)


def test_k_equal_to_n_puts_every_point_in_its_own_cluster() -> None:
    points = X[:6]
    estimator = TransformerKMeans(6, random_state=0, max_iter=2).fit(points)
    assert sorted(estimator.labels_.tolist()) == list(range(6))
    assert estimator.inertia_ == pytest.approx(0.0, abs=1e-20)


def test_predict_before_fit_is_a_clear_error() -> None:
    for method in ("predict", "transform", "score"):
        with pytest.raises(NotFittedError, match=rf"not fitted yet; call fit\(X\) first, then {method}\(X\)") as caught:
            getattr(TransformerKMeans(3), method)(X)
        assert isinstance(caught.value, KtframeError) and isinstance(caught.value, ValueError) and isinstance(caught.value, AttributeError)
        assert isinstance(caught.value, SklearnNotFittedError)  # scikit-learn is loaded here
        assert "\n" not in str(caught.value)
    with pytest.raises(SklearnNotFittedError):
        check_is_fitted(TransformerKMeans(3))
    check_is_fitted(TransformerKMeans(3, random_state=0).fit(X))


# --- dtypes, the objective, the number of iterations ----------------------------------------


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_the_input_float_dtype_is_kept(kind: str) -> None:
    convert = torch.from_numpy if kind == "tensor" else np.asarray
    for dtype in (np.float32, np.float64):
        data = convert(X.astype(dtype))
        estimator = TransformerKMeans(3, random_state=0).fit(data)
        expected = data.dtype
        assert estimator.cluster_centers_.dtype == expected
        assert estimator.transform(data).dtype == expected
        assert estimator.fit_transform(data).dtype == expected
    # integers and lists become float64, as scikit-learn converts them
    integers = np.rint(X * 10).astype(np.int64)
    assert TransformerKMeans(3, random_state=0).fit(integers).cluster_centers_.dtype == np.float64
    assert TransformerKMeans(3, random_state=0).fit(X.astype(np.float32).tolist()).cluster_centers_.dtype == np.float64
    # dtype= forces one
    forced = TransformerKMeans(3, random_state=0, dtype="float64").fit(X.astype(np.float32))
    assert forced.cluster_centers_.dtype == np.float64
    assert forced.transform(X.astype(np.float32)).dtype == np.float64


def test_dtype_must_be_a_float_dtype() -> None:
    with pytest.raises(KtframeError, match=r"unsupported dtype 'int32'; expected None \(the input's float dtype\) or one of: float32, float64"):
        TransformerKMeans(3, dtype="int32").fit(X)


def test_a_float_tensor_of_the_right_dtype_is_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real = TransformerKMeans._check_X

    def spy(self, data, *, fitted):
        tensor, batched = real(self, data, fitted=fitted)
        seen.append(tensor)
        return tensor, batched

    monkeypatch.setattr(TransformerKMeans, "_check_X", spy)
    for data in (X, X.astype(np.float32), torch.from_numpy(X), torch.from_numpy(X.astype(np.float32))):
        TransformerKMeans(3, random_state=0).fit(data)
        pointer = data.ctypes.data if isinstance(data, np.ndarray) else data.data_ptr()
        assert seen[-1].data_ptr() == pointer


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batched", [False, True])
def test_inertia_and_labels_agree_with_the_centers(dtype: type, batched: bool) -> None:
    # max_iter=2 stops before convergence: the labels are still those of the returned centers
    for max_iter in (2, 300):
        data = (tasks(3) if batched else blobs(40, 3, 4, 3.0, seed=1)[0]).astype(dtype)
        estimator = TransformerKMeans(4, max_iter=max_iter, random_state=0).fit(data)
        np.testing.assert_array_equal(estimator.labels_, estimator.predict(data))
        rel = 1e-5 if dtype == np.float32 else 1e-12
        for t, task in enumerate(data if batched else [data]):
            centers = estimator.cluster_centers_[t] if batched else estimator.cluster_centers_
            labels = estimator.labels_[t] if batched else estimator.labels_
            exact = objective(task.astype(np.float64), centers.astype(np.float64))
            distances = ((task.astype(np.float64)[:, None] - centers.astype(np.float64)[None]) ** 2).sum(-1)
            assert (distances[np.arange(len(task)), labels] <= distances.min(1) * (1 + rel) + 1e-30).all()
            inertia = estimator.inertia_[t] if batched else estimator.inertia_
            assert inertia == pytest.approx(exact, rel=rel)


@pytest.mark.parametrize("kernels", ["on", "off"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_predict_is_the_exact_nearest_center_at_ties_and_near_ties(kernels: str, dtype: type, monkeypatch: pytest.MonkeyPatch) -> None:
    # Duplicate centers (an exact tie: the lower index), points halfway between two centers (a
    # near tie that float32 distances may round either way) and ordinary points: predict gives
    # the nearest center in float64, on the fused arg-max path and on the exact fallback.
    if kernels == "off":
        monkeypatch.setenv("KTFRAME_NO_KERNELS", "1")
    rng = np.random.default_rng(3)
    centers = rng.normal(0, 1, (9, 5)).astype(dtype)
    centers[4] = centers[1]
    halfway = (centers[2:4].astype(np.float64).mean(0) + rng.normal(0, 1e-7, (50, 5))).astype(dtype)
    points = np.concatenate([rng.normal(0, 1, (2000, 5)).astype(dtype), halfway, centers[[1, 4]]])
    estimator = TransformerKMeans(9, init=centers).fit(centers)  # each center its own cluster
    np.testing.assert_array_equal(estimator.cluster_centers_, centers)
    distances = ((points.astype(np.float64)[:, None] - centers.astype(np.float64)[None]) ** 2).sum(-1)
    labels = estimator.predict(points)
    np.testing.assert_array_equal(labels, distances.argmin(1))
    assert (labels != 4).all()


def test_max_iter_is_the_default_and_n_layers_an_alias() -> None:
    estimator = TransformerKMeans(3)
    assert estimator.max_iter == 300 and estimator.n_layers is None and estimator.dtype is None
    points, _ = blobs(40, 2, 3, 2.0, seed=3)
    C0 = points[:3]
    long = TransformerKMeans(3, init=C0, tol=0).fit(points)
    theirs = KMeans(3, algorithm="lloyd", init=C0, n_init=1, tol=0).fit(points)  # max_iter=300 too
    assert long.n_iter_ == theirs.n_iter_
    np.testing.assert_allclose(long.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-12)
    alias = TransformerKMeans(3, init=C0, n_layers=1).fit(points)
    one = TransformerKMeans(3, init=C0, max_iter=1).fit(points)
    np.testing.assert_array_equal(alias.cluster_centers_, one.cluster_centers_)
    assert alias.n_iter_ == 1
    with pytest.raises(KtframeError, match="max_iter must be an integer >= 1"):
        TransformerKMeans(3, max_iter=0).fit(points)


def test_a_refit_reuses_the_model_only_while_its_settings_stay() -> None:
    estimator = TransformerKMeans(3, init="random", random_state=0, max_iter=5)
    first = estimator.fit(X).cluster_centers_.copy()
    model = estimator._built[1]
    np.testing.assert_array_equal(estimator.fit(X).cluster_centers_, first)  # the same model, the same result
    assert estimator._built[1] is model
    estimator.set_params(n_clusters=4).fit(X)
    assert estimator._built[1] is not model and estimator.cluster_centers_.shape == (4, 2)
    estimator.set_params(n_clusters=3, gamma=10.0).fit(X)
    assert estimator._built[1].k == 3 and estimator._built[0][4] == 10.0
    assert clone(estimator).__dict__.get("_built") is None  # a clone starts from its parameters alone


def test_a_refit_reuses_the_lloyd_finish_while_its_steps_stay() -> None:
    estimator = TransformerKMeans(3, variant="soft", gamma=5.0, init="random", random_state=0, max_iter=6, lloyd_last=2, tol=0)
    first = estimator.fit(X).cluster_centers_.copy()
    finish = estimator._built_finish[1]
    np.testing.assert_array_equal(estimator.fit(X).cluster_centers_, first)
    assert estimator._built_finish[1] is finish
    estimator.set_params(lloyd_last=3).fit(X)
    assert estimator._built_finish[1] is not finish and estimator._built_finish[0][2] == 3


# --- many tasks at once -----------------------------------------------------------------------


def tasks(n_tasks: int = 5) -> np.ndarray:
    return np.stack([blobs(n_per=20, d=3, seed=seed)[0] for seed in range(n_tasks)])


def test_many_tasks_in_one_fit_equal_one_fit_per_task() -> None:
    Xs = tasks()
    starts = np.stack([task[:3] for task in Xs])
    batched = TransformerKMeans(3, init=starts, max_iter=6).fit(Xs)
    assert batched.cluster_centers_.shape == (5, 3, 3)
    assert batched.labels_.shape == (5, 60)
    assert batched.inertia_.shape == (5,)
    assert batched.n_iter_.shape == (5,)
    for t, task in enumerate(Xs):
        alone = TransformerKMeans(3, init=starts[t], max_iter=6).fit(task)
        assert batched.n_iter_[t] == alone.n_iter_
        np.testing.assert_allclose(batched.cluster_centers_[t], alone.cluster_centers_, atol=1e-12, rtol=0)
        np.testing.assert_array_equal(batched.labels_[t], alone.labels_)
        assert batched.inertia_[t] == pytest.approx(alone.inertia_, rel=1e-12)
        assert batched.inertia_[t] == pytest.approx(objective(task, alone.cluster_centers_), rel=1e-9)


def test_many_tasks_predict_transform_and_score_per_task() -> None:
    Xs = tasks(3)
    fitted = TransformerKMeans(3, random_state=0).fit(Xs)
    np.testing.assert_array_equal(fitted.predict(Xs), fitted.labels_)
    distances = fitted.transform(Xs)
    assert distances.shape == (3, 60, 3)
    np.testing.assert_array_equal(distances.argmin(-1), fitted.labels_)
    np.testing.assert_allclose(fitted.score(Xs), -fitted.inertia_, rtol=1e-12)
    with pytest.raises(KtframeError, match=r"fitted on 3; expected shape \(3, n_samples, 3\)"):
        fitted.predict(Xs[:2])


def test_many_tasks_seeded_k_means_plus_plus_reproduces() -> None:
    Xs = tasks(4)
    a = TransformerKMeans(3, random_state=7).fit(Xs)
    b = TransformerKMeans(3, random_state=7).fit(torch.tensor(Xs))
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_.numpy())


@pytest.mark.parametrize("options", [None, {"share_weights": False}])
def test_a_fit_that_settles_early_gives_what_every_step_gives(options: dict | None) -> None:
    # Tasks settling after 8 to 53 steps: the model stops once all have, max_iter=300 steps given.
    data = np.stack([blobs(100, 2, 6, 4.0, seed=seed)[0] for seed in range(6)])
    fitted = TransformerKMeans(6, random_state=0, init="random", n_init=1, max_iter=300, tol=0, variant_options=options).fit(data)
    model = ktframe.build_model("lloyd", d=2, k=6, n_layers=300, dtype="float64", reset="identity", **(options or {}))
    X = torch.from_numpy(data)
    C0 = ktframe.reference.random_points(X, 6, torch.Generator().manual_seed(0))  # the fit's init="random", random_state=0
    model.plan = dataclasses.replace(model.plan, skip_settled=False)  # every step on every task
    with torch.no_grad():
        every = model(X, C0)
    np.testing.assert_array_equal(fitted.cluster_centers_, every.centers.numpy())
    if options is None:
        assert 10 < fitted.n_iter_.max() < 300  # settled before the end, past a short run


@pytest.mark.parametrize("variant, gamma", [("soft", 20.0), ("lloyd", math.inf)])
def test_lloyd_last_is_the_model_then_lloyd_from_its_centers(variant: str, gamma: float) -> None:
    X, _ = blobs(n_per=40, k=4, spread=0.6, seed=3)
    both = TransformerKMeans(4, variant=variant, gamma=gamma, max_iter=12, lloyd_last=5, tol=0, random_state=1).fit(X)
    first = TransformerKMeans(4, variant=variant, gamma=gamma, max_iter=7, tol=0, random_state=1).fit(X)
    then = KMeans(4, init=first.cluster_centers_, n_init=1, max_iter=5, tol=0, algorithm="lloyd").fit(X)
    np.testing.assert_allclose(both.cluster_centers_, then.cluster_centers_, atol=1e-12)
    assert both.n_iter_ == first.n_iter_ + TransformerKMeans(4, init=first.cluster_centers_, max_iter=5, tol=0).fit(X).n_iter_
    assert both.inertia_ == pytest.approx(then.inertia_, rel=1e-12)
    # all the steps Lloyd's: Lloyd from the seeded start
    alone = TransformerKMeans(4, variant=variant, gamma=gamma, max_iter=12, lloyd_last=12, tol=0, random_state=1).fit(X)
    plain = TransformerKMeans(4, max_iter=12, tol=0, random_state=1).fit(X)
    np.testing.assert_array_equal(alone.cluster_centers_, plain.cluster_centers_)


@pytest.mark.parametrize("lloyd_last", [-1, 11, True, 1.5, "2"])
def test_lloyd_last_must_be_a_number_of_the_steps(lloyd_last) -> None:
    X, _ = blobs()
    with pytest.raises(ktframe.InputError, match=r"lloyd_last must be an integer from 0 to the 10 steps of the fit") as caught:
        TransformerKMeans(3, max_iter=10, lloyd_last=lloyd_last).fit(X)
    assert "\n" not in str(caught.value)
