"""Experiments as researchers run them, on real processes (the installed wheel: test_wheel.py):
multiruns, evaluation after training, ``ktframe report``, offline W&B runs read back from their own
files, Lightning Trainer arguments, and the bad input of each (one line, exit 2, nothing written)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_training import REPO, TINY, csv_rows, fit, logged, ok, one_line_error, run_cli, summary
from wandb.sdk.launch.sweeps import utils as sweep_utils
from wandb_records import records

from ktframe.learning.config import describe_keys, load_config

# The evaluation protocol, shrunk: 8 tasks at two n, 5 steps.
SMALL_EVAL = ["eval.tasks=8", "eval.batch_size=4", "eval.steps=5", "eval.ns=[16,32]"]


def offline_run(run_dir: Path) -> Path:
    (found,) = (run_dir / "wandb").glob("offline-run-*")
    return found


def wandb_records(run_dir: Path) -> list:
    (path,) = offline_run(run_dir).glob("*.wandb")
    return list(records(path))


# --------------------------------------------------------------------------------------------------
# 1. Every run ends validated and checkpointed


def test_a_run_whose_last_step_falls_between_validations_ends_validated_and_checkpointed(tmp_path):
    ok(fit(tmp_path, "name=between", "trainer.max_steps=25", "trainer.val_every=10", "trainer.log_every=1"))
    run_dir = tmp_path / "runs" / "between"
    assert [step for step, _ in logged(csv_rows(run_dir), "val/ratio")] == [9, 19, 24]  # the last at step 25
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 25
    result = summary(run_dir)
    assert result["global_step"] == 25
    ratios = [value for _, value in logged(csv_rows(run_dir), "val/ratio")]
    assert result["metrics"]["val/ratio"] == pytest.approx(ratios[-1])  # the final validation
    assert result["best_val_ratio"] == pytest.approx(min(ratios))
    best = torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    assert best["global_step"] == [10, 20, 25][ratios.index(min(ratios))]


# --------------------------------------------------------------------------------------------------
# 2. Multirun, evaluation after training, report


def test_a_resumed_run_is_evaluated_with_the_eval_settings_given_when_it_resumes(tmp_path):
    """The checkpoint keeps the config it was trained with; the evaluation after a resumed run
    follows the eval.* of the command that resumed it (a sweep narrowed to one n on its way)."""
    ok(fit(tmp_path, "name=r", *SMALL_EVAL))  # trained, not evaluated: its checkpoints hold eval.ns=[16,32] and both inits
    run_dir = tmp_path / "runs" / "r"
    ok(fit(tmp_path, "name=r", "resume=auto", "eval.after_fit=true", *SMALL_EVAL[:-1], "eval.ns=[32]", "eval.inits=[random]"))
    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    assert [(setting["init"], setting["n"]) for setting in report["settings"]] == [("random", 32)]
    assert summary(run_dir)["global_step"] == 20  # finished already: resumed, not trained further


@pytest.mark.slow
def test_multirun_of_two_seeds_evaluates_each_and_reports_them(tmp_path):
    done = ok(fit(tmp_path, "-m", "--jobs", "2", "name=seeds", "trainer.seed=0,1", "eval.after_fit=true", *SMALL_EVAL, timeout=300))
    sweep = tmp_path / "runs" / "seeds"
    assert sorted(p.name for p in sweep.iterdir()) == [".lock", "0", "1", "multirun.json"]  # the sweep's lock, released
    state = json.loads((sweep / "multirun.json").read_text())
    assert [(job["swept"], job["status"]) for job in state["jobs"]] == [({"trainer.seed": "0"}, "ok"), ({"trainer.seed": "1"}, "ok")]
    assert f"ktframe report {sweep}" in done.stdout

    summaries = [summary(sweep / job) for job in ("0", "1")]
    configs = [OmegaConf.load(sweep / job / "config.yaml") for job in ("0", "1")]
    assert [(c.trainer.seed, c.data.seed, c.logger.group) for c in configs] == [(0, 0, "seeds"), (1, 1, "seeds")]
    assert summaries[0]["run_id"] != summaries[1]["run_id"]
    assert summaries[0]["metrics"]["val/ratio"] != summaries[1]["metrics"]["val/ratio"]  # two seeds, two runs
    evals = [json.loads((sweep / job / "eval" / "eval.json").read_text()) for job in ("0", "1")]

    report = json.loads(ok(run_cli(["report", str(sweep), "--json"], tmp_path)).stdout)
    assert report["runs"] == 2 and sorted(report["paths"]) == ["0", "1"]
    ratio = report["metrics"]["val/ratio"]
    assert ratio["n"] == 2 and ratio["mean"] == pytest.approx(sum(s["metrics"]["val/ratio"] for s in summaries) / 2)
    rows = {(row["init"], row["n"], row["method"]): row for row in report["eval"]}
    assert set(rows) == {
        (init, n, m) for init in ("random", "k-means++") for n in (16, 32) for m in ("model", "lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++")
    }
    model = rows[("random", 32, "model")]
    finals = [next(s for s in e["settings"] if (s["init"], s["n"]) == ("random", 32))["log_objective"]["model"][-1] for e in evals]
    assert model["runs"] == 2 and model["mean"] == pytest.approx(sum(finals) / 2)
    # both seeds were evaluated on the same tasks (eval.seed): their paired differences make one set
    versus = next(r for r in report["versus"] if (r["init"], r["n"], r["method"], r["versus"]) == ("random", 32, "model", "lloyd"))
    pairs = [next(s for s in e["settings"] if (s["init"], s["n"]) == ("random", 32))["versus"]["model"]["lloyd"] for e in evals]
    assert (versus["runs"], versus["task_sets"], versus["tasks"]) == (2, 1, evals[0]["tasks"])
    assert versus["mean"] == pytest.approx(sum(p["mean"] for p in pairs) / 2) and versus["sem"] == pytest.approx(sum(p["sem"] for p in pairs) / 2)
    assert all((sweep / "report" / name).is_file() for name in ("report.json", "report.md", "report.png", "training.png"))
    ratios = [dict(logged(csv_rows(sweep / job), "val/ratio")) for job in ("0", "1")]  # the runs' own CSV logs
    curve = report["training"]["curves"]["val/ratio"]
    assert curve["step"] == sorted(ratios[0]) == sorted(ratios[1]) and curve["runs"] == [2] * len(curve["step"])
    assert curve["median"] == pytest.approx([(ratios[0][step] + ratios[1][step]) / 2 for step in curve["step"]])


@pytest.mark.slow
def test_a_failing_job_does_not_stop_the_others_and_is_named(tmp_path):
    # The second job's initialiser is looked up when its run starts, so it fails there, not at planning.
    done = run_cli(["fit", "-m", *TINY, f"root={tmp_path / 'runs'}", "logger.kind=csv", "name=mixed", "data.init=random,no-such-init"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert "1 of 2 runs failed: job 1 (data.init=no-such-init" in done.stderr
    sweep = tmp_path / "runs" / "mixed"
    assert summary(sweep / "0")["global_step"] == 20
    assert "no-such-init" in (sweep / "1" / "fit.log").read_text()
    assert [job["status"] for job in json.loads((sweep / "multirun.json").read_text())["jobs"]] == ["ok", "failed"]


# --------------------------------------------------------------------------------------------------
# 3. W&B a dashboard can use


@pytest.mark.slow
def test_offline_wandb_run_holds_group_tags_model_artifact_and_eval_table(tmp_path):
    tags = ["logger.group=grp", "logger.tags=[seed0,quick]", "logger.job_type=train", "logger.notes=a note"]
    ok(fit(tmp_path, "name=wb", "eval.after_fit=true", *SMALL_EVAL, *tags, logger=None))
    run_dir = tmp_path / "runs" / "wb"
    found = wandb_records(run_dir)
    kinds = [r.WhichOneof("record_type") for r in found]

    (run,) = [r.run for r in found if r.WhichOneof("record_type") == "run"]
    assert (run.run_group, list(run.tags), run.job_type, run.notes) == ("grp", ["seed0", "quick"], "train", "a note")
    assert run.run_id == summary(run_dir)["run_id"]

    # The config once, as flat sections (not a second copy nested under "config").
    assert kinds.count("config") == 1
    (config,) = [r.config for r in found if r.WhichOneof("record_type") == "config"]
    assert {u.key for u in config.update} >= {"data", "model", "optim", "trainer", "logger", "eval"}
    assert "config" not in {u.key for u in config.update}

    # The best checkpoint as a model artifact, byte for byte.
    (model,) = [r.artifact for r in found if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "model"]
    assert [entry.path for entry in model.manifest.contents] == ["best.ckpt"] and "best" in model.aliases
    assert json.loads(model.metadata)["best_val_ratio"] == pytest.approx(summary(run_dir)["best_val_ratio"])

    # The evaluation as a table (one row per setting, method and step) and its picture; the learning rate.
    history = {item.key or "/".join(item.nested_key): item.value_json for r in found if r.WhichOneof("record_type") == "history" for item in r.history.item}
    assert json.loads(history["eval/log_objective/_type"]) == "table-file"
    table = json.loads((offline_run(run_dir) / "files" / json.loads(history["eval/log_objective/path"])).read_text())
    assert table["columns"] == ["init", "n", "k", "method", "step", "log_objective"]
    assert len(table["data"]) == 2 * 2 * 5 * 6  # inits x ns x methods x (steps + 1)
    evaluated = json.loads((run_dir / "eval" / "eval.json").read_text())
    first = evaluated["settings"][0]
    assert table["data"][0] == [first["init"], first["n"], first["k"], "model", 0, pytest.approx(first["log_objective"]["model"][0])]
    assert json.loads(history["eval/objective/_type"]) == "images/separated"
    assert float(history["train/lr"]) == pytest.approx(0.01)


@pytest.mark.slow
def test_the_sweep_file_runs_as_wandb_agent_runs_it(tmp_path):
    """configs/sweeps/gamma-lr.yaml, expanded as `wandb agent` expands it for one grid point, with
    the run id the agent exports: the run folder and the W&B run follow that id."""
    config = sweep_utils.load_sweep_config(str(REPO / "configs" / "sweeps" / "gamma-lr.yaml"))
    assert config["method"] == "grid" and config["metric"] == {"name": "val/ratio", "goal": "minimize"}
    point = {key: {"value": spec["values"][0]} for key, spec in config["parameters"].items()}
    args = sweep_utils.create_sweep_command_args({"args": point})
    command = []
    for part in sweep_utils.create_sweep_command(list(config["command"])):
        macro = part[2:-1] if part.startswith("${") else None
        command += {"env": [], "args_no_hyphens": args["args_no_hyphens"]}.get(macro, [part]) if macro else [part]
    assert command[:2] == ["ktframe", "fit"] and "model.gamma=0.5" in command and "optim.lr=0.003" in command
    shrink = [*TINY, f"root={tmp_path / 'runs'}"]  # the grid point on tiny tasks, as the test's own overrides
    ok(run_cli([*command[1:], *shrink], tmp_path, env={"WANDB_RUN_ID": "agentrun1", "WANDB_MODE": "offline"}))
    run_dir = tmp_path / "runs" / "agentrun1"
    assert summary(run_dir)["run_id"] == "agentrun1"
    assert offline_run(run_dir).name.endswith("-agentrun1")
    (run,) = [r.run for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "run"]
    assert run.run_group == "gamma-lr" and run.job_type == "sweep"
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert (saved.model.gamma, saved.optim.lr) == (0.5, 0.003)


# --------------------------------------------------------------------------------------------------
# 4. Lightning Trainer arguments, early stopping, --help


@pytest.mark.slow
def test_any_trainer_argument_reaches_lightning_and_early_stopping_stops(tmp_path):
    done = ok(
        fit(
            tmp_path,
            "name=t",
            "trainer.max_steps=200",
            "trainer.profiler=simple",
            "trainer.gradient_clip_val=0.5",
            "trainer.early_stopping=1",
            "optim.lr=1e-12",
        )
    )
    assert "FIT Profiler Report" in done.stdout + done.stderr  # trainer.profiler reached the Trainer
    run_dir = tmp_path / "runs" / "t"
    # The weights cannot move at this learning rate, so val/ratio never improves on its first value:
    # early stopping with patience 1 ends the run at the second validation.
    assert summary(run_dir)["global_step"] == 20
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.trainer.gradient_clip_val == 0.5 and saved.trainer.profiler == "simple"


@pytest.mark.parametrize("preset, n", [(None, "128"), ("paper", "512")])
def test_fit_help_lists_every_config_key_with_type_the_runs_value_and_meaning(tmp_path, preset, n):
    """The values the run would use, the preset's (quick by default), not the schema's defaults."""
    given = [f"preset={preset}"] if preset else []
    text = ok(run_cli(["fit", *given, "--help"], tmp_path, timeout=120)).stdout
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.split()}
    for key, kind, value, meaning in describe_keys(values=load_config(given)):
        assert key in lines, key
        assert kind in lines[key] and value in lines[key] and meaning in lines[key], lines[key]
    assert lines["data.n"].split()[2] == n and lines["preset"].split()[2] == (preset or "quick")
    assert "trainer.KEY" in lines


# --------------------------------------------------------------------------------------------------
# 5. Bad input: one line, exit 2, nothing written

BAD = [
    pytest.param(["-m", "data.seed=0,,1"], "has an empty value", id="empty-item"),
    pytest.param(["-m", "data.seed=range(3,3)"], "the range is empty", id="empty-range"),
    pytest.param(["-m", "data.sed=0,1"], "unknown config key 'data.sed'", id="unknown-key-in-sweep"),
    pytest.param(["-m", "data.seed=a,b"], "'data.seed'", id="wrong-type-in-sweep"),
    pytest.param(["-m", "name=a,b"], "name cannot be swept", id="swept-name"),
    pytest.param(["-m", "--jobs", "0", "data.seed=0,1"], "--jobs: expected an integer >= 1", id="jobs-0"),
    pytest.param(["--jobs", "2"], "--jobs needs -m", id="jobs-without-m"),
    pytest.param(["data.seed=0,1"], "ktframe fit -m data.seed=0,1", id="sweep-without-m"),
    pytest.param(["trainer.gradient_clip=1.0"], "did you mean 'trainer.gradient_clip_val'", id="misspelt-trainer-key"),
    pytest.param(["trainer.val_check_interval=5"], "expected 'trainer.val_every'", id="trainer-key-ktframe-sets"),
    pytest.param(["trainer.gradient_clip_algorithm=sideways"], "trainer.gradient_clip_algorithm", id="trainer-value-lightning-refuses"),
]


@pytest.mark.parametrize("args, fragment", BAD)
def test_bad_workflow_input_is_one_line_and_writes_nothing(tmp_path, args, fragment):
    line = one_line_error(run_cli(["fit", f"root={tmp_path / 'runs'}", "logger.kind=csv", *args], tmp_path, timeout=120))
    assert fragment in line, line
    assert not (tmp_path / "runs").exists()


def test_a_logger_whose_package_is_absent_names_the_extra(tmp_path):
    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    line = one_line_error(fit(tmp_path, logger="tensorboard"))
    assert "needs the tensorboard package" in line and "pip install 'ktframe[tensorboard]'" in line
    assert not (tmp_path / "runs").exists()


def test_the_declared_dependencies_cover_every_import():
    """Each third-party package the code imports, at the top or inside a function, is declared
    (PyYAML among them), and Lightning's floor is the version whose API the code uses."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=\[ ]", dep)[0].lower() for dep in project["dependencies"]}
    imported = set()
    for path in [*(REPO / "ktframe").rglob("*.py"), *(REPO / "plugins").glob("ktframe_*/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    stdlib = set(sys.stdlib_module_names) | {"__future__", "ktframe"}
    test_only = {"pytest"}  # ktframe.plugin.testing, the conformance checker, runs under pytest
    distribution = {"yaml": "pyyaml"}
    third_party = {distribution.get(name, name) for name in imported - stdlib - test_only if not name.startswith("ktframe_")}
    assert third_party <= declared, third_party - declared
    assert any(dep.startswith("lightning>=2.6") for dep in project["dependencies"])  # Trainer.fit(weights_only=...)
