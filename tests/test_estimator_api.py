"""``TransformerKMeans``' scikit-learn parameters beyond Lloyd's: ``tol``, ``n_init``,
``sample_weight``, ``predict_proba``/``memberships_``, and ``--option`` on ``ktframe cluster`` and
``ktframe verify``, each against scikit-learn, numpy or the variant's own model step by step."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs
from test_training import one_line_error

import ktframe
from ktframe import KtframeError, TransformerKMeans
from ktframe.plugin.build import get_variant
from ktframe.plugin.manager import registry

REPO = Path(__file__).resolve().parents[1]
# Every hand-built variant, at a gamma where it computes its classical algorithm's step.
HAND_BUILT = {"lloyd": np.inf, "lloyd-dot": np.inf, "soft": 1.0, "spherical": np.inf, "trimmed": np.inf, "robust": np.inf, "kmedoids": np.inf}
WEIGHTED = ["lloyd", "lloyd-dot", "soft", "spherical"]  # Variant.sample_weights
PLAIN = {"fast": False}  # a variant's build option: the plain definition, not the fast path


def blobs(n: int = 60, d: int = 2, k: int = 3, std: float = 2.5, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return make_blobs(n, n_features=d, centers=k, cluster_std=std, random_state=seed)[0] * scale


def softmax_memberships(X: np.ndarray, C: np.ndarray, gamma: float) -> np.ndarray:
    """softmax_j(−γ‖x − c_j‖²), soft k-means' responsibilities, in numpy."""
    logits = -gamma * ((X[:, None, :] - C[None]) ** 2).sum(-1)
    weights = np.exp(logits - logits.max(1, keepdims=True))
    return weights / weights.sum(1, keepdims=True)


def one_line(info: pytest.ExceptionInfo) -> str:
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --- tol ----------------------------------------------------------------------------------------


def test_tol_is_scikit_learns_default_for_every_variant() -> None:
    assert TransformerKMeans().tol == KMeans().tol == 1e-4
    X = blobs()
    for variant, gamma in HAND_BUILT.items():
        assert TransformerKMeans(3, variant=variant, gamma=gamma).fit(X).tol == 1e-4


DATA = {  # uniform points settle slowly (tol stops them early); blobs at three scales
    "uniform": np.random.default_rng(0).uniform(size=(2000, 2)),
    "blobs-1e-3": blobs(300, 2, 4, 4.0, seed=1, scale=1e-3),
    "blobs-1e3": blobs(300, 3, 4, 4.0, seed=4, scale=1e3),
}


@pytest.mark.parametrize("options", [None, PLAIN], ids=["fast", "plain"])
@pytest.mark.parametrize("name", list(DATA))
def test_lloyd_with_tol_stops_where_scikit_learn_does(name: str, options: dict | None) -> None:
    X = DATA[name]
    C0 = X[:6]
    ours = TransformerKMeans(6, init=C0, variant_options=options).fit(X)  # tol=1e-4
    theirs = KMeans(6, algorithm="lloyd", init=C0, n_init=1, tol=1e-4).fit(X)
    assert len(np.unique(theirs.labels_)) == 6, "a cluster emptied: scikit-learn would move its center"
    assert ours.n_iter_ == theirs.n_iter_
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-12 * np.abs(X).max())
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-12)
    if name == "uniform":  # tol counts here: running on to an iteration that changes nothing takes longer
        exact = KMeans(6, algorithm="lloyd", init=C0, n_init=1, tol=0).fit(X)
        assert ours.n_iter_ < exact.n_iter_ == TransformerKMeans(6, init=C0, tol=0, variant_options=options).fit(X).n_iter_


def test_many_tasks_each_stop_where_scikit_learn_stops_it() -> None:
    # Tasks of 250 points in 1-d: the fast path runs every step of every task in one kernel call,
    # then cuts each task back to its stop, its point stream (its assignments) too.
    data = np.stack([np.random.default_rng(seed).uniform(size=(250, 1)) for seed in range(12)])
    C0 = data[:, :4]
    fitted = TransformerKMeans(4, init=C0).fit(data)
    cut = []
    for task in range(12):
        theirs = KMeans(4, algorithm="lloyd", init=C0[task], n_init=1, tol=1e-4).fit(data[task])
        assert fitted.n_iter_[task] == theirs.n_iter_
        np.testing.assert_allclose(fitted.cluster_centers_[task], theirs.cluster_centers_, rtol=0, atol=1e-14)
        np.testing.assert_array_equal(fitted.labels_[task], theirs.labels_)
        cut.append(theirs.n_iter_ < KMeans(4, algorithm="lloyd", init=C0[task], n_init=1, tol=0).fit(data[task]).n_iter_)
    assert 0 < sum(cut) < 12, "some tasks should stop early and some not"
    results = []
    for fast in (True, False):
        model = ktframe.build_model("lloyd", d=1, k=4, n_layers=40, dtype="float64", fast=fast)
        with torch.no_grad():
            results.append(model(torch.from_numpy(data), torch.from_numpy(C0), tol=1e-4))
    fast, plain = results
    np.testing.assert_array_equal(fast.n_iter.numpy(), fitted.n_iter_)
    np.testing.assert_array_equal(fast.n_iter.numpy(), plain.n_iter.numpy())
    np.testing.assert_allclose(fast.trajectory.numpy(), plain.trajectory.numpy(), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(fast.assignments.numpy(), plain.assignments.numpy())


@pytest.mark.parametrize("variant", list(HAND_BUILT))
def test_every_variant_stops_by_scikit_learns_rule_plain_and_fast(variant: str) -> None:
    # The rule, from the variant's own model run every step: a task stops after the first step
    # whose squared center shift, summed over the centers, is at most tol times the mean variance
    # of the coordinates; its centers are those of that step.
    X = blobs()
    C0 = X[:3]
    gamma, steps = HAND_BUILT[variant], 40
    model = ktframe.build_model(variant, d=2, k=3, n_layers=steps, gamma=gamma, dtype="float64", fast=False)
    with torch.no_grad():
        trajectory = model(torch.from_numpy(X)[None], torch.from_numpy(C0)[None]).trajectory[0].numpy()
    shifts = ((trajectory[1:] - trajectory[:-1]) ** 2).sum(axis=(1, 2))
    within = shifts <= 1e-4 * X.var(axis=0).mean()
    assert within.any(), "the data should settle within the steps given"
    stop = int(within.argmax()) + 1
    for options in (None, PLAIN):
        fitted = TransformerKMeans(3, variant=variant, gamma=gamma, init=C0, max_iter=steps, variant_options=options).fit(X)
        assert fitted.n_iter_ == stop < steps
        np.testing.assert_allclose(fitted.cluster_centers_, trajectory[stop], rtol=0, atol=1e-12)


def test_a_soft_fit_stops_early_with_the_default_tol() -> None:
    X = blobs(200, 2, 4, 1.5, seed=1)
    settled = {}
    for options in (None, PLAIN):
        default = TransformerKMeans(4, variant="soft", gamma=1.0, random_state=0, max_iter=60, variant_options=options).fit(X)
        exact = TransformerKMeans(4, variant="soft", gamma=1.0, random_state=0, max_iter=60, tol=0, variant_options=options).fit(X)
        assert default.n_iter_ < 20 < exact.n_iter_
        assert default.inertia_ == pytest.approx(exact.inertia_, rel=1e-3)  # settled all but
        settled[options is None] = default
    # the plain definition and the fast path stop at the same step, at the same centers
    assert settled[True].n_iter_ == settled[False].n_iter_
    np.testing.assert_allclose(settled[True].cluster_centers_, settled[False].cluster_centers_, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tol", [-1e-4, float("nan"), float("inf"), "small", None, True])
def test_a_bad_tol_is_one_line(tol: object) -> None:
    with pytest.raises(KtframeError) as info:
        TransformerKMeans(3, tol=tol).fit(blobs())
    assert one_line(info).startswith("tol must be a non-negative finite number") and f"got {tol!r}" in str(info.value)


# --- predict_proba and memberships_ ----------------------------------------------------------------


def test_soft_memberships_are_softmax_over_the_fitted_centers() -> None:
    X = blobs(200, 3, 4, 1.5, seed=1)
    fitted = TransformerKMeans(4, variant="soft", gamma=0.5, random_state=0).fit(X)
    expected = softmax_memberships(X, fitted.cluster_centers_, 0.5)
    assert fitted.memberships_.shape == (200, 4)
    np.testing.assert_allclose(fitted.memberships_.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fitted.memberships_, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fitted.predict_proba(X), fitted.memberships_)
    # new points, fewer of them than centers too
    new = np.random.default_rng(2).normal(0, 6, (7, 3))
    for points in (new, new[:2]):
        np.testing.assert_allclose(fitted.predict_proba(points), softmax_memberships(points, fitted.cluster_centers_, 0.5), rtol=0, atol=1e-12)


def test_soft_memberships_of_many_tasks_and_of_tensors() -> None:
    data = np.stack([blobs(50, 2, 3, 2.0, seed=s) for s in range(3)])
    fitted = TransformerKMeans(3, variant="soft", gamma=0.3, random_state=0).fit(torch.from_numpy(data))
    assert isinstance(fitted.memberships_, torch.Tensor) and fitted.memberships_.shape == (3, 50, 3)
    for task in range(3):
        expected = softmax_memberships(data[task], fitted.cluster_centers_[task].numpy(), 0.3)
        np.testing.assert_allclose(fitted.memberships_[task].numpy(), expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(fitted.predict_proba(torch.from_numpy(data)).numpy(), fitted.memberships_.numpy())


def test_a_variant_with_hard_assignments_has_no_memberships() -> None:
    # as scikit-learn's available_if: no predict_proba where the variant has none, before a fit
    # (the variant named) and after it (the variant fitted)
    assert hasattr(TransformerKMeans(3, variant="soft"), "predict_proba") and not hasattr(TransformerKMeans(3), "predict_proba")
    X = blobs()
    estimator = TransformerKMeans(3, variant="soft", gamma=1.0, random_state=0).fit(X)
    assert hasattr(estimator, "memberships_") and hasattr(estimator, "predict_proba")
    estimator.set_params(variant="lloyd", gamma=np.inf).fit(X)  # a refit with lloyd drops them
    assert not hasattr(estimator, "memberships_") and not hasattr(estimator, "predict_proba")
    with pytest.raises(KtframeError) as info:
        estimator.predict_proba(X)
    assert isinstance(info.value, AttributeError)
    with_them = [name for name in registry().names("variant") if get_variant(name).soft_memberships]
    assert with_them == ["soft"]
    assert one_line(info).startswith("variant 'lloyd' has no soft memberships") and info.value.args[0].endswith(": soft")


# --- sample_weight ------------------------------------------------------------------------------------


WEIGHTS = np.random.default_rng(7).uniform(0.1, 3.0, 200)


@pytest.mark.parametrize("options", [None, PLAIN], ids=["fast", "plain"])
@pytest.mark.parametrize("tol", [0, 1e-4])
@pytest.mark.parametrize("variant", ["lloyd", "lloyd-dot"])
def test_weighted_lloyd_equals_scikit_learns_weighted_kmeans(variant: str, tol: float, options: dict | None) -> None:
    X = blobs(200, 3, 4, 2.5, seed=1)
    C0 = X[[0, 50, 100, 150]]
    # max_iter=20: the plain definition runs every step of a task that has stopped
    ours = TransformerKMeans(4, variant=variant, init=C0, max_iter=20, tol=tol, dtype="float64", variant_options=options).fit(X, sample_weight=WEIGHTS)
    theirs = KMeans(4, algorithm="lloyd", init=C0, n_init=1, max_iter=20, tol=tol).fit(X, sample_weight=WEIGHTS)
    assert len(np.unique(theirs.labels_)) == 4
    assert ours.n_iter_ == theirs.n_iter_ < 20
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-12)
    assert ours.score(X, sample_weight=WEIGHTS) == pytest.approx(-theirs.inertia_, rel=1e-12)
    assert ours.score(X) == pytest.approx(theirs.score(X), rel=1e-12)


def weighted_soft_kmeans(X: np.ndarray, C: np.ndarray, w: np.ndarray, gamma: float, steps: int) -> np.ndarray:
    for _ in range(steps):
        R = softmax_memberships(X, C, gamma) * w[:, None]
        C = R.T @ X / R.sum(0)[:, None]
    return C


def weighted_spherical_kmeans(X: np.ndarray, C: np.ndarray, w: np.ndarray, steps: int) -> np.ndarray:
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = C / np.linalg.norm(C, axis=1, keepdims=True)
    for _ in range(steps):
        labels = (U @ C.T).argmax(1)
        sums = np.stack([(w[labels == j, None] * U[labels == j]).sum(0) for j in range(len(C))])
        C = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    return C


@pytest.mark.parametrize("options", [None, PLAIN], ids=["fast", "plain"])
def test_weighted_soft_and_spherical_equal_their_weighted_updates_in_numpy(options: dict | None) -> None:
    X = blobs(200, 3, 4, 2.5, seed=1)
    C0 = X[[0, 50, 100, 150]]
    soft = TransformerKMeans(4, variant="soft", gamma=0.2, init=C0, max_iter=6, tol=0, variant_options=options).fit(X, sample_weight=WEIGHTS)
    np.testing.assert_allclose(soft.cluster_centers_, weighted_soft_kmeans(X, C0, WEIGHTS, 0.2, 6), rtol=0, atol=1e-10)
    np.testing.assert_allclose(soft.memberships_, softmax_memberships(X, soft.cluster_centers_, 0.2), rtol=0, atol=1e-12)
    moved = X + [6.0, 0.0, 0.0]  # away from the origin, so that directions differ
    spherical = TransformerKMeans(4, variant="spherical", init=moved[[0, 50, 100, 150]], max_iter=6, tol=0, variant_options=options)
    spherical.fit(moved, sample_weight=WEIGHTS)
    np.testing.assert_allclose(spherical.cluster_centers_, weighted_spherical_kmeans(moved, moved[[0, 50, 100, 150]], WEIGHTS, 6), rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", WEIGHTED)
def test_integer_weights_are_repeated_points(variant: str) -> None:
    X = blobs(90, 2, 3, 2.5, seed=2)
    counts = np.random.default_rng(3).integers(0, 4, len(X))
    C0 = X[counts > 0][:3]
    gamma = HAND_BUILT[variant]
    weighted = TransformerKMeans(3, variant=variant, gamma=gamma, init=C0, max_iter=8, tol=0).fit(X, sample_weight=counts)
    repeated = TransformerKMeans(3, variant=variant, gamma=gamma, init=C0, max_iter=8, tol=0).fit(np.repeat(X, counts, axis=0))
    np.testing.assert_allclose(weighted.cluster_centers_, repeated.cluster_centers_, rtol=0, atol=1e-12)
    assert weighted.n_iter_ == repeated.n_iter_
    assert weighted.inertia_ == pytest.approx(repeated.inertia_, rel=1e-12)
    # and the variant's classical reference, run on the repeated points
    spec = get_variant(variant)
    reference = spec.run_reference(torch.from_numpy(np.repeat(X, counts, axis=0))[None], torch.from_numpy(C0)[None], 8, gamma, {})
    np.testing.assert_allclose(weighted.cluster_centers_, reference.centers[0].numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["trimmed", "robust", "kmedoids"])
def test_a_variant_without_a_weighted_mean_refuses_weights(variant: str) -> None:
    with pytest.raises(KtframeError) as info:
        TransformerKMeans(3, variant=variant).fit(blobs(), sample_weight=np.ones(60))
    assert one_line(info).startswith(f"variant {variant!r} does not take sample weights")
    assert str(info.value).endswith(f"a variant that takes them: {', '.join(WEIGHTED)}")


def with_value(array: np.ndarray, index: int, value: float) -> np.ndarray:
    array = array.copy()
    array[index] = value
    return array


@pytest.mark.parametrize(
    "weights, mentions",
    [
        (with_value(np.ones(60), 4, -1.0), ["must hold non-negative finite numbers", "got -1.0 at index 4"]),
        (with_value(np.ones(60), 5, np.nan), ["must hold non-negative finite numbers", "got nan at index 5"]),
        (with_value(np.ones(60), 6, np.inf), ["must hold non-negative finite numbers", "got inf at index 6"]),
        (np.ones(59), ["must have shape (n_samples,) = (60,)", "got (59,)"]),
        (np.ones((60, 1)), ["must have shape (n_samples,) = (60,)", "got (60, 1)"]),
        (np.zeros(60), ["is zero for every point", "expected some positive weight"]),
    ],
    ids=["negative", "nan", "inf", "short", "column", "all-zero"],
)
def test_bad_weights_are_one_line(weights: np.ndarray, mentions: list[str]) -> None:
    with pytest.raises(KtframeError) as info:
        TransformerKMeans(3).fit(blobs(), sample_weight=weights)
    assert one_line(info).startswith("sample_weight ")
    assert all(m in str(info.value) for m in mentions), str(info.value)
    fitted = TransformerKMeans(3, random_state=0).fit(blobs())
    with pytest.raises(KtframeError, match="sample_weight "):
        fitted.score(blobs(), sample_weight=weights)


def test_many_tasks_with_weights_equal_scikit_learn_task_by_task() -> None:
    data = np.stack([blobs(80, 2, 4, 2.0, seed=s) for s in range(3)])
    weights = np.random.default_rng(1).uniform(0.2, 2.0, (3, 80))
    C0 = data[:, :4]
    fitted = TransformerKMeans(4, init=C0).fit(data, sample_weight=weights)
    for task in range(3):
        theirs = KMeans(4, algorithm="lloyd", init=C0[task], n_init=1, tol=1e-4).fit(data[task], sample_weight=weights[task])
        assert fitted.n_iter_[task] == theirs.n_iter_
        np.testing.assert_allclose(fitted.cluster_centers_[task], theirs.cluster_centers_, rtol=0, atol=1e-10)
        assert fitted.inertia_[task] == pytest.approx(theirs.inertia_, rel=1e-12)
    np.testing.assert_allclose(fitted.score(data, sample_weight=weights), -fitted.inertia_, rtol=1e-12)
    for bad, mentions in [(weights[0], "(n_tasks, n_samples) = (3, 80)"), (with_value(weights, (2, 3), -1.0), "at index (2, 3)")]:
        with pytest.raises(KtframeError, match=r"^sample_weight .*" + mentions.replace("(", r"\(").replace(")", r"\)")):
            TransformerKMeans(4, init=C0).fit(data, sample_weight=bad)
    with pytest.raises(KtframeError, match="sample_weight of task 1 is zero for every point"):
        TransformerKMeans(4, init=C0).fit(data, sample_weight=weights * [[1], [0], [1]])


# --- n_init -----------------------------------------------------------------------------------------


def starts_of(X: np.ndarray, k: int, n_init: int, seed: int, init: str) -> torch.Tensor:
    """The ``n_init`` starts of each task that ``random_state=seed`` draws, from ktframe's
    reference seedings: ``(n_tasks, n_init, k, d)``."""
    tasks = torch.from_numpy(X if X.ndim == 3 else X[None]).repeat_interleave(n_init, dim=0)
    generator = torch.Generator().manual_seed(seed)
    if init == "random":
        starts = ktframe.reference.random_points(tasks, k, generator)
    else:
        starts = ktframe.reference.kmeans_plusplus(tasks, k, generator, greedy=True)
    return starts.reshape(-1, n_init, k, X.shape[-1])


@pytest.mark.parametrize("init", ["random", "k-means++"])
def test_n_init_keeps_the_start_of_least_inertia(init: str) -> None:
    X = blobs(120, 2, 6, 1.5, seed=3)
    fitted = TransformerKMeans(6, init=init, n_init=5, random_state=0).fit(X)
    runs = [TransformerKMeans(6, init=start.numpy()).fit(X) for start in starts_of(X, 6, 5, 0, init)[0]]
    inertias = [run.inertia_ for run in runs]
    assert len(set(np.round(inertias, 6))) > 1, "the starts should end differently"
    best = runs[int(np.argmin(inertias))]
    assert fitted.inertia_ == min(inertias) <= TransformerKMeans(6, init=init, n_init=1, random_state=0).fit(X).inertia_
    np.testing.assert_array_equal(fitted.cluster_centers_, best.cluster_centers_)
    np.testing.assert_array_equal(fitted.labels_, best.labels_)
    assert fitted.n_iter_ == best.n_iter_


def test_n_init_picks_per_task_and_memberships_follow_the_start_kept() -> None:
    data = np.stack([blobs(60, 2, 5, 1.5, seed=s) for s in range(3)])
    fitted = TransformerKMeans(5, variant="soft", gamma=2.0, init="random", n_init=4, random_state=1).fit(data)
    starts = starts_of(data, 5, 4, 1, "random")
    for task in range(3):
        runs = [TransformerKMeans(5, variant="soft", gamma=2.0, init=start.numpy()).fit(data[task]) for start in starts[task]]
        best = runs[int(np.argmin([run.inertia_ for run in runs]))]
        assert fitted.inertia_[task] == best.inertia_ and fitted.n_iter_[task] == best.n_iter_
        np.testing.assert_array_equal(fitted.cluster_centers_[task], best.cluster_centers_)
        np.testing.assert_allclose(fitted.memberships_[task], best.memberships_, rtol=0, atol=1e-12)


def test_n_init_auto_is_scikit_learns_rule() -> None:
    X = blobs(120, 2, 6, 1.5, seed=3)
    assert TransformerKMeans().n_init == KMeans().n_init == "auto"
    auto = TransformerKMeans(6, init="random", random_state=0).fit(X)
    assert auto.inertia_ == TransformerKMeans(6, init="random", n_init=10, random_state=0).fit(X).inertia_
    assert auto.inertia_ < TransformerKMeans(6, init="random", n_init=1, random_state=0).fit(X).inertia_
    for init in ("k-means++", "kmeans++"):  # one start, the same draws as n_init=1
        np.testing.assert_array_equal(
            TransformerKMeans(6, init=init, random_state=0).fit(X).cluster_centers_,
            TransformerKMeans(6, init="k-means++", n_init=1, random_state=0).fit(X).cluster_centers_,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an array with n_init="auto": one start and no warning
        TransformerKMeans(6, init=X[:6]).fit(X)


def test_an_array_with_several_starts_warns_as_scikit_learn_and_runs_once() -> None:
    X = blobs(120, 2, 6, 1.5, seed=3)
    with pytest.warns(RuntimeWarning) as theirs:
        KMeans(6, init=X[:6], n_init=3).fit(X)
    with pytest.warns(RuntimeWarning) as ours:
        fitted = TransformerKMeans(6, init=X[:6], n_init=3).fit(X)
    assert [str(w.message) for w in ours] == [str(w.message).replace("KMeans", "TransformerKMeans") for w in theirs]
    assert ours[0].filename == __file__  # pointing at the caller's fit
    np.testing.assert_array_equal(fitted.cluster_centers_, TransformerKMeans(6, init=X[:6]).fit(X).cluster_centers_)


@pytest.mark.parametrize("n_init", [0, -2, 1.5, "many", None, True])
def test_a_bad_n_init_is_one_line(n_init: object) -> None:
    with pytest.raises(KtframeError) as info:
        TransformerKMeans(3, n_init=n_init).fit(blobs())
    assert one_line(info) == f"n_init must be 'auto' or an integer >= 1 (the starts run, the best kept); got {n_init!r}"


# --- --option on the command line ------------------------------------------------------------------

POINTS = blobs(40, 2, 3, 2.0, seed=5)
CLI_RUNS = {
    "cluster-trimmed": ["cluster", "points.npy", "--k", "3", "--variant", "trimmed"],
    "cluster-trim": ["cluster", "points.npy", "--k", "3", "--variant", "trimmed", "--option", "trim=0.3"],
    "cluster-unknown": ["cluster", "points.npy", "--k", "3", "--variant", "trimmed", "--option", "trm=0.3"],
    "cluster-twice": ["cluster", "points.npy", "--k", "3", "--variant", "trimmed", "--option", "trim=0.1", "--option", "trim=0.2"],
    "cluster-malformed": ["cluster", "points.npy", "--k", "3", "--option", "x"],
    "verify-trimmed": ["verify", "--variant", "trimmed", "--n", "40", "--k", "3", "--layers", "3", "--json"],
    "verify-trim": ["verify", "--variant", "trimmed", "--n", "40", "--k", "3", "--layers", "3", "--option", "trim=0.3", "--json"],
    "verify-unknown": ["verify", "--variant", "trimmed", "--option", "trm=0.3"],
    "verify-gamma": ["verify", "--variant", "soft", "--option", "gamma="],
    "verify-malformed": ["verify", "--option", "trim"],
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """Every run above, two at a time (each is mostly the start-up of Python and torch)."""
    folder = tmp_path_factory.mktemp("options")
    np.save(folder / "points.npy", POINTS)

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "ktframe.cli.main", *argv]
        return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(CLI_RUNS, pool.map(run, CLI_RUNS.values())))


def labels(run: subprocess.CompletedProcess) -> np.ndarray:
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    return np.array([int(line) for line in run.stdout.splitlines()[1:]])


def objective_of(run: subprocess.CompletedProcess) -> float:
    return float(run.stderr.split("objective ")[1].split()[0])


def test_a_valid_option_reaches_cluster(cli: dict[str, subprocess.CompletedProcess]) -> None:
    expected = TransformerKMeans(3, variant="trimmed", n_layers=10, random_state=0, variant_options={"trim": 0.3}).fit(POINTS)
    np.testing.assert_array_equal(labels(cli["cluster-trim"]), expected.labels_)
    assert objective_of(cli["cluster-trim"]) == pytest.approx(expected.inertia_, rel=1e-5)
    labels(cli["cluster-trimmed"])
    assert objective_of(cli["cluster-trimmed"]) < objective_of(cli["cluster-trim"]) * 0.99  # trimming 30% moves the centers


def test_a_valid_option_reaches_verify(cli: dict[str, subprocess.CompletedProcess]) -> None:
    default, trimmed = (json.loads(cli[name].stdout) for name in ("verify-trimmed", "verify-trim"))
    assert cli["verify-trim"].returncode == 0 and trimmed["passed"] and trimmed["options"] == {"trim": 0.3}
    assert default["options"] == {} and default["log_objective_reference"] != trimmed["log_objective_reference"]


@pytest.mark.parametrize(
    "name, mentions",
    [
        ("cluster-unknown", "unknown option 'trm' for variant 'trimmed'; expected one of: gamma, trim, share_weights, fast (did you mean 'trim'?)"),
        ("cluster-twice", "--option trim is given twice; expected each option once"),
        ("cluster-malformed", "--option takes KEY=VALUE, a build option of the variant (e.g. --option trim=0.1); got 'x'"),
        ("verify-unknown", "unknown option 'trm' for variant 'trimmed'; expected one of: gamma, trim, share_weights, fast (did you mean 'trim'?)"),
        ("verify-gamma", "the temperature is --gamma; expected --gamma VALUE"),
        ("verify-malformed", "--option takes KEY=VALUE, a build option of the variant (e.g. --option trim=0.1); got 'trim'"),
    ],
)
def test_a_bad_option_exits_2_with_one_line(cli: dict[str, subprocess.CompletedProcess], name: str, mentions: str) -> None:
    assert mentions in one_line_error(cli[name], CLI_RUNS[name][0])


# --- docs/estimator.md ---------------------------------------------------------------------------


def test_docs_examples_run_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Python block of docs/estimator.md, in order, in one namespace, from the repository root."""
    text = (REPO / "docs" / "estimator.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 8
    monkeypatch.chdir(REPO)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(REPO / "docs" / "estimator.md"), "exec"), namespace)
