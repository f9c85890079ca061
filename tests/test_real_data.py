"""``ktframe real-data``: the committed checkpoints on scikit-learn's bundled data sets, their
numbers against an independent computation of one sample, and its bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits, load_iris
from sklearn.decomposition import PCA

from ktframe.cli.main import main
from ktframe.clustering.estimator import TransformerKMeans
from ktframe.core.errors import InputError
from ktframe.evaluation import real_data
from ktframe.evaluation.datasets import DATASETS
from ktframe.fast.swaps import swap

ROOT = Path(__file__).resolve().parent.parent
PAPER, ANYK = ROOT / "results" / "paper-seed0.ckpt", ROOT / "results" / "anyk-seed0.ckpt"
LLOYD_LAST = 5
SWAPS = 2
SWAPPED = real_data.swapped_name(LLOYD_LAST)


def ktframe_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktframe.cli.main", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Both committed checkpoints on iris (zero-padded) and digits (PCA-reduced) at k = 3 and 10,
    two samples each, through the command, with the model's last LLOYD_LAST steps Lloyd's beside,
    and SWAPS swaps after them and after Lloyd's."""
    folder = tmp_path_factory.mktemp("real-data")
    done = ktframe_cli(
        "real-data", "--checkpoint", str(PAPER), "--checkpoint", str(ANYK), "--datasets", "iris,digits", "--ks", "3,10", "--samples", "2",
        "--lloyd-last", str(LLOYD_LAST), "--swaps", str(SWAPS), "--out", "out", "--json", cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads((folder / "out" / "report.json").read_text())
    assert json.loads(done.stdout) == written
    return folder, written


def _row(report: dict, checkpoint: str, dataset: str, k: int) -> dict:
    return next(r for r in report["rows"] if r["checkpoint"].endswith(checkpoint) and r["dataset"] == dataset and r["k"] == k)


def test_every_checkpoint_at_every_k_it_takes_and_the_others_skipped(report):
    folder, found = report
    assert [(Path(r["checkpoint"]).name, r["dataset"], r["k"]) for r in found["rows"]] == [
        ("anyk-seed0.ckpt", "iris", 3),
        ("paper-seed0.ckpt", "iris", 10),
        ("anyk-seed0.ckpt", "iris", 10),
        ("anyk-seed0.ckpt", "digits", 3),
        ("paper-seed0.ckpt", "digits", 10),
        ("anyk-seed0.ckpt", "digits", 10),
    ]
    assert [(Path(s["checkpoint"]).name, s["dataset"], s["k"], s["reason"]) for s in found["skipped"]] == [
        ("paper-seed0.ckpt", dataset, 3, "its model takes k=10 only") for dataset in ("iris", "digits")
    ]
    # the two paths of the frame: iris is narrower than the model's d = 32, digits wider
    assert {r["dataset"]: r["frame"] for r in found["rows"]} == {"iris": "zero-padded to 32", "digits": "first 32 principal components"}
    assert {r["dataset"]: r["points"] for r in found["rows"]} == {"iris": 150, "digits": 512}
    # paths relative to the report's folder, no absolute path of this machine
    for checkpoint in found["checkpoints"]:
        assert not Path(checkpoint["path"]).is_absolute() and (folder / "out" / checkpoint["path"]).resolve() in (PAPER, ANYK)
    assert str(folder) not in (folder / "out" / "report.json").read_text()
    text = (folder / "out" / "report.md").read_text()
    assert "| iris | zero-padded to 32 | 3 |" in text and "paper-seed0.ckpt on iris at k = 3: its model takes k=10 only" in text


def test_the_baselines_do_not_depend_on_the_checkpoint_of_one_frame(report):
    _, found = report
    for dataset in ("iris", "digits"):
        paper, anyk = _row(found, "paper-seed0.ckpt", dataset, 10), _row(found, "anyk-seed0.ckpt", dataset, 10)
        ours = ("model", real_data.HYBRID, SWAPPED)
        assert {m: v for m, v in paper["per_sample"].items() if m not in ours} == {m: v for m, v in anyk["per_sample"].items() if m not in ours}
        assert paper["per_sample"]["model"] != anyk["per_sample"]["model"]


def test_means_differences_and_their_intervals_are_those_of_the_samples(report):
    _, found = report
    for row in found["rows"]:
        samples = {m: np.array(v) for m, v in row["per_sample"].items()}
        assert set(samples) == {*real_data.METHODS, real_data.HYBRID, SWAPPED, real_data.SWAPPED_LLOYD} and all(len(v) == 2 for v in samples.values())
        for method, values in samples.items():
            assert math.isclose(row["log_objective"][method]["mean"], values.mean(), rel_tol=1e-12)
        compared = [("model", other, versus) for other, versus in row["versus"].items()]
        compared += [(real_data.HYBRID, other, versus) for other, versus in row["hybrid_versus"].items()]
        compared += [(SWAPPED, other, versus) for other, versus in row["swapped_versus"].items()]
        assert {other for ours, other, _ in compared if ours == real_data.HYBRID} == set(real_data.METHODS[1:])
        assert {other for ours, other, _ in compared if ours == SWAPPED} == {*real_data.METHODS[1:], real_data.SWAPPED_LLOYD}
        for ours, other, versus in compared:
            difference = samples[ours] - samples[other]
            half = stats.t.ppf(0.975, 1) * difference.std(ddof=1) / math.sqrt(2)
            assert math.isclose(versus["mean"], difference.mean(), abs_tol=1e-12)
            assert versus["ci95"] == pytest.approx([difference.mean() - half, difference.mean() + half], abs=1e-9)
            assert versus["below"] == int((difference < 0).sum())
        # Lloyd run to convergence ends no higher than its 20 iterations, from the same start
        assert (samples["lloyd-converged"] <= samples["lloyd"] + 1e-6).all()
        # a swap is kept only where it lowers the objective
        assert (samples[SWAPPED] <= samples[real_data.HYBRID] + 1e-6).all() and (samples[real_data.SWAPPED_LLOYD] <= samples["lloyd"] + 1e-6).all()
        # Dropping the padded coordinates of the layer's centers can only bring them nearer the
        # data; a PCA frame loses nothing mapping them to the user's units and back.
        before, after = row["model_before_projection"]["mean"], row["log_objective"]["model"]["mean"]
        assert before >= after - 1e-12 if row["dataset"] == "iris" else math.isclose(before, after, abs_tol=1e-6)


def _objective(Y: np.ndarray, C: np.ndarray) -> float:
    return math.log(((Y[:, None] - C[None]) ** 2).sum(-1).min(1).sum())


def _independent(points: np.ndarray, Y: np.ndarray, row: dict, checkpoint: Path, to_frame) -> None:
    """Sample 0 of ``row`` computed apart from the command: ``Y`` the sample in a frame built here
    (``to_frame`` maps points there), Lloyd by scikit-learn from the command's start, the model by
    the estimator from the same points."""
    C0 = real_data.starts(torch.from_numpy(Y)[None], row["k"], row["dataset"], 0)["random"][0].numpy()
    start = [int(np.flatnonzero((Y == c).all(axis=1))[0]) for c in C0]  # the start's points, by index
    for method, iterations in (("lloyd", row["steps"]), ("lloyd-converged", 300)):
        lloyd = KMeans(n_clusters=row["k"], init=C0, n_init=1, max_iter=iterations, tol=0, algorithm="lloyd").fit(Y)
        assert math.isclose(math.log(lloyd.inertia_), row["per_sample"][method][0], abs_tol=1e-5), method
    model = TransformerKMeans(n_clusters=row["k"], init=points[start], checkpoint=checkpoint, tol=0).fit(points)
    assert model.n_iter_ == row["steps"]
    assert math.isclose(_objective(Y, to_frame(model.cluster_centers_)), row["per_sample"]["model"][0], abs_tol=2e-4)
    # model+lloyd: the estimator's first steps, then Lloyd's from its centers in the frame
    first = TransformerKMeans(n_clusters=row["k"], init=points[start], checkpoint=checkpoint, n_layers=row["steps"] - LLOYD_LAST, tol=0).fit(points)
    C = to_frame(first.cluster_centers_)
    for _ in range(LLOYD_LAST):  # Lloyd keeping an emptied cluster's center (scikit-learn moves it)
        labels = ((Y[:, None] - C[None]) ** 2).sum(-1).argmin(1)
        C = np.stack([Y[labels == j].mean(0) if (labels == j).any() else C[j] for j in range(len(C))])
    assert math.isclose(_objective(Y, C), row["per_sample"][real_data.HYBRID][0], abs_tol=2e-4)
    # the swaps from those centers, each followed by the model's steps of Lloyd's, the sample's own draws
    draws = real_data._generator(real_data._SWAPS, 0, row["dataset"], row["k"], 0)
    swapped = swap(torch.from_numpy(Y)[None].float(), torch.from_numpy(C)[None].float(), SWAPS, row["steps"], draws).objective.log().item()
    assert math.isclose(swapped, row["per_sample"][SWAPPED][0], abs_tol=2e-4)
    # and the estimator's own door to it
    hybrid = TransformerKMeans(n_clusters=row["k"], init=points[start], checkpoint=checkpoint, lloyd_last=LLOYD_LAST, tol=0).fit(points)
    assert hybrid.n_iter_ <= row["steps"]
    assert math.isclose(_objective(Y, to_frame(hybrid.cluster_centers_)), row["per_sample"][real_data.HYBRID][0], abs_tol=2e-4)


def test_one_padded_sample_as_computed_independently(report):
    _, found = report
    points = load_iris().data  # every sample is the whole set
    low, span = points.min(axis=0), np.ptp(points, axis=0)
    to_frame = lambda x: (x - low) / span  # the 28 padded coordinates are 0 for every point and center
    for checkpoint in (PAPER, ANYK):
        _independent(points, to_frame(points), _row(found, checkpoint.name, "iris", 10), checkpoint, to_frame)


def test_one_reduced_sample_as_computed_independently(report):
    _, found = report
    data = load_digits().data
    points = data[real_data.sample_indices(len(data), "digits", 2, 0)[0].numpy()]
    pca = PCA(32, svd_solver="full").fit(
        points
    )  # exact, not randomized; its signs may differ from the frame's: each min-max scaled axis is then mirrored, distances kept
    reduced = pca.transform(points)
    low, span = reduced.min(axis=0), np.ptp(reduced, axis=0)
    to_frame = lambda x: (pca.transform(x) - low) / span
    _independent(points, to_frame(points), _row(found, "anyk-seed0.ckpt", "digits", 3), ANYK, to_frame)


def test_a_report_is_never_replaced_unless_its_folder_is_named(tmp_path, monkeypatch, capsys):
    first = ktframe_cli("real-data", "--checkpoint", str(ANYK), "--datasets", "iris", "--ks", "3", "--samples", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    written = (tmp_path / "real-data" / "report.json").read_bytes()
    monkeypatch.chdir(tmp_path)
    line = ["--quiet", "real-data", "--checkpoint", str(ANYK), "--datasets", "iris", "--ks", "4", "--samples", "2"]
    assert main(line) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds an earlier report" in err and "--out real-data" in err
    assert (tmp_path / "real-data" / "report.json").read_bytes() == written
    assert main([*line, "--out", "real-data"]) == 0
    assert [row["k"] for row in json.loads((tmp_path / "real-data" / "report.json").read_text())["rows"]] == [4]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--datasets", "iris,wines"], "unknown data set 'wines'; expected one of"),
        (["--samples", "1"], "--samples 1: expected at least 2 samples"),
        (["--ks", "0,3"], "--ks 0,3: expected numbers of clusters >= 2"),
        (["--ks", "3,x"], "argument --ks: expected numbers of clusters separated by commas"),
        (["--ks", "200"], "k=200 for the data set 'iris' of 150 points"),
        (["--checkpoint", "missing.ckpt"], "missing.ckpt"),
        (["--seed", "-1"], "--seed -1: expected a seed >= 0"),
        (["--lloyd-last", "-1"], "--lloyd-last -1: expected a number of steps >= 0"),
        (["--lloyd-last", "21"], "runs 20 steps; expected at most 20 of them Lloyd's"),
        (["--swaps", "-1"], "--swaps -1: expected a number of swaps >= 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, arguments, expected):
    monkeypatch.chdir(tmp_path)
    line = ["real-data", "--datasets", "iris", "--checkpoint", str(ANYK), *arguments]
    try:
        code = main(line)
    except SystemExit as usage:  # argparse's usage errors
        code = usage.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and expected in err and "Traceback" not in err
    assert not (tmp_path / "real-data").exists()


def test_the_default_checkpoints_are_those_of_results_that_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert real_data.default_checkpoints() == [p for p in real_data.DEFAULT_CHECKPOINTS if (ROOT / p).is_file()]
    assert {"results/paper-seed0.ckpt", "results/anyk-seed0.ckpt"} <= set(real_data.default_checkpoints())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="expected --checkpoint PATH"):
        real_data.default_checkpoints()


def test_penguins_are_read_from_the_packages_csv_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / "palmerpenguins"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('imports pandas')\n")
    (package / "data" / "penguins.csv").write_text(
        "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year\n"
        "Adelie,Torgersen,39.1,18.7,181,3750,male,2007\n"
        "Adelie,Torgersen,NA,NA,NA,NA,NA,2007\n"
        "Gentoo,Biscoe,46.1,13.2,211,4500,NA,2007\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert DATASETS["penguins"].load().tolist() == [[39.1, 18.7, 181, 3750], [46.1, 13.2, 211, 4500]]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path) and not (Path(p) / "palmerpenguins").is_dir()])
    with pytest.raises(InputError, match=r"needs the palmerpenguins package.*pip install 'ktframe\[realdata\]'"):
        DATASETS["penguins"].load()


def test_help_lists_the_data_sets_without_importing_torch(tmp_path):
    probe = (
        "import sys\nfrom ktframe.cli.main import main\ntry:\n    main(['real-data', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'numpy', 'lightning') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.splitlines()[-1] == "[]", done.stderr
    assert "digits (k = 5, 10, 16)" in done.stdout and "penguins (k = 3, 10)" in done.stdout


def test_each_checkpoint_gets_its_own_finish_unless_one_is_given(tmp_path):
    """Without --lloyd-last and --swaps a checkpoint is evaluated with its config's eval.lloyd_last
    and eval.swaps, as TransformerKMeans(checkpoint=...) uses it (0 where it has none), beside one
    without them; given, they hold for every checkpoint."""
    checkpoint = torch.load(ANYK, weights_only=True)
    checkpoint["hyper_parameters"]["config"]["eval"].update(lloyd_last=5, swaps=2)
    finished = tmp_path / "finished.ckpt"
    torch.save(checkpoint, finished)
    own = real_data.evaluate([str(finished), str(ANYK)], ["iris"], samples=2, ks=[3], out=tmp_path)
    assert [(c["lloyd_last"], c["swaps"]) for c in own["checkpoints"]] == [(5, 2), (0, 0)]
    assert [(r["lloyd_last"], r["swaps"]) for r in own["rows"]] == [(5, 2), (0, 0)]
    with_finish, without = own["rows"]
    assert {real_data.HYBRID, SWAPPED, real_data.SWAPPED_LLOYD} <= set(with_finish["per_sample"])
    assert not {real_data.HYBRID, SWAPPED, real_data.SWAPPED_LLOYD} & set(without["per_sample"])
    assert with_finish["per_sample"]["model"] == without["per_sample"]["model"]  # the same layer
    text = real_data.markdown(own)
    assert text.count(f"`{SWAPPED}`: 2 swaps after `{real_data.HYBRID}`'s centers") == 1
    given = real_data.evaluate([str(finished), str(ANYK)], ["iris"], samples=2, ks=[3], lloyd_last=0, swaps=1, out=tmp_path)
    assert [(r["lloyd_last"], r["swaps"]) for r in given["rows"]] == [(0, 1), (0, 1)]
    assert given["rows"][0]["per_sample"] == given["rows"][1]["per_sample"]


@pytest.mark.slow
def test_each_checkpoint_gets_baselines_of_its_own_steps(tmp_path):
    # Two checkpoints of one frame (the same d and data.scaling) that differ in eval.steps: each
    # row's classical methods run its own checkpoint's steps, as in a report of that one alone.
    checkpoint = torch.load(PAPER, weights_only=True, map_location="cpu")
    checkpoint["hyper_parameters"]["config"]["eval"]["steps"] = 3
    fewer = tmp_path / "paper-3-steps.ckpt"
    torch.save(checkpoint, fewer)
    both = real_data.evaluate([str(PAPER), str(fewer)], ["iris"], samples=2, ks=[10], out=tmp_path)
    alone = real_data.evaluate([str(fewer)], ["iris"], samples=2, ks=[10], out=tmp_path)
    rows = {Path(row["checkpoint"]).name: row for row in both["rows"]}
    assert rows["paper-3-steps.ckpt"]["steps"] == 3 and rows["paper-seed0.ckpt"]["steps"] == 20
    assert rows["paper-3-steps.ckpt"]["per_sample"]["lloyd"] == alone["rows"][0]["per_sample"]["lloyd"]
    assert rows["paper-3-steps.ckpt"]["per_sample"]["lloyd"] != rows["paper-seed0.ckpt"]["per_sample"]["lloyd"]
