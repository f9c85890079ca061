"""The authors' protocol beside ktframe's: Lloyd with re-seeding (``lloyd-reseed``), a run's last
checkpoint (``eval.checkpoint``), each run's own tasks (``eval.seed_per_run``), the median over
runs (``ktframe report --stat median``); run outputs and committed files with no machine's absolute
path; the GPU script's plan for ten seeds of Figures 9 and 10. Real runs of the command line on
tiny models (n = 32, d = 2, k = 3)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_training import TINY, ok, one_line_error, run_cli

from ktframe.evaluation.evaluate import evaluate_checkpoint, format_table, reseed_seed, task_seed
from ktframe.evaluation.reseed import lloyd_reseed
from ktframe.fast.lloyd import lloyd
from ktframe.training.relative import RunCheckpoint

REPO = Path(__file__).resolve().parents[1]
SMALL = ["eval.tasks=8", "eval.batch_size=4", "eval.steps=4", "eval.ns=[32]", "eval.inits=[random]"]


# 1. Lloyd with re-seeding


def test_an_emptied_cluster_is_reseeded_at_a_point_of_its_task():
    """A center far from every point gets none at the first step: Lloyd keeps it, lloyd-reseed
    moves it onto a point of its own task; the other centers take the step Lloyd takes."""
    X = torch.rand(2, 40, 2, generator=torch.Generator().manual_seed(1))
    C0 = torch.cat([X[:, :2], torch.full((2, 1, 2), 10.0)], dim=1)
    trajectory, reseeded = lloyd_reseed(X, C0, 3, [11, 12])
    kept = lloyd(X, C0, 3).trajectory
    assert reseeded.tolist() == [True, True]
    assert torch.equal(kept[:, 1, 2], C0[:, 2])  # ktframe's Lloyd keeps the emptied center
    for b in range(2):
        moved = trajectory[b, 1, 2]
        assert any(torch.equal(moved, point) for point in X[b]), b  # a point of task b
        assert not any(torch.equal(moved, point) for point in X[1 - b])
        assert torch.equal(trajectory[b, 1, :2], kept[b, 1, :2])


def test_lloyd_reseed_is_reproducible_and_each_tasks_own():
    """The same seeds give the same run to the last bit; a task's run depends on its own seed
    alone, not on the batch it is in; another seed draws another point."""
    X = torch.rand(3, 60, 2, generator=torch.Generator().manual_seed(2))
    C0 = torch.cat([X[:, :3], torch.full((3, 2, 2), 10.0)], dim=1)
    first, _ = lloyd_reseed(X, C0, 5, [1, 2, 3])
    assert torch.equal(first, lloyd_reseed(X, C0, 5, [1, 2, 3])[0])
    alone, _ = lloyd_reseed(X[1:2], C0[1:2], 5, [2])
    assert torch.equal(alone[0], first[1])
    other, _ = lloyd_reseed(X[1:2], C0[1:2], 5, [99])
    assert not torch.equal(other[0, 1], first[1, 1])
    assert reseed_seed(777, 32, 3, 0) != reseed_seed(777, 32, 3, 1) != reseed_seed(778, 32, 3, 1)


def test_lloyd_reseed_is_lloyd_where_no_cluster_empties():
    """Well-separated tasks started at one point of each cluster: no cluster empties, and every
    step is ktframe's Lloyd's to the last bit."""
    g = torch.Generator().manual_seed(3)
    means = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    X = (means.repeat_interleave(20, dim=0) + 0.1 * torch.randn(4, 60, 2, generator=g)).float()
    C0 = X[:, ::20].clone()
    trajectory, reseeded = lloyd_reseed(X, C0, 6, [5, 6, 7, 8])
    assert not reseeded.any()
    assert torch.equal(trajectory, lloyd(X, C0, 6).trajectory)


# 2. Runs, checkpoints and evaluations of the authors' form


def strings(value, found: list[str]) -> list[str]:
    """Every string of a nested value (dict keys too)."""
    if isinstance(value, dict):
        for key, item in value.items():
            strings(key, found)
            strings(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            strings(item, found)
    elif isinstance(value, str):
        found.append(value)
    return found


def absolute(value) -> list[str]:
    return [s for s in strings(value, []) if s.startswith("/")]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two seeds of the tiny setting, each run evaluated when it ends at its last checkpoint on
    tasks of its own, under an absolute root: the sweep folder."""
    home = tmp_path_factory.mktemp("faithful")
    root = (home / "runs").resolve()
    args = ["fit", "-m", *TINY, "trainer.max_steps=4", "trainer.val_every=2", "logger.kind=none", f"root={root}", "name=sw", "trainer.seed=0,1"]
    ok(run_cli([*args, "eval.after_fit=true", "eval.checkpoint=last", "eval.seed_per_run=true", *SMALL], home))
    return root / "sw"


@pytest.mark.slow
def test_run_outputs_hold_paths_relative_to_their_run_folder(sweep):
    state = json.loads((sweep / "multirun.json").read_text())
    assert absolute(state) == [] and state["folder"] == "." and [job["run_dir"] for job in state["jobs"]] == ["0", "1"]
    for run in (sweep / "0", sweep / "1"):
        summary = json.loads((run / "summary.json").read_text())
        assert absolute(summary) == []
        assert (run / summary["best_checkpoint"]).is_file() and (run / summary["last_checkpoint"]).is_file()
        assert summary["eval"] == "eval/eval.json"
        evaluation = json.loads((run / summary["eval"]).read_text())
        assert evaluation["checkpoint"] == "checkpoints/last.ckpt" and evaluation["checkpoint_step"] == 4  # eval.checkpoint=last
        for name in ("best.ckpt", "last.ckpt"):
            checkpoint = torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=True)
            assert absolute({key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")}) == [], name
            assert checkpoint["hyper_parameters"]["config"]["root"] == ".."


@pytest.mark.slow
def test_each_run_has_tasks_of_its_own_with_seed_per_run(sweep, tmp_path):
    """With eval.seed_per_run each seed's tasks come from eval.seed and its trainer.seed (so the
    baselines differ from seed to seed, reproducibly); without, every seed has the same tasks."""
    own = [json.loads((sweep / s / "eval" / "eval.json").read_text()) for s in ("0", "1")]
    assert own[0]["seed_per_run"] and own[0]["task_seed"] != own[1]["task_seed"] != 777
    config = {"eval": {"seed": 777, "seed_per_run": True}, "trainer": {"seed": 1}}
    assert own[1]["task_seed"] == task_seed(config)
    assert own[0]["log_objective"]["lloyd"] != own[1]["log_objective"]["lloyd"]
    again = ok(
        run_cli(["eval", str(sweep / "1"), *SMALL, "eval.checkpoint=last", "eval.seed_per_run=true", "--out", str(tmp_path / "again"), "--json"], tmp_path)
    )
    assert json.loads(again.stdout)["settings"] == own[1]["settings"]  # reproducible to the last digit, as the fit's own ran it
    # the runs were fitted with eval.seed_per_run=true: their checkpoints' setting, unless overridden
    shared = [evaluate_checkpoint(sweep / s, [*SMALL, "eval.seed_per_run=false"], tmp_path / f"shared{s}")[0] for s in ("0", "1")]
    assert shared[0]["task_seed"] == shared[1]["task_seed"] == 777
    assert shared[0]["log_objective"]["lloyd"] == shared[1]["log_objective"]["lloyd"]


@pytest.mark.slow
def test_a_run_folder_is_evaluated_at_its_best_or_last_checkpoint(sweep, tmp_path):
    run = sweep / "0"
    for which in ("best", "last"):
        report, _ = evaluate_checkpoint(run, [*SMALL, f"eval.checkpoint={which}"], tmp_path / which)
        step = torch.load(run / "checkpoints" / f"{which}.ckpt", map_location="cpu", weights_only=True)["global_step"]
        assert report["checkpoint_step"] == step
        # relative to the eval.json's own folder, outside the run folder
        assert (tmp_path / which / report["checkpoint"]).resolve() == (run / "checkpoints" / f"{which}.ckpt").resolve()
        assert "model - lloyd-reseed" in format_table(report)
    file = run / "checkpoints" / "best.ckpt"
    line = one_line_error(run_cli(["eval", str(file), "eval.checkpoint=last", "--out", str(tmp_path / "file")], tmp_path), "eval")
    assert "eval.checkpoint=last chooses the checkpoint of a run folder" in line and not (tmp_path / "file").exists()
    line = one_line_error(run_cli(["eval", str(run), "eval.checkpoint=latest", "--out", str(tmp_path / "bad")], tmp_path), "eval")
    assert "'eval.checkpoint' must be best or last" in line, line
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    line = one_line_error(run_cli(["eval", str(tmp_path / "empty"), "eval.checkpoint=last"], tmp_path), "eval")
    assert "holds no checkpoints/last.ckpt" in line


@pytest.mark.slow
def test_lloyd_reseed_is_a_method_of_the_json_the_table_and_the_report(sweep, tmp_path):
    evaluation = json.loads((sweep / "0" / "eval" / "eval.json").read_text())
    (setting,) = evaluation["settings"]
    assert list(setting["log_objective"])[:3] == ["model", "lloyd", "lloyd-reseed"]
    assert set(setting["versus"]["model"]) >= {"lloyd", "lloyd-reseed"}
    assert type(setting["reseeded"]) is int and 0 <= setting["reseeded"] <= 8
    if setting["reseeded"] == 0:
        assert setting["log_objective"]["lloyd-reseed"] == setting["log_objective"]["lloyd"]
    done = ok(run_cli(["report", str(sweep), "--stat", "median", "--out", str(tmp_path / "report")], tmp_path))
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = {row["method"]: row for row in report["eval"]}
    finals = sorted(json.loads((sweep / s / "eval" / "eval.json").read_text())["log_objective"]["lloyd-reseed"][-1] for s in ("0", "1"))
    assert (rows["lloyd-reseed"]["min"], rows["lloyd-reseed"]["max"]) == pytest.approx(finals)
    assert rows["lloyd-reseed"]["median"] == pytest.approx(sum(finals) / 2)
    row = next(r for r in rows.values() if r["method"] == "lloyd-reseed")
    cell = f"{row['median']:.4f} [{row['min']:.4f}, {row['max']:.4f}]"
    assert "| median [min, max] |" in done.stdout and f"| lloyd-reseed | {cell} |" in done.stdout
    versus = next(v for v in report["versus"] if v["versus"] == "lloyd-reseed")
    assert versus["task_sets"] == 2  # each seed its own tasks: two independent sets
    assert versus["min"] <= versus["median"] <= versus["max"]


def test_a_moved_run_resumes_with_its_best_score(tmp_path):
    """RunCheckpoint's state names its paths relative to the run folder; read back in a run folder
    elsewhere it keeps the best score and points into the new folder (Lightning's own would not:
    its folder changed)."""
    saved = RunCheckpoint(dirpath=tmp_path / "a" / "checkpoints", monitor="val/ratio")
    saved.best_model_score, saved.best_model_path = torch.tensor(0.5), str(tmp_path / "a" / "checkpoints" / "best.ckpt")
    saved.best_k_models = {saved.best_model_path: saved.best_model_score}
    state = saved.state_dict()
    assert absolute(state) == [] and state["dirpath"] == "checkpoints" and state["best_model_path"] == "checkpoints/best.ckpt"
    moved = RunCheckpoint(dirpath=tmp_path / "b" / "checkpoints", monitor="val/ratio")
    moved.load_state_dict(state)
    assert moved.best_model_score == 0.5 and moved.best_model_path == str((tmp_path / "b" / "checkpoints" / "best.ckpt").resolve())
    assert list(moved.best_k_models) == [moved.best_model_path]


# 3. Committed files


def tracked(*patterns: str) -> list[Path]:
    return [REPO / p for p in subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()]


# A machine's absolute path in running text: after a space, quote, bracket or '=', under a folder
# where a machine keeps its users' and its scratch files (not /dev/null, which every machine has).
ABSOLUTE = re.compile(r"""(?:^|[\s"'`(\[=,])(/(?:work|tmp|home|root|Users|mnt|data|scratch|srv|opt|var|private)/[\w./-]*)""", re.MULTILINE)
TEXT = (".json", ".csv", ".md", ".yaml", ".yml", ".txt")


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="a git checkout")
def test_no_committed_output_or_document_holds_an_absolute_path():
    """Results (JSON, CSV), documents and configs name no path of the machine they were made on;
    in JSON no string at all starts with '/'. (Source files may: a test's absolute name to refuse.)"""
    assert ABSOLUTE.findall("run in /work/main/runs, 'root=/tmp/x/runs'") == ["/work/main/runs", "/tmp/x/runs"]
    files = [path for path in tracked() if path.suffix in TEXT and path.is_file()]
    assert any(path.name == "eval.json" for path in files)
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(REPO)}: {s}" for s in (absolute(json.loads(text)) if path.suffix == ".json" else ABSOLUTE.findall(text))]
    assert found == []


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="a git checkout")
def test_no_committed_checkpoint_holds_an_absolute_path():
    """Every tracked checkpoint's stored config and callback states: no string starts with '/'."""
    checkpoints = tracked("*.ckpt")
    assert len(checkpoints) >= 90
    for path in checkpoints:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        kept = {key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")}
        assert absolute(kept) == [], path


# 4. Ten seeds of Figures 9 and 10 on a GPU: the plan


def test_the_gpu_script_plans_ten_seeds_of_every_setting_of_figures_9_and_10(tmp_path):
    """``--dry-run`` prints every run the GPU would train, as ktframe's planner resolves them:
    seeds 3-9 of each setting whose seeds 0-2 are committed, so that each has ten, the settings
    that the paper's Figure 10 shows first, at most 16 runs at once; nothing is written."""
    done = subprocess.run(
        ["bash", "benchmarks/gpu.sh", str(tmp_path / "out"), "--seeds", "--figures", "--dry-run"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [re.fullmatch(r"part (\d) jobs (\d+) sweep (\S+) run \d+: (.*) seed=(\d)", line) for line in done.stdout.splitlines()]
    assert all(lines) and len(lines) == 168 and not (tmp_path / "out").exists()
    jobs: dict[str, dict[str, int]] = {}
    planned: dict[str, set[int]] = {}  # setting -> seeds planned
    for m in lines:
        jobs.setdefault(m[1], {})[m[3]] = int(m[2])
        assert int(m[5]) not in planned.setdefault(m[4], set())
        planned[m[4]].add(int(m[5]))
        figure_10 = "preset=fig10" in m[4] or "lambda=10.0" in m[4]  # the panels of the paper's Figure 10 first
        assert int(m[1]) == (1 if figure_10 else 2), m[0]
    assert all(sum(part.values()) <= 16 for part in jobs.values())
    committed: dict[str, set[int]] = {}
    for config in (REPO / "results" / "sweeps").glob("fig*/*/config.yaml"):
        if (config.parent / "checkpoints" / "best.ckpt").is_file():
            c = yaml.safe_load(config.read_text())
            setting = f"preset={c['preset']} n={c['data']['n']} d={c['data']['d']} k={c['data']['k']} lambda={c['optim']['loss_lambda']} embedding={c['model']['embedding']} steps={c['trainer']['max_steps']}"
            committed.setdefault(setting, set()).add(c["trainer"]["seed"])
    assert set(planned) == set(committed) and len(committed) == 24
    assert all(committed[s] == {0, 1, 2} and planned[s] == set(range(3, 10)) for s in committed)
