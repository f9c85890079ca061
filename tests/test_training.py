"""``ktframe fit`` and ``ktframe config show`` as a user runs them: the real command line in
subprocesses (no mocks), with tiny tasks so that every run takes seconds.

Every run gets a folder of its own as HOME (so no ~/.netrc or W&B settings are found) and as the
runs' root, and an environment without W&B variables or an inherited run id.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]

# Tasks of 32 points in 2-d with 3 clusters, 4 per batch; 8 validation tasks (two DDP ranks see 4
# each; any count is validated exactly, see test_reliability.py's torchrun test with 7).
TINY = [
    "data.n=32",
    "data.d=2",
    "data.k=3",
    "data.batch_size=4",
    "data.val_tasks=8",
    "data.val_batch_size=4",
    "trainer.max_steps=20",
    "trainer.val_every=10",
    "trainer.progress_bar=false",
]
VAL_METRICS = ("val/ratio", "val/objective", "val/log_objective", "val/ari", "val/nmi")


def cli_env(home: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without W&B settings or an inherited run id, ``home`` as HOME,
    the repository on the path, then ``env``."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_") and key not in ("NETRC", "KTFRAME_RUN_ID")}
    environ.update(HOME=str(home), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return {**environ, **(env or {})}


def start_cli(args: list[str], home: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m ktframe.cli.main ARGS`` started in ``home``, in a process group of its own."""
    command = [sys.executable, "-m", "ktframe.cli.main", *args]
    return subprocess.Popen(
        command, cwd=home, env=cli_env(home, env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def run_cli(args: list[str], home: Path, *, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m ktframe.cli.main ARGS`` in ``home``; on a timeout its whole process group (DDP
    ranks, W&B's service) is killed and the test fails."""
    proc = start_cli(args, home, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"`ktframe {' '.join(args)}` still running after {timeout} s\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def fit(tmp_path: Path, *overrides: str, logger: str | None = "csv", **kwargs) -> subprocess.CompletedProcess:
    args = ["fit", *TINY, f"root={tmp_path / 'runs'}", *([f"logger.kind={logger}"] if logger else []), *overrides]
    return run_cli(args, tmp_path, **kwargs)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-5000:]}"
    return done


def one_line_error(done: subprocess.CompletedProcess, command: str = "fit") -> str:
    """The contract of every user error: exit 2, one line on stderr, no traceback, nothing on stdout."""
    assert done.returncode == 2, f"exit {done.returncode}\n--- stderr\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"ktframe {command}: error: "), lines[0]
    assert done.stdout == ""
    return lines[0]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def logged(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every row that logged ``key``."""
    return [(int(row["step"]), float(row[key])) for row in rows if row.get(key)]


def assert_plain(value, where: str = "config") -> None:
    """Only the containers and scalars that ``torch.load(weights_only=True)`` and JSON take."""
    if isinstance(value, dict):
        assert type(value) is dict, f"{where}: {type(value).__name__}"
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r}"
            assert_plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        assert type(value) is list, f"{where}: {type(value).__name__}"
        for i, item in enumerate(value):
            assert_plain(item, f"{where}[{i}]")
    else:
        assert value is None or type(value) in (str, int, float, bool), f"{where}: {type(value).__name__}"


def validate_in_process(state: dict, dataset) -> dict[str, float]:
    """The validation metrics of a checkpoint's model on ``dataset``, in one process."""
    from torch.utils.data import DataLoader

    from ktframe.learning.module import KMeansTransformerModule

    module = KMeansTransformerModule(state["hyper_parameters"]["config"])
    module.load_state_dict(state["state_dict"])  # strict: the keys are the module's own
    module.eval()
    with torch.no_grad():
        for i, batch in enumerate(DataLoader(dataset, batch_size=4, shuffle=False)):
            module.validation_step(batch, i)
    return {name: float(value) for name, value in module.val_metrics.compute().items()}


# --------------------------------------------------------------------------------------------------
# 1. A fit, end to end


@pytest.mark.slow
def test_fit_end_to_end_learns_and_writes_its_run_folder(tmp_path):
    done = ok(fit(tmp_path, "name=e2e", "trainer.max_steps=60", "trainer.val_every=30", "trainer.log_every=1", "optim.lr=0.01"))
    run_dir = tmp_path / "runs" / "e2e"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["e2e"]
    result = summary(run_dir)
    assert done.stdout.splitlines()[0].startswith(f"run {result['run_id']}: 60 steps")

    # The loss falls: the last ten logged training losses beat the first ten.
    rows = csv_rows(run_dir)
    losses = logged(rows, "train/loss")
    assert [step for step, _ in losses] == list(range(60))
    first, last = [v for _, v in losses[:10]], [v for _, v in losses[-10:]]
    assert sum(last) / 10 < sum(first) / 10, (first, last)

    # The summary: the steps, one process, the best validation ratio and the final metrics.
    assert result["global_step"] == 60 and result["world_size"] == 1
    ratios = logged(rows, "val/ratio")
    assert [step for step, _ in ratios] == [29, 59]  # validated every 30 steps, the last at the end
    assert result["best_val_ratio"] == pytest.approx(min(v for _, v in ratios))
    assert set(result["metrics"]) == {"train/loss", "train/lr", *VAL_METRICS}
    assert all(math.isfinite(v) for v in result["metrics"].values())
    assert result["metrics"]["val/ratio"] == pytest.approx(ratios[-1][1])

    # The resolved config, as run: the overrides on top of the quick preset, with the run id.
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    assert config["run_id"] == result["run_id"] and config["name"] == "e2e" and config["preset"] == "quick"
    assert config["trainer"]["max_steps"] == 60 and config["optim"]["lr"] == 0.01 and config["data"]["n"] == 32

    # Both checkpoints load with weights_only=True and carry the same config, in plain containers.
    checkpoints = run_dir / "checkpoints"
    assert run_dir / result["best_checkpoint"] == checkpoints / "best.ckpt"  # relative to the run folder
    for name in ("last.ckpt", "best.ckpt"):
        state = torch.load(checkpoints / name, map_location="cpu", weights_only=True)
        assert {"state_dict", "hyper_parameters"} <= set(state), name
        assert type(state["hyper_parameters"]["config"]) is dict
        assert_plain(state["hyper_parameters"]["config"])
        assert state["hyper_parameters"]["config"] == {**config, "root": ".."}  # its paths relative to the run folder
        assert state["state_dict"] and all(isinstance(t, torch.Tensor) for t in state["state_dict"].values())
    assert torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == 60

    # The figures of the trained model are in the run folder.
    assert sorted(p.name for p in (run_dir / "figures").iterdir()) == ["attention.png", "objective.png", "qk.png", "trajectories.png"]

    # `ktframe eval` runs the paper's protocol on the checkpoint (small: 8 tasks, 5 steps).
    evaluated = ok(
        run_cli(["eval", str(checkpoints / "best.ckpt"), "eval.tasks=8", "eval.batch_size=4", "eval.steps=5", "eval.ns=[16,32]", "--json"], tmp_path)
    )
    report = json.loads(evaluated.stdout)
    assert set(report["log_objective"]) == {"model", "lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++"}
    assert all(len(values) == 6 and all(math.isfinite(v) for v in values) for values in report["log_objective"].values())
    assert report["primary"] == {"init": "random", "n": 32, "k": 3}  # the training n and k, the first init
    assert [(s["init"], s["n"]) for s in report["settings"]] == [("random", 16), ("random", 32), ("k-means++", 16), ("k-means++", 32)]
    # Lloyd never increases the objective; the model and Lloyd share their start.
    lloyd = report["log_objective"]["lloyd"]
    assert all(b <= a + 1e-9 for a, b in zip(lloyd, lloyd[1:]))
    assert report["log_objective"]["model"][0] == pytest.approx(lloyd[0])
    assert (run_dir / "eval" / "eval.json").is_file() and (run_dir / "eval" / "eval.png").is_file()


# --------------------------------------------------------------------------------------------------
# 2. Two DDP processes on CPU (gloo)


@pytest.mark.slow
def test_ddp_two_processes_agree_on_run_and_reduce_metrics_exactly(tmp_path):
    from torch.utils.data import Subset

    from ktframe.learning.config import load_config
    from ktframe.learning.data import TaskDataModule

    overrides = ["trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp"]
    done = ok(fit(tmp_path, *overrides, env={"KTFRAME_RUN_ID": "ddp-agree-1"}, timeout=300))

    # Both ranks took the run id of the environment: one folder, named after it.
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["ddp-agree-1"]
    run_dir = tmp_path / "runs" / "ddp-agree-1"
    result = summary(run_dir)
    assert result["run_id"] == "ddp-agree-1" and result["world_size"] == 2 and result["global_step"] == 20
    reports = [line for line in done.stdout.splitlines() if line.startswith("run ")]
    assert len(reports) == 1 and reports[0].startswith("run ddp-agree-1: 20 steps"), done.stdout  # rank 0 only

    # Each rank validated half of the tasks; the logged metrics, reduced across ranks, are those of
    # the final model on all of them in one process. (max_steps is a multiple of val_every, so the
    # last validation saw the weights of last.ckpt.)
    cfg = load_config([*TINY, f"root={tmp_path / 'runs'}", "logger.kind=csv", *overrides])
    data = TaskDataModule(cfg.data)
    data.setup()
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["global_step"] == 20
    assert logged(csv_rows(run_dir), "val/ratio")[-1][0] == 19
    whole = validate_in_process(state, data.val)
    for name in VAL_METRICS:
        assert result["metrics"][name] == pytest.approx(whole[name], rel=1e-5, abs=1e-6), name
    # ... and not those of one rank's half, so the comparison means something.
    half = validate_in_process(state, Subset(data.val, range(0, len(data.val), 2)))
    assert half["val/ratio"] != pytest.approx(whole["val/ratio"], rel=1e-4)


# --------------------------------------------------------------------------------------------------
# 3. Resuming


@pytest.mark.slow
def test_resume_auto_continues_the_named_run(tmp_path):
    first = ok(fit(tmp_path, "name=r", "trainer.log_every=1"))
    run_dir = tmp_path / "runs" / "r"
    before = summary(run_dir)
    assert before["global_step"] == 20

    second = ok(fit(tmp_path, "name=r", "trainer.log_every=1", "resume=auto", "trainer.max_steps=40"))
    # ktframe's own lines alone: not Lightning's warnings that the run's csv/ and checkpoints/ hold files
    assert [line.split(":")[0] for line in second.stderr.splitlines()] == ["ktframe fit"], second.stderr
    after = summary(run_dir)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r"]
    # The same run goes on: its id (hence its W&B run) too, not only its folder.
    assert after["run_id"] == before["run_id"], (first.stdout, second.stdout)
    assert after["global_step"] == 40 and second.stdout.startswith(f"run {before['run_id']}: 40 steps")
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["global_step"] == 40 and state["hyper_parameters"]["config"]["trainer"]["max_steps"] == 40

    # metrics.csv holds the whole run: the first part's rows kept, the second's appended, none twice.
    rows = csv_rows(run_dir)
    assert [step for step, _ in logged(rows, "train/loss")] == list(range(40))
    assert [step for step, _ in logged(rows, "val/ratio")] == [9, 19, 29, 39]

    # The plateau scheduler saw every validation once, as in an unbroken run: those at steps
    # 10, 20 and 30 (the one at 40 comes after last.ckpt is written), including the one at 20 that
    # the first part's checkpoint was written at.
    scheduler = state["lr_schedulers"][0]
    assert scheduler["last_epoch"] == 3
    ratios = [v for _, v in logged(rows, "val/ratio")]
    assert scheduler["best"] == pytest.approx(min(ratios[:3]))


def test_a_finished_run_resumed_keeps_its_final_metrics(tmp_path):
    """A run resumed at its last step (it stopped after training, before its summary: say, in its
    evaluation) trains nothing; its summary still holds the final validation, as the first had."""
    ok(fit(tmp_path, "name=r"))
    run_dir = tmp_path / "runs" / "r"
    before, rows = summary(run_dir), csv_rows(run_dir)
    (run_dir / "summary.json").unlink()
    ok(fit(tmp_path, "name=r", "resume=auto"))
    after = summary(run_dir)
    assert csv_rows(run_dir) == rows  # validated for the summary, not logged a second time
    assert after["global_step"] == before["global_step"] == 20 and after["run_id"] == before["run_id"]
    val = {name: value for name, value in before["metrics"].items() if name.startswith("val/")}
    assert set(val) >= {"val/ratio", "val/objective", "val/ari"}
    assert {name: after["metrics"][name] for name in val} == pytest.approx(val, rel=1e-6)


def test_resume_from_a_missing_checkpoint_is_a_one_line_error(tmp_path):
    missing = tmp_path / "nowhere" / "last.ckpt"
    line = one_line_error(fit(tmp_path, f"resume={missing}"))
    assert f"resume={missing}" in line and "no such checkpoint" in line
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------------
# 4. Config errors and `ktframe config show`


def _bad_yaml(tmp_path: Path) -> str:
    (tmp_path / "bad.yaml").write_text("data:\n  n: [128, 256\ntrainer:\n  max_steps: 5\n")
    return "preset=bad.yaml"


CONFIG_ERRORS = [
    pytest.param(lambda tmp: "optim.lrr=0.1", ["unknown config key 'optim.lrr'", "did you mean 'optim.lr'"], id="misspelt-key"),
    pytest.param(lambda tmp: "trainer.max_steps=abc", ["config key 'trainer.max_steps' has the value 'abc'; expected an integer"], id="wrong-type"),
    pytest.param(lambda tmp: "model.scale=[1]", ["config key 'model.scale' has the value [1]; expected a number or null"], id="wrong-type-optional"),
    pytest.param(lambda tmp: "name=../../x", ["config key 'name' must be a single folder name", "got '../../x'"], id="name-leaves-root"),
    pytest.param(lambda tmp: "name=/tmp/outside", ["config key 'name' must be a single folder name", "got '/tmp/outside'"], id="name-absolute"),
    pytest.param(lambda tmp: "run_id=..", ["config key 'run_id' must be a single folder name", "got '..'"], id="run-id-dot-dot"),
    pytest.param(lambda tmp: "preset=quik", ["unknown preset 'quik'", "did you mean 'quick'"], id="unknown-preset"),
    pytest.param(_bad_yaml, ["bad.yaml", "YAML syntax error"], id="yaml-syntax-error"),
]


@pytest.mark.parametrize("make_override, fragments", CONFIG_ERRORS)
def test_config_error_is_one_line_and_creates_nothing(tmp_path, make_override, fragments):
    line = one_line_error(run_cli(["fit", f"root={tmp_path / 'runs'}", make_override(tmp_path)], tmp_path, timeout=120))
    for fragment in fragments:
        assert fragment in line, line
    assert not (tmp_path / "runs").exists()


def test_config_show_prints_the_resolved_yaml(tmp_path):
    done = ok(run_cli(["config", "show", "optim.lr=0.5"], tmp_path, timeout=120))
    assert done.stderr == ""
    assert "  lr: 0.5" in done.stdout.splitlines()
    shown = OmegaConf.to_container(OmegaConf.create(done.stdout))
    assert shown["optim"]["lr"] == 0.5 and shown["preset"] == "quick"

    # Every value of the quick preset is there (the preset file is the reference, not a copy of it).
    def leaves(tree: dict, prefix: str = ""):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    preset = OmegaConf.to_container(OmegaConf.load(REPO / "configs" / "quick.yaml"))
    flat = dict(leaves(shown))
    for key, value in leaves(preset):
        assert flat[key] == value, key


# --------------------------------------------------------------------------------------------------
# 5. W&B with no network and no API key


@pytest.mark.slow
def test_wandb_without_a_key_runs_offline_and_says_how_to_sync(tmp_path):
    assert not (tmp_path / ".netrc").exists()
    done = ok(fit(tmp_path, "name=w", logger=None, timeout=240))  # logger.kind left at its default, wandb
    run_dir = tmp_path / "runs" / "w"
    result = summary(run_dir)
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and offline[0].is_dir(), sorted(p.name for p in (run_dir / "wandb").iterdir())
    assert offline[0].name.endswith(result["run_id"])  # the W&B run id is the ktframe run id
    assert list(offline[0].glob("*.wandb")), sorted(p.name for p in offline[0].iterdir())
    assert result["wandb_sync"] == f"wandb sync {offline[0]}"
    assert f"upload with: {result['wandb_sync']}" in done.stdout, done.stdout
    assert result["global_step"] == 20
