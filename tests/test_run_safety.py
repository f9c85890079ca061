"""Nothing lost: a run folder belongs to one run, and a fault after training keeps what training
made. Every case runs the real command line in subprocesses: a second fit into a finished run or
sweep, two fits in one folder at once, a lock left by a SIGKILLed run, run ids from the
environment, a file size limit (``ulimit -f``) and a folder without write permission after
training, and evaluations outside a run folder. Each checks that the earlier files are intact byte
for byte and that the error is one line, exit 2. docs/reliability.md ("Run folders") lists them.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_training import TINY, cli_env, ok, one_line_error, run_cli, start_cli, summary

from ktframe.learning.checkpoint_io import read_checkpoint

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# A small evaluation: 4 tasks, 3 steps, one n.
SMALL_EVAL = ["eval.tasks=4", "eval.batch_size=4", "eval.steps=3", "eval.ns=[32]"]
PNG_START, PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


def fit_args(root: Path, *overrides: str) -> list[str]:
    return ["fit", *TINY, f"root={root}", "logger.kind=csv", *overrides]


def files(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def both(*calls):
    """The results of the calls, run side by side (each starts a process of its own)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


def last_line_error(done: subprocess.CompletedProcess, command: str = "fit") -> str:
    """For an error after training, where Lightning has written its own lines before: exit 2, no
    traceback, and the error is one line, the last."""
    assert done.returncode == 2, f"exit {done.returncode}\n--- stderr\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and done.stderr.strip().splitlines()[-1] == errors[0], done.stderr[-3000:]
    assert errors[0].startswith(f"ktframe {command}: error: ")
    return errors[0]


def run_in(args: list[str], cwd: Path, home: Path, preexec=None) -> subprocess.CompletedProcess:
    """``ktframe ARGS`` in ``cwd`` with ``home`` as HOME (one whose caches, matplotlib's fonts and
    the compiled kernels, are warm: a fresh one takes a minute to fill) and ``preexec`` run in the
    child before it starts."""
    command = [sys.executable, "-m", "ktframe.cli.main", *args]
    # A child under a limit (a file size, say) must not write Python's bytecode caches into the
    # checkout: cut short by the limit, they would break the next import of ktframe.
    env = cli_env(home, {**ONE_THREAD, **({"PYTHONDONTWRITEBYTECODE": "1"} if preexec else {})})
    return subprocess.run(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, preexec_fn=preexec)


def file_size_limit(limit: int):
    def preexec() -> None:
        # Ignored, SIGXFSZ turns a write past the limit into the error EFBIG instead of a kill.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def assert_whole_pictures(folder: Path) -> None:
    """Every file in ``folder`` is a whole PNG; no temporary file is left."""
    for path in folder.iterdir():
        assert not path.name.startswith("."), f"temporary file left: {path}"
        content = path.read_bytes()
        assert content.startswith(PNG_START) and content.endswith(PNG_END), f"{path} is not a whole PNG"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished sweep of one job: ``runs/sw`` (multirun.json) holding the finished run ``0``,
    evaluated after training; its home's caches are warm for the evaluations below."""
    home = tmp_path_factory.mktemp("sweep")
    ok(run_cli(fit_args(home / "runs", "-m", "name=sw", "eval.after_fit=true", *SMALL_EVAL), home, env=ONE_THREAD))
    return home / "runs" / "sw"


# --------------------------------------------------------------------------------------------------
# A run folder belongs to one run


@pytest.mark.slow
def test_a_fit_into_a_folder_that_holds_a_run_or_a_sweep_is_refused_and_changes_nothing(tmp_path, sweep):
    shutil.copytree(sweep, tmp_path / "runs" / "sw")
    before = files(tmp_path / "runs")
    into_run, into_sweep, sweep_again = both(
        lambda: run_cli(fit_args(tmp_path / "runs" / "sw", "name=0"), tmp_path, env=ONE_THREAD),
        lambda: run_cli(fit_args(tmp_path / "runs", "name=sw"), tmp_path, env=ONE_THREAD),
    ) + [run_cli(fit_args(tmp_path / "runs", "-m", "name=sw"), tmp_path, env=ONE_THREAD)]
    run = tmp_path / "runs" / "sw" / "0"
    assert one_line_error(into_run) == (
        f"ktframe fit: error: {run}: holds a run (config.yaml, checkpoints, summary.json) already; "
        "expected resume=auto to continue it, or another name for a new run (e.g. name=0-2)"
    )
    for done in (into_sweep, sweep_again):
        line = one_line_error(done)
        assert f"{run.parent}: holds a sweep (multirun.json) already; expected `ktframe fit -m ... resume=auto` to continue it" in line, line
        assert "(e.g. name=sw-2)" in line
    assert files(tmp_path / "runs") == before


@pytest.mark.slow
def test_a_second_process_in_a_run_folder_is_refused_naming_the_holder_and_a_killed_ones_lock_is_gone(tmp_path):
    run_dir = tmp_path / "runs" / "twin"
    last = run_dir / "checkpoints" / "last.ckpt"
    first = start_cli(fit_args(tmp_path / "runs", "name=twin", "trainer.max_steps=1000000"), tmp_path, env=ONE_THREAD)
    try:
        deadline = time.monotonic() + 180
        while not last.exists():
            assert first.poll() is None and time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.05)
        # While the first runs: resuming it is refused by the lock, a new run by the folder's content.
        resumed, fresh = both(
            lambda: run_cli(fit_args(tmp_path / "runs", "name=twin", "resume=auto"), tmp_path, env=ONE_THREAD),
            lambda: run_cli(fit_args(tmp_path / "runs", "name=twin"), tmp_path, env=ONE_THREAD),
        )
        assert one_line_error(resumed) == (
            f"ktframe fit: error: {run_dir}: in use by another ktframe fit (held by pid {first.pid} on {socket.gethostname()}); "
            "expected it to end first, or another name= for a new run"
        )
        assert "holds a run (config.yaml, checkpoints) already; expected resume=auto" in one_line_error(fresh)
        assert first.poll() is None  # untouched by either
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    # Killed, it holds no lock: the kernel released it. The run goes on from its last checkpoint.
    run_id = read_checkpoint(last)["hyper_parameters"]["config"]["run_id"]
    step = read_checkpoint(last)["global_step"]
    ok(run_cli(fit_args(tmp_path / "runs", "name=twin", "resume=auto", f"trainer.max_steps={step + 10}"), tmp_path, env=ONE_THREAD))
    assert (summary(run_dir)["run_id"], summary(run_dir)["global_step"]) == (run_id, step + 10)


@pytest.mark.slow
def test_two_fits_started_at_once_in_one_folder_leave_one_whole_run(tmp_path):
    outcomes = both(*[lambda: run_cli(fit_args(tmp_path / "runs", "name=twin"), tmp_path, env=ONE_THREAD)] * 2)
    assert sorted(done.returncode for done in outcomes) == [0, 2], [done.stderr[-2000:] for done in outcomes]
    refused = next(done for done in outcomes if done.returncode == 2)
    line = one_line_error(refused)
    assert "in use by another ktframe fit (held by pid" in line or "holds a run" in line, line
    run_dir = tmp_path / "runs" / "twin"
    run_id = summary(run_dir)["run_id"]
    configs = [read_checkpoint(run_dir / "checkpoints" / name)["hyper_parameters"]["config"]["run_id"] for name in ("best.ckpt", "last.ckpt")]
    assert configs == [run_id, run_id] and f"run_id: {run_id}" in (run_dir / "config.yaml").read_text()


def test_a_run_id_from_the_environment_that_is_no_folder_name_is_refused(tmp_path):
    from_ktframe, from_wandb = both(
        lambda: run_cli(fit_args(tmp_path / "runs"), tmp_path, env={**ONE_THREAD, "KTFRAME_RUN_ID": "../escaped"}),
        lambda: run_cli(fit_args(tmp_path / "runs"), tmp_path, env={**ONE_THREAD, "WANDB_RUN_ID": "a/b"}),
    )
    assert one_line_error(from_ktframe) == (
        "ktframe fit: error: the run id in the environment variable KTFRAME_RUN_ID must be a single folder name "
        "(not empty, '.' or '..', no '/' or '\\'); got '../escaped'"
    )
    assert "the run id in the environment variable WANDB_RUN_ID must be a single folder name" in one_line_error(from_wandb)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "escaped").exists()


# --------------------------------------------------------------------------------------------------
# Faults after training


@pytest.mark.slow
def test_a_file_size_limit_after_training_is_one_line_and_resume_auto_finishes_the_run(tmp_path, sweep):
    # The limit lets every file of training through (config, checkpoints, CSV log), not the largest figure.
    finished = sweep / "0"
    limit = max(len(content) for name, content in files(finished).items() if not name.startswith(("figures", "eval"))) + 1024
    assert max(len(content) for content in files(finished / "figures").values()) > limit
    run_dir = tmp_path / "runs" / "big"
    line = last_line_error(run_in(fit_args(tmp_path / "runs", "name=big"), tmp_path, sweep.parents[1], file_size_limit(limit)))
    assert line.startswith(f"ktframe fit: error: {run_dir / 'figures'}/") and "(File too large)" in line, line
    assert f"training finished and its checkpoints in {run_dir / 'checkpoints'} are intact: resume=auto finishes the run" in line
    assert not (run_dir / "summary.json").exists()
    assert_whole_pictures(run_dir / "figures")
    assert [read_checkpoint(run_dir / "checkpoints" / name)["global_step"] for name in ("best.ckpt", "last.ckpt")] == [20, 20]
    checkpoints = files(run_dir / "checkpoints")
    assert sorted(checkpoints) == ["best.ckpt", "last.ckpt"]

    ok(run_cli(fit_args(tmp_path / "runs", "name=big", "resume=auto"), tmp_path, env=ONE_THREAD))
    assert summary(run_dir)["global_step"] == 20
    assert sorted(p.name for p in (run_dir / "figures").iterdir()) == ["attention.png", "objective.png", "qk.png", "trajectories.png"]
    assert files(run_dir / "checkpoints") == checkpoints  # resumed at its end: nothing trained, nothing rewritten


def drop_root_override() -> None:
    """As root, give up the capability to write where the permissions say no (the child only)."""
    if os.geteuid() == 0:
        PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1
        if ctypes.CDLL(None, use_errno=True).prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
            os._exit(99)  # the test skips on this exit code


@pytest.mark.slow
def test_a_figures_folder_without_write_permission_is_one_line_after_training(tmp_path):
    run_dir = tmp_path / "runs" / "denied"
    (run_dir / "figures").mkdir(parents=True)
    (run_dir / "figures").chmod(0o555)
    try:
        done = run_in(fit_args(tmp_path / "runs", "name=denied"), tmp_path, tmp_path, drop_root_override)
    finally:
        (run_dir / "figures").chmod(0o755)
    if done.returncode == 99:
        pytest.skip("cannot drop root's CAP_DAC_OVERRIDE here")
    line = last_line_error(done)
    assert f"{run_dir / 'figures'}" in line and "(Permission denied)" in line and "checkpoints in" in line, line
    assert list((run_dir / "figures").iterdir()) == []
    assert read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 20


# --------------------------------------------------------------------------------------------------
# Evaluations: where they go, and never over an earlier one


@pytest.mark.slow
def test_an_evaluation_outside_a_run_folder_goes_to_the_current_folder_and_none_is_replaced_unasked(tmp_path, sweep):
    checkpoint = tmp_path / "x" / "model.ckpt"
    checkpoint.parent.mkdir()
    shutil.copy(sweep / "0" / "checkpoints" / "best.ckpt", checkpoint)
    (tmp_path / "eval").mkdir()  # where the checkpoint's grandparent would take an evaluation
    (tmp_path / "eval" / "eval.json").write_text('{"mine": true}')
    work = tmp_path / "work"
    work.mkdir()
    run_dir = tmp_path / "runs" / "r"
    shutil.copytree(sweep / "0", run_dir)  # evaluated after training: eval/eval.json
    best = run_dir / "checkpoints" / "best.ckpt"
    home = sweep.parents[1]
    before = files(run_dir / "eval")
    outside, inside = both(
        lambda: run_in(["eval", str(checkpoint), *SMALL_EVAL], work, home),
        lambda: run_in(["eval", str(best), *SMALL_EVAL], tmp_path, home),
    )
    assert ok(outside).stdout.strip().endswith(f"written: {Path('eval-model') / 'eval.json'}, {Path('eval-model') / 'eval.png'}")
    assert sorted(p.name for p in (work / "eval-model").iterdir()) == ["eval.json", "eval.png"]
    assert (tmp_path / "eval" / "eval.json").read_text() == '{"mine": true}'
    assert one_line_error(inside, "eval") == (
        f"ktframe eval: error: {run_dir / 'eval' / 'eval.json'}: holds an earlier evaluation; "
        f"expected --out DIR for this one (or --out {run_dir / 'eval'} to replace it)"
    )
    assert files(run_dir / "eval") == before

    # Again outside: refused too. Into a folder named with --out: replaced, as asked.
    evaluation = files(work / "eval-model")
    again, replaced = both(
        lambda: run_in(["eval", str(checkpoint), *SMALL_EVAL], work, home),
        lambda: run_in(["eval", str(best), *SMALL_EVAL, "eval.seed=1", "--out", str(run_dir / "eval")], tmp_path, home),
    )
    assert f"{Path('eval-model') / 'eval.json'}: holds an earlier evaluation" in one_line_error(again, "eval")
    assert files(work / "eval-model") == evaluation
    ok(replaced)
    assert files(run_dir / "eval")["eval.json"] != before["eval.json"]


def test_an_evaluation_under_a_file_size_limit_is_one_line_and_leaves_no_eval_json(tmp_path, sweep):
    best = sweep / "0" / "checkpoints" / "best.ckpt"
    line = one_line_error(run_in(["eval", str(best), *SMALL_EVAL, "--out", "out"], tmp_path, sweep.parents[1], file_size_limit(8192)), "eval")
    assert line.startswith(f"ktframe eval: error: {Path('out') / 'eval.png'}: ") and "(File too large)" in line, line
    assert list((tmp_path / "out").iterdir()) == []  # no eval.json (written last), no piece of a picture
