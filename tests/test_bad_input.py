"""Bad input is refused clearly: a KtframeError from the API and the estimator; from ``ktframe
cluster``, exit code 2, one stderr line, no traceback and no file written or changed.

Each CLI case runs in a process of its own, in a folder of its own. Starting Python and importing
torch costs seconds a process, so on Linux the CLI cases run as children forked from one driver
process that has already imported ktframe. Each child runs ``ktframe.cli.main`` as ``__main__``
(what ``python -m ktframe.cli.main`` does) and ends the way the interpreter would: the exit code
of SystemExit, or a printed traceback and exit code 1. The cases marked ``real=True`` (every case,
where there is no fork) also run as ``[sys.executable, "-m", "ktframe.cli.main", ...]`` and must
meet the same checks.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ktframe import KtframeError, TransformerKMeans, build_model

RNG = np.random.default_rng(0)
POINTS = RNG.normal(size=(20, 2))  # n=20, d=2


# --- API: build_model and the model call ----------------------------------------------------------


def model(**options: Any):
    spec = {"variant": "lloyd", "d": 2, "k": 3, "n_layers": 2, "dtype": "float64", **options}
    return build_model(spec.pop("variant"), **spec)


def call(X: Any = None, C0: Any = None):
    X = torch.tensor(POINTS)[None] if X is None else X
    C0 = torch.tensor(POINTS[:3])[None] if C0 is None else C0
    return model()(X, C0)


def with_value(array: np.ndarray, index: tuple, value: float) -> np.ndarray:
    array = np.array(array, dtype=float)
    array[index] = value
    return array


X3 = POINTS[None]  # (1, 20, 2)
C3 = POINTS[None, :3]  # (1, 3, 2)

API_CASES: list[tuple[str, Callable[[], Any], list[str]]] = [
    # non-finite data, reported with its index
    ("X-nan", lambda: call(with_value(X3, (0, 4, 1), math.nan)), ["X must be finite", "nan", "(0, 4, 1)"]),
    ("X-inf", lambda: call(with_value(X3, (0, 7, 0), math.inf)), ["X must be finite", "inf", "(0, 7, 0)"]),
    ("X-neginf", lambda: call(with_value(X3, (0, 0, 1), -math.inf)), ["X must be finite", "-inf", "(0, 0, 1)"]),
    ("C0-nan", lambda: call(C0=with_value(C3, (0, 2, 0), math.nan)), ["C0 must be finite", "nan", "(0, 2, 0)"]),
    ("C0-inf", lambda: call(C0=with_value(C3, (0, 1, 1), math.inf)), ["C0 must be finite", "inf"]),
    # wrong rank and wrong sizes
    ("X-1d", lambda: call(np.zeros(20)), ["X must have shape (B, n, 2)", "(20,)", "1 dimensions"]),
    ("X-2d", lambda: call(POINTS), ["X must have shape (B, n, 2)", "(20, 2)"]),
    ("X-4d", lambda: call(POINTS[None, None]), ["X must have shape (B, n, 2)", "(1, 1, 20, 2)", "4 dimensions"]),
    ("X-wrong-d", lambda: call(np.zeros((1, 20, 3))), ["3 coordinates", "d=2", "(B, n, 2)"]),
    ("C0-wrong-k", lambda: call(C0=C3[:, :2]), ["C0 must have shape (1, 3, 2)", "got (1, 2, 2)"]),
    ("C0-wrong-d", lambda: call(C0=np.zeros((1, 3, 3))), ["C0 must have shape (1, 3, 2)", "got (1, 3, 3)"]),
    ("C0-wrong-batch", lambda: call(C0=np.zeros((2, 3, 2))), ["C0 must have shape (1, 3, 2)", "got (2, 3, 2)"]),
    ("C0-2d", lambda: call(C0=POINTS[:3]), ["C0 must have shape (B, 3, 2)", "(3, 2)"]),
    ("k-above-n", lambda: call(X3[:, :2]), ["k=3", "n=2", "k <= n"]),
    # non-numeric data
    ("X-strings", lambda: call([[["a", "b"]] * 20]), ["X must contain only numbers", "<U1"]),
    ("X-object", lambda: call(np.array([[[1.0, "x"]] * 20], dtype=object)), ["X must contain only numbers", "object"]),
    ("X-ragged", lambda: call([[[1.0, 2.0], [3.0]]]), ["X must be an array of numbers", "inhomogeneous"]),
    ("X-complex", lambda: call(X3.astype(complex)), ["X must be real numbers", "complex"]),
    # the model's own parameters
    ("k-0", lambda: model(k=0), ["k must be an integer >= 1", "got 0"]),
    ("k-negative", lambda: model(k=-1), ["k must be an integer >= 1", "got -1"]),
    ("k-float", lambda: model(k=2.5), ["k must be an integer >= 1", "got 2.5"]),
    ("k-string", lambda: model(k="3"), ["k must be an integer >= 1", "got '3'"]),
    ("d-0", lambda: model(d=0), ["d must be an integer >= 1", "got 0"]),
    ("layers-0", lambda: model(n_layers=0), ["n_layers must be an integer >= 1", "got 0"]),
    ("gamma-0", lambda: model(gamma=0), ["gamma must be a positive number or inf", "got 0"]),
    ("gamma-negative", lambda: model(gamma=-2.0), ["gamma must be a positive number or inf", "got -2.0"]),
    ("gamma-nan", lambda: model(gamma=math.nan), ["gamma must be a positive number or inf", "got nan"]),
    ("gamma-text", lambda: model(gamma="hot"), ["gamma must be a positive number or inf", "got 'hot'"]),
    ("unknown-variant", lambda: model(variant="loyd"), ["unknown variant 'loyd'", "lloyd, lloyd-dot", "did you mean 'lloyd'?"]),
    ("unknown-option", lambda: model(resett="identity"), ["unknown option 'resett'", "reset", "did you mean 'reset'?"]),
    ("unknown-dtype", lambda: model(dtype="float16"), ["unsupported dtype 'float16'", "float32, float64"]),
]


def test_unknown_variant_is_an_unknown_name_error() -> None:
    from ktframe.core.errors import UnknownNameError

    with pytest.raises(UnknownNameError):
        model(variant="kmeans")


# --- the estimator ---------------------------------------------------------------------------


def fit(X: Any = POINTS, **params: Any) -> TransformerKMeans:
    return TransformerKMeans(**{"n_clusters": 3, "n_layers": 2, "random_state": 0, **params}).fit(X)


FITTED = fit()

ESTIMATOR_CASES: list[tuple[str, Callable[[], Any], list[str]]] = [
    # non-finite data, reported at its (row, column)
    ("nan", lambda: fit(with_value(POINTS, (4, 1), math.nan)), ["X must be finite", "nan", "(4, 1)"]),
    ("inf", lambda: fit(with_value(POINTS, (9, 0), math.inf)), ["X must be finite", "inf", "(9, 0)"]),
    ("neginf", lambda: fit(with_value(POINTS, (0, 0), -math.inf)), ["X must be finite", "-inf", "(0, 0)"]),
    ("nan-tensor", lambda: fit(torch.tensor(with_value(POINTS, (3, 1), math.nan))), ["X must be finite", "(3, 1)"]),
    ("nan-float32", lambda: fit(with_value(POINTS, (3, 1), math.nan), dtype="float32"), ["X must be finite", "(3, 1)"]),
    # rank and size
    ("1d", lambda: fit(POINTS[:, 0]), ["X must have shape (n_samples, n_features) or (n_tasks, n_samples, n_features)", "(20,)"]),
    ("4d", lambda: fit(POINTS[None, None]), ["X must have shape (n_samples, n_features) or (n_tasks, n_samples, n_features)", "(1, 1, 20, 2)"]),
    (
        "init-2d-for-tasks",
        lambda: fit(np.stack([POINTS, POINTS]), init=POINTS[:3]),
        ["init must have shape (n_tasks, n_clusters, n_features) = (2, 3, 2)", "got (3, 2)"],
    ),
    ("no-points", lambda: fit(np.zeros((0, 2))), ["at least one point", "0 sample(s) (shape=(0, 2))"]),
    ("no-features", lambda: fit(np.zeros((5, 0))), ["at least one coordinate", "0 feature(s) (shape=(5, 0))"]),
    ("no-tasks", lambda: fit(np.zeros((0, 5, 2))), ["at least one point", "0 task(s) (shape=(0, 5, 2))"]),
    ("predict-no-points", lambda: FITTED.predict(np.zeros((0, 2))), ["at least one point", "(shape=(0, 2))"]),
    # the number of clusters
    ("k-0", lambda: fit(n_clusters=0), ["number of clusters k must be an integer >= 1", "got 0"]),
    ("k-negative", lambda: fit(n_clusters=-1), ["number of clusters k must be an integer >= 1", "got -1"]),
    ("k-float", lambda: fit(n_clusters=2.5), ["number of clusters k must be an integer >= 1", "got 2.5"]),
    ("k-bool", lambda: fit(n_clusters=True), ["number of clusters k must be an integer >= 1", "got True"]),
    ("k-above-n", lambda: fit(n_clusters=21), ["k=21", "n=20", "k <= n"]),
    # non-numeric data
    ("strings", lambda: fit([["a", "b"]] * 20), ["X must contain only numbers", "<U1"]),
    ("numeric-strings", lambda: fit(np.array([["1", "2"]] * 20)), ["X must contain only numbers", "<U1"]),
    ("object", lambda: fit(np.array([[1.0, "x"]] * 20, dtype=object)), ["X must contain only numbers", "object"]),
    ("ragged", lambda: fit([[1.0, 2.0], [3.0]]), ["X must be an array of numbers", "inhomogeneous"]),
    # variant, options, gamma
    ("unknown-variant", lambda: fit(variant="loyd"), ["unknown variant 'loyd'", "lloyd, lloyd-dot", "did you mean 'lloyd'?"]),
    ("unknown-option", lambda: fit(variant_options={"bogus": 1}), ["unknown option 'bogus'", "center_update, reset, share_weights"]),
    (
        "unknown-option-dot",
        lambda: fit(variant="lloyd-dot", variant_options={"share_weight": True}),
        ["unknown option 'share_weight'", "did you mean 'share_weights'?"],
    ),
    ("gamma-0", lambda: fit(gamma=0), ["gamma must be a positive number or inf", "got 0"]),
    ("gamma-negative", lambda: fit(gamma=-1), ["gamma must be a positive number or inf", "got -1"]),
    ("gamma-nan", lambda: fit(gamma=math.nan), ["gamma must be a positive number or inf", "got nan"]),
    ("gamma-text", lambda: fit(gamma="x"), ["gamma must be a positive number or inf", "got 'x'"]),
    ("layers-0", lambda: fit(n_layers=0), ["n_layers must be an integer >= 1", "got 0"]),
    ("dtype", lambda: fit(dtype="float16"), ["unsupported dtype 'float16'", "float32, float64"]),
    # init
    ("init-name", lambda: fit(init="kmeans"), ["init must be 'k-means++' (or 'kmeans++'), 'random' or an array of shape (3, 2)", "got 'kmeans'"]),
    ("init-too-few", lambda: fit(init=POINTS[:2]), ["init must have shape (n_clusters, n_features) = (3, 2)", "got (2, 2)"]),
    ("init-wrong-d", lambda: fit(init=np.zeros((3, 3))), ["init must have shape (n_clusters, n_features) = (3, 2)", "got (3, 3)"]),
    ("init-1d", lambda: fit(init=np.zeros(3)), ["init must have shape (n_clusters, n_features) = (3, 2)", "(3,)"]),
    ("init-nan", lambda: fit(init=with_value(POINTS[:3], (1, 0), math.nan)), ["init must be finite", "nan", "(1, 0)"]),
    # random_state
    ("seed-negative", lambda: fit(random_state=-1), ["random_state must be None, a non-negative integer", "got -1"]),
    ("seed-float", lambda: fit(random_state=1.5), ["random_state must be None, a non-negative integer", "got 1.5"]),
    ("seed-text", lambda: fit(random_state="seed"), ["random_state must be None, a non-negative integer", "got 'seed'"]),
    # a fitted model given other data
    ("predict-wrong-d", lambda: FITTED.predict(np.zeros((4, 3))), ["X has 3 features", "fitted with 2", "(n_samples, 2)"]),
    ("transform-wrong-d", lambda: FITTED.transform(np.zeros((4, 1))), ["X has 1 features", "fitted with 2"]),
    ("score-wrong-d", lambda: FITTED.score(np.zeros((4, 3))), ["X has 3 features", "fitted with 2"]),
    ("predict-nan", lambda: FITTED.predict(with_value(POINTS[:4], (2, 1), math.nan)), ["X must be finite", "(2, 1)"]),
    ("predict-1d", lambda: FITTED.predict(np.zeros(2)), ["X must have shape (n_samples, 2)", "(2,)"]),
    ("predict-tasks-on-one", lambda: FITTED.predict(POINTS[None]), ["X must have shape (n_samples, 2)", "(1, 20, 2)"]),
    ("predict-unfitted", lambda: TransformerKMeans(3).predict(POINTS), ["not fitted yet", "fit(X)"]),
    ("set-unknown-param", lambda: TransformerKMeans(3).set_params(n_cluster=2), ["invalid parameter 'n_cluster'", "n_clusters"]),
]


@pytest.mark.parametrize("thunk, fragments", [pytest.param(t, f, id=i) for i, t, f in API_CASES + ESTIMATOR_CASES])
def test_api_and_estimator_reject(thunk: Callable[[], Any], fragments: list[str]) -> None:
    with pytest.raises(KtframeError) as info:
        thunk()
    message = str(info.value)
    assert "\n" not in message and message.strip() == message and message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_failed_fit_leaves_a_fitted_model_as_it_was() -> None:
    estimator = TransformerKMeans(3, n_layers=2, random_state=0).fit(torch.tensor(POINTS))
    centers = estimator.cluster_centers_.clone()
    with pytest.raises(KtframeError):
        estimator.fit(with_value(POINTS, (0, 0), math.nan))  # a numpy array this time
    assert torch.equal(estimator.cluster_centers_, centers)
    assert isinstance(estimator.predict(torch.tensor(POINTS)), torch.Tensor)  # still the tensor model


# --- the CLI: ``ktframe cluster`` ------------------------------------------------------------------

GOOD = np.vstack([RNG.normal(0, 0.1, (3, 2)), RNG.normal(5, 0.1, (3, 2))])  # 6 points, 2 clusters
GOOD_CSV = "x,y\n" + "".join(f"{a},{b}\n" for a, b in GOOD)
PREVIOUS = "label\nprevious run\n"  # what a pre-existing --out file holds


@dataclass
class CliCase:
    id: str
    args: list[str]  # after "cluster"; "--out out.csv" is added unless out is "stdout"
    fragments: list[str]  # each must appear in the stderr line
    files: dict[str, Any] = field(default_factory=dict)  # name -> str | bytes | numpy array
    out: str = "new"  # "new": out.csv must not appear; "existing": must stay unchanged; "stdout"
    real: bool = False  # also run through ``python -m ktframe.cli.main``


def good(**files: Any) -> dict[str, Any]:
    return {"good.csv": GOOD_CSV, **files}


CLI_CASES = [
    # non-finite values: the row and column (data rows, counted after the header)
    CliCase("nan", ["nan.csv", "--k", "2"], ["nan.csv: row 2, column 1 is nan", "finite"], {"nan.csv": "x,y\n1,2\nnan,4\n5,6\n"}, real=True),
    CliCase("inf", ["inf.csv", "--k", "2"], ["inf.csv: row 3, column 2 is inf", "finite"], {"inf.csv": "1,2\n3,4\n5,inf\n"}, out="existing"),
    CliCase("neginf", ["neginf.csv", "--k", "2"], ["row 1, column 2 is -inf", "finite"], {"neginf.csv": "1,-inf\n3,4\n5,6\n"}, out="stdout"),
    CliCase("nan-npy", ["nan.npy", "--k", "2"], ["nan.npy: row 4, column 2 is nan", "finite"], {"nan.npy": with_value(GOOD, (3, 1), math.nan)}),
    # wrong rank
    CliCase("rank-1", ["one.npy", "--k", "2"], ["one.npy: array has shape (6,)", "expected 2 dimensions"], {"one.npy": np.arange(6.0)}),
    CliCase(
        "rank-4",
        ["four.npy", "--k", "2"],
        ["four.npy: array has shape (2, 2, 2, 2)", "expected 2 dimensions"],
        {"four.npy": np.zeros((2, 2, 2, 2))},
        out="existing",
    ),
    # the number of clusters
    CliCase("k-0", ["good.csv", "--k", "0"], ["number of clusters k must be an integer >= 1", "got 0"], good()),
    CliCase("k-negative", ["good.csv", "--k", "-1"], ["number of clusters k must be an integer >= 1", "got -1"], good(), out="stdout"),
    CliCase("k-float", ["good.csv", "--k", "2.5"], ["argument --k", "invalid int value: '2.5'"], good(), real=True),
    CliCase("k-above-n", ["good.csv", "--k", "7"], ["k=7", "n=6", "k <= n"], good(), out="existing"),
    # non-numeric data
    CliCase("csv-word", ["word.csv", "--k", "2"], ["word.csv: row 2, column 2 is 'abc', not a number", "numeric"], {"word.csv": "x,y\n1,2\n3,abc\n5,6\n"}),
    CliCase("csv-empty-cell", ["hole.csv", "--k", "2"], ["hole.csv: row 2, column 1 is '', not a number"], {"hole.csv": "1,2\n,4\n5,6\n"}),
    CliCase(
        "npy-strings", ["str.npy", "--k", "2"], ["str.npy: holds values of type <U1", "expected real numbers"], {"str.npy": np.array([["a", "b"], ["c", "d"]])}
    ),
    CliCase("npy-not-npy", ["text.npy", "--k", "2"], ["text.npy: not a numeric .npy array", "numpy.save"], {"text.npy": "1,2\n3,4\n"}),
    CliCase("npy-zero-bytes", ["zero.npy", "--k", "2"], ["zero.npy: not a readable .npy file", "numpy.save"], {"zero.npy": b""}, out="existing"),
    CliCase("csv-binary", ["bin.csv", "--k", "2"], ["bin.csv: not a text CSV file", "UTF-8"], {"bin.csv": b"\xff\xfe\x00\x01\x80\x81"}),
    # empty, header-only and ragged CSV
    CliCase("csv-empty", ["empty.csv", "--k", "2"], ["empty.csv: the file holds no points"], {"empty.csv": ""}),
    CliCase("csv-blank-lines", ["blank.csv", "--k", "2"], ["blank.csv: the file holds no points"], {"blank.csv": "\n\n  \n"}, out="stdout"),
    CliCase("csv-header-only", ["header.csv", "--k", "2"], ["header.csv: the file holds no points"], {"header.csv": "x,y\n"}, out="existing"),
    CliCase(
        "csv-ragged",
        ["ragged.csv", "--k", "2"],
        ["ragged.csv: row 2 has 1 values but the first row has 2", "same number of columns"],
        {"ragged.csv": "1,2\n3\n5,6\n"},
    ),
    # files that are not there or not supported
    CliCase("missing-file", ["missing.csv", "--k", "2"], ["missing.csv: no such file"]),
    CliCase(
        "unsupported-extension",
        ["points.txt", "--k", "2"],
        ["points.txt: unsupported file type '.txt'", "expected a .csv or .npy file"],
        {"points.txt": GOOD_CSV},
    ),
    CliCase("no-extension", ["points", "--k", "2"], ["unsupported file type '(none)'", ".csv or .npy"], {"points": GOOD_CSV}),
    CliCase("folder", ["data", "--k", "2"], ["data: is a folder", "expected a .csv or .npy file"], {"data": None}),
    CliCase("folder-named-csv", ["data.csv", "--k", "2"], ["data.csv: is a folder", "expected a .csv or .npy file"], {"data.csv": None}, out="existing"),
    # numbers whose squared distances overflow the dtype (d·(2·max|x|)² > the largest float)
    CliCase(
        "overflow-float64",
        ["huge.csv", "--k", "2"],
        ["huge.csv: points reach magnitude 1e+200", "overflow float64", "rescale the data"],
        {"huge.csv": "x,y\n1e200,0\n0,1\n-3,2\n"},
        out="existing",
        real=True,
    ),
    CliCase(
        "overflow-float32-npy",
        ["huge.npy", "--k", "2"],
        ["huge.npy: points reach magnitude 1e+20", "overflow float32"],
        {"huge.npy": with_value(GOOD, (2, 1), 1e20).astype(np.float32)},
    ),
    CliCase(
        "overflow-dtype-float32",
        ["big.csv", "--k", "2", "--dtype", "float32"],
        ["big.csv: points reach magnitude 1e+20", "overflow float32"],
        {"big.csv": "1e20,0\n0,1\n5,5\n"},
    ),
    # below that, but the objective's sum of n squared distances overflows, or gamma times one does
    CliCase(
        "objective-inf",
        ["sum.csv", "--k", "1"],
        ["gave a k-means objective of inf", "overflow float64", "rescale the data"],
        {"sum.csv": "6e153\n-6e153\n" * 3},
        out="existing",
    ),
    CliCase(
        "objective-nan", ["good.csv", "--k", "2", "--gamma", "1e308"], ["gave a k-means objective of nan", "gamma times", "smaller gamma"], good(), out="stdout"
    ),
    # variant, gamma, init, seed, layers
    CliCase(
        "unknown-variant",
        ["good.csv", "--k", "2", "--variant", "loyd"],
        ["unknown variant 'loyd'", "lloyd, lloyd-dot", "did you mean 'lloyd'?"],
        good(),
        out="existing",
        real=True,
    ),
    CliCase("gamma-0", ["good.csv", "--k", "2", "--gamma", "0"], ["argument --gamma", "positive number", "got '0'"], good()),
    CliCase("gamma-negative", ["good.csv", "--k", "2", "--gamma=-1"], ["argument --gamma", "positive number", "got '-1'"], good()),
    CliCase("gamma-nan", ["good.csv", "--k", "2", "--gamma", "nan"], ["argument --gamma", "positive number", "got 'nan'"], good(), out="existing"),
    CliCase("init-name", ["good.csv", "--k", "2", "--init", "kmeans"], ["argument --init", "invalid choice: 'kmeans'", "'k-means++', 'random'"], good()),
    CliCase("seed-negative", ["good.csv", "--k", "2", "--seed", "-1"], ["argument --seed", "expected an integer >= 0", "got '-1'"], good()),
    CliCase("seed-text", ["good.csv", "--k", "2", "--seed", "abc"], ["argument --seed", "expected an integer >= 0", "got 'abc'"], good(), out="existing"),
    CliCase("n-init-zero", ["good.csv", "--k", "2", "--n-init", "0"], ["argument --n-init", "expected 'auto' or an integer >= 1", "got '0'"], good()),
    CliCase("layers-0", ["good.csv", "--k", "2", "--layers", "0"], ["argument --layers: expected an integer >= 1", "got '0'"], good()),
    CliCase("k-missing", ["good.csv"], ["the following arguments are required: --k"], good()),
    # where the labels go, checked before anything else (k=7 > n=6 would fail later)
    CliCase(
        "out-is-the-input",
        ["good.csv", "--k", "7", "--out", "good.csv"],
        ["--out good.csv is the input file good.csv", "expected another file"],
        good(),
        out="stdout",
    ),
    CliCase(
        "out-is-the-input-by-another-name",
        ["good.csv", "--k", "7", "--out", "results/../good.csv"],
        ["--out results/../good.csv is the input file good.csv"],
        good(results=None),
        out="stdout",
    ),
    CliCase(
        "out-folder-missing",
        ["good.csv", "--k", "7", "--out", "nowhere/labels.csv"],
        ["nowhere/labels.csv: the folder nowhere does not exist"],
        good(),
        out="stdout",
    ),
    CliCase(
        "out-is-a-folder",
        ["good.csv", "--k", "7", "--out", "results"],
        ["results: is a folder", "expected the name of a file"],
        good(results=None),
        out="stdout",
    ),
]

FORK = sys.platform == "linux" and hasattr(os, "fork")

# One child per case, forked from a process that imported ktframe once; it runs the CLI module as
# __main__ and exits as the interpreter would. Prints {case id: exit code} as JSON.
DRIVER = r"""
import json, os, runpy, sys, traceback
import ktframe, ktframe.core.errors, ktframe.cli.cluster, ktframe.cli.plugins, ktframe.cli.verify

def child(argv, folder, stdout, stderr):
    code = 1
    try:
        os.chdir(folder)
        for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, stdout, os.O_WRONLY | os.O_CREAT), (2, stderr, os.O_WRONLY | os.O_CREAT)):
            os.dup2(os.open(name, flags, 0o644), fd)
        sys.argv = ["ktframe", *argv]
        try:
            runpy.run_module("ktframe.cli.main", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

codes = {}
for case in json.load(open(sys.argv[1])):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(case["argv"], case["folder"], case["stdout"], case["stderr"])
    codes[case["id"]] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(codes))
"""


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    folder: Path


def prepare(case: CliCase, folder: Path) -> list[str]:
    """Write the case's files into ``folder``; the command line after ``cluster``."""
    folder.mkdir(parents=True)
    for name, content in case.files.items():
        path = folder / name
        if content is None:
            path.mkdir()
        elif isinstance(content, np.ndarray):
            np.save(path, content)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    if case.out == "existing":
        (folder / "out.csv").write_text(PREVIOUS)
    return ["cluster", *case.args, *([] if case.out == "stdout" else ["--out", "out.csv"])]


@pytest.fixture(scope="module")
def cli_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Outcome]:
    root = tmp_path_factory.mktemp("cli")
    # the real ``python -m`` runs start first and run alongside the forking driver
    real = {}
    for case in CLI_CASES:
        if case.real or not FORK:
            folder = root / "real" / case.id
            argv = prepare(case, folder)
            while sum(process.poll() is None for _, process in real.values()) >= max(2, os.cpu_count() or 2):
                time.sleep(0.05)
            real[case.id] = (
                folder,
                subprocess.Popen(
                    [sys.executable, "-m", "ktframe.cli.main", *argv],
                    cwd=folder,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
    jobs = []
    for case in CLI_CASES if FORK else []:
        folder = root / "fork" / case.id
        argv = prepare(case, folder)
        jobs.append({"id": case.id, "argv": argv, "folder": str(folder), "stdout": str(root / f"{case.id}.stdout"), "stderr": str(root / f"{case.id}.stderr")})
    outcomes = {}
    codes = {}
    if jobs:
        (root / "jobs.json").write_text(json.dumps(jobs))
        driver = subprocess.run([sys.executable, "-c", DRIVER, str(root / "jobs.json")], capture_output=True, text=True, timeout=300)
        assert driver.returncode == 0, driver.stderr
        codes = json.loads(driver.stdout)
    for job in jobs:
        outcomes[(job["id"], "fork")] = Outcome(codes[job["id"]], Path(job["stdout"]).read_text(), Path(job["stderr"]).read_text(), Path(job["folder"]))
    for case_id, (folder, process) in real.items():
        stdout, stderr = process.communicate(timeout=300)
        outcomes[(case_id, "python -m")] = Outcome(process.returncode, stdout, stderr, folder)
    return outcomes


CLI_PARAMS = [pytest.param(case, "fork", id=case.id) for case in CLI_CASES if FORK] + [
    pytest.param(case, "python -m", id=f"{case.id}-python-m") for case in CLI_CASES if case.real or not FORK
]


@pytest.mark.parametrize("case, runner", CLI_PARAMS)
def test_cli_rejects(case: CliCase, runner: str, cli_outcomes: dict[tuple[str, str], Outcome]) -> None:
    outcome = cli_outcomes[(case.id, runner)]
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.returncode == 2, outcome.stderr
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected one stderr line, got {outcome.stderr!r}"
    assert lines[0].startswith("ktframe cluster: error: "), lines[0]
    for fragment in case.fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert outcome.stdout == "", "nothing goes to stdout when the command fails"
    # nothing half-written: no output file, no temporary file, a previous output untouched
    expected = set(case.files) | ({"out.csv"} if case.out == "existing" else set())
    assert {p.name for p in outcome.folder.iterdir()} == expected
    if case.out == "existing":
        assert (outcome.folder / "out.csv").read_text() == PREVIOUS
    for name, content in case.files.items():  # the files the command was given, byte for byte
        if isinstance(content, (str, bytes)):
            assert (outcome.folder / name).read_bytes() == (content.encode() if isinstance(content, str) else content), name
