"""A trained checkpoint on a user's data: ``TransformerKMeans(checkpoint=PATH)`` and ``ktframe cluster
FILE --checkpoint PATH``, with the committed ``results/paper-seed0.ckpt`` (d=32, k=10) and
``results/anyk-seed0.ckpt`` (d=32, any k up to 16).

Each fit is checked against the model's own evaluation protocol (``ktframe eval``'s loader, its
steps, re-embedding between them) run here on data framed by hand: zero-padded or reduced by
scikit-learn's PCA, then min-max scaled per coordinate as the training tasks were."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_iris
from sklearn.decomposition import PCA
from test_reliability import assert_payload_is_live, payload_checkpoint
from test_training import ok, one_line_error, start_cli

from ktframe import KtframeError, TransformerKMeans
from ktframe.clustering.trained import Frame
from ktframe.evaluation.evaluate import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "results" / "paper-seed0.ckpt"  # d=32, k=10, data.scaling=minmax, eval.steps=20
ANY_K = REPO / "results" / "anyk-seed0.ckpt"  # d=32, k from 1 to 16
STEPS = 20

IRIS = load_iris().data[::2]  # 75 points of 4 coordinates: narrower than the model
RNG = np.random.default_rng(0)
# 90 points of 64 coordinates, in 6 groups, of falling spread: wider than the model
WIDE = RNG.normal(size=(90, 64)) * np.linspace(3.0, 0.2, 64) + np.repeat(RNG.normal(0, 3, (6, 64)), 15, axis=0)


def minmax(Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return Y.min(0), Y.max(0) - Y.min(0)


def by_hand(X: np.ndarray, d: int = 32):
    """``X`` in the model's frame and the map of centers back, in numpy and scikit-learn: padded
    with zeros or reduced by PCA to d coordinates, then each coordinate to [0, 1]."""
    if X.shape[1] <= d:
        low, span = minmax(X)
        pad = d - X.shape[1]
        return lambda Z: np.pad((Z - low) / span, ((0, 0), (0, pad))), lambda C: C[:, : X.shape[1]] * span + low
    pca = PCA(d, svd_solver="full").fit(X)  # the largest loading of each component positive
    low, span = minmax(pca.transform(X))
    return lambda Z: (pca.transform(Z) - low) / span, lambda C: (C * span + low) @ pca.components_ + pca.mean_


def eval_protocol(path: Path, framed: np.ndarray, C0: np.ndarray, steps: int = STEPS) -> np.ndarray:
    """The trajectory ``(steps + 1, k, d)`` of the model as ``ktframe eval`` runs it."""
    _, model = load_checkpoint(path)
    with torch.no_grad():
        result = model.double()(torch.from_numpy(framed)[None], torch.from_numpy(C0)[None], n_steps=steps, reembed=True)
    return result.trajectory[0].numpy()


CASES = {"narrower": (PAPER, IRIS, 10), "wider": (ANY_K, WIDE, 6)}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fit_is_the_eval_protocol_on_the_framed_data(case: str) -> None:
    path, X, k = CASES[case]
    C0 = X[:: len(X) // k][:k]
    to_model, to_user = by_hand(X)
    framed = to_model(X)
    trajectory = eval_protocol(path, framed, to_model(C0))
    fitted = TransformerKMeans(k, checkpoint=path, init=C0, tol=0).fit(X)
    centers = trajectory[-1]
    assert fitted.n_iter_ == STEPS  # the steps it was evaluated with (of max_iter=300)
    assert fitted.cluster_centers_.shape == (k, X.shape[1])
    np.testing.assert_allclose(fitted.cluster_centers_, to_user(centers), rtol=0, atol=1e-10 * np.abs(X).max())
    labels = ((framed[:, None] - centers[None]) ** 2).sum(-1).argmin(1)  # nearest in the frame the model clustered in
    np.testing.assert_array_equal(fitted.labels_, labels)
    np.testing.assert_array_equal(fitted.predict(X), labels)
    user = to_user(centers)
    assert fitted.inertia_ == pytest.approx(((X - user[labels]) ** 2).sum(), rel=1e-10)  # in the user's units
    np.testing.assert_allclose(fitted.transform(X[:5]), np.linalg.norm(X[:5, None] - user[None], axis=-1), rtol=1e-10)
    # Frame, fitted on the data alone, maps the model's centers as the hand-made map does
    frame = Frame.fit(torch.from_numpy(X)[None], 32, "minmax")
    np.testing.assert_allclose(frame.to_user(torch.from_numpy(centers)[None])[0].numpy(), user, rtol=0, atol=1e-10 * np.abs(X).max())
    np.testing.assert_allclose(frame.to_model(torch.from_numpy(X)[None])[0].numpy(), framed, rtol=0, atol=1e-12)


def test_the_padded_frame_by_hand() -> None:
    # one point per corner of a box in 2-d: the frame is the unit square, padded with 30 zeros
    X = np.array([[1.0, -2.0], [3.0, -2.0], [1.0, 6.0], [3.0, 6.0], [2.0, 2.0]])
    frame = Frame.fit(torch.from_numpy(X)[None], 32, "minmax")
    framed = frame.to_model(torch.from_numpy(X)[None])[0].numpy()
    np.testing.assert_array_equal(framed[:, :2], [[0, 0], [1, 0], [0, 1], [1, 1], [0.5, 0.5]])
    assert not framed[:, 2:].any()
    centers = np.zeros((1, 32))
    centers[0, :3] = [0.25, 0.75, 9.0]  # a coordinate beyond the data's is dropped
    np.testing.assert_array_equal(frame.to_user(torch.from_numpy(centers)[None])[0].numpy(), [[1.5, 4.0]])


def test_tol_stops_the_trained_steps_by_the_framed_centers_shift() -> None:
    # in the model's frame: the first step whose squared center shift is within tol times the
    # mean variance of the framed coordinates (the padding's among them)
    C0 = IRIS[::8][:10]
    to_model, to_user = by_hand(IRIS)
    framed = to_model(IRIS)
    trajectory = eval_protocol(PAPER, framed, to_model(C0))
    shifts = ((trajectory[1:] - trajectory[:-1]) ** 2).sum(axis=(1, 2))
    stop = int(np.argmax(shifts <= 1e-2 * framed.var(axis=0).mean())) + 1
    assert 1 < stop < STEPS
    fitted = TransformerKMeans(10, checkpoint=PAPER, init=C0, tol=1e-2).fit(IRIS)
    assert fitted.n_iter_ == stop
    np.testing.assert_allclose(fitted.cluster_centers_, to_user(trajectory[stop]), rtol=0, atol=1e-10)
    # n_layers (and a smaller max_iter) set the steps instead
    for params in ({"n_layers": 3}, {"max_iter": 3}):
        np.testing.assert_allclose(
            TransformerKMeans(10, checkpoint=PAPER, init=C0, tol=0, **params).fit(IRIS).cluster_centers_, to_user(trajectory[3]), rtol=0, atol=1e-10
        )


def test_seeded_starts_and_several_of_them() -> None:
    fitted = TransformerKMeans(10, checkpoint=PAPER, random_state=0).fit(IRIS)
    again = TransformerKMeans(10, checkpoint=PAPER, random_state=0).fit(IRIS)
    np.testing.assert_array_equal(fitted.cluster_centers_, again.cluster_centers_)
    best = TransformerKMeans(10, checkpoint=PAPER, init="random", n_init=3, random_state=0).fit(IRIS)
    one = TransformerKMeans(10, checkpoint=PAPER, init="random", n_init=1, random_state=0).fit(IRIS)
    assert best.inertia_ <= one.inertia_ * (1 + 1e-12)  # its first start is the one start, run in a batch of three: equal up to rounding
    assert fitted.cluster_centers_.dtype == np.float64
    float32 = TransformerKMeans(10, checkpoint=PAPER, random_state=0).fit(IRIS.astype(np.float32))
    assert float32.cluster_centers_.dtype == np.float32


@pytest.mark.parametrize(
    "path, k, mentions",
    [
        (PAPER, 5, "paper-seed0.ckpt: its model was trained for k=10 only; got n_clusters=5; expected n_clusters=10"),
        (ANY_K, 17, "anyk-seed0.ckpt: its model takes any k up to 16; got n_clusters=17; expected 1 <= n_clusters <= 16"),
    ],
)
def test_a_k_the_model_does_not_take_is_one_line(path: Path, k: int, mentions: str) -> None:
    with pytest.raises(KtframeError) as info:
        TransformerKMeans(k, checkpoint=path).fit(IRIS)
    assert "\n" not in str(info.value) and str(info.value).endswith(mentions)
    assert TransformerKMeans(3, checkpoint=ANY_K, random_state=0).fit(IRIS).cluster_centers_.shape == (3, 4)


def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.ckpt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.ckpt")
    cases = {
        tmp_path / "missing.ckpt": "missing.ckpt: no such checkpoint file",
        tmp_path / "notes.ckpt": "notes.ckpt: refused to load: not plain weights and data",
        tmp_path / "other.ckpt": "other.ckpt: not a checkpoint of ktframe fit: ",
    }
    for path, mentions in cases.items():
        with pytest.raises(KtframeError) as info:
            TransformerKMeans(10, checkpoint=path).fit(IRIS)
        assert "\n" not in str(info.value) and mentions in str(info.value) and "expected a .ckpt written by ktframe fit" in str(info.value)


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    hostile = payload_checkpoint(PAPER, tmp_path / "hostile.ckpt", marker)
    assert_payload_is_live(hostile, marker)
    with pytest.raises(KtframeError, match=r"hostile.ckpt: refused to load.*weights_only=True"):
        TransformerKMeans(10, checkpoint=hostile).fit(IRIS)
    assert not marker.exists(), "the payload ran"


@pytest.mark.parametrize("params", [{"variant": "soft"}, {"gamma": 10.0}, {"variant_options": {"reset": "identity"}}])
def test_a_hand_built_setting_with_a_checkpoint_is_one_line(params: dict) -> None:
    with pytest.raises(KtframeError, match=r"^checkpoint= clusters with the checkpoint's trained model, but variant, gamma or variant_options is set"):
        TransformerKMeans(10, checkpoint=PAPER, **params).fit(IRIS)


# --- ktframe cluster --checkpoint ---------------------------------------------------------------------

CLI_RUNS = {
    "labels": ["iris.csv", "--checkpoint", str(PAPER), "--k", "10", "--out", "labels.csv"],
    "hybrid": ["iris.csv", "--checkpoint", str(PAPER), "--k", "10", "--lloyd-last", "5", "--swaps", "2", "--out", "hybrid.csv"],
    "variant": ["iris.csv", "--checkpoint", str(PAPER), "--k", "10", "--variant", "soft"],
    "option": ["iris.csv", "--checkpoint", str(PAPER), "--k", "10", "--option", "reset=identity"],
    "k": ["iris.csv", "--checkpoint", str(PAPER), "--k", "5"],
    "missing": ["iris.csv", "--checkpoint", "missing.ckpt", "--k", "10"],
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    folder = tmp_path_factory.mktemp("checkpoint")
    np.savetxt(folder / "iris.csv", IRIS, delimiter=",", fmt="%.17g")
    runs = {}
    for names in (list(CLI_RUNS)[:2], list(CLI_RUNS)[2:4], list(CLI_RUNS)[4:]):  # two or three at a time: each is mostly the start-up of torch
        started = {name: start_cli(["cluster", *CLI_RUNS[name]], folder) for name in names}
        for name, process in started.items():
            stdout, stderr = process.communicate(timeout=300)
            runs[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return folder, runs


def test_cluster_with_a_checkpoint_writes_the_estimators_labels(cli, kernels_by_ktframe_rule) -> None:
    folder, runs = cli
    done = ok(runs["labels"])
    lines = (folder / "labels.csv").read_text().splitlines()
    expected = TransformerKMeans(10, checkpoint=PAPER, random_state=0).fit(IRIS)
    assert lines[0] == "label"
    np.testing.assert_array_equal([int(line) for line in lines[1:]], expected.labels_)
    assert done.stdout.startswith(f"75 points, 4 dimensions, k=10, checkpoint={PAPER}: objective {expected.inertia_:.6g} ")
    assert done.stdout.rstrip().endswith("labels written to labels.csv")


def test_cluster_lloyd_last_and_swaps_write_the_estimators_labels(cli) -> None:
    folder, runs = cli
    ok(runs["hybrid"])
    expected = TransformerKMeans(10, checkpoint=PAPER, lloyd_last=5, swaps=2, random_state=0).fit(IRIS)
    np.testing.assert_array_equal(np.loadtxt(folder / "hybrid.csv", skiprows=1, dtype=int), expected.labels_)
    finished = TransformerKMeans(10, checkpoint=PAPER, lloyd_last=5, random_state=0).fit(IRIS)
    assert expected.inertia_ < finished.inertia_ != TransformerKMeans(10, checkpoint=PAPER, random_state=0).fit(IRIS).inertia_


@pytest.mark.parametrize(
    "name, mentions",
    [
        ("variant", "--checkpoint clusters with the trained model, which --variant would describe otherwise; expected --checkpoint alone"),
        ("option", "--checkpoint clusters with the trained model, which --option would describe otherwise; expected --checkpoint alone"),
        ("k", "its model was trained for k=10 only; got n_clusters=5; expected n_clusters=10"),
        ("missing", "missing.ckpt: no such checkpoint file; expected a .ckpt written by ktframe fit"),
    ],
)
def test_cluster_with_a_checkpoint_refuses_in_one_line(cli, name: str, mentions: str) -> None:
    _, runs = cli
    assert mentions in one_line_error(runs[name], "cluster")
