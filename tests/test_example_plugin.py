"""The third-party path, end to end: ``plugins/ktframe-kmedians`` is a package with its own
pyproject.toml, pip-installed here into a temporary folder exactly as a user would install it
from an index, then found, listed, verified, tested with its own suite and trained by the real
command line, with no change to ktframe itself.

The runs are slow to start (torch), so all of them start at once, in parallel.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import distributions as dists
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "plugins" / "ktframe-kmedians"
FIRST_PARTY = ("kmedoids", "learned", "lloyd", "lloyd-dot", "robust", "soft", "spherical", "trimmed")
TINY = [
    "data.n=24", "data.d=2", "data.k=3", "data.batch_size=4", "data.val_tasks=4", "data.val_batch_size=4",
    "trainer.max_steps=4", "trainer.val_every=2", "trainer.progress_bar=false", "logger.kind=csv", "name=kmedians",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("example-plugin")
    site = root / "site"
    dists.pip_install(EXAMPLE, site)
    env = dists.plugin_env([site], strict=True)

    def own_suite():
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE / "tests")],
            cwd=root, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        return dists.Run(("pytest",), done.returncode, done.stdout, done.stderr)

    def fit_then_eval():
        fitted = dists.ktframe(["fit", "variant=kmedians", f"root={root / 'runs'}", *TINY], [site], strict=True, cwd=root)
        ckpt = root / "runs" / "kmedians" / "checkpoints" / "best.ckpt"
        evaluated = dists.ktframe(
            ["eval", str(ckpt), "eval.tasks=4", "eval.batch_size=4", "eval.steps=3", "eval.ns=[24]", "--json"], [site], strict=True, cwd=root
        )
        return fitted, evaluated

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            "plugins": pool.submit(dists.ktframe, ["plugins", "--json"], [site], strict=True, cwd=root),
            # No --gamma or --dtype: the setting the plugin declares exact (gamma=inf, float64).
            "verify": pool.submit(dists.ktframe, ["verify", "--variant", "kmedians", "--n", "200", "--layers", "4", "--json"], [site], strict=True, cwd=root),
            "suite": pool.submit(own_suite),
            "fit": pool.submit(fit_then_eval),
        }
        return {name: future.result() for name, future in futures.items()} | {"root": root}


def test_it_is_listed_with_every_first_party_variant_and_their_distributions(runs):
    run = runs["plugins"]
    assert run.returncode == 0, run
    info = run.json()
    assert info["failures"] == []
    variants = {v["name"]: v for v in info["variants"]}
    assert sorted(variants) == sorted([*FIRST_PARTY, "kmedians"])
    for name in FIRST_PARTY:
        assert (variants[name]["plugin"], variants[name]["distribution"]) == (name, "ktframe"), variants[name]
    assert variants["kmedians"]["distribution"] == "ktframe-kmedians" and variants["kmedians"]["classical"] == "k-medians"
    assert variants["kmedians"]["exact"] == {"gamma": "inf", "dtype": "float64"}
    example = next(p for p in info["plugins"] if p["name"] == "kmedians")
    assert example == {
        "name": "kmedians",
        "distribution": "ktframe-kmedians",
        "version": "0.1.0",
        "registers": {"score": ["manhattan", "cluster-coordinate"], "map": ["median"], "variant": ["kmedians"]},
    }
    # The new first-party components are listed under ktframe's own built-in modules.
    builtins = {p["name"]: p["registers"] for p in info["plugins"] if p["distribution"] == "ktframe"}
    assert "cluster-euclidean" in builtins["ktframe.components.scores"]["score"]
    assert {"normmax", "sparsemax", "gumbel-hardmax"} <= set(builtins["ktframe.components.maps"]["map"])
    assert "sphere" in builtins["ktframe.components.norms"]["norm"]


def test_it_passes_verify_against_its_own_reference(runs):
    run = runs["verify"]
    assert run.returncode == 0, run
    report = run.json()
    assert (report["variant"], report["classical"], report["gamma"], report["dtype"]) == ("kmedians", "k-medians", "inf", "float64")
    assert report["exact_setting"] == {"gamma": "inf", "dtype": "float64"} and report["at_exact_setting"] is True
    assert report["passed"] is True and report["max_center_error"] <= 1e-9 and report["assignment_agreement"] == 1.0
    # Its objective is k-medians', not Lloyd's: the layers move the centers.
    assert report["center_error_per_layer"][0] == 0.0 and len(set(report["log_objective_transformer"])) > 1


def test_its_own_test_suite_runs_ktframe_conformance_checks(runs):
    run = runs["suite"]
    assert run.returncode == 0, run
    assert "9 passed" in run.stdout, run  # seven conformance checks and its two own tests


def test_it_trains_and_evaluates_against_its_reference(runs):
    fitted, evaluated = runs["fit"]
    assert fitted.returncode == 0, fitted
    assert fitted.stdout.startswith("run "), fitted
    config = (runs["root"] / "runs" / "kmedians" / "config.yaml").read_text()
    assert "variant: kmedians" in config and "gamma: .inf" in config  # the setting the plugin declares
    assert evaluated.returncode == 0, evaluated
    report = evaluated.json()
    assert (report["variant"], report["reference"]) == ("kmedians", "k-medians")
    assert set(report["log_objective"]) == {"model", "lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++", "reference"}
    assert all(len(v) == 4 and all(math.isfinite(x) for x in v) for v in report["log_objective"].values())
    # Both start from the same initial centers.
    assert report["log_objective"]["reference"][0] == pytest.approx(report["log_objective"]["model"][0])
    assert json.loads((runs["root"] / "runs" / "kmedians" / "eval" / "eval.json").read_text())["variant"] == "kmedians"
