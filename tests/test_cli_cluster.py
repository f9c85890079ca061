"""``ktframe cluster`` on good input: CSV with and without a header, ``.npy``, ``--out`` or stdout.

Every command runs as ``[sys.executable, "-m", "ktframe.cli.main", ...]``; they start together in
one fixture, since importing torch costs each process seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from ktframe import TransformerKMeans
from ktframe.clustering.datafile import load_points

K = 3
RNG = np.random.default_rng(11)
TRUTH = RNG.permutation(np.repeat(np.arange(K), 10))
POINTS = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])[TRUTH] + RNG.normal(0, 0.5, (len(TRUTH), 2))
N = len(POINTS)


def rows(points: np.ndarray) -> str:
    return "".join(",".join(repr(float(v)) for v in row) + "\n" for row in points)  # repr: exact round trip


FILES = {
    "header.csv": "x,y\n" + rows(POINTS),
    "plain.csv": rows(POINTS),
    "points.npy": POINTS,
}

# four processes cover the three formats, both destinations and the options: each run's labels
# must equal those of the estimator with the parameters in PARAMS
RUNS = {
    "header": ["header.csv", "--k", "3", "--out", "header-labels.csv"],
    "plain": ["plain.csv", "--k", "3", "--seed", "5", "--layers", "4", "--dtype", "float32", "--n-init", "3", "--out", "plain-labels.csv"],
    "npy": ["points.npy", "--k", "3", "--variant", "lloyd-dot", "--gamma", "inf", "--init", "k-means++", "--out", "npy-labels.csv"],
    "stdout": ["header.csv", "--k", "3"],
}
PARAMS = {"header": {}, "plain": {"random_state": 5, "n_layers": 4, "dtype": "float32", "n_init": 3}, "npy": {"variant": "lloyd-dot"}, "stdout": {}}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cluster")
    for name, content in FILES.items():
        np.save(folder / name, content) if name.endswith(".npy") else (folder / name).write_text(content)
    return folder


@pytest.fixture(scope="module")
def runs(folder: Path) -> dict[str, Run]:
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ktframe.cli.main", "cluster", *argv],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, argv in RUNS.items()
    }
    results = {}
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        results[name] = Run(process.returncode, stdout, stderr)
    return results


def labels_of(text: str) -> np.ndarray:
    lines = text.splitlines()
    assert lines[0] == "label", lines[:1]
    assert len(lines) == N + 1, f"expected a header and {N} labels, got {len(lines)} lines"
    assert all(re.fullmatch(r"\d+", line) for line in lines[1:]), "every label is a non-negative integer"
    labels = np.array([int(line) for line in lines[1:]])
    assert labels.min() >= 0 and labels.max() < K
    return labels


def objective_in(summary: str) -> float:
    match = re.search(r"objective (\S+) \(log (\S+)\)", summary)
    assert match, summary
    return float(match.group(1))


def expected(**params) -> TransformerKMeans:
    """The estimator the CLI stands for: seed 0, 10 layers, k-means++ by default."""
    return TransformerKMeans(K, **{"random_state": 0, **params}).fit(POINTS)


@pytest.mark.parametrize("name", ["header", "plain", "npy"])
def test_clusters_a_file_into_out(name: str, runs: dict[str, Run], folder: Path) -> None:
    run = runs[name]
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and run.stderr == ""
    out = folder / RUNS[name][-1]
    text = out.read_text()
    assert text.endswith("\n")
    labels = labels_of(text)
    assert adjusted_rand_score(TRUTH, labels) == 1.0
    reference = expected(**PARAMS[name])
    np.testing.assert_array_equal(labels, reference.labels_)
    summary = run.stdout.splitlines()
    assert len(summary) == 1, run.stdout
    variant = PARAMS[name].get("variant", "lloyd")
    assert summary[0].startswith(f"{N} points, 2 dimensions, k=3, variant={variant}: objective ")
    assert summary[0].endswith(f"labels written to {out.name}")
    assert objective_in(summary[0]) == pytest.approx(reference.inertia_, rel=1e-5)
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")], "no temporary file is left behind"


def test_stdout_mode_prints_the_labels(runs: dict[str, Run]) -> None:
    run = runs["stdout"]
    assert run.returncode == 0, run.stderr
    labels = labels_of(run.stdout)
    np.testing.assert_array_equal(labels, expected().labels_)
    summary = run.stderr.splitlines()
    assert len(summary) == 1 and "objective" in summary[0] and "Traceback" not in run.stderr


def test_same_seed_same_output(runs: dict[str, Run], folder: Path) -> None:
    # two processes, the same file and seed: the same bytes, whether written to --out or stdout
    assert runs["header"].returncode == runs["stdout"].returncode == 0
    first = (folder / "header-labels.csv").read_bytes()
    assert runs["stdout"].stdout.encode() == first
    # the same points read from .npy (lloyd-dot equals lloyd) give the same file too
    assert (folder / "npy-labels.csv").read_bytes() == first
    # while --seed 5 starts elsewhere: the same partition under other label numbers
    plain = labels_of((folder / "plain-labels.csv").read_text())
    assert not np.array_equal(plain, labels_of(first.decode()))
    assert adjusted_rand_score(plain, labels_of(first.decode())) == 1.0


def test_loader_reads_csv_with_and_without_header(tmp_path: Path) -> None:
    # in-process: the loader behind the command, on the layouts spreadsheets and scripts write
    layouts = {
        "header.csv": "x,y\n" + rows(POINTS),
        "plain.csv": rows(POINTS),
        "bom.csv": "\ufeffx,y\n" + rows(POINTS),  # "CSV UTF-8" from a spreadsheet
        "bom-plain.csv": "\ufeff" + rows(POINTS),
        "blank-lines.csv": "x,y\n\n" + rows(POINTS).replace("\n", "\n\n"),
        "crlf.csv": ("x,y\n" + rows(POINTS)).replace("\n", "\r\n"),
        "spaces.csv": "x, y\n" + rows(POINTS).replace(",", ", "),
    }
    for name, text in layouts.items():
        (tmp_path / name).write_text(text, encoding="utf-8", newline="")
        np.testing.assert_array_equal(load_points(tmp_path / name), POINTS, err_msg=name)
    np.save(tmp_path / "ints.npy", np.arange(6).reshape(3, 2))
    loaded = load_points(tmp_path / "ints.npy")
    assert loaded.dtype == np.float64 and loaded.shape == (3, 2)


def test_loader_dtype_and_the_slow_path_agree(tmp_path: Path) -> None:
    # numpy's C parser reads the usual layouts; what it refuses (quoted cells, a line of spaces)
    # goes through the csv module instead, with the same result
    from ktframe.clustering import datafile

    (tmp_path / "plain.csv").write_text("x,y\n" + rows(POINTS))
    (tmp_path / "quoted.csv").write_text('"x","y"\n' + "".join(f'"{a!r}",{b!r}\n' for a, b in POINTS.tolist()) + "   \n")
    for name in ("plain.csv", "quoted.csv"):
        np.testing.assert_array_equal(load_points(tmp_path / name), POINTS, err_msg=name)
        np.testing.assert_array_equal(datafile._load_csv_slowly(tmp_path / name), POINTS, err_msg=name)
        single = load_points(tmp_path / name, "float32")
        assert single.dtype == np.float32
        np.testing.assert_array_equal(single, POINTS.astype(np.float32))
    np.save(tmp_path / "single.npy", POINTS.astype(np.float32))
    assert load_points(tmp_path / "single.npy").dtype == np.float32  # a float32 file stays float32
    assert load_points(tmp_path / "single.npy", np.float64).dtype == np.float64
    np.save(tmp_path / "double.npy", POINTS)
    assert load_points(tmp_path / "double.npy", "float32").dtype == np.float32


def test_labels_are_written_in_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ktframe.clustering import datafile
    from ktframe.core import io

    monkeypatch.setattr(datafile, "LABEL_BLOCK", 4)
    labels = np.arange(10) % 3
    blocks = list(datafile.label_lines(labels))
    assert blocks[0] == "label" and len(blocks) == 4 and max(len(b.splitlines()) for b in blocks) == 4
    io.write_atomically(tmp_path / "labels.csv", datafile.label_lines(labels))
    assert (tmp_path / "labels.csv").read_text() == "label\n" + "".join(f"{v}\n" for v in labels)
    assert [p.name for p in tmp_path.iterdir()] == ["labels.csv"]
