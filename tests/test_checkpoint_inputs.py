"""Checkpoints that load weights-only but are not ktframe's, and the cluster flags that would hang:
each refused in one line naming the file and the part (or the flag), exit 2, every earlier file intact."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch
from test_training import REPO, fit, one_line_error, run_cli

from ktframe.core.errors import InputError

SOURCE = REPO / "results" / "anyk-seed0.ckpt"


def _drop(path: tuple[str, ...]):
    def edit(checkpoint: dict) -> None:
        *parents, last = path
        node = checkpoint
        for key in parents:
            node = node[key]
        del node[last]

    return edit


def _set(path: tuple[str, ...], value):
    def edit(checkpoint: dict) -> None:
        *parents, last = path
        node = checkpoint
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _nan(checkpoint: dict) -> None:
    next(iter(checkpoint["state_dict"].values()))[...] = math.nan


CONFIG = ("hyper_parameters", "config")
# name: (the edit, what the one line must say)
BROKEN = {
    "no-model": (_drop((*CONFIG, "model")), "has no 'model' section"),
    "no-data": (_drop((*CONFIG, "data")), "has no 'data' section"),
    "no-eval": (_drop((*CONFIG, "eval")), "has no 'eval' section"),
    "no-run-id": (_drop((*CONFIG, "run_id")), "no 'run_id'"),
    "model-list": (_set((*CONFIG, "model"), [1, 2]), "'model' section, not a mapping"),
    "state-list": (_set(("state_dict",), [1]), "no state_dict mapping"),
    "state-not-tensor": (_set(("state_dict", "model.extra"), "text"), "state_dict['model.extra'] is a str, not a tensor"),
    "huge-d": (_set((*CONFIG, "data", "d"), 10**12), "data.d must be an integer from 1 to"),
    "huge-layers": (_set((*CONFIG, "model", "n_layers"), 10**9), "model.n_layers must be an integer from 1 to"),
    "bad-steps": (_set((*CONFIG, "eval", "steps"), -3), "eval.steps must be an integer from 1 to"),
    "lloyd-over-steps": (_set((*CONFIG, "eval", "lloyd_last"), 50), "eval.lloyd_last=50 exceeds its eval.steps=20"),
    "nan-weights": (_nan, "its weights are not finite (state_dict['model."),
}


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> dict[str, Path]:
    """Each edit of a real checkpoint of ktframe fit, saved with torch.save, made once per module."""
    folder = tmp_path_factory.mktemp("broken")
    paths = {}
    for name, (edit, _) in BROKEN.items():
        checkpoint = torch.load(SOURCE, map_location="cpu", weights_only=True)
        edit(checkpoint)
        paths[name] = folder / f"{name}.ckpt"
        torch.save(checkpoint, paths[name])
    return paths


def _digests(folder: Path) -> dict[Path, str]:
    return {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture
def points(tmp_path: Path) -> Path:
    path = tmp_path / "points.csv"
    path.write_text("".join(f"{i % 7},{i % 5}\n" for i in range(40)))
    return path


def _refused(done, command: str, path: Path, expected: str) -> None:
    line = one_line_error(done, command)
    assert str(path) in line and expected in line, line
    assert "rescale the data" not in line and "C0" not in line and "lloyd_last=" not in line.replace("eval.lloyd_last=", "")


@pytest.mark.parametrize("name", ["no-model", "no-eval", "model-list", "state-not-tensor", "huge-d", "lloyd-over-steps", "nan-weights"])
def test_cluster_refuses_a_checkpoint_not_of_ktframe(broken, points, tmp_path, name):
    before = _digests(tmp_path) | _digests(broken[name].parent)
    done = run_cli(["cluster", str(points), "--k", "3", "--checkpoint", str(broken[name]), "--out", str(tmp_path / "labels.csv")], tmp_path)
    _refused(done, "cluster", broken[name], BROKEN[name][1])
    assert not (tmp_path / "labels.csv").exists()
    assert _digests(tmp_path) | _digests(broken[name].parent) == before


@pytest.mark.parametrize("name", ["no-data", "no-run-id", "state-list", "huge-layers", "bad-steps", "nan-weights"])
def test_eval_refuses_a_checkpoint_not_of_ktframe(broken, tmp_path, name):
    before = _digests(broken[name].parent)
    done = run_cli(["eval", str(broken[name]), "--out", str(tmp_path / "eval.json")], tmp_path)
    _refused(done, "eval", broken[name], BROKEN[name][1])
    assert not (tmp_path / "eval.json").exists()
    assert _digests(broken[name].parent) == before


@pytest.mark.parametrize("name", ["no-model", "huge-layers", "nan-weights"])
def test_estimator_refuses_a_checkpoint_not_of_ktframe(broken, name):
    from ktframe import TransformerKMeans

    X = torch.rand(40, 2, dtype=torch.float64).numpy()
    with pytest.raises(InputError) as info:
        TransformerKMeans(3, checkpoint=str(broken[name])).fit(X)
    assert str(broken[name]) in str(info.value) and BROKEN[name][1] in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key", ["resume", "model.init_from"])
def test_fit_refuses_a_checkpoint_not_of_ktframe(broken, tmp_path, key):
    done = fit(tmp_path, f"{key}={broken['no-model']}")
    _refused(done, "fit", broken["no-model"], BROKEN["no-model"][1])
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize(
    "flag, value",
    [("--seed", str(2**64)), ("--layers", "1000000000"), ("--swaps", str(10**21)), ("--lloyd-last", "2000000"), ("--layers", "1e9")],
)
def test_cluster_refuses_counts_beyond_the_shared_bounds(points, tmp_path, flag, value):
    before = _digests(tmp_path)
    done = run_cli(["cluster", str(points), "--k", "3", flag, value, "--out", str(tmp_path / "labels.csv")], tmp_path, timeout=60)
    line = one_line_error(done, "cluster")
    assert f"argument {flag}:" in line and value in line, line
    assert _digests(tmp_path) == before
