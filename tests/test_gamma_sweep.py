"""``ktframe gamma-sweep``: the temperature sweep of the hand-built construction, end to end on a
tiny grid, its tasks, its grids and its bad input."""

from __future__ import annotations

import csv
import fcntl
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import ktframe
from ktframe.experiments import gamma_sweep

TINY = "k: [2, 3]\nd: [1, 2]\nn: [30, 60]\nscale: [1, 5]\ngamma: [1, 100]\n"


def ktframe_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktframe.cli.main", *args], capture_output=True, text=True, cwd=cwd)


def test_a_tiny_grid_end_to_end(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    done = ktframe_cli("gamma-sweep", "--grid", "tiny.yaml", "--out", "sweep", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["cells"] == 32
    rows = list(csv.DictReader((tmp_path / "sweep" / "gamma-sweep.csv").open()))
    assert list(rows[0]) == ["k", "d", "n", "scale", "gamma", "delta"]
    assert {(r["k"], r["d"], r["n"], r["scale"], r["gamma"]) for r in rows} == {
        (k, d, n, s, g) for k in "23" for d in "12" for n in ("30", "60") for s in "15" for g in ("1", "100")
    }
    assert all(math.isfinite(float(r["delta"])) for r in rows)  # no NaN, emptied clusters included
    # Near the hard limit the softmax assignment is Lloyd's: at γ = 100 on data of scale 5 the
    # squared distances are large against 1/γ, and most cells end where Lloyd does.
    near = [abs(float(r["delta"])) < 1e-3 for r in rows if r["gamma"] == "100" and r["scale"] == "5"]
    assert sum(near) >= 6 and len(near) == 8
    for name in gamma_sweep.HEATMAPS:
        assert (tmp_path / "sweep" / f"gamma-sweep-{name}.png").stat().st_size > 1000
    assert set(summary["median_delta_by_gamma"]) == {"1.0", "100.0"}
    assert not [p for p in (tmp_path / "sweep").iterdir() if p.name.startswith(".")]  # no temporary file left

    # The finished sweep against another in the authors' format: theirs 0.5 higher everywhere,
    # one cell empty and one NaN there (as clusters that emptied leave them).
    authors = ["Clusters,Iteration,Dimensions,Gamma,Points,Loss,Scale"]
    for i, r in enumerate(rows):
        loss = "" if i == 0 else "nan" if i == 1 else repr(float(r["delta"]) + 0.5)
        authors.append(f"{r['k']},-1,{r['d']},{r['gamma']},{r['n']},{loss},{r['scale']}")
    (tmp_path / "authors.csv").write_text("\n".join(authors) + "\n")
    redone = ktframe_cli("gamma-sweep", "--from", "sweep/gamma-sweep.csv", "--against", "authors.csv", "--out", "again", "--json", cwd=tmp_path)
    assert redone.returncode == 0, redone.stderr
    comparison = json.loads(redone.stdout)["against"]
    assert (comparison["cells"], comparison["shared"]) == (32, 30)
    for axis in ("by_gamma", "by_scale", "by_k"):
        ours, theirs = comparison[axis]["ours"], comparison[axis]["theirs"]
        assert ours.keys() == theirs.keys() and all(math.isclose(theirs[key], ours[key] + 0.5, abs_tol=1e-6) for key in ours)
    # Cell by cell: theirs is ours shifted, so perfectly correlated, and never at Lloyd's.
    assert all(math.isclose(r, 1.0, abs_tol=1e-9) for r in comparison["correlation"].values())
    assert set(comparison["at_lloyd"]["theirs"].values()) == {0.0} and comparison["at_lloyd"]["ours"]["100.0"] > 0.5
    assert (tmp_path / "again" / "gamma-sweep.csv").read_bytes() == (tmp_path / "sweep" / "gamma-sweep.csv").read_bytes()
    text = (tmp_path / "again" / "gamma-sweep-against.md").read_text()
    assert "| ktframe |" in text and "| correlation | 1.000 | 1.000 |" in text


def test_the_tasks_follow_the_papers_protocol():
    generator = torch.Generator().manual_seed(0)
    X, C0 = gamma_sweep.tasks(3, 103, 4, 5, 7.0, generator, torch.float64)
    assert X.shape == (3, 100, 4)  # n // k points around each of the k centers
    assert torch.equal(C0, X[:, :5])  # the first k points of the shuffled data
    assert torch.allclose(X.amin(dim=1), torch.zeros(3, 4, dtype=X.dtype)) and torch.allclose(X.amax(dim=1), torch.full((3, 4), 7.0, dtype=X.dtype))


def test_the_quick_grid_is_every_third_value_of_the_papers_axes():
    paper, quick = gamma_sweep.PAPER, gamma_sweep.GRIDS["quick"]
    assert paper.cells == 30_000 and paper.n[0] == 100 and paper.n[-1] == 1_000_000
    assert quick.k == (5, 20, 35, 50) and quick.d == (1, 4, 7, 10) and quick.n == (100, 2154, 46415, 1_000_000)
    assert quick.gamma == paper.gamma


def test_soft_with_identity_resets_is_soft_with_attention_resets():
    # The sweep runs soft with its resets in identity mode (O(n) rather than an n × n arg-max):
    # exact at any gamma, duplicate points included.
    g = torch.Generator().manual_seed(0)
    X = torch.rand(3, 120, 3, generator=g, dtype=torch.float64)
    X[0, 5] = X[0, 6]
    for gamma in (1.0, 100.0):
        plain, identity = (ktframe.build_model("soft", d=3, k=4, n_layers=6, gamma=gamma, dtype="float64", reset=r) for r in ("attention", "identity"))
        with torch.no_grad():
            assert torch.equal(plain(X, X[:, :4]).trajectory, identity(X, X[:, :4]).trajectory)


BAD_INPUT = {
    "unknown grid": (["--grid", "huge"], "unknown grid 'huge'; expected one of: paper, quick, or a YAML file"),
    "unknown variant": (["--variant", "nosuch"], "nosuch"),
    "grid file": (["--grid", "bad.yaml"], "grid file bad.yaml: expected exactly the axes k, d, n, scale, gamma"),
    "unwritable": (["--out", "a-file/sweep"], "a-file/sweep: cannot write there"),  # a folder that cannot be made, even by root
    "seed": (["--seed", "-1"], "--seed -1: expected a seed >= 0"),
    "nothing to resume": (["--resume"], "--resume: gamma-sweep holds no unfinished sweep"),
    "from": (["--from", "bad.csv"], "bad.csv: expected a CSV whose header is k,d,n,scale,gamma,delta"),
    "from and resume": (["--from", "bad.csv", "--resume"], "--from takes a finished sweep and --resume goes on with an unfinished one"),
    "against": (
        ["--against", "bad.csv"],
        "bad.csv: expected the columns k,d,n,scale,gamma,delta (a gamma-sweep.csv) or Clusters,Dimensions,Points,Scale,Gamma,Loss",
    ),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess, list[str], list[str]]]:
    """Every BAD_INPUT case in a folder of its own, run all at once (each start of the CLI costs
    seconds, mostly importing): what it did, and the folder's files before and after."""

    def attempt(case: str):
        folder = tmp_path_factory.mktemp(case.replace(" ", "-"))
        (folder / "bad.yaml").write_text("k: [2]\nd: [1]\n")
        (folder / "bad.csv").write_text("a,b\n1,2\n")
        (folder / "a-file").write_text("not a folder")
        before = sorted(p.name for p in folder.rglob("*"))
        done = ktframe_cli("gamma-sweep", *BAD_INPUT[case][0], cwd=folder)
        return done, before, sorted(p.name for p in folder.rglob("*"))

    with ThreadPoolExecutor(len(BAD_INPUT)) as pool:
        return dict(zip(BAD_INPUT, pool.map(attempt, BAD_INPUT)))


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(refused, case):
    done, before, after = refused[case]
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and BAD_INPUT[case][1] in done.stderr and "Traceback" not in done.stderr
    assert after == before


def test_a_stopped_sweep_goes_on_with_resume_to_the_same_files(tmp_path, kernels_by_ktframe_rule):
    (tmp_path / "tiny.yaml").write_text(TINY)
    chosen = gamma_sweep.grid(str(tmp_path / "tiny.yaml"))
    gamma_sweep.run("soft", chosen, tmp_path / "whole")
    # Stopped as Ctrl-C stops it, after three of the grid's eight batches.
    batches = []

    def stop(cells):
        batches.append(cells)
        if len(batches) == 4:  # the first call counts the batches already done (none)
            raise KeyboardInterrupt

    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        gamma_sweep.run("soft", chosen, cut, progress=stop)
    assert sorted(p.name for p in cut.iterdir()) == [gamma_sweep.PARTIAL, gamma_sweep.SETTINGS]  # no sweep files yet
    journal = cut / gamma_sweep.PARTIAL
    assert len(journal.read_text().splitlines()) == 1 + 3 * 4
    with journal.open("a") as out:
        out.write("3,2,60,5,1")  # a row that a stop cut short
    before = {p.name: p.read_bytes() for p in cut.iterdir()}

    refusals = {
        ("--grid", "tiny.yaml"): "cut holds an unfinished sweep; expected --resume to continue it, or another --out",
        ("--grid", "tiny.yaml", "--resume", "--seed", "1"): "--resume: the sweep in cut was started with seed 0; expected the options it was started with",
        ("--grid", "quick", "--resume"): "was started with another grid",
        ("--grid", "tiny.yaml", "--resume"): "cut: another gamma-sweep is writing this sweep; expected one process per sweep",
    }
    # The lock that a sweep still running holds on its journal.
    with journal.open() as held, ThreadPoolExecutor(len(refusals)) as pool:  # each start of the CLI costs seconds, mostly importing
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused = dict(zip(refusals, pool.map(lambda args: ktframe_cli("gamma-sweep", "--out", "cut", *args, cwd=tmp_path), refusals)))
    for args, message in refusals.items():
        done = refused[args]
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert {p.name: p.read_bytes() for p in cut.iterdir()} == before

    resumed = ktframe_cli("gamma-sweep", "--grid", "tiny.yaml", "--out", "cut", "--resume", "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["cells"] == 32
    assert (cut / "gamma-sweep.csv").read_bytes() == (tmp_path / "whole" / "gamma-sweep.csv").read_bytes()
    assert not (cut / gamma_sweep.PARTIAL).exists() and not (cut / gamma_sweep.SETTINGS).exists()


def test_a_cells_task_depends_on_the_seed_and_the_cell_alone():
    draw = lambda seed, k, d, n, scale: gamma_sweep.tasks(1, n, d, k, scale, gamma_sweep.cell_generator(seed, k, d, n, scale), torch.float32)[0]
    assert torch.equal(draw(0, 3, 2, 60, 5), draw(0, 3, 2, 60, 5))
    assert not torch.equal(draw(0, 3, 2, 60, 5), draw(1, 3, 2, 60, 5)) and not torch.equal(draw(0, 3, 2, 60, 5), draw(0, 3, 2, 60, 4))
    # So a cell comes out alike in any grid that holds it, batched with other cells or alone.
    small = gamma_sweep.Grid(k=(3,), d=(2,), n=(60,), scale=(5,), gamma=(1.0, 100.0))
    large = gamma_sweep.Grid(k=(2, 3), d=(2,), n=(30, 60), scale=(1, 5), gamma=(1.0, 100.0))
    alone = {(r["gamma"]): r["delta"] for rows in gamma_sweep.sweep("soft", small) for r in rows}
    among = {(r["gamma"]): r["delta"] for rows in gamma_sweep.sweep("soft", large) for r in rows if (r["k"], r["n"], r["scale"]) == (3, 60, 5)}
    assert alone.keys() == among.keys() and all(math.isclose(alone[g], among[g], rel_tol=1e-5, abs_tol=1e-6) for g in alone)
