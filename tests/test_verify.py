"""``ktframe verify``, run as a user runs it: the real command line, in a subprocess.

With no flag it runs the paper's data (n = 10 000, d = 2, k = 5, 10 layers, seed 5487) at the
setting the variant declares exact (``Variant.exact``: gamma = inf in float64 for lloyd); every
first-party variant passes there. ``--gamma`` and ``--dtype`` override the declared setting.

At the paper's finite temperature (``--gamma 1e4 --dtype float32``) the model is a soft clustering: a softmax at gamma = 1e4 cannot separate points whose two
nearest centers are within about 1/gamma in squared distance, so the assignment agreement is about
0.995, not 1, and the centers drift by up to ~1e-3 (docs/exactness.md). That is why the finite-gamma
checks ask for >= 0.99 and <= 1e-3, and the hard limit (gamma = inf) for exactly 1 and <= 1e-9.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["lloyd", "lloyd-dot"]
FIRST_PARTY = ["lloyd", "lloyd-dot", "soft", "spherical", "trimmed", "robust", "kmedoids"]
HARD_FLOAT64 = {"gamma": "inf", "dtype": "float64"}


@functools.cache
def ktframe(*args: str) -> subprocess.CompletedProcess:
    """Run ``ktframe ARGS`` once per distinct argument list (several tests read the same run)."""
    return subprocess.run(
        [sys.executable, "-m", "ktframe.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def verify_json(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = ktframe("verify", *args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    return proc, report


def check_report_shape(report: dict, layers: int) -> None:
    for key in ("log_objective_transformer", "log_objective_reference", "center_error_per_layer"):
        assert len(report[key]) == layers + 1, key
        assert all(math.isfinite(v) for v in report[key]), key
    # Layer 0 is the common start: the same initial centers, the same objective.
    assert report["center_error_per_layer"][0] == 0.0
    assert report["log_objective_transformer"][0] == report["log_objective_reference"][0]
    assert report["max_center_error"] == max(report["center_error_per_layer"])
    # Lloyd's algorithm never increases the objective.
    ref = report["log_objective_reference"]
    assert all(b <= a + 1e-12 for a, b in zip(ref, ref[1:]))


# --- finite gamma: one flag away from the declared exact setting -----------------------------------

# lloyd: --gamma alone replaces the declared gamma = inf and keeps the declared float64;
# lloyd-dot: the paper's own check, float32 too.
FINITE = {"lloyd": ("--gamma", "1e4"), "lloyd-dot": ("--gamma", "1e4", "--dtype", "float32")}


@pytest.mark.parametrize("variant", VARIANTS)
def test_gamma_flag_overrides_the_declared_exact_setting(variant):
    proc, report = verify_json("--variant", variant, *FINITE[variant])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert report["variant"] == variant
    dtype = "float64" if variant == "lloyd" else "float32"
    assert (report["n"], report["d"], report["k"], report["layers"], report["seed"], report["dtype"]) == (10_000, 2, 5, 10, 5487, dtype)
    assert report["gamma"] == 1e4
    assert report["exact_setting"] == HARD_FLOAT64 and report["at_exact_setting"] is False
    assert report["overridden"] == (["gamma"] if variant == "lloyd" else ["gamma", "dtype"])
    assert report["max_center_error"] <= 1e-3
    assert report["assignment_agreement"] >= 0.99
    assert report["passed"] is True
    assert report["tolerance"] == {"center_error": 1e-3, "agreement": 0.99}
    check_report_shape(report, 10)
    # The soft model follows Lloyd's objective closely at every layer.
    for a, b in zip(report["log_objective_transformer"], report["log_objective_reference"]):
        assert abs(a - b) < 2e-3


# --- the hard limit: exact, and what verify runs with no flag -----------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_hard_limit_float64_is_exact(variant):
    proc, report = verify_json("--variant", variant)  # the declared exact setting: gamma = inf, float64
    assert proc.returncode == 0, proc.stderr
    assert report["gamma"] == "inf" and report["dtype"] == "float64"
    assert report["exact_setting"] == HARD_FLOAT64 and report["at_exact_setting"] is True and report["overridden"] == []
    assert report["assignment_agreement"] == 1.0
    assert report["max_center_error"] <= 1e-9
    assert report["one_hot_rows"] == report["n"] == 10_000
    assert report["passed"] is True
    assert report["tolerance"] == {"center_error": 1e-9, "agreement": 1.0}
    check_report_shape(report, 10)
    for a, b in zip(report["log_objective_transformer"], report["log_objective_reference"]):
        assert a == pytest.approx(b, abs=1e-12)


@pytest.fixture(scope="module")
def declared_runs():
    """``ktframe verify --variant NAME --json`` of every first-party variant with no flag but a
    smaller ``--n`` (the paper's 10 000 points take minutes over all of them), two at a time."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(FIRST_PARTY, pool.map(lambda name: ktframe("verify", "--variant", name, "--n", "300", "--json"), FIRST_PARTY)))


@pytest.mark.parametrize("variant", FIRST_PARTY)
def test_every_first_party_variant_passes_at_its_declared_exact_setting(declared_runs, variant):
    proc = declared_runs[variant]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is True and report["variant"] == variant
    assert report["at_exact_setting"] is True and report["overridden"] == []
    assert report["exact_setting"] == ({"gamma": 100.0, "dtype": "float64"} if variant == "soft" else HARD_FLOAT64)
    assert (report["gamma"], report["dtype"]) == (report["exact_setting"]["gamma"], "float64")
    assert report["max_center_error"] <= 1e-9 and report["assignment_agreement"] == 1.0
    assert len(report["center_error_per_layer"]) == 11 and report["center_error_per_layer"][0] == 0.0  # 10 layers


# --- table output and the failing exit code -----------------------------------------------------


def test_table_output_passes():
    # No --variant: the default variant is lloyd.
    proc = ktframe("verify", "--n", "300", "--layers", "3", "--gamma", "inf", "--dtype", "float64")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "PASS"
    assert "PASS" in proc.stdout and "FAIL" not in proc.stdout
    assert lines[0] == "ktframe verify: lloyd against Lloyd's algorithm"
    assert "n=300 d=2 k=5 layers=3 gamma=inf seed=5487 dtype=float64" in proc.stdout
    assert lines[2] == "setting: gamma=inf dtype=float64, the declared exact setting of lloyd"
    # One row per layer, the start included, each with a center error at float64 rounding.
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2, 3]
    assert float(rows[0][-1]) == 0.0
    assert all(float(r[-1]) <= 1e-15 for r in rows)


def test_outside_tolerance_fails_with_exit_1():
    # gamma = 10 is far too soft to follow Lloyd's hard assignments: the check must say so.
    proc = ktframe("verify", "--n", "500", "--layers", "4", "--gamma", "10")
    assert proc.returncode == 1
    assert proc.stderr == ""
    assert proc.stdout.strip().splitlines()[-1] == "FAIL"
    assert "PASS" not in proc.stdout
    assert "setting: not the declared exact setting of lloyd (gamma=inf dtype=float64); overridden: gamma" in proc.stdout


# --- bad input: exit 2, one line, no traceback --------------------------------------------------

BAD_ARGUMENTS = [
    (("--variant", "nope"), "unknown variant 'nope'"),
    (("--variant", "lloyd-dto", "--json"), "did you mean 'lloyd-dot'"),
    (("--k", "0"), "k must be an integer >= 1"),
    (("--gamma", "-1", "--json"), "gamma must be a positive number"),
    (("--gamma", "nan"), "gamma must be a positive number"),
    (("--n", "3", "--k", "5", "--json"), "exceeds the number of points"),
    (("--dtype", "float16"), "float16"),
]


@pytest.fixture(scope="module")
def bad_runs():
    """All the bad-argument runs, two at a time (each is mostly the start-up of Python and torch)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda case: ktframe("verify", *case[0]), BAD_ARGUMENTS))
    return {case[0]: run for case, run in zip(BAD_ARGUMENTS, runs)}


@pytest.mark.parametrize("args, mentions", BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_exit_2_with_one_line(bad_runs, args, mentions):
    proc = bad_runs[args]
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ktframe verify: error:")
    assert mentions in lines[0]
    assert proc.stdout == ""
