"""``ktframe report`` as a user runs it: run folders of real summary.json and eval/eval.json files
of known numbers, the real command line in subprocesses, and the numbers it must print,
computed here on their own (numpy and scipy.stats)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_training import ok, one_line_error, run_cli

from ktframe.cli.main import build_parser, main

RATIOS = {"a": 0.9, "b": 1.0, "deep/group/c": 1.1}  # run folder → val/ratio; one run two levels down
ARIS = {"a": 0.7, "b": 0.8}  # the third run has no val/ari
SHIFTS = {"a": 0.0, "b": 0.1, "deep/group/c": 0.3}  # run folder → how far its eval curves are moved
ROWS = [("random", 512, "model"), ("random", 512, "lloyd"), ("k-means++", 512, "model"), ("k-means++", 512, "lloyd")]


def eval_curves(shift: float, steps: int = 3) -> dict[tuple[str, int], dict[str, list[float]]]:
    """Per (init, n): the mean log objective of each method at steps 0..steps."""
    tail = [1.2 + shift] * (steps - 3)
    return {
        ("random", 512): {"model": [3.0, 2.0 + shift, 1.6 + shift, 1.5 + 2 * shift, *tail], "lloyd": [3.0, 2.2, 1.9 + shift, 1.8 + shift, *tail]},
        ("k-means++", 512): {"model": [2.0, 1.5, 1.4 + shift, 1.3 + shift, *tail], "lloyd": [2.0, 1.7, 1.6, 1.6 - shift, *tail]},
    }


def write_run(folder: Path, metrics: dict[str, float], curves: dict[tuple[str, int], dict[str, list[float]]] | None) -> Path:
    """A run folder as ``ktframe fit`` (summary.json) and ``ktframe eval`` (eval/eval.json) leave it."""
    folder.mkdir(parents=True)
    summary = {
        "run_id": folder.name,
        "run_dir": str(folder),
        "global_step": 60,
        "world_size": 1,
        "rank": 0,
        "best_checkpoint": str(folder / "checkpoints" / "best.ckpt"),
        "last_checkpoint": str(folder / "checkpoints" / "last.ckpt"),
        "best_val_ratio": metrics["val/ratio"],
        "metrics": {"train/loss": 1.2, **metrics},
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    if curves is not None:
        write_eval(folder / "eval", curves, summary["best_checkpoint"])
    return folder


def write_eval(folder: Path, curves: dict[tuple[str, int], dict[str, list[float]]], checkpoint: str) -> Path:
    """The eval.json that ``ktframe eval CHECKPOINT --out folder`` writes."""
    settings = [{"init": init, "n": n, "log_objective": methods} for (init, n), methods in curves.items()]
    report = {
        "variant": "learned",
        "reference": None,
        "family": "gaussian",
        "tasks": 320,
        "steps": len(settings[0]["log_objective"]["model"]) - 1,
        "primary": {"init": settings[0]["init"], "n": settings[0]["n"]},
        "log_objective": settings[0]["log_objective"],
        "settings": settings,
        "checkpoint": checkpoint,
    }
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps(report, indent=2))
    return folder


def write_runs(root: Path, evaluated: tuple[str, ...] = tuple(RATIOS)) -> Path:
    """The three runs of RATIOS below ``root`` (those in ``evaluated`` with an eval.json), and a
    folder that is not a run."""
    for name, ratio in RATIOS.items():
        metrics = {"val/ratio": ratio, "val/objective": 3.1, **({"val/ari": ARIS[name]} if name in ARIS else {})}
        write_run(root / name, metrics, eval_curves(SHIFTS[name]) if name in evaluated else None)
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("not a run\n")
    return root


def no_nan(constant: str) -> None:
    raise AssertionError(f"{constant} in the report's JSON")


def assert_stats(found: dict, values: list[float], count: str = "n") -> None:
    """``found`` holds the mean, the sample std, the count and the 95 % Student-t interval of
    ``values``, and their median, least and greatest value."""
    array = np.array(values)
    assert found[count] == len(values)
    assert (found["median"], found["min"], found["max"]) == pytest.approx((np.median(array), array.min(), array.max()), abs=1e-12)
    assert found["mean"] == pytest.approx(array.mean(), abs=1e-12)
    assert found["std"] == pytest.approx(array.std(ddof=1), abs=1e-12)
    interval = stats.t.interval(0.95, len(values) - 1, loc=array.mean(), scale=stats.sem(array))
    assert found["ci95"] == pytest.approx(list(interval), abs=1e-12)


def test_report_aggregates_every_run_below_the_folder(tmp_path: Path) -> None:
    root = write_runs(tmp_path / "runs")
    done = ok(run_cli(["report", str(root), "--json"], tmp_path, timeout=60))
    report = json.loads(done.stdout, parse_constant=no_nan)

    assert report["runs"] == 3
    assert report["paths"] == ["a", "b", "deep/group/c"]
    assert list(report["metrics"]) == ["val/ratio", "val/objective", "val/ari"]  # val/ only: no train/loss
    assert_stats(report["metrics"]["val/ratio"], list(RATIOS.values()))
    assert_stats(report["metrics"]["val/ari"], list(ARIS.values()))
    assert report["metrics"]["val/objective"]["std"] == 0.0

    assert [(row["init"], row["n"], row["method"]) for row in report["eval"]] == ROWS
    for row in report["eval"]:
        curves = np.array([eval_curves(shift)[(row["init"], row["n"])][row["method"]] for shift in SHIFTS.values()])
        assert_stats(row, list(curves[:, -1]), count="runs")
        assert row["curve"]["mean"] == pytest.approx(list(curves.mean(axis=0)), abs=1e-12)
        assert row["curve"]["std"] == pytest.approx(list(curves.std(axis=0, ddof=1)), abs=1e-12)

    assert json.loads((root / "report" / "report.json").read_text(), parse_constant=no_nan) == report
    text = (root / "report" / "report.md").read_text()
    assert f"3 runs in {root}" in text.splitlines()[0]
    assert "| val/ratio | 1.0000 ± 0.1000 |" in text
    assert "| random | 512 | — | model |" in text  # an eval.json without k: one k, the checkpoint's
    assert (root / "report" / "report.png").read_bytes().startswith(b"\x89PNG")


def test_evaluations_of_several_k_and_final_baselines_are_reported_per_k(tmp_path: Path) -> None:
    """An eval.json of ``eval.ks=[2, 3]`` with ``eval.baselines``: one row per (init, n, k,
    method), the baselines' values at convergence as rows of their own."""
    root = tmp_path / "runs"
    for name, shift in (("a", 0.0), ("b", 0.2)):
        folder = write_run(root / name, {"val/ratio": 1.0}, eval_curves(shift))
        evaluation = json.loads((folder / "eval" / "eval.json").read_text())
        settings = []
        for k in (2, 3):
            for setting in evaluation["settings"]:
                curves = {method: [value + k for value in values] for method, values in setting["log_objective"].items()}
                settings.append({**setting, "k": k, "log_objective": curves, "final": {"best-of-10": 1.0 + k + shift}})
        evaluation["settings"] = settings
        (folder / "eval" / "eval.json").write_text(json.dumps(evaluation))
    report = json.loads(ok(run_cli(["report", str(root), "--json"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    rows = {(row["init"], row["n"], row["k"], row["method"]): row for row in report["eval"]}
    assert len(rows) == 2 * 2 * 3  # (init) x (k) x (model, lloyd, best-of-10)
    for k in (2, 3):
        assert_stats(rows[("random", 512, k, "best-of-10")], [1.0 + k, 1.2 + k], count="runs")
        finals = [eval_curves(shift)[("k-means++", 512)]["model"][-1] + k for shift in (0.0, 0.2)]
        assert_stats(rows[("k-means++", 512, k, "model")], finals, count="runs")
    assert "| random | 512 | 3 | best-of-10 | 4.1000 ± 0.1414 |" in (root / "report" / "report.md").read_text()


def test_out_folder_markdown_and_missing_values(tmp_path: Path) -> None:
    """A run without eval.json, a diverged metric (NaN) and a diverged curve (Infinity) are left
    out of their means, and the counts say so."""
    root = write_runs(tmp_path / "runs", evaluated=("a", "deep/group/c"))
    summary = json.loads((root / "b" / "summary.json").read_text())
    summary["metrics"]["val/ari"] = float("nan")
    (root / "b" / "summary.json").write_text(json.dumps(summary))
    evaluation = json.loads((root / "a" / "eval" / "eval.json").read_text())
    evaluation["settings"][0]["log_objective"]["model"][2] = float("inf")
    (root / "a" / "eval" / "eval.json").write_text(json.dumps(evaluation))
    out = tmp_path / "reports" / "today"
    done = ok(run_cli(["report", str(root), "--out", str(out)], tmp_path, timeout=60))

    names = ("report.json", "report.md", "report.png")
    assert done.stdout.startswith(f"# ktframe report: 3 runs in {root}")
    assert done.stdout.strip().splitlines()[-1] == "written: " + ", ".join(str(out / name) for name in names)
    assert all((out / name).is_file() for name in names)
    assert not list(root.glob("report.*"))
    report = json.loads((out / "report.json").read_text(), parse_constant=no_nan)
    assert report["metrics"]["val/ratio"]["n"] == 3
    one = ARIS["a"]
    assert report["metrics"]["val/ari"] == {"mean": one, "std": 0.0, "n": 1, "ci95": None, "median": one, "min": one, "max": one}
    assert [(row["init"], row["n"], row["method"]) for row in report["eval"]] == ROWS
    assert [row["runs"] for row in report["eval"]] == [1, 2, 2, 2]  # b has no eval.json; a's random model curve diverged
    finals = [eval_curves(SHIFTS[name])[("random", 512)]["lloyd"][-1] for name in ("a", "deep/group/c")]
    assert_stats(report["eval"][1], finals, count="runs")
    assert (out / "report.md").read_text().strip() == done.stdout.strip().rsplit("\n\n", 1)[0].strip()


def test_one_run_folder_without_evaluation(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", {"val/ratio": 0.95}, None)
    report = json.loads(ok(run_cli(["report", str(run), "--json"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)

    assert report == {
        "runs": 1,
        "paths": ["."],
        "metrics": {"val/ratio": {"mean": 0.95, "std": 0.0, "n": 1, "ci95": None, "median": 0.95, "min": 0.95, "max": 0.95}},
        "eval": [],
        "versus": [],
        "training": None,
    }
    text = (run / "report" / "report.md").read_text()
    assert "| val/ratio | 0.9500 | — | 1 |" in text  # one run: its value, no spread
    assert "No evaluation was found" in text
    assert not (run / "report" / "report.png").exists()


def test_evaluation_folders_count_as_runs_with_an_evaluation(tmp_path: Path) -> None:
    """Checkpoints evaluated with ``ktframe eval --out`` (say, on another family): each folder
    holding an eval.json alone is a run with an evaluation and no validation metrics; a training
    run's own eval/ is not counted twice."""
    root = tmp_path / "results"
    write_run(root / "run", {"val/ratio": 0.9}, eval_curves(0.0))
    for seed, shift in enumerate((0.1, 0.3)):
        write_eval(root / "cauchy" / f"seed{seed}", eval_curves(shift), f"paper-seed{seed}.ckpt")

    report = json.loads(ok(run_cli(["report", str(root / "cauchy"), "--json"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    assert report["runs"] == 2 and report["paths"] == ["seed0", "seed1"] and report["metrics"] == {}
    for row in report["eval"]:
        finals = [eval_curves(shift)[(row["init"], row["n"])][row["method"]][-1] for shift in (0.1, 0.3)]
        assert_stats(row, finals, count="runs")

    everything = json.loads(ok(run_cli(["report", str(root), "--json"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    assert everything["paths"] == ["cauchy/seed0", "cauchy/seed1", "run"]
    assert everything["metrics"]["val/ratio"]["n"] == 1 and {row["runs"] for row in everything["eval"]} == {3}


def write_paired(folder: Path, start: float, mean: float, sem: float, tasks: int = 320) -> Path:
    """An eval.json of one setting whose baselines start at ``start`` (they identify its tasks: the
    same ``start``, the same tasks), with the model's paired difference from Lloyd's ``mean`` ± ``sem``."""
    write_eval(folder, {("random", 512): {"model": [start, start - 0.5 + mean], "lloyd": [start, start - 0.5]}}, "seed.ckpt")
    evaluation = json.loads((folder / "eval.json").read_text())
    evaluation["tasks"] = tasks
    evaluation["settings"][0] |= {"k": 5, "versus": {"model": {"lloyd": {"mean": mean, "sem": sem}}}}
    (folder / "eval.json").write_text(json.dumps(evaluation))
    return folder


def test_paired_differences_are_pooled_over_runs_and_sets_of_tasks(tmp_path: Path) -> None:
    """Checkpoints evaluated on one set of tasks share its noise: their differences are averaged,
    their standard errors too (a bound); another set (other baselines) is independent, weighted by
    its tasks. A run whose difference is not finite is left out."""
    root = tmp_path / "evals"
    one = {"seed0": (0.02, 0.03), "seed1": (0.04, 0.01)}  # the same 320 tasks
    for name, (mean, sem) in one.items():
        write_paired(root / "tasks1" / name, 3.0, mean, sem)
    write_paired(root / "tasks2" / "seed0", 3.1, -0.01, 0.02, tasks=640)
    write_paired(root / "tasks2" / "seed1", 3.1, 0.0, 0.02, tasks=640)
    diverged = json.loads((root / "tasks2" / "seed1" / "eval.json").read_text())
    diverged["settings"][0]["versus"]["model"]["lloyd"]["mean"] = float("nan")
    (root / "tasks2" / "seed1" / "eval.json").write_text(json.dumps(diverged))

    report = json.loads(ok(run_cli(["report", str(root), "--json"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    (row,) = report["versus"]
    means, errors, weights = np.array([0.03, -0.01]), np.array([0.02, 0.02]), np.array([320, 640])
    mean, sem = (weights * means).sum() / weights.sum(), np.sqrt(((weights * errors) ** 2).sum()) / weights.sum()
    assert (row["k"], row["method"], row["versus"], row["runs"], row["task_sets"], row["tasks"]) == (5, "model", "lloyd", 3, 2, 960)
    assert row["mean"] == pytest.approx(mean) and row["sem"] == pytest.approx(sem)
    assert row["ci95"] == pytest.approx(list(stats.norm.interval(0.95, loc=mean, scale=sem)))
    assert f"| random | 512 | 5 | model | lloyd | {mean:+.4f} ± {sem:.4f} |" in (root / "report" / "report.md").read_text()

    for folder in root.glob("*/seed*"):  # grouped by the set of tasks: each group one set
        (folder / "config.yaml").write_text(f"eval:\n  seed: {folder.parent.name}\n")
    grouped = json.loads(ok(run_cli(["report", str(root), "--by", "eval.seed", "--json", "--force"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    (one_set,) = next(g for g in grouped["groups"] if g["setting"] == {"eval.seed": "tasks1"})["versus"]
    assert (one_set["mean"], one_set["sem"], one_set["runs"], one_set["task_sets"]) == (pytest.approx(0.03), pytest.approx(0.02), 2, 1)
    assert "| tasks1 | random | 512 | 5 | model | lloyd | +0.0300 ± 0.0200 |" in (root / "report" / "report.md").read_text()


def _missing(tmp_path: Path) -> tuple[list[str], str]:
    return [str(tmp_path / "nowhere")], "no such folder"


def _empty(tmp_path: Path) -> tuple[list[str], str]:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    return [str(tmp_path / "empty")], f"no runs (no summary.json or eval.json) below {tmp_path / 'empty'}"


def _garbled_summary(tmp_path: Path) -> tuple[list[str], str]:
    root = write_runs(tmp_path / "runs")
    (root / "b" / "summary.json").write_text('{"metrics": {"val/ratio": 1.0')
    return [str(root)], f"{root / 'b' / 'summary.json'}: not valid JSON"


def _garbled_eval(tmp_path: Path) -> tuple[list[str], str]:
    root = write_runs(tmp_path / "runs")
    (root / "a" / "eval" / "eval.json").write_text('{"settings": [{"init": "random", "n": "512"}]}')
    return [str(root)], f"{root / 'a' / 'eval' / 'eval.json'}: settings[0]"


def _garbled_versus(tmp_path: Path) -> tuple[list[str], str]:
    folder = write_paired(tmp_path / "evals" / "seed0", 3.0, 0.02, 0.03)
    evaluation = json.loads((folder / "eval.json").read_text())
    evaluation["settings"][0]["versus"]["model"]["lloyd"]["mean"] = "small"
    (folder / "eval.json").write_text(json.dumps(evaluation))
    return [str(tmp_path / "evals")], f"{folder / 'eval.json'}: settings[0].versus['model']['lloyd'].mean is a str; expected a number"


def _steps_differ(tmp_path: Path) -> tuple[list[str], str]:
    root = tmp_path / "runs"
    write_run(root / "a", {"val/ratio": 0.9}, eval_curves(0.0))
    write_run(root / "b", {"val/ratio": 1.0}, eval_curves(0.1, steps=5))
    return [str(root)], "has 5 steps but"


def _out_under_a_file(tmp_path: Path) -> tuple[list[str], str]:
    root = write_runs(tmp_path / "runs")
    (tmp_path / "file.txt").write_text("a regular file\n")
    return [str(root), "--out", str(tmp_path / "file.txt" / "reports")], f"{tmp_path / 'file.txt'} is a file, not a folder"


BAD_INPUT = {
    setup.__name__.strip("_"): setup for setup in (_missing, _empty, _garbled_summary, _garbled_eval, _garbled_versus, _steps_differ, _out_under_a_file)
}


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess, str, Path]]:
    """Every BAD_INPUT case, each in a folder of its own, run all at once: each start of the CLI
    costs seconds, mostly importing, and the cases do not depend on one another."""
    cases = {name: (tmp_path_factory.mktemp(name), setup) for name, setup in BAD_INPUT.items()}
    prepared = {name: (folder, *setup(folder)) for name, (folder, setup) in cases.items()}
    with ThreadPoolExecutor(len(prepared)) as pool:
        done = {name: pool.submit(run_cli, ["report", *args, "--json"], folder, timeout=60) for name, (folder, args, _) in prepared.items()}
    return {name: (done[name].result(), fragment, folder) for name, (folder, _, fragment) in prepared.items()}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_one_line_and_writes_nothing(bad_input: dict, case: str) -> None:
    done, fragment, folder = bad_input[case]
    assert fragment in one_line_error(done, "report")
    assert not list(folder.rglob("report.*"))


def test_help_lists_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """The command's help text goes through argparse's %-formatting: a bare % would break ``ktframe --help``."""
    assert "95 % interval" in build_parser().format_help()
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert "--by KEYS" in capsys.readouterr().out


def test_by_groups_the_runs_by_config_values(tmp_path: Path) -> None:
    """A sweep's settings, seeds pooled: the runs sharing the values of the --by keys in their
    config.yaml are aggregated together, beside the report over every run."""
    root = write_runs(tmp_path / "runs")
    lambdas = {"a": 10.0, "b": 10.0, "deep/group/c": 4.0}  # numbers in numeric order: 4 before 10
    for name, value in lambdas.items():
        (root / name / "config.yaml").write_text(f"optim:\n  loss_lambda: {value}\ndata:\n  d: 32\n")
    done = ok(run_cli(["report", str(root), "--by", "optim.loss_lambda,data.d", "--json"], tmp_path, timeout=60))
    report = json.loads(done.stdout, parse_constant=no_nan)
    assert report["runs"] == 3 and report["by"] == ["optim.loss_lambda", "data.d"]
    assert [(g["setting"], g["paths"]) for g in report["groups"]] == [
        ({"optim.loss_lambda": 4.0, "data.d": 32}, ["deep/group/c"]),
        ({"optim.loss_lambda": 10.0, "data.d": 32}, ["a", "b"]),
    ]
    assert_stats(report["groups"][1]["metrics"]["val/ratio"], [RATIOS["a"], RATIOS["b"]])
    text = (root / "report" / "report.md").read_text()
    assert "## By optim.loss_lambda, data.d: final validation metrics" in text
    assert f"| 10.0 | 32 | 2 | {np.mean([RATIOS['a'], RATIOS['b']]):.4f} ±" in text
    assert text.index("| 4.0 | 32 | 1 |") < text.index("| 10.0 | 32 | 2 |")
    assert "## By optim.loss_lambda, data.d: evaluation at the last step" in text

    (root / "report" / "report.json").unlink()
    bad = run_cli(["report", str(root), "--by", "optim.nope"], tmp_path, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "the config has no key optim.nope" in bad.stderr and not (root / "report" / "report.json").exists()


def write_history(run: Path, ratios: dict[int, float], losses: dict[int, float]) -> None:
    """csv/metrics.csv as Lightning's CSV logger writes it: a row per logging step, the training
    loss and the validation metrics in rows of their own, empty cells elsewhere."""
    rows = ["epoch,step,train/loss,train/lr,val/objective,val/ratio"]
    rows += [f"0,{step},{loss},0.01,," for step, loss in losses.items()]
    rows += [f"0,{step},,,3.1,{ratio}" for step, ratio in ratios.items()]
    (run / "csv").mkdir(parents=True, exist_ok=True)
    (run / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_training_curves_pool_the_runs_as_median_and_quartiles(tmp_path: Path) -> None:
    """Each run's csv/metrics.csv: the validation ratio at every step as the median and the 25th
    and 75th percentiles over the runs that reached it (one run stopped early), the training loss
    averaged per window of steps first; per --by group, a table and training.png."""
    root = write_runs(tmp_path / "runs", evaluated=())
    ratios = {"a": [1.5, 1.2, 1.0, 0.9], "b": [1.7, 1.1, 0.95, 0.97], "deep/group/c": [1.6, 1.3]}  # c stopped after two validations
    for name, values in ratios.items():
        loss = {step: 100.0 - step / 10 + len(name) for step in range(400)}  # logged at every step
        write_history(root / name, dict(zip(range(99, 400, 100), values)), {s: v for s, v in loss.items() if s < 100 * len(values)})
        (root / name / "config.yaml").write_text(f"model:\n  embedding: {'none' if name == 'b' else 'onehot'}\n")

    report = json.loads(ok(run_cli(["report", str(root), "--by", "model.embedding", "--json", "--force"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    curve = report["training"]["curves"]["val/ratio"]
    assert curve["step"] == [99, 199, 299, 399] and curve["runs"] == [3, 3, 2, 2]
    for i in range(4):
        values = [v[i] for v in ratios.values() if len(v) > i]
        assert [curve["q25"][i], curve["median"][i], curve["q75"][i]] == pytest.approx(np.percentile(values, [25, 50, 75]).tolist())
    loss = report["training"]["curves"]["train/loss"]
    assert loss["step"][:2] == [1, 3] and loss["runs"][:2] == [3, 3]  # windows of 2 steps (400 steps, at most 200 points), each at its last step
    assert loss["median"][1] == pytest.approx(np.median([100.0 - 0.25 + len(name) for name in ratios]))  # steps 2 and 3 averaged, then pooled
    summary = report["training"]["summary"]
    assert summary["runs"] == 3 and summary["last_step"] == 399
    assert summary["last"] == pytest.approx(np.percentile([0.9, 0.97, 1.3], [25, 50, 75]).tolist())
    assert summary["lowest"] == pytest.approx(np.percentile([0.9, 0.95, 1.3], [25, 50, 75]).tolist())
    onehot = next(g for g in report["groups"] if g["setting"] == {"model.embedding": "onehot"})
    assert onehot["training"]["curves"]["val/ratio"]["median"] == pytest.approx([1.55, 1.25, 1.0, 0.9])
    text = (root / "report" / "report.md").read_text()
    assert "## Training curves (csv/metrics.csv)" in text and "| none | 1 | 399 | 0.9700 | 0.9500 |" in text
    assert (root / "report" / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (root / "report" / "report.png").exists()

    for name in ratios:  # no history: no training section of numbers, and the old picture goes
        (root / name / "csv" / "metrics.csv").unlink()
    report = json.loads(ok(run_cli(["report", str(root), "--json", "--force"], tmp_path, timeout=60)).stdout, parse_constant=no_nan)
    assert report["training"] is None and not (root / "report" / "training.png").exists()


def test_a_garbled_training_history_is_one_line(tmp_path: Path) -> None:
    root = write_runs(tmp_path / "runs", evaluated=())
    write_history(root / "a", {99: 1.0}, {9: 50.0})
    (root / "a" / "csv" / "metrics.csv").write_text("epoch,step,train/loss\n0,nine,50.0\n")
    done = run_cli(["report", str(root)], tmp_path, timeout=60)
    assert f"{root / 'a' / 'csv' / 'metrics.csv'}: line 2" in one_line_error(done, "report")
    assert not (root / "report").exists()
