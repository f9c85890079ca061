"""Nothing of the user's is lost, and no garbage passes for a result.

``ktframe cluster --out`` never replaces the input (by any name: the same path spelt otherwise, a
hard link, a symbolic link), checks where it writes before any work, keeps an existing output's
permission mode, writes through a symbolic link, and streams to standard output for ``-`` and
``/dev/stdout``, as an unprivileged user and into a pipe too. A file that cannot be read (no
permission, too large for the memory, a folder) is one line and exit 2. Points whose squared
distances overflow the dtype are refused by the estimator, the model and the command alike, and
an objective that is not finite is an error, never a result.

Every command is a real ``python -m ktframe.cli.main`` process in a folder of its own; they start
together in one fixture, since importing torch costs each process seconds. Where the tests run as
root, the unprivileged cases run as the user ``nobody`` through ``setpriv`` (root reads and writes
whatever the modes say), and are skipped, with the reason, where that cannot be done; elsewhere
they run as the user running the tests.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ktframe import InputError, TransformerKMeans, build_model
from ktframe.clustering.datafile import label_lines
from ktframe.core.io import output_path, write_atomically
from ktframe.core.validation import magnitude_limit

RNG = np.random.default_rng(3)
POINTS = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])[np.arange(30) % 3] + RNG.normal(0, 0.5, (30, 2))
CSV = "x,y\n" + "".join(f"{a!r},{b!r}\n" for a, b in POINTS.tolist())
PREVIOUS = b"label\nprevious run\n"  # what a file the command must not lose holds
NOBODY = 65534
ROOT = os.geteuid() == 0
MEMORY = 4 << 30  # the address space of a memory-limited case: enough for Python and torch
HUGE = 1 << 34  # the size of a (sparse) file whose points do not fit in MEMORY


def _labels_file() -> bytes:
    labels = TransformerKMeans(3, n_layers=10, random_state=0).fit(POINTS).labels_
    return "".join(block + "\n" for block in label_lines(labels)).encode()


LABELS = _labels_file()  # what every successful run below writes


# --- the cases --------------------------------------------------------------------------------


def _link(name: str, target: str) -> Callable[[Path], None]:
    return lambda folder: os.symlink(target, folder / name)


def _hard_link(folder: Path) -> None:
    os.link(folder / "points.csv", folder / "twin.csv")


def _private(folder: Path) -> None:
    (folder / "out.csv").write_bytes(PREVIOUS)
    os.chmod(folder / "out.csv", 0o600)


def _linked_output(folder: Path) -> None:
    (folder / "data").mkdir()
    (folder / "data" / "labels.csv").write_bytes(PREVIOUS)
    os.chmod(folder / "data" / "labels.csv", 0o640)
    os.symlink("data/labels.csv", folder / "link.csv")


def _unreadable(folder: Path) -> None:
    os.chmod(folder / "points.csv", 0)


def _locked_folder(folder: Path) -> None:
    (folder / "locked").mkdir(mode=0o555)
    os.chmod(folder / "locked", 0o555)  # whatever the umask


def _sparse_csv(folder: Path) -> None:
    with open(folder / "big.csv", "wb") as handle:  # a file of HUGE bytes that takes no disk
        handle.write(b"x,y\n1,2\n")
        handle.truncate(HUGE)


def _sparse_npy(folder: Path) -> None:
    with open(folder / "big.npy", "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f8", "fortran_order": False, "shape": (HUGE // 16, 2)})
        handle.truncate(handle.tell() + HUGE)


def _many_points(folder: Path) -> None:
    # labels of more than a pipe's buffer, so that a reader that stops early is noticed
    np.save(folder / "many.npy", RNG.normal(size=(200_000, 2)))


@dataclass
class Case:
    args: list[str]  # after "cluster"
    setup: Callable[[Path], None] | None = None  # after points.csv, points.npy and out.csv are written
    stdout: str = "pipe"  # "pipe", "file" (a regular file, captured.txt, outside the folder) or "one line" (then closed)
    unprivileged: bool = False
    memory: int | None = None
    umask: int | None = None
    error: list[str] = field(default_factory=list)  # fragments of the one stderr line; [] for success


CASES = {
    # --out is the input under another name (the same path, spelt in any way: tests/test_bad_input.py):
    # refused before any work (--k 99 > n would fail later)
    "hard-link": Case(["points.csv", "--k", "99", "--out", "twin.csv"], _hard_link, error=["--out twin.csv is the input file points.csv"]),
    "symlink-to-input": Case(["points.csv", "--k", "99", "--out", "link.csv"], _link("link.csv", "points.csv"), error=["--out link.csv is the input file"]),
    # where the labels go
    "private-output": Case(["points.csv", "--k", "3", "--out", "out.csv"], _private),
    "new-output": Case(["points.csv", "--k", "3", "--out", "new.csv"], umask=0o027),
    "symlink-through": Case(["points.csv", "--k", "3", "--out", "link.csv"], _linked_output),
    "dash": Case(["points.csv", "--k", "3", "--out", "-"]),
    "dev-stdout-pipe": Case(["points.csv", "--k", "3", "--out", "/dev/stdout"]),
    "dev-stdout-file": Case(["points.csv", "--k", "3", "--out", "/dev/stdout"], stdout="file"),
    "dev-stdout-unprivileged": Case(["points.npy", "--k", "3", "--out", "/dev/stdout"], unprivileged=True),
    "reader-stops": Case(["many.npy", "--k", "3"], _many_points, stdout="one line"),
    "unwritable-folder": Case(
        ["points.npy", "--k", "99", "--out", "locked/labels.csv"],
        _locked_folder,
        unprivileged=True,
        error=["locked/labels.csv: cannot write in the folder locked"],
    ),
    # files that cannot be read
    "unreadable": Case(
        ["points.csv", "--k", "3"], _unreadable, unprivileged=True, error=["points.csv: cannot read the file (Permission denied)", "expected a file"]
    ),
    "memory-csv": Case(["big.csv", "--k", "3", "--out", "out.csv"], _sparse_csv, memory=MEMORY, error=["big.csv: not enough memory to read its points"]),
    "memory-npy": Case(["big.npy", "--k", "3", "--out", "out.csv"], _sparse_npy, memory=MEMORY, error=["big.npy: not enough memory to read its points"]),
}


# --- running them -----------------------------------------------------------------------------


@dataclass
class Outcome:
    returncode: int
    stdout: bytes
    stderr: str
    folder: Path
    before: dict[str, Any]  # the folder's entries after setup, as _snapshot gives them
    skipped: str = ""
    after: dict[str, Any] = field(default_factory=dict)  # and after the command


def _snapshot(folder: Path) -> dict[str, Any]:
    """Every entry under ``folder``: a link's target, a file's mode and bytes (or, for a file too
    large to read here, its size and modification time), a folder's mode."""
    entries = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            entries[str(path.relative_to(folder))] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            entries[str(path.relative_to(folder))] = ("folder", stat.S_IMODE(info.st_mode))
        else:
            os.chmod(path, stat.S_IMODE(info.st_mode) | stat.S_IRUSR)  # an unreadable input is read here too
            content = path.read_bytes() if info.st_size < 1 << 20 else (info.st_size, info.st_mtime_ns)
            os.chmod(path, stat.S_IMODE(info.st_mode))
            entries[str(path.relative_to(folder))] = ("file", stat.S_IMODE(info.st_mode), content, info.st_nlink)
    return entries


def _preexec(case: Case) -> Callable[[], None]:
    def child() -> None:
        if case.umask is not None:
            os.umask(case.umask)
        if case.memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (case.memory, case.memory))

    return child


@functools.cache
def _unprivileged() -> list[str] | str:
    """The command prefix that runs a command as an unprivileged user (none unless root), or why
    there is none here."""
    if not ROOT:
        return []
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    try:
        probe = subprocess.run([*prefix, sys.executable, "-c", "import os; assert os.geteuid() != 0"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        return f"running as root, and setpriv cannot drop to an unprivileged user here ({exc})"
    if probe.returncode != 0:
        return f"running as root, and Python does not run as the user nobody here ({probe.stderr.strip()[-200:]})"
    return prefix


def _environment(case: Case, folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    if case.unprivileged:
        # A user without a writable cache would compile the numba kernels in every process (about a
        # minute); the kernels have nothing to do with what these cases test.
        env.update(HOME=str(folder), KTFRAME_NO_KERNELS="1")
    return env


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    # A folder that the user nobody can enter (pytest's own are private to the user running it).
    root = Path(tempfile.mkdtemp(prefix="ktframe-user-files-"))
    os.chmod(root, 0o755)
    started: dict[str, tuple[Case, Path, dict[str, Any], subprocess.Popen | None, str]] = {}
    try:
        for name, case in CASES.items():
            folder = root / name
            folder.mkdir(mode=0o755)
            os.chmod(folder, 0o755)
            (folder / "points.csv").write_text(CSV)
            np.save(folder / "points.npy", POINTS)
            (folder / "out.csv").write_bytes(PREVIOUS)
            for path in folder.iterdir():
                os.chmod(path, 0o644)  # whatever the umask: the user nobody reads them
            if case.setup:
                case.setup(folder)
            before = _snapshot(folder)
            while sum(process.poll() is None for *_, process, _ in started.values() if process) >= max(2, os.cpu_count() or 2):
                time.sleep(0.05)
            prefix = _unprivileged() if case.unprivileged else []
            if isinstance(prefix, str):
                started[name] = (case, folder, before, None, prefix)
                continue
            with open(root / f"{name}.captured.txt", "wb") if case.stdout == "file" else contextlib.nullcontext(subprocess.PIPE) as stdout:
                process = subprocess.Popen(
                    [*prefix, sys.executable, "-m", "ktframe.cli.main", "cluster", *case.args],
                    cwd=folder,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=subprocess.PIPE,
                    preexec_fn=_preexec(case),
                    env=_environment(case, folder),
                )
            started[name] = (case, folder, before, process, "")
        results = {}
        for name, (case, folder, before, process, skipped) in started.items():
            if process is None:
                results[name] = Outcome(-1, b"", "", folder, before, skipped)
                continue
            if case.stdout == "one line":
                first = process.stdout.readline()
                process.stdout.close()
                stderr = process.stderr.read().decode()
                process.wait(timeout=300)
                results[name] = Outcome(process.returncode, first, stderr, folder, before)
                continue
            stdout, stderr = process.communicate(timeout=300)
            if case.stdout == "file":
                stdout = (root / f"{name}.captured.txt").read_bytes()
            results[name] = Outcome(process.returncode, stdout, stderr.decode(), folder, before)
        for outcome in results.values():
            outcome.after = _snapshot(outcome.folder)  # taken before the folders go
        yield results
    finally:
        for path in [root, *root.rglob("*")]:
            if not path.is_symlink():
                os.chmod(path, 0o700)
        shutil.rmtree(root)


def outcome_of(outcomes: dict[str, Outcome], name: str) -> Outcome:
    outcome = outcomes[name]
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    return outcome


ERRORS = [name for name, case in CASES.items() if case.error]


@pytest.mark.parametrize("name", ERRORS)
def test_a_refusal_is_one_line_and_leaves_every_file_as_it_was(name: str, outcomes: dict[str, Outcome]) -> None:
    outcome = outcome_of(outcomes, name)
    assert "Traceback" not in outcome.stderr, outcome.stderr
    assert outcome.returncode == 2, outcome.stderr
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ktframe cluster: error: "), outcome.stderr
    for fragment in CASES[name].error:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert outcome.stdout == b""
    # byte for byte, with their modes, links and hard links: nothing made, changed or removed
    assert outcome.after == outcome.before


@pytest.mark.parametrize("name", ["hard-link", "symlink-to-input", "unwritable-folder"])
def test_the_output_is_checked_before_any_work(name: str, outcomes: dict[str, Outcome]) -> None:
    # --k 99 exceeds the 30 points: had the command read and clustered them first, it would say so
    outcome = outcome_of(outcomes, name)
    assert outcome.returncode == 2 and "k=99" not in outcome.stderr, outcome.stderr


def _succeeded(outcome: Outcome) -> None:
    assert outcome.returncode == 0, outcome.stderr
    assert "Traceback" not in outcome.stderr


def _others_unchanged(outcome: Outcome, *changed: str) -> None:
    """Every entry but ``changed`` as it was; no temporary file left anywhere."""
    assert {k: v for k, v in outcome.after.items() if k not in changed} == {k: v for k, v in outcome.before.items() if k not in changed}
    assert set(outcome.after) == set(outcome.before) | set(changed)


def test_an_existing_output_keeps_its_mode(outcomes: dict[str, Outcome]) -> None:
    outcome = outcome_of(outcomes, "private-output")
    _succeeded(outcome)
    kind, mode, content, _ = outcome.after["out.csv"]
    assert (kind, mode, content) == ("file", 0o600, LABELS)
    _others_unchanged(outcome, "out.csv")
    assert outcome.stdout.decode().endswith("labels written to out.csv\n")


def test_a_new_output_gets_the_mode_the_umask_gives(outcomes: dict[str, Outcome]) -> None:
    outcome = outcome_of(outcomes, "new-output")
    _succeeded(outcome)
    assert outcome.after["new.csv"][:3] == ("file", 0o640, LABELS)  # 0o666 less umask 0o027
    _others_unchanged(outcome, "new.csv")


def test_a_symlinked_output_is_written_through_and_stays_a_link(outcomes: dict[str, Outcome]) -> None:
    outcome = outcome_of(outcomes, "symlink-through")
    _succeeded(outcome)
    assert outcome.after["link.csv"] == ("link", "data/labels.csv")
    assert outcome.after["data/labels.csv"][:3] == ("file", 0o640, LABELS)
    _others_unchanged(outcome, "data/labels.csv")


@pytest.mark.parametrize("name", ["dash", "dev-stdout-pipe", "dev-stdout-file", "dev-stdout-unprivileged"])
def test_standard_output_is_written_as_a_stream(name: str, outcomes: dict[str, Outcome]) -> None:
    outcome = outcome_of(outcomes, name)
    _succeeded(outcome)
    assert outcome.stdout == LABELS  # the labels alone; the summary goes to stderr
    summary = outcome.stderr.splitlines()
    assert len(summary) == 1 and "objective" in summary[0], outcome.stderr
    _others_unchanged(outcome)
    assert os.path.islink("/dev/stdout") or not os.path.exists("/dev/stdout")  # never replaced


def test_a_reader_that_stops_early_is_one_line_and_exit_2(outcomes: dict[str, Outcome]) -> None:
    """The labels did not all arrive: never exit 0 on a partial output."""
    outcome = outcome_of(outcomes, "reader-stops")
    assert outcome.stdout == b"label\n"
    assert outcome.returncode == 2, outcome.stderr
    assert outcome.stderr.splitlines() == ["ktframe cluster: error: could not write to standard output (Broken pipe); expected a writable output"]


# --- the writer, in process -------------------------------------------------------------------


def test_the_writer_keeps_modes_follows_links_and_streams_into_a_pipe(tmp_path: Path) -> None:
    for mode in (0o600, 0o640, 0o755):
        path = tmp_path / f"file-{mode:o}"
        path.write_bytes(PREVIOUS)
        os.chmod(path, mode)
        write_atomically(path, ["new"])
        assert stat.S_IMODE(path.stat().st_mode) == mode and path.read_text() == "new\n"
    # a chain of links, and a link to a file not yet there: each written through to its target
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "target").write_bytes(PREVIOUS)
    os.symlink(tmp_path / "real" / "target", tmp_path / "first")
    os.symlink("first", tmp_path / "second")
    write_atomically(tmp_path / "second", b"through")
    assert os.readlink(tmp_path / "second") == "first" and (tmp_path / "real" / "target").read_bytes() == b"through"
    os.symlink("real/later", tmp_path / "dangling")
    write_atomically(tmp_path / "dangling", b"made")
    assert (tmp_path / "real" / "later").read_bytes() == b"made" and (tmp_path / "dangling").is_symlink()
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["later", "target"]  # no temporary file
    # a pipe is not replaced by a file: it gets the content
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_atomically(fifo, ["a", "b"])
    reader.join(timeout=30)
    assert received == [b"a\nb\n"] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_the_writer_checks_the_folder_as_a_command_does_up_front(tmp_path: Path) -> None:
    # one check: what output_path refuses before any work, write_atomically refuses the same way
    for path, message in [
        (tmp_path / "nowhere" / "x.csv", "the folder"),
        (tmp_path, "is a folder"),
    ]:
        with pytest.raises(InputError, match=message) as up_front:
            output_path(path)
        with pytest.raises(InputError) as writing:
            write_atomically(path, b"x")
        assert str(writing.value) == str(up_front.value)
    assert output_path(tmp_path / "new.csv") == tmp_path / "new.csv"


# --- numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, value", [(np.float64, 1e200), (np.float32, 1e20)])
@pytest.mark.parametrize("method", ["fit", "fit_predict", "predict", "score", "transform"])
def test_the_estimator_refuses_points_whose_squared_distances_overflow(dtype: type, value: float, method: str) -> None:
    X = POINTS.astype(dtype)
    X[7, 1] = -value
    estimator = TransformerKMeans(3, random_state=0).fit(POINTS.astype(dtype))
    with pytest.raises(InputError) as info:
        getattr(estimator, method)(X)
    name = np.dtype(dtype).name
    assert str(info.value) == (
        f"X: points reach magnitude {value:.3g}, whose squared distances overflow {name}; "
        f"expected magnitudes up to {magnitude_limit(2, getattr(torch, name)):.3g} in 2 dimensions: rescale the data (e.g. standardise it)"
    )
    with pytest.raises(InputError, match=f"overflow {name}"):  # as a tensor, and as many tasks
        getattr(estimator if method != "fit" else TransformerKMeans(3), method)(torch.from_numpy(X))
    with pytest.raises(InputError, match=f"overflow {name}"):
        TransformerKMeans(3).fit(np.stack([POINTS.astype(dtype), X]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", [1, 5])
def test_points_up_to_the_limit_cluster_to_a_finite_objective(dtype: torch.dtype, d: int) -> None:
    limit = magnitude_limit(d, dtype)
    below = torch.full((2, d), 0.99 * limit, dtype=dtype)
    below[1] *= -1
    for k in (1, 2):
        estimator = TransformerKMeans(k, random_state=0).fit(below)
        assert np.isfinite(estimator.inertia_) and torch.isfinite(estimator.cluster_centers_).all()
    above = below * 1.02
    with pytest.raises(InputError, match="rescale the data"):
        TransformerKMeans(1).fit(above)


def test_an_objective_that_is_not_finite_is_an_error_not_a_result() -> None:
    estimator = TransformerKMeans(1, random_state=0).fit(POINTS)
    before = estimator.cluster_centers_.copy()
    # each point within the limit, their sum of squared distances not
    summed = np.array([[6e153], [-6e153]] * 3)
    with pytest.raises(InputError, match="clustering X gave a k-means objective of inf: squared distances or their sum overflow float64"):
        TransformerKMeans(1).fit(summed)
    with pytest.raises(InputError, match="scoring X gave a k-means objective of inf"):
        TransformerKMeans(1).fit(summed[:1]).score(summed)
    # gamma times a squared distance overflows: the softmax is NaN
    with pytest.raises(InputError, match="objective of nan: gamma times squared distances.*or use a smaller gamma"):
        TransformerKMeans(3, gamma=1e308, max_iter=2).fit(POINTS)
    with pytest.raises(InputError):
        estimator.fit(summed)
    np.testing.assert_array_equal(estimator.cluster_centers_, before)  # a failed fit changes nothing


def test_the_model_refuses_points_and_centers_that_overflow() -> None:
    model = build_model("lloyd", d=2, k=3, n_layers=2, dtype="float64")
    X = torch.from_numpy(POINTS)[None]
    with pytest.raises(InputError, match="X: points reach magnitude 1e\\+200, whose squared distances overflow float64"):
        model(X * 1e200 / X.abs().max(), X[:, :3])
    with pytest.raises(InputError, match="C0: points reach magnitude"):
        model(X, X[:, :3] * 1e160)
    assert torch.isfinite(model(X, X[:, :3]).centers).all()


def test_the_estimator_names_the_shape_the_user_passed() -> None:
    for shape in [(0, 3), (4, 0), (0, 4, 2), (2, 0, 3)]:
        with pytest.raises(InputError) as info:
            TransformerKMeans(2).fit(np.zeros(shape))
        assert f"(shape={shape})" in str(info.value)
        assert "(1, " not in str(info.value) or shape[0] == 1, str(info.value)
    fitted = TransformerKMeans(2, random_state=0).fit(POINTS)
    with pytest.raises(InputError, match=r"0 sample\(s\) \(shape=\(0, 2\)\)") as info:
        fitted.predict(np.zeros((0, 2)))
    assert "(1, 0, 2)" not in str(info.value)


def test_verify_reports_a_model_that_overflows_as_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    # verify makes its own data in [0, 1]; at gamma = 1e308 gamma times a squared distance overflows
    # and the model's centers are NaN: a FAIL, exit 1, never a PASS
    from ktframe.cli.main import main

    assert main(["verify", "--n", "50", "--layers", "2", "--gamma", "1e308", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False and math.isnan(report["max_center_error"])
