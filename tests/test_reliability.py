"""Reliability: runs resumed, killed with SIGKILL, preempted with SIGTERM, started by torchrun;
full disks; bad and hostile input, broken plugins, no network, and properties of the exact models
on random input. Everything runs for real: the CLI in subprocesses, real signals, real DDP ranks,
pip-installed plugin distributions, W&B offline runs. docs/reliability.md says what each test
shows and what holds.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import re
import select
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import distributions as dists
import pytest
import torch
from distributions import BROKEN_IMPORT, GOOD, Distribution
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bad_input import DRIVER, FORK, Outcome
from test_equivalence import EXACT_MODELS, problems, run_model
from test_training import TINY, VAL_METRICS, cli_env, csv_rows, fit, logged, ok, one_line_error, run_cli, start_cli, summary, validate_in_process

from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.learning.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError, read_checkpoint, write_checkpoint
from ktframe.plugin import manager as pluginmanager
from ktframe.plugin.manager import PluginLoadWarning

# One thread per run: torch's thread pool, spinning on a busy 2-core machine, makes a tiny run
# several times slower.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# 40 steps, a checkpoint every 10, every training loss logged. (Dropout is on: TINY keeps the
# default model.dropout, so resumed runs must draw the same masks too.)
RUN = ("trainer.max_steps=40", "trainer.log_every=1")
# Runs until a signal stops it.
ENDLESS = "trainer.max_steps=1000000"


def fit_args(root: Path, *overrides: str) -> list[str]:
    return ["fit", *TINY, f"root={root}", "logger.kind=csv", *RUN, *overrides]


class Payload:
    """Unpickled, it runs ``os.mkdir(marker)``: the code a crafted checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def payload_checkpoint(source: Path, path: Path, marker: Path) -> Path:
    """A real training checkpoint with a :class:`Payload` in its config, in torch's format."""
    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["config"]["note"] = Payload(marker)
    torch.save(checkpoint, path)
    return path


def assert_payload_is_live(path: Path, marker: Path) -> None:
    """The control: unpickled the unsafe way, the file does run its code (then undo that)."""
    assert not marker.exists()
    with contextlib.suppress(RuntimeError):  # torch's legacy loader unpickles a bare pickle, then balks
        torch.load(path, map_location="cpu", weights_only=False)
    assert marker.is_dir(), "the crafted file should run its payload when loaded unsafely"
    marker.rmdir()


# --------------------------------------------------------------------------------------------------
# Determinism, and a run killed with SIGKILL that resumes


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[Path]:
    """Two uninterrupted runs of the same seed and config, side by side; their run folders."""
    home = tmp_path_factory.mktemp("uninterrupted")
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda name: ok(run_cli(fit_args(home / "runs", f"name={name}"), home, env=ONE_THREAD)), ("a", "b")))
    return [home / "runs" / "a", home / "runs" / "b"]


def logged_values(rows: list[dict[str, str]], before_step: int | None = None) -> list[dict[str, str]]:
    """The non-empty cells of every row (up to ``before_step``)."""
    return [{k: v for k, v in row.items() if v} for row in rows if before_step is None or int(row["step"]) < before_step]


def test_same_seed_and_config_give_the_same_run_twice_on_cpu(uninterrupted):
    a, b = uninterrupted
    losses = [value for _, value in logged(csv_rows(a), "train/loss")]
    assert len(set(losses)) > 1  # it trained: the equalities below compare something
    assert summary(a)["metrics"] == summary(b)["metrics"]  # to the last bit
    assert logged_values(csv_rows(a)) == logged_values(csv_rows(b))  # every value at every step
    weights = [read_checkpoint(run / "checkpoints" / "last.ckpt")["state_dict"] for run in (a, b)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


def wait_for(proc: subprocess.Popen, last: Path, timeout: float = 180) -> None:
    """Until ``last`` exists, having read it: written atomically, a checkpoint is whole from the
    moment it can be seen."""
    deadline = time.monotonic() + timeout
    while not last.exists():
        assert proc.poll() is None, f"the run ended before its first checkpoint:\n{proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.02)
    read_checkpoint(last)


def kill_after_first_checkpoint(proc: subprocess.Popen, last: Path) -> None:
    """SIGKILL ``proc`` as soon as ``last`` exists."""
    wait_for(proc, last)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def equal(a, b) -> bool:
    """``a == b``, tensors compared with ``torch.equal``, through dicts and lists."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(equal, a, b))
    return a == b


def assert_same_training_state(run: Path, reference: Path) -> None:
    """``last.ckpt`` of both runs: the same step, weights, optimizer and scheduler states, bit for
    bit; and the same validation values logged at the same steps."""
    a, b = (read_checkpoint(path / "checkpoints" / "last.ckpt") for path in (run, reference))
    assert a["global_step"] == b["global_step"]
    assert equal(a["state_dict"], b["state_dict"]), "weights differ"
    assert equal(a["optimizer_states"], b["optimizer_states"]), "optimizer states differ"
    assert equal(a["lr_schedulers"], b["lr_schedulers"]), "scheduler states differ"
    assert logged(csv_rows(run), "val/ratio") == logged(csv_rows(reference), "val/ratio")


def test_a_run_resumed_at_step_20_is_bit_identical_to_the_straight_run(tmp_path, uninterrupted):
    ok(run_cli(fit_args(tmp_path / "runs", "name=r", "trainer.max_steps=20"), tmp_path, env=ONE_THREAD))
    ok(run_cli(fit_args(tmp_path / "runs", "name=r", "resume=auto"), tmp_path, env=ONE_THREAD))
    assert_same_training_state(tmp_path / "runs" / "r", uninterrupted[0])


def test_a_stopped_multirun_goes_on_job_by_job_with_resume_auto(tmp_path, uninterrupted):
    # A sweep stopped after 20 of its 40 steps and launched again with resume=auto: each job goes
    # on in its own run folder. Both jobs train the same seed (the swept key is a note), so each
    # must end as the run that was never stopped.
    sweep = ("-m", "--jobs", "2", "name=sw", "logger.notes=a,b")
    jobs = [tmp_path / "runs" / "sw" / job for job in ("0", "1")]
    ok(run_cli(fit_args(tmp_path / "runs", *sweep, "trainer.max_steps=20"), tmp_path, env=ONE_THREAD))
    run_ids = [summary(job)["run_id"] for job in jobs]
    ok(run_cli(fit_args(tmp_path / "runs", *sweep, "resume=auto"), tmp_path, env=ONE_THREAD))
    for job, run_id in zip(jobs, run_ids):
        assert (summary(job)["run_id"], summary(job)["global_step"]) == (run_id, 40)  # went on, not started again
        assert [step for step, _ in logged(csv_rows(job), "val/ratio")] == [9, 19, 29, 39]
        assert_same_training_state(job, uninterrupted[0])
        assert (job / "fit.log").read_text().count("ktframe fit: run ") == 2  # the log goes on too: both fits

    # Launched once more, the finished jobs are not run again (nor evaluated, nor logged to).
    files = [job / name for job in jobs for name in ("summary.json", "fit.log", "checkpoints/last.ckpt")]
    before = [(f.stat().st_mtime_ns, f.read_bytes()) for f in files]
    again = ok(run_cli(fit_args(tmp_path / "runs", *sweep, "resume=auto"), tmp_path, env=ONE_THREAD))
    assert again.stdout.count("(finished before: not run again)") == 2, again.stdout
    assert [(f.stat().st_mtime_ns, f.read_bytes()) for f in files] == before


def test_a_sigkilled_fit_resumes_from_its_last_checkpoint_to_the_same_end(tmp_path, uninterrupted):
    ref = uninterrupted[0]
    run_dir = tmp_path / "runs" / "crash"
    last = run_dir / "checkpoints" / "last.ckpt"
    kill_after_first_checkpoint(start_cli(fit_args(tmp_path / "runs", "name=crash"), tmp_path, env=ONE_THREAD), last)
    assert not (run_dir / "summary.json").exists()  # it died mid-run
    start = read_checkpoint(last)["global_step"]
    assert start in (10, 20, 30)
    run_id = read_checkpoint(last)["hyper_parameters"]["config"]["run_id"]

    done = ok(fit(tmp_path, "name=crash", "resume=auto", *RUN, env=ONE_THREAD))
    after = summary(run_dir)
    assert after["run_id"] == run_id and done.stdout.startswith(f"run {run_id}: 40 steps")
    assert after["global_step"] == summary(ref)["global_step"] == 40
    assert read_checkpoint(last)["global_step"] == 40

    # Up to the checkpoint the killed run was the uninterrupted one, value for value, and the
    # resumed run kept those rows; after it, every step is logged once.
    rows = csv_rows(run_dir)
    assert logged_values(rows, before_step=start) == logged_values(csv_rows(ref), before_step=start)
    assert [step for step, _ in logged(rows, "train/loss")] == list(range(40))
    assert [step for step, _ in logged(rows, "val/ratio")] == [9, 19, 29, 39]

    assert after["metrics"] == summary(ref)["metrics"]  # to the last bit
    assert_same_training_state(run_dir, ref)


def test_sigterm_checkpoints_the_current_step_and_the_resumed_run_is_bit_identical(tmp_path, uninterrupted):
    run_dir = tmp_path / "runs" / "p"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = start_cli(fit_args(tmp_path / "runs", "name=p", ENDLESS), tmp_path, env=ONE_THREAD)
    wait_for(proc, last)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    step = read_checkpoint(last)["global_step"]
    assert 10 < step < 40, step  # past the first validation's checkpoint: written for the signal
    assert stderr.strip().splitlines()[-1] == f"ktframe fit: stopped by SIGTERM after step {step}, checkpoint {last}; continue with resume=auto"
    assert "Traceback" not in stderr
    assert "weights_only" not in stderr  # the checkpoint of the signal says what it saves
    assert [p.name for p in last.parent.iterdir() if p.name.endswith(".partial")] == []

    ok(run_cli(fit_args(tmp_path / "runs", "name=p", "resume=auto"), tmp_path, env=ONE_THREAD))
    assert_same_training_state(run_dir, uninterrupted[0])
    assert [s for s, _ in logged(csv_rows(run_dir), "train/loss")] == list(range(40))  # each step once


def test_a_second_signal_exits_at_once_and_leaves_the_last_checkpoint(tmp_path):
    run_dir = tmp_path / "runs" / "twice"
    last = run_dir / "checkpoints" / "last.ckpt"
    proc = start_cli(fit_args(tmp_path / "runs", "name=twice", ENDLESS), tmp_path, env=ONE_THREAD)
    wait_for(proc, last)
    # Two signals before the run reaches the end of its step: Python runs both handlers in turn.
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM), stderr[-3000:]
    assert "again: exiting at once" in stderr.strip().splitlines()[-1]
    assert read_checkpoint(last)["global_step"] % 10 == 0  # the last validation's, whole
    assert not (run_dir / "summary.json").exists()


# --------------------------------------------------------------------------------------------------
# Ranks started by torchrun; validation split across ranks


@pytest.mark.slow
def test_torchrun_ranks_share_one_run_and_validate_an_odd_task_count_exactly(tmp_path):
    """7 validation tasks on 2 ranks (4 and 3, none repeated): the metrics are those of one process."""
    overrides = ["data.val_tasks=7", "data.val_batch_size=2", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
    args = ["--standalone", "--nproc_per_node=2", "-m", "ktframe.cli.main", *fit_args(tmp_path / "runs", "trainer.max_steps=20", *overrides)]
    env = cli_env(tmp_path, ONE_THREAD)
    done = subprocess.run([str(Path(sys.executable).with_name("torchrun")), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    ok(done)
    (run_dir,) = (tmp_path / "runs").iterdir()  # one folder, though each rank could have chosen its own
    result = summary(run_dir)
    assert result["world_size"] == 2 and result["global_step"] == 20 and run_dir.name == result["run_id"]
    assert [line for line in done.stdout.splitlines() if line.startswith("run ")] == [
        f"run {result['run_id']}: 20 steps ({result['seconds']:.0f} s of training), best val/ratio {result['best_val_ratio']:.4f}"
    ]

    from ktframe.learning.config import load_config
    from ktframe.learning.data import TaskDataModule

    data = TaskDataModule(load_config([*TINY, *overrides]).data)
    data.setup()
    whole = validate_in_process(read_checkpoint(run_dir / "checkpoints" / "last.ckpt"), data.val)
    for name in VAL_METRICS:
        # the same per-task values, summed in another order: equal up to float64 rounding
        assert result["metrics"][name] == pytest.approx(whole[name], rel=1e-6), name


# --------------------------------------------------------------------------------------------------
# Disk faults


def test_an_unwritable_run_folder_is_one_line_before_training(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    line = one_line_error(fit(tmp_path, f"root={tmp_path / 'file' / 'runs'}", "name=x"))
    assert f"{tmp_path / 'file' / 'runs' / 'x'}: {tmp_path / 'file'} is a file, not a folder; expected a writable folder" in line, line


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_stops_in_one_line(tmp_path, monkeypatch):
    """In process, with ``torch.save`` failing as a full disk makes it fail, half-way through the
    second checkpoint's bytes."""
    from ktframe.learning.config import load_config
    from ktframe.training.run import train

    save = torch.save

    def full_disk(obj, file, *args, **kwargs):
        if obj["global_step"] < 20:
            return save(obj, file, *args, **kwargs)
        file.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    cfg = load_config([*TINY, f"root={tmp_path / 'runs'}", "name=full", "logger.kind=none"])
    with pytest.raises(CheckpointWriteError) as error:
        train(cfg)
    monkeypatch.undo()
    last = tmp_path / "runs" / "full" / "checkpoints" / "last.ckpt"
    message = str(error.value)
    assert "\n" not in message and "cannot write the checkpoint of step 20 (No space left on device)" in message, message
    assert "the previous checkpoint is intact" in message
    assert read_checkpoint(last)["global_step"] == 10  # whole: the previous validation's
    assert sorted(p.name for p in last.parent.iterdir()) == ["best.ckpt", "last.ckpt"]  # no .partial
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers  # the fit's handlers are gone


# --------------------------------------------------------------------------------------------------
# Atomic checkpoints

# Writes a 16 MB checkpoint (every value its step, so a torn or mixed file shows) to ARGV[1], prints
# the size of a whole one, then overwrites it with step 1, 2, ... until killed; ARGV[2] says how:
# through ktframe's checkpoint I/O, or torch.save in place (the control).
WRITER = r"""
import os, sys, torch
from ktframe.learning.checkpoint_io import AtomicCheckpointIO
path, how = sys.argv[1], sys.argv[2]
save = AtomicCheckpointIO().save_checkpoint if how == "atomic" else torch.save
def checkpoint(step):
    return {"global_step": step, "hyper_parameters": {"config": {}}, "state_dict": {f"w{i}": torch.full((1 << 18,), float(step)) for i in range(16)}}
save(checkpoint(0), path)
print(os.path.getsize(path), flush=True)
step = 1
while True:
    save(checkpoint(step), path)
    step += 1
"""


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # not yet written, or renamed away
        return 0


def kill_while_writing(path: Path, how: str, attempts: int = 5) -> None:
    """SIGKILL the writer while a checkpoint's bytes are going to disk: when the file being
    written (the temporary file, or ``path`` itself in place) holds some but not all of them."""
    written = path.with_name(f".{path.name}.partial") if how == "atomic" else path
    for _ in range(attempts):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), how], stdout=subprocess.PIPE, text=True, env={**os.environ, **ONE_THREAD})
        whole = int(proc.stdout.readline())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not 0 < size(written) < whole:
            pass
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        if 0 < size(written) < whole:  # it died with the write unfinished
            return
    pytest.fail(f"no kill landed inside a write in {attempts} attempts")


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "last.ckpt"
    kill_while_writing(path, "atomic")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # loads: whole (a bare dict of tensors, no fit's config)
    step = checkpoint["global_step"]
    assert all(torch.equal(t, torch.full_like(t, float(step))) for t in checkpoint["state_dict"].values())  # one step's, not mixed
    # The cut-off temporary file is the only trace, and the next write replaces it.
    partial = tmp_path / ".last.ckpt.partial"
    assert partial.exists()
    write_checkpoint(checkpoint, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_the_same_kill_corrupts_a_checkpoint_written_in_place(tmp_path):
    """The control of the test above: killed at the same moment, a plain torch.save leaves a
    broken last.ckpt, which ktframe reports in one line."""
    path = tmp_path / "last.ckpt"
    kill_while_writing(path, "in-place")
    with pytest.raises(InputError, match="not a readable checkpoint"):
        read_checkpoint(path)


def test_fit_checkpoints_through_the_atomic_writer(tmp_path):
    from ktframe.learning.config import load_config
    from ktframe.training.run import make_trainer

    trainer = make_trainer(load_config([*TINY, "logger.kind=none"]), False, [], tmp_path)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


# --------------------------------------------------------------------------------------------------
# Untrusted checkpoints and config files


def test_checkpoint_io_loads_weights_only_whatever_lightning_asks(tmp_path, uninterrupted):
    marker = tmp_path / "payload-ran"
    hostile = payload_checkpoint(uninterrupted[0] / "checkpoints" / "last.ckpt", tmp_path / "hostile.ckpt", marker)
    assert_payload_is_live(hostile, marker)
    with pytest.raises(InputError, match=r"refused to load.*weights_only=True"):
        AtomicCheckpointIO().load_checkpoint(hostile, weights_only=False)
    raw = tmp_path / "raw-pickle.ckpt"  # a bare pickle, as torch's legacy format reads it
    raw.write_bytes(pickle.dumps({"state_dict": {}, "hyper_parameters": {"config": {}}, "note": Payload(marker)}, protocol=2))
    assert_payload_is_live(raw, marker)
    with pytest.raises(InputError, match="refused to load"):
        read_checkpoint(raw)
    assert not marker.exists()


def test_a_checkpoint_crafted_to_run_code_is_refused_by_eval(tmp_path, uninterrupted):
    """In a fresh interpreter, as a user runs it; ``resume=`` and more are in the table below."""
    marker = tmp_path / "payload-ran"
    hostile = payload_checkpoint(uninterrupted[0] / "checkpoints" / "last.ckpt", tmp_path / "hostile.ckpt", marker)
    assert_payload_is_live(hostile, marker)
    (tmp_path / "home").mkdir()
    # Even where the user's environment asks torch to load unsafely by default.
    env = {**ONE_THREAD, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    line = one_line_error(run_cli(["eval", str(hostile), "--out", str(tmp_path / "out")], tmp_path / "home", env=env, timeout=120), "eval")
    assert "hostile.ckpt: refused to load" in line and "weights_only=True" in line, line
    assert not marker.exists(), "the payload ran"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "hostile.ckpt"]  # no out/


# --------------------------------------------------------------------------------------------------
# Bad input to `ktframe fit` / `eval`, their overrides, YAML files and checkpoints: one line on
# stderr, exit code 2, no traceback, nothing written. Each case runs as a child forked from one
# process that imported ktframe's training code once (see test_bad_input.py).


@dataclass
class Case:
    id: str
    argv: list[str]  # after "ktframe"; "{name}" stands for the path of a file in ``bad_files``
    fragments: list[str]
    files: dict[str, bytes] = field(default_factory=dict)  # written into the case's own folder


FIT = ["fit", *TINY, "root=runs", "logger.kind=csv"]


def eval_with(*overrides: str) -> list[str]:
    return ["eval", "{good.ckpt}", "eval.tasks=4", "eval.ns=[32]", *overrides, "--out", "out"]


CASES = [
    # config values a schema type cannot refuse
    Case("fit-k-above-n", [*FIT, "data.k=40"], ["'data.k'=40 exceeds data.n=32", "expected data.k <= data.n"]),
    Case("fit-lr-nan", [*FIT, "optim.lr=nan"], ["'optim.lr' must be a positive number; got nan"]),
    Case("fit-lr-inf", [*FIT, "optim.lr=inf"], ["'optim.lr' must be a positive number; got inf"]),
    Case("fit-std-negative", [*FIT, "data.std=-0.1"], ["'data.std' must be a positive number; got -0.1"]),
    Case("fit-no-points", [*FIT, "data.n=0"], ["'data.n' must be an integer >= 1; got 0"]),
    Case("fit-steps-negative", [*FIT, "trainer.max_steps=-5"], ["'trainer.max_steps' must be an integer >= 1; got -5"]),
    Case("fit-dropout-above-1", [*FIT, "model.dropout=1.5"], ["'model.dropout' must be a number in [0, 1); got 1.5"]),
    Case("fit-family", [*FIT, "data.family=gauss"], ["'data.family' must be one of gaussian, cauchy", "got 'gauss'"]),
    Case("fit-initializer", [*FIT, "data.init=kmeans"], ["unknown initializer 'kmeans'", "did you mean 'k-means++'?"]),
    Case("fit-accelerator", [*FIT, "trainer.accelerator=tpu9"], ["invalid trainer.accelerator", "tpu9"]),
    Case(
        "fit-online-without-key",
        [*FIT, "logger.kind=wandb", "logger.mode=online"],
        ["logger.mode=online needs a W&B API key", "expected logger.mode=auto or offline"],
    ),
    Case("fit-wandb-mode", [*FIT, "logger.kind=wandb", "logger.mode=loud"], ["'logger.mode' must be one of auto, online, offline", "got 'loud'"]),
    # integers within their type and bounds, checked before the run folder is made
    Case("fit-seed-negative", [*FIT, "trainer.seed=-1"], ["config key 'trainer.seed' must be an integer from 0 to 4294967295 (a seed); got -1"]),
    Case("fit-seed-beyond-64-bits", [*FIT, f"trainer.seed={2**70}"], ["config key 'trainer.seed' must be an integer from 0 to 4294967295", f"got {2**70}"]),
    Case("fit-val-seed-beyond-64-bits", [*FIT, f"data.val_seed={2**70}"], ["config key 'data.val_seed' must be an integer from 0 to 4294967295"]),
    Case("fit-max-epochs-text", [*FIT, "trainer.max_epochs=abc"], ["config key 'trainer.max_epochs' must be an integer from 0 to 10000000000; got 'abc'"]),
    Case("fit-max-epochs-huge", [*FIT, "trainer.max_epochs=1e30"], ["config key 'trainer.max_epochs' must be an integer from 0 to 10000000000"]),
    Case(
        "fit-max-steps-huge", [*FIT, "trainer.max_steps=100000000000000000000000"], ["config key 'trainer.max_steps' must be an integer from 1 to 10000000000"]
    ),
    Case("fit-layers-huge", [*FIT, "model.n_layers=1000000000"], ["config key 'model.n_layers' must be an integer from 1 to 1000000; got 1000000000"]),
    Case("fit-early-stopping-negative", [*FIT, "trainer.early_stopping=-1"], ["config key 'trainer.early_stopping' must be null (never) or an integer >= 1"]),
    Case("fit-std-huge", [*FIT, "data.std=1e300"], ["config key 'data.std' must be a positive number up to 1e+15", "got 1e+300"]),
    Case("fit-name-empty", [*FIT, "name="], ["config key 'name' is empty; expected a folder name, or no name= at all for a generated run id"]),
    Case("fit-name-too-long", [*FIT, "name=" + "a" * 300], ["config key 'name' is 300 bytes long; expected a folder name of at most 200 bytes"]),
    Case("fit-override-yaml-tag", [*FIT, "data.n=!!python/object:os.system x"], ["could not parse overrides: refused", "expected plain values, no YAML tags"]),
    # YAML files
    Case("yaml-python-tag", [*FIT, "preset={python-tag.yaml}"], ["python-tag.yaml: refused", "python/object/apply:os.mkdir", "no Python tags"]),
    Case("yaml-not-a-mapping", [*FIT, "preset={list.yaml}"], ["list.yaml: a config file must be a mapping", "got list"]),
    Case("yaml-not-text", [*FIT, "preset={binary.yaml}"], ["binary.yaml: YAML syntax error", "can't decode"]),
    Case("yaml-bad-value", [*FIT, "preset={negative-lr.yaml}"], ["'optim.lr' must be a positive number; got -0.1"]),
    # checkpoints given to eval
    Case(
        "eval-truncated",
        ["eval", "{truncated.ckpt}"],
        ["truncated.ckpt: not a readable checkpoint (empty, truncated or corrupt", "expected a .ckpt written by ktframe fit"],
    ),
    Case("eval-empty", ["eval", "{empty.ckpt}"], ["empty.ckpt: not a readable checkpoint", "expected a .ckpt"]),
    Case("eval-not-a-checkpoint", ["eval", "{points.ckpt}"], ["points.ckpt: refused to load", "expected a .ckpt written by ktframe fit"]),
    Case("eval-payload", ["eval", "{hostile.ckpt}"], ["hostile.ckpt: refused to load", "weights_only=True"]),
    Case(
        "eval-other-d-k",
        ["eval", "{other-d-k.ckpt}"],
        ["other-d-k.ckpt: its weights do not fit the model its config describes", "size mismatch for layers.0", "torch.Size([9, 9])"],
    ),
    Case("eval-other-variant", ["eval", "{other-variant.ckpt}"], ["other-variant.ckpt: its weights do not fit the model its config describes"]),
    # d and k swapped: weights of the same shapes (d + k wide), trained for another k
    Case(
        "eval-swapped-d-k",
        ["eval", "{swapped-d-k.ckpt}"],
        ["swapped-d-k.ckpt: its weights were trained for d=2, k=3, not for the d=3, k=2 of the model its config"],
    ),
    Case("eval-missing", ["eval", "{nowhere.ckpt}"], ["nowhere.ckpt: no such checkpoint file"]),
    # eval overrides
    Case("eval-override-d", eval_with("data.d=5"), ["data.d cannot be changed at evaluation", "eval.* or data.family"]),
    Case("eval-override-variant", eval_with("model.variant=lloyd-dot"), ["model.variant cannot be changed at evaluation"]),
    Case("eval-no-tasks", eval_with("eval.tasks=0"), ["'eval.tasks' must be an integer >= 1; got 0"]),
    Case("eval-n-below-k", eval_with("eval.ns=[2]"), ["eval.ns holds n=2, fewer points than k=3"]),
    Case("eval-ns-not-a-list", eval_with("eval.ns=abc"), ["config key 'eval.ns'"]),
    Case("eval-ns-not-numbers", eval_with("eval.ns=[a]"), ["'eval.ns' must be a non-empty list of integers >= 1; got ['a']"]),
    Case("eval-family", eval_with("eval.family=cauchyy"), ["'eval.family' must be one of null, gaussian", "got 'cauchyy'"]),
    # checkpoints given to resume
    Case("resume-truncated", [*FIT, "resume={truncated.ckpt}"], ["truncated.ckpt: not a readable checkpoint"]),
    Case("resume-payload", [*FIT, "resume={hostile.ckpt}"], ["hostile.ckpt: refused to load", "weights_only=True"]),
    Case(
        "resume-other-d",
        [*FIT, "data.d=3", "resume={good.ckpt}"],
        ["cannot resume: the checkpoint was trained with data.d=2, this run has data.d=3", "add data.d=2"],
    ),
    Case("resume-other-variant", [*FIT, "resume={other-variant.ckpt}"], ["trained with model.variant=lloyd, this run has model.variant=learned"]),
    Case("resume-swapped-d-k", [*FIT, "data.d=3", "data.k=2", "resume={swapped-d-k.ckpt}"], ["its weights were trained for d=2, k=3, not for the d=3, k=2"]),
    Case(
        "init-from-swapped-d-k",
        [*FIT, "data.d=3", "data.k=2", "model.init_from={good.ckpt}"],
        ["good.ckpt: its weights were trained for d=2, k=3, not for the d=3, k=2 of the model this run's config describes"],
    ),
    Case(
        "resume-edited-weights",
        [*FIT, "data.d=5", "data.k=4", "resume={other-d-k.ckpt}"],
        ["other-d-k.ckpt: its weights do not fit the model its config describes", "size mismatch for model.layers.0"],
    ),
    Case(
        "resume-auto-corrupt-last",
        [*FIT, "name=cut", "resume=auto"],
        ["last.ckpt: not a readable checkpoint"],
        {"runs/cut/checkpoints/last.ckpt": b"PK\x03\x04 cut short"},
    ),
]
# Run with the cases, checked on its own: --debug shows what the one line hides.
DEBUG = Case("debug", ["--debug", "eval", "{truncated.ckpt}"], ["ktframe.core.errors.InputError: ", "not a readable checkpoint"])


@pytest.fixture(scope="module")
def bad_files(uninterrupted, tmp_path_factory) -> Path:
    """The files the cases name: checkpoints derived from a real one, YAML files, a marker that
    a payload would create."""
    folder = tmp_path_factory.mktemp("bad-files")
    source = uninterrupted[0] / "checkpoints" / "last.ckpt"
    whole = source.read_bytes()
    (folder / "good.ckpt").write_bytes(whole)
    (folder / "truncated.ckpt").write_bytes(whole[: len(whole) // 2])
    (folder / "empty.ckpt").write_bytes(b"")
    (folder / "points.ckpt").write_text("x,y\n1,2\n")
    payload_checkpoint(source, folder / "hostile.ckpt", folder / "payload-ran")
    edits = {
        "other-d-k.ckpt": {"data": {"d": 5, "k": 4}},
        "other-variant.ckpt": {"model": {"variant": "lloyd"}},
        "swapped-d-k.ckpt": {"data": {"d": 3, "k": 2}},
    }
    for name, changes in edits.items():
        checkpoint = torch.load(source, map_location="cpu", weights_only=True)
        for section, values in changes.items():
            checkpoint["hyper_parameters"]["config"][section].update(values)
        torch.save(checkpoint, folder / name)
    (folder / "python-tag.yaml").write_text(f"data: !!python/object/apply:os.mkdir ['{folder / 'payload-ran'}']\n")
    (folder / "list.yaml").write_text("- 1\n- 2\n")
    (folder / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01")
    (folder / "negative-lr.yaml").write_text("optim:\n  lr: -0.1\n")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"/" for p in sorted(folder.rglob("*"))}


def run_with_files(job: dict, env: dict[str, str]) -> int:
    """A job of the fork driver's kind, in a fresh interpreter (where there is no fork)."""
    with open(job["stdout"], "w") as stdout, open(job["stderr"], "w") as stderr:
        command = [sys.executable, "-m", "ktframe.cli.main", *job["argv"]]
        return subprocess.run(command, cwd=job["folder"], env=env, stdout=stdout, stderr=stderr, timeout=300).returncode


@pytest.fixture(scope="module")
def case_outcomes(bad_files, tmp_path_factory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("cases")
    jobs = []
    for case in [*CASES, DEBUG]:
        folder = root / case.id
        for name, content in case.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(content)
        folder.mkdir(exist_ok=True)
        argv = [re.sub(r"\{([^}]+)\}", lambda m: str(bad_files / m[1]), arg) for arg in case.argv]
        jobs.append({"id": case.id, "argv": argv, "folder": str(folder), "stdout": str(root / f"{case.id}.stdout"), "stderr": str(root / f"{case.id}.stderr")})
    before = snapshot(bad_files)
    # unsafe loading asked for by the environment, as in the test above: ktframe must not follow it
    env = cli_env(root, {**ONE_THREAD, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    if FORK:
        (root / "jobs.json").write_text(json.dumps(jobs))
        preload = "import ktframe.training.run, ktframe.evaluation.evaluate, ktframe.cli.fit, ktframe.cli.eval\n"
        driver = subprocess.run([sys.executable, "-c", preload + DRIVER, str(root / "jobs.json")], capture_output=True, text=True, timeout=300, env=env)
        assert driver.returncode == 0, driver.stderr
        codes = json.loads(driver.stdout)
    else:
        codes = {job["id"]: run_with_files(job, env) for job in jobs}
    assert snapshot(bad_files) == before, "a case changed the files it was given"
    assert not (bad_files / "payload-ran").exists(), "a payload ran"
    return {job["id"]: Outcome(codes[job["id"]], Path(job["stdout"]).read_text(), Path(job["stderr"]).read_text(), Path(job["folder"])) for job in jobs}


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, case_outcomes):
    outcome = case_outcomes[case.id]
    line = one_line_error(outcome, case.argv[0])
    for fragment in case.fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    # nothing created or changed in the folder it ran in (runs/, out/, a run folder, a checkpoint)
    given = {Path(name): content for name, content in case.files.items()}
    assert snapshot(outcome.folder) == {str(path): b"/" for name in given for path in name.parents if path != Path(".")} | {
        str(name): content for name, content in given.items()
    }


@pytest.mark.parametrize("override", ["name=${oc.decode:'!!python/name:os.system'}", "name=${oc.env:HOME}"])
def test_a_resolver_in_an_override_is_refused_and_makes_nothing(tmp_path, override):
    """OmegaConf's resolvers read the environment or parse text as YAML: an override takes plain values."""
    line = one_line_error(run_cli([*FIT, override], tmp_path, env=ONE_THREAD))
    assert f"override {override!r}: refused: a resolver (${{NAME:...}}); expected a plain value" in line, line
    assert not (tmp_path / "runs").exists()


def test_debug_shows_the_traceback(case_outcomes):
    outcome = case_outcomes[DEBUG.id]
    assert outcome.returncode == 1 and outcome.stderr.startswith("Traceback (most recent call last):")
    assert all(fragment in outcome.stderr for fragment in DEBUG.fragments), outcome.stderr


# --------------------------------------------------------------------------------------------------
# Plugins: one that raises while pluggy registers it; --no-plugins

# Its module lists its attributes lazily, and listing them fails: pluggy's register() does that to
# find a plugin's hooks, so this plugin fails at registration, after a clean import.
BROKEN_REGISTER = Distribution(
    name="ktframe-broken-register",
    version="0.0.6",
    module="ktframe_test_broken_register",
    entry_points={"broken-register": "ktframe_test_broken_register"},
    source="""
        from ktframe import hookimpl
        from ktframe.components.scores import Euclidean


        @hookimpl
        def ktframe_register_scores(register):
            register("never-registered", Euclidean)


        def __dir__():
            raise RuntimeError("ktframe-broken-register cannot list its hooks")
    """,
)


@pytest.fixture(scope="module")
def plugin_sites(tmp_path_factory) -> dict[str, Path]:
    return dists.build_all(tmp_path_factory.mktemp("plugins"), (GOOD, BROKEN_IMPORT, BROKEN_REGISTER))


@pytest.fixture(scope="module")
def plugin_runs(plugin_sites) -> dict[str, dists.Run]:
    good, broken_import, broken_register = (plugin_sites[d.name] for d in (GOOD, BROKEN_IMPORT, BROKEN_REGISTER))
    runs = {
        "register": (["plugins", "--json"], [good, broken_register], {"strict": False}),
        "register-strict": (["plugins", "--json"], [good, broken_register], {"strict": True}),
        "no-plugins": (["--no-plugins", "plugins", "--json"], [good, broken_import], {"strict": True}),
        "env-disabled": (["plugins", "--json"], [good, broken_import], {"strict": True, "disable": "1"}),
    }
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(dists.ktframe, args, paths, **options) for name, (args, paths, options) in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_a_plugin_that_raises_at_registration_is_named_and_the_rest_load(plugin_runs):
    run = plugin_runs["register"]
    assert run.returncode == 0, run
    info = run.json()
    assert info["failures"] == [
        {
            "plugin": "broken-register",
            "distribution": "ktframe-broken-register",
            "stage": "register",
            "error": "RuntimeError: ktframe-broken-register cannot list its hooks",
        }
    ]
    assert "plugin 'broken-register' from distribution ktframe-broken-register failed at register" in run.stderr
    names = [p["name"] for p in info["plugins"]]
    assert "good" in names and "broken-register" not in names
    scores = {name for p in info["plugins"] for name in p["registers"].get("score", [])}
    assert "manhattan" in scores and "never-registered" not in scores


def test_a_registration_failure_leaves_nothing_of_the_plugin_behind(plugin_sites, monkeypatch):
    for dist in (GOOD, BROKEN_REGISTER):
        monkeypatch.syspath_prepend(str(plugin_sites[dist.name]))
    monkeypatch.setenv("KTFRAME_STRICT_PLUGINS", "0")
    monkeypatch.delenv(pluginmanager.DISABLE_ENV, raising=False)
    try:
        with pytest.warns(PluginLoadWarning, match="broken-register"):
            state = pluginmanager.load()
    finally:
        pluginmanager.reset()
    assert [(f.plugin, f.stage) for f in state.failures] == [("broken-register", "register")]
    assert state.manager.get_plugin("broken-register") is None  # pluggy's side too, not only ktframe's registry
    assert state.registry.get("score", "manhattan") is not None


def test_strict_mode_makes_a_registration_failure_a_one_line_error(plugin_runs):
    line = one_line_error(plugin_runs["register-strict"], "plugins")
    assert "plugin 'broken-register' from distribution ktframe-broken-register failed at register" in line


def test_no_plugins_runs_ktframe_alone(plugin_runs):
    run = plugin_runs["no-plugins"]
    assert run.returncode == 0, run  # strict, yet the plugin that fails to import is never imported
    info = run.json()
    assert info["failures"] == [] and "learned" in [v["name"] for v in info["variants"]]
    assert all(p["distribution"] == "ktframe" for p in info["plugins"])
    assert info == plugin_runs["env-disabled"].json()  # the switch is KTFRAME_DISABLE_PLUGINS=1


# --------------------------------------------------------------------------------------------------
# No network


def test_wandb_unreachable_and_no_key_never_hangs_and_says_how_to_sync(tmp_path):
    # A server that accepts connections and never answers: a W&B client that tried it would hang.
    with socket.create_server(("127.0.0.1", 0)) as server:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        done = ok(fit(tmp_path, "name=w", logger=None, env={**ONE_THREAD, "WANDB_BASE_URL": url}, timeout=240))
        assert select.select([server], [], [], 0)[0] == [], "W&B tried to reach the server"
    offline = sorted((tmp_path / "runs" / "w" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert f"W&B ran offline; upload with: wandb sync {offline[0]}" in done.stdout
    assert summary(tmp_path / "runs" / "w")["wandb_sync"] == f"wandb sync {offline[0]}"
    assert "API key" not in done.stdout + done.stderr  # no prompt, no login attempt


@pytest.mark.slow
def test_wandb_with_a_key_and_no_network_falls_back_offline_in_bounded_time(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as server:
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        env = {**ONE_THREAD, "WANDB_BASE_URL": url, "WANDB_API_KEY": "k" * 40}
        start = time.monotonic()
        done = ok(fit(tmp_path, "name=w", "logger.init_timeout=2", "logger.log_model=false", logger=None, env=env, timeout=240))
        took = time.monotonic() - start
    warnings = [line for line in done.stderr.splitlines() if line.startswith("ktframe fit: warning: W&B")]
    assert len(warnings) == 1 and warnings[0].endswith("logging offline instead"), done.stderr[-3000:]
    assert took < 90, took  # W&B's own default would wait 90 s before the run even started
    (offline,) = (tmp_path / "runs" / "w" / "wandb").glob("offline-run-*")
    assert f"W&B ran offline; upload with: wandb sync {offline}" in done.stdout
    assert summary(tmp_path / "runs" / "w")["global_step"] == 20


# --------------------------------------------------------------------------------------------------
# Properties of the exact models and the reference on random valid input


@st.composite
def valid_problems(draw):
    """``problems()`` of test_equivalence in float32 or float64, at scales far from 1, and with
    repeated points (exact ties) half of the time."""
    X, C0, layers, _ = draw(problems())
    if draw(st.booleans()):
        X = torch.cat([X, X[:, : max(1, X.shape[1] // 2)]], dim=1)
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    return (X * scale).to(dtype), (C0 * scale).to(dtype), layers


# A Lloyd iteration never increases the objective in exact arithmetic. Computed, two things move
# it by rounding alone. The objective itself is summed in float64 (relative error ~1e-16). And a
# center is a mean rounded to the dtype: at a fixed assignment the mean minimises the cost, so a
# center off by d raises it by n * d**2 only, relative (unit roundoff)**2 * (|x| / spread)**2, which
# for float32 (roundoff 6e-8) on these data is up to ~1e-11 (5e-12 seen in 1 500 examples).
RTOL = {torch.float64: 1e-13, torch.float32: 1e-9}
RUNNERS = [*EXACT_MODELS, pytest.param("reference", {}, id="reference")]


@pytest.mark.parametrize("variant, options", RUNNERS)
@settings(max_examples=30, deadline=None)
@given(problem=valid_problems())
def test_no_nan_and_the_objective_never_increases_layer_to_layer(variant, options, problem):
    X, C0, layers = problem
    if variant == "reference":
        result = reference.lloyd(X, C0, layers)
    else:
        result = run_model(variant, options, X, C0, layers, dtype=X.dtype)
    assert result.trajectory.dtype == X.dtype
    assert bool(torch.isfinite(result.trajectory).all()) and bool(torch.isfinite(result.assignments).all())
    # the objective of each layer's centers, computed in float64 for the points as given
    objective = torch.stack([reference.objective(X.double(), result.trajectory[:, t].double()) for t in range(layers + 1)], dim=1)
    rises = objective[:, 1:] - objective[:, :-1]
    allowed = RTOL[X.dtype] * objective[:, :-1] + torch.finfo(torch.float64).tiny
    assert bool((rises <= allowed).all()), f"largest relative rise {float((rises / objective[:, :-1].clamp_min(1e-300)).max()):.3g}"
