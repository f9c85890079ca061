"""CONTRIBUTING.md's smallest variant, exactly as written there: the files between its
``<!-- smallest-variant -->`` markers are written into a throwaway project, pip-installed into a
temporary folder like any distribution, then listed, verified and checked for conformance by the
real command line and ``ktframe.plugin.testing``, in fresh interpreters."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import distributions as dists
import pytest

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- smallest-variant -->", "<!-- /smallest-variant -->"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def snippet() -> dict[str, str]:
    """File name -> text, for every code block between the markers; each block's first line is a
    comment naming its file."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert text.count(START) == 1 and text.count(END) == 1, "CONTRIBUTING.md marks its smallest variant once"
    files = {}
    for _, body in BLOCK.findall(text[text.index(START) : text.index(END)]):
        first = body.splitlines()[0]
        assert first.startswith("# "), f"the block does not start by naming its file: {first!r}"
        files[first.removeprefix("# ").strip()] = body
    return files


def test_the_smallest_variant_is_small_and_uses_public_names_only():
    files = snippet()
    assert sorted(files) == ["my_variant.py", "pyproject.toml"]
    code = files["my_variant.py"]
    assert len(code.splitlines()) <= 30
    imported = [name.strip() for line in code.splitlines() if line.startswith("from ") for name in line.split(" import ")[1].split(",")]
    assert imported and not [name for name in imported if name.startswith("_")]
    assert not re.search(r"\._[a-z]", code), "the snippet uses a private attribute"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("smallest-variant")
    project, site = root / "ktframe-my-lloyd", root / "site"
    project.mkdir()
    for name, text in snippet().items():
        (project / name).write_text(text)
    dists.pip_install(project, site)

    def conformance():
        code = "from ktframe.plugin.testing import check_variant; print(' '.join(check_variant('my-lloyd')))"
        done = subprocess.run([sys.executable, "-c", code], cwd=root, env=dists.plugin_env([site], strict=True), capture_output=True, text=True, timeout=600)
        return dists.Run(("check_variant",), done.returncode, done.stdout, done.stderr)

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            "plugins": pool.submit(dists.ktframe, ["plugins", "--json"], [site], strict=True, cwd=root),
            "verify": pool.submit(dists.ktframe, ["verify", "--variant", "my-lloyd", "--json"], [site], strict=True, cwd=root),
            "conformance": pool.submit(conformance),
        }
        return {name: future.result() for name, future in futures.items()}


def test_it_is_listed_with_its_distribution_and_exact_setting(runs):
    run = runs["plugins"]
    assert run.returncode == 0, run
    info = run.json()
    assert info["failures"] == []
    plugin = next(p for p in info["plugins"] if p["name"] == "my-lloyd")
    assert plugin == {"name": "my-lloyd", "distribution": "ktframe-my-lloyd", "version": "0.1.0", "registers": {"variant": ["my-lloyd"]}}
    variant = next(v for v in info["variants"] if v["name"] == "my-lloyd")
    assert (variant["plugin"], variant["classical"], variant["exact"]) == ("my-lloyd", "Lloyd's algorithm", {"gamma": "inf", "dtype": "float64"})


def test_it_passes_verify_at_its_declared_exact_setting(runs):
    run = runs["verify"]
    assert run.returncode == 0, run
    report = run.json()
    assert (report["variant"], report["gamma"], report["dtype"], report["n"]) == ("my-lloyd", "inf", "float64", 10_000)
    assert report["at_exact_setting"] is True and report["passed"] is True
    assert report["max_center_error"] <= 1e-9 and report["assignment_agreement"] == 1.0


def test_it_passes_the_conformance_suite(runs):
    run = runs["conformance"]
    assert run.returncode == 0, run
    assert run.stdout.split() == ["registered", "shapes", "dtypes", "batching", "determinism", "reference", "trainable"]
