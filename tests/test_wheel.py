"""The wheel, installed into a fresh virtual environment outside the checkout, runs every command:
what a user who installs ktframe gets, with nothing of the source tree on the path."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_training import REPO, cli_env, summary
from test_workflow import SMALL_EVAL


def build_wheel(dist: Path) -> Path:
    """The checkout's wheel, built into the folder ``dist``."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w", str(dist)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("ktframe-*.whl")
    return wheel


def install_wheel(wheel: Path, env_dir: Path, *, reuse_packages: bool = False) -> Path:
    """A virtual environment at ``env_dir`` with ``wheel`` installed; returns its python.

    Its dependencies: as the wheel declares them, installed afresh (no system site-packages), or
    with ``reuse_packages`` this interpreter's packages, found after its own: seconds, not
    minutes, and nothing of theirs can stand in for the wheel's ktframe (a folder named in a
    ``.pth`` file is searched, its own ``.pth`` files, this checkout's editable install among
    them, are not read)."""
    venv.create(env_dir, with_pip=not reuse_packages)
    python = env_dir / "bin" / "python"
    if reuse_packages:
        # pip installs into that interpreter's environment, which holds nothing yet to replace.
        command = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)]
    else:
        # --no-compile: byte-compiling every installed module (torch's thousands) would take as
        # long as the install; the commands compile what they import, once.
        command = [str(python), "-m", "pip", "install", "-q", "--no-compile", "-c", str(REPO / ".ci" / "constraints.txt"), str(wheel)]
    installed = subprocess.run(command, capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    if reuse_packages:
        (site_packages,) = env_dir.glob("lib/python*/site-packages")
        (site_packages / "reused-packages.pth").write_text(
            "".join(f"{path}\n" for path in dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib")))
        )
    return python


@pytest.mark.slow
def test_the_wheel_installed_into_a_fresh_venv_runs_every_command(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    env_dir = tmp_path / "venv"
    python = install_wheel(wheel, env_dir)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {key: value for key, value in cli_env(work).items() if key != "PYTHONPATH"}

    def ktframe(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([str(env_dir / "bin" / "ktframe"), *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"ktframe {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
        return done

    where = subprocess.run([str(python), "-c", "import ktframe; print(ktframe.__file__)"], cwd=work, env=env, capture_output=True, text=True)
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout  # the installed copy, not the checkout

    # The commands that read no run go side by side with the fit, which the others then read; the
    # first, alone, byte-compiles what they all import (the install compiled nothing).
    variants = {v["name"] for v in json.loads(ktframe("plugins", "--json").stdout)["variants"]}
    assert {"lloyd", "lloyd-dot", "soft", "spherical", "trimmed", "robust", "kmedoids"} <= variants
    (work / "points.csv").write_text("x,y\n" + "\n".join(f"{i % 7},{i % 5}" for i in range(40)) + "\n")
    alone = {
        "help": ("fit", "--help"),
        "config": ("config", "show", "preset=paper"),
        "verify": ("verify", "--n", "200", "--k", "3", "--layers", "3", "--gamma", "inf", "--dtype", "float64", "--json"),
        "cluster": ("cluster", "points.csv", "--k", "3", "--out", "labels.csv"),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = {name: pool.submit(ktframe, *args) for name, args in alone.items()}
        fitted = ktframe(
            "fit",
            "name=w",
            "trainer.max_steps=3",
            "trainer.val_every=2",
            "data.val_tasks=8",
            "logger.kind=csv",
            "trainer.progress_bar=false",
            "eval.after_fit=true",
            *SMALL_EVAL,
        )
        done = {name: future.result() for name, future in started.items()}
    assert "paper-none, quick" in done["help"].stdout  # the presets are inside the package
    assert OmegaConf.create(done["config"].stdout).data.n == 512
    assert json.loads(done["verify"].stdout)["passed"]
    assert (work / "labels.csv").read_text().splitlines()[0] == "label"
    run_dir = work / "runs" / "w"
    assert summary(run_dir)["global_step"] == 3, fitted.stdout
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert json.loads((run_dir / "eval" / "eval.json").read_text())["steps"] == 5
    # --out: the run folder's eval/ holds the evaluation after training, which no eval replaces unasked
    assert json.loads(ktframe("eval", str(run_dir / "checkpoints" / "best.ckpt"), *SMALL_EVAL, "--out", "again", "--json").stdout)["tasks"] == 8
    assert json.loads(ktframe("report", "runs", "--json").stdout)["runs"] == 1
