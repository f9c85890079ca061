"""The first hour of a new user: the command line answers at once, a fit's console holds ktframe's
own lines, the bar and one summary, long commands show progress on a terminal (and not under
``--quiet`` or into a pipe), small problems never wait for the kernels, reports never pool runs of
different settings unsaid, and each name has one spelling with the others accepted.

Real processes throughout (a pseudo-terminal where a terminal matters); ``benchmarks/first_hour.py``
measures the same things' times.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
import torch
from test_report import write_run
from test_training import REPO, TINY, cli_env, ok, run_cli

from ktframe.core.errors import InputError, UnknownNameError
from ktframe.learning.config import load_config
from ktframe.plugin.manager import registry
from ktframe.reporting.report import build_report, markdown
from ktframe.training import console

# --------------------------------------------------------------------------------------------------
# Answering at once


# Runs ktframe's main with the arguments given; prints, last, on stderr: the exit code, which heavy
# packages were imported and the process's CPU seconds.
PROBE = """
import json, resource, sys
from ktframe.cli.main import main
code = 0
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "lightning", "numpy", "numba", "wandb", "omegaconf", "ktframe.plugin.manager") if m in sys.modules)
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "heavy": heavy, "cpu": use.ru_utime + use.ru_stime}), file=sys.stderr)
"""

QUICK = [
    pytest.param(["--help"], 0, "Clustering algorithms written as transformer circuits", id="help"),
    pytest.param(["--version"], 0, "ktframe ", id="version"),
    pytest.param(["clsuter", "x.csv"], 2, "unknown command 'clsuter'; did you mean 'cluster'?", id="misspelt-command"),
    pytest.param(["fit", "--trainer.max_steps=20"], 2, "ktframe takes trainer.max_steps=20, without the dashes", id="lightningcli-style"),
    pytest.param(["fit", "--trainer.max_steps", "20"], 2, "ktframe takes trainer.max_steps=20, without the dashes", id="lightningcli-style-spaced"),
    pytest.param(["fit", "-m", "--jobs", "0"], 2, "--jobs: expected an integer >= 1", id="fit-usage"),
    pytest.param(["eval"], 2, "the following arguments are required: checkpoint", id="eval-usage"),
    pytest.param(["report", "runs", "--bogus"], 2, "unrecognized arguments: --bogus", id="report-usage"),
    pytest.param(["cluster", "points.csv"], 2, "the following arguments are required: --k/--n-clusters", id="cluster-usage"),
    pytest.param(["gamma-sweep", "--dtype", "half"], 2, "invalid choice: 'half'", id="gamma-sweep-usage"),
    pytest.param(["config"], 2, "the following arguments are required: ACTION", id="config-usage"),
    pytest.param(["plugins", "--bogus"], 2, "unrecognized arguments: --bogus", id="plugins-usage"),
    pytest.param(["real-data", "--bogus"], 2, "unrecognized arguments: --bogus", id="real-data-usage"),
]


@pytest.mark.parametrize("argv, code, says", QUICK)
def test_help_version_and_usage_errors_answer_without_torch(tmp_path, argv, code, says):
    """Neither PyTorch nor Lightning nor the plugins are imported to answer, well under a second
    of CPU (about 0.05 s on 2 shared cores; PyTorch's import alone takes 1.5 s)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=120)
    *text, last = done.stderr.splitlines()
    seen = json.loads(last)
    assert seen["code"] == code, done.stderr
    assert says in done.stdout + "\n".join(text)
    assert seen["heavy"] == [] and seen["cpu"] < 0.8, seen


def test_version_is_printed_on_standard_output(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ktframe.cli.main", "--version"], cwd=tmp_path, env=cli_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == ""
    assert re.fullmatch(r"ktframe \S+\n", done.stdout), done.stdout


def cpu_seconds_above_torch(code: str) -> float:
    """The least CPU time (user + system), of three fresh processes, that ``code`` takes after
    ``import torch`` in the same process: torch's own import varies by more than the budget."""
    probe = (
        "import resource, torch\n"
        "def cpu():\n    u = resource.getrusage(resource.RUSAGE_SELF)\n    return u.ru_utime + u.ru_stime\n"
        f"before = cpu()\n{code}\nprint(cpu() - before)"
    )
    times = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
        times.append(float(done.stdout.split()[-1]))
    return min(times)


def test_import_ktframe_imports_only_what_its_estimator_needs():
    """``import ktframe`` imports no PyTorch; with the estimator and the model builder it imports
    PyTorch but none of numba, scipy, entmax, matplotlib, Lightning or W&B, and costs at most 0.2 s
    of CPU more than ``import torch``."""
    probe = (
        "import json, sys; import ktframe; bare = 'torch' in sys.modules; from ktframe import TransformerKMeans, build_model, reference;"
        "print(json.dumps([bare, sorted(m for m in ('numba', 'scipy', 'entmax', 'matplotlib', 'lightning', 'wandb') if m in sys.modules)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(done.stdout) == [False, []]
    assert cpu_seconds_above_torch("from ktframe import TransformerKMeans") < 0.2


def test_a_key_without_its_section_is_answered_with_it():
    with pytest.raises(InputError, match=r"unknown config key 'max_steps'; did you mean 'trainer.max_steps'\?"):
        load_config(["max_steps=20"])
    with pytest.raises(InputError, match=r"unknown config key 'lr'; did you mean 'optim.lr'\?"):
        load_config(["lr=0.1"])


def test_readme_lists_config_show():
    assert "ktframe config show" in (REPO / "README.md").read_text()


# --------------------------------------------------------------------------------------------------
# One spelling of each name


def test_k_means_plus_plus_has_one_spelling_and_the_other_is_accepted():
    """scikit-learn's ``k-means++`` in the registry, the configs and the tables; ``kmeans++``
    accepted for it everywhere, and a near miss answered with the name."""
    assert {"k-means++", "greedy-k-means++"} <= set(registry().names("initializer"))
    assert not {"kmeans++", "greedy-kmeans++"} & set(registry().names("initializer"))
    assert registry().get("initializer", "kmeans++") is registry().get("initializer", "k-means++")
    assert registry().get("initializer", "greedy-kmeans++") is registry().get("initializer", "greedy-k-means++")
    cfg = load_config(["data.init=kmeans++", "eval.inits=[random,greedy-kmeans++]"])
    assert cfg.data.init == "k-means++" and list(cfg.eval.inits) == ["random", "greedy-k-means++"]
    assert list(load_config([]).eval.inits) == ["random", "k-means++"]
    with pytest.raises(UnknownNameError, match=r"did you mean 'k-means\+\+'\?"):
        registry().get("initializer", "kmeans")


def test_a_report_reads_evaluations_written_with_the_other_spelling(tmp_path):
    curves = {("kmeans++", 512): {"model": [2.0, 1.5], "kmeans++": [2.0, 1.6], "greedy-kmeans++": [2.0, 1.55]}}
    write_run(tmp_path / "runs" / "old", {"val/ratio": 1.0}, curves)
    write_run(
        tmp_path / "runs" / "new", {"val/ratio": 1.0}, {("k-means++", 512): {"model": [2.0, 1.4], "k-means++": [2.0, 1.6], "greedy-k-means++": [2.0, 1.5]}}
    )
    rows = {(row["init"], row["method"]): row["runs"] for row in build_report(tmp_path / "runs")["eval"]}
    assert rows == {("k-means++", "model"): 2, ("k-means++", "k-means++"): 2, ("k-means++", "greedy-k-means++"): 2}


def test_n_clusters_is_k_and_kmeans_plus_plus_is_k_means_plus_plus(tmp_path):
    np.savetxt(tmp_path / "points.csv", np.random.default_rng(0).random((60, 2)), delimiter=",")
    outputs = [
        ok(run_cli(["cluster", "points.csv", *argv], tmp_path, timeout=120)).stdout
        for argv in (["--k", "3"], ["--n-clusters", "3"], ["--k", "3", "--init", "kmeans++"])
    ]
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0].splitlines()) == 61


# --------------------------------------------------------------------------------------------------
# Threads


def test_ktframe_chooses_one_thread_for_a_small_model_and_respects_the_users(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert console.thread_count(load_config([]))[0] == 1  # the quick preset: never slower than one thread
    assert console.thread_count(load_config(["preset=paper"]))[0] == torch.get_num_threads()
    assert console.thread_count(load_config(["trainer.threads=3"]))[0] == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert console.thread_count(load_config([])) == (torch.get_num_threads(), "OMP_NUM_THREADS")
    with pytest.raises(InputError, match="'trainer.threads' must be null"):
        load_config(["trainer.threads=0"])
    before = torch.get_num_threads()
    with console.threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# --------------------------------------------------------------------------------------------------
# A fit's console, and progress on a terminal


def on_terminal(argv: list[str], home: Path, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """``python -m ktframe.cli.main ARGV`` with a pseudo-terminal 150 columns wide as its standard
    output and error: its exit code and what the terminal shows, each line as last redrawn."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "ktframe.cli.main", *argv], cwd=home, env=cli_env(home, env), stdin=subprocess.DEVNULL, stdout=child, stderr=child
    )
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    code = process.wait(timeout=timeout)
    text = out.decode(errors="replace").replace("\r\n", "\n")
    return code, "\n".join(line.split("\r")[-1] for line in text.split("\n"))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, str]:
    """A tiny fit as the README runs it (W&B, offline for want of a key), on a terminal."""
    home = tmp_path_factory.mktemp("fit")
    code, shown = on_terminal(["fit", *TINY, "trainer.progress_bar=true", f"root={home / 'runs'}", "name=first"], home)
    assert code == 0, shown
    return home, shown


@pytest.mark.slow
def test_a_fit_shows_its_own_lines_the_bar_and_one_summary(fitted):
    home, shown = fitted
    for chatter in ("Tip", "litlogger", "anonymous", "_pytree", "FutureWarning", "site-packages", "GPU available", "wandb:", "Trainer.fit"):
        assert chatter not in shown, shown
    assert "fit: 100%" in shown and "20/20" in shown  # the steps' bar, to max_steps
    assert shown.count("wandb sync") == 1 and shown.count("next: ktframe eval") == 1, shown
    assert shown.count("below 1 beats Lloyd") == 1
    assert "on 1 thread" in shown  # ktframe's choice for so small a model
    lines = [line for line in shown.splitlines() if line.strip()]
    assert all(line.startswith(("ktframe fit: ", "fit: ", "run ", "  ")) for line in lines), lines
    # the run keeps its metrics beside W&B: ktframe report draws its training curves
    report = json.loads(ok(run_cli(["report", "runs/first", "--json"], home, timeout=120)).stdout)
    assert report["training"]["summary"]["last_step"] == 19


@pytest.mark.slow
def test_eval_and_report_show_progress_on_a_terminal_only(fitted):
    home, _ = fitted
    evaluate = ["eval", "runs/first/checkpoints/best.ckpt", "eval.tasks=8", "eval.ns=[16]", "eval.inits=[random]"]
    code, shown = on_terminal([*evaluate, "--out", "on-terminal"], home)
    assert code == 0 and "eval: 100%" in shown and "8/8" in shown and "task" in shown, shown
    code, shown = on_terminal(["--quiet", *evaluate, "--out", "quiet"], home)
    assert code == 0 and "eval:" not in shown and "written:" in shown, shown
    piped = ok(run_cli([*evaluate, "--out", "piped"], home, timeout=300))
    assert piped.stderr == "" and "written:" in piped.stdout
    code, shown = on_terminal(["report", "runs"], home)
    assert code == 0 and "report: 100%" in shown and "1/1" in shown, shown


def test_verify_and_cluster_show_progress_on_a_terminal_only(tmp_path):
    np.savetxt(tmp_path / "points.csv", np.random.default_rng(0).random((300, 2)), delimiter=",")
    for bar, argv in (("verify lloyd", ["verify", "--n", "500"]), ("cluster points.csv", ["cluster", "points.csv", "--k", "3"])):
        code, shown = on_terminal(argv, tmp_path)
        assert code == 0 and bar in shown and "100%" in shown and "2/2" in shown, shown
        code, shown = on_terminal(["--quiet", *argv], tmp_path)
        assert code == 0 and bar not in shown and "100%" not in shown, shown


# --------------------------------------------------------------------------------------------------
# Kernels: small problems never wait; a compilation is announced once


def test_a_small_problem_runs_without_the_kernels_and_compiles_nothing(tmp_path):
    """``ktframe cluster`` on 2 000 points, with an empty kernel cache: no compilation, nothing
    cached, nothing announced; the size rule itself in a fresh process."""
    rng = np.random.default_rng(0)
    np.savetxt(tmp_path / "points.csv", rng.random((2000, 2)), delimiter=",")
    env = {"KTFRAME_CACHE_DIR": str(tmp_path / "cache")}
    done = ok(run_cli(["cluster", "points.csv", "--k", "5", "--out", "labels.csv"], tmp_path, env=env, timeout=120))
    assert "compiling" not in done.stderr and not (tmp_path / "cache").exists()
    rule = "import torch; from ktframe.kernels import cpu, jit; print(cpu.usable(torch.zeros(jit.MIN_NUMBERS - 1)), cpu.usable(torch.zeros(jit.MIN_NUMBERS)))"
    assert subprocess.run([sys.executable, "-c", rule], capture_output=True, text=True, check=True).stdout.split() == ["False", "True"]


KERNEL = """
from ktframe.kernels.jit import kernel

@kernel(nogil=True)
def twice(x):
    return 2 * x
"""
ANNOUNCE = """
import sys
sys.path.insert(0, sys.argv[1])
from ktframe.kernels import jit
jit.on_first_compile(lambda folder: print("compiling, cached in", folder))
import tiny
print(tiny.twice(2), tiny.twice(3), tiny.twice(4.0))
"""


def test_a_compilation_is_announced_once_with_its_cache_and_a_cached_kernel_is_not(tmp_path):
    (tmp_path / "tiny.py").write_text(KERNEL)
    env = {**os.environ, "KTFRAME_CACHE_DIR": str(tmp_path / "cache")}
    run = lambda: subprocess.run([sys.executable, "-c", ANNOUNCE, str(tmp_path)], env=env, capture_output=True, text=True, check=True, timeout=300).stdout  # noqa: E731
    first, second = run(), run()
    assert first.splitlines() == [f"compiling, cached in {tmp_path / 'cache' / 'numba'}", "4 6 8.0"]  # once, for two signatures
    assert second.splitlines() == ["4 6 8.0"]  # loaded from the cache: nothing compiled


# --------------------------------------------------------------------------------------------------
# Reports never pool runs of different settings unsaid


def test_runs_of_other_settings_are_reported_apart_and_named(tmp_path):
    root = tmp_path / "runs"
    for name, steps, seed, logger in (("a", 20, 0, "csv"), ("b", 20, 1, "wandb"), ("c", 20, 2, "csv"), ("long", 3000, 0, "wandb")):
        write_run(root / name, {"val/ratio": 1.0 if steps == 3000 else 2.0}, None)
        (root / name / "config.yaml").write_text(f"trainer:\n  max_steps: {steps}\n  seed: {seed}\nlogger:\n  kind: {logger}\nname: {name}\n")
    report = build_report(root)
    assert report["differing"] == ["trainer.max_steps"] and report["by"] == ["trainer.max_steps"]  # not the seeds, names or loggers
    assert [(g["setting"], g["runs"], g["metrics"]["val/ratio"]["mean"]) for g in report["groups"]] == [
        ({"trainer.max_steps": 20}, 3, 2.0),
        ({"trainer.max_steps": 3000}, 1, 1.0),
    ]
    assert "**The runs' configs differ** (trainer.max_steps: 20, 3000)" in markdown(report, root)
    by_seed = build_report(root, ["trainer.seed"])  # a --by key: the other differing key is added
    assert by_seed["by"] == ["trainer.seed", "trainer.max_steps"] and by_seed["differing"] == ["trainer.max_steps"]
    (root / "long").rename(tmp_path / "long")
    assert "differing" not in build_report(root) and "groups" not in build_report(root)
