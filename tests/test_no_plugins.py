"""``ktframe --no-plugins COMMAND``: ktframe alone, its built-in components and its own variants (entry
points of the ktframe distribution), no other distribution's plugin: every command works (fit, eval,
report, config, plugins, verify, cluster). A third-party variant named under it is one line that
says which plugins are disabled (tests/test_plugins.py installs one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_training import TINY, ok, one_line_error, run_cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One tiny fit under --no-plugins, to the end (its figures included): the folder it ran in."""
    home = tmp_path_factory.mktemp("no-plugins")
    done = ok(run_cli(["--no-plugins", "fit", *TINY, f"root={home / 'runs'}", "name=core", "logger.kind=csv"], home))
    assert done.stdout.splitlines()[0].startswith("run ")
    return home


def test_fit_runs_to_the_end_and_draws_the_learned_heads_alone(trained):
    run_dir = trained / "runs" / "core"
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 20
    # The QᵀK figure, which draws the learned heads beside the hand-built `lloyd` ones.
    assert sorted(p.name for p in (run_dir / "figures").iterdir()) == ["attention.png", "objective.png", "qk.png", "trajectories.png"]


def test_eval(trained):
    checkpoint = trained / "runs" / "core" / "checkpoints" / "last.ckpt"
    done = ok(run_cli(["--no-plugins", "eval", str(checkpoint), "eval.tasks=4", "eval.batch_size=4", "eval.steps=2", "eval.ns=[16]", "--json"], trained))
    assert set(json.loads(done.stdout)["log_objective"]) == {"model", "lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++"}


def test_report(trained):
    done = ok(run_cli(["--no-plugins", "report", str(trained / "runs"), "--json", "--out", str(trained / "report")], trained))
    assert json.loads(done.stdout)
    assert (trained / "report" / "report.json").is_file()


def test_config_show(tmp_path):
    done = ok(run_cli(["--no-plugins", "config", "show", "optim.lr=0.5"], tmp_path, timeout=120))
    assert "  lr: 0.5" in done.stdout.splitlines()


def test_plugins_lists_ktframe_alone(tmp_path):
    info = json.loads(ok(run_cli(["--no-plugins", "plugins", "--json"], tmp_path, timeout=120)).stdout)
    assert info["failures"] == [] and {"learned", "lloyd", "soft"} <= {v["name"] for v in info["variants"]}
    assert all(p["distribution"] == "ktframe" for p in info["plugins"])


def test_verify_runs_a_first_party_variant(tmp_path):
    done = ok(run_cli(["--no-plugins", "verify", "--n", "300", "--json"], tmp_path, timeout=300))
    assert json.loads(done.stdout)["passed"] is True


def test_a_third_party_variant_is_one_line_that_says_plugins_are_disabled(tmp_path):
    points = tmp_path / "points.csv"
    points.write_text("".join(f"{i % 3},{i % 5}\n" for i in range(30)))
    line = one_line_error(run_cli(["--no-plugins", "cluster", str(points), "--k", "2", "--variant", "kmedians"], tmp_path, timeout=120), "cluster")
    assert "'kmedians'" in line and "plugins of other distributions than ktframe are disabled" in line, line
