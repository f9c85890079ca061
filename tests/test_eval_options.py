"""``ktframe eval``'s options beyond the paper's protocol: several k in one report (``eval.ks``,
``data.k=K``), and the baselines that run to convergence (``eval.baselines``). Real runs of the
command line on tiny checkpoints trained once per module (2 steps: the numbers need not be good,
only the same under the same seeds)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.cluster import KMeans
from test_training import TINY, ok, one_line_error, run_cli

from ktframe.clustering.baselines import BASELINES
from ktframe.core.errors import InputError
from ktframe.evaluation.evaluate import baseline_seed, evaluate_checkpoint, load_checkpoint, table_rows
from ktframe.learning.data import draw

# 4 tasks in batches of 2, 3 steps, n in {8, 32} (32: the training n): a few seconds per evaluation.
SMALL = ["eval.tasks=4", "eval.batch_size=2", "eval.steps=3", "eval.ns=[8,32]"]
METHODS = {"model", "lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++"}


def train(root: Path, name: str, *overrides: str) -> Path:
    """The best checkpoint of a 2-step ``ktframe fit`` of the TINY setting (n = 32, d = 2, k = 3)."""
    ok(run_cli(["fit", *TINY, "trainer.max_steps=2", "trainer.val_every=2", "logger.kind=none", f"root={root / 'runs'}", f"name={name}", *overrides], root))
    return root / "runs" / name / "checkpoints" / "best.ckpt"


@pytest.fixture(scope="module")
def fixed(tmp_path_factory) -> Path:
    """A checkpoint of a model for k = 3 only."""
    return train(tmp_path_factory.mktemp("fixed"), "fixed")


@pytest.fixture(scope="module")
def any_k(tmp_path_factory) -> Path:
    """A checkpoint of a model for any k up to 4 (validated at data.k = 3)."""
    return train(tmp_path_factory.mktemp("anyk"), "anyk", "data.k_range=[2,4]", "model.options.any_k=true")


def evaluate(checkpoint: Path, out: Path, *overrides: str, cli: bool = False) -> dict:
    """The report ``ktframe eval CHECKPOINT OVERRIDES --json --out OUT`` prints; with ``cli``
    from the command itself, else from the function behind it in this process (a second less
    per evaluation than a new process), through JSON as the command prints it."""
    if cli:
        return json.loads(ok(run_cli(["eval", str(checkpoint), *SMALL, *overrides, "--out", str(out), "--json"], out.parent)).stdout)
    return json.loads(json.dumps(evaluate_checkpoint(checkpoint, [*SMALL, *overrides], out)[0]))


def refused(checkpoint: Path, out: Path, *overrides: str, cli: bool = False) -> str:
    """The one-line error of an evaluation that must not run, having checked that it wrote
    nothing: with ``cli`` the command's (exit 2, one line, no traceback), else the InputError
    the command turns into that line."""
    if cli:
        line = one_line_error(run_cli(["eval", str(checkpoint), *SMALL, *overrides, "--out", str(out)], out.parent), "eval")
    else:
        with pytest.raises(InputError) as error:
            evaluate_checkpoint(checkpoint, [*SMALL, *overrides], out)
        line = str(error.value)
        assert "\n" not in line
    assert not out.exists()
    return line


def test_help_names_the_new_keys(tmp_path):
    text = ok(run_cli(["eval", "--help"], tmp_path)).stdout
    assert "eval.ks=" in text and "data.k=" in text and "eval.baselines=" in text


# --------------------------------------------------------------------------------------------------
# 1. eval.ks and data.k on a model for one k


def test_the_trained_k_gives_the_same_report_however_it_is_named(fixed, tmp_path, kernels_by_ktframe_rule):
    default = evaluate(fixed, tmp_path / "default", cli=True)
    assert default["primary"] == {"init": "random", "n": 32, "k": 3}  # the first init, the training n and k
    assert [(s["init"], s["n"], s["k"]) for s in default["settings"]] == [("random", 8, 3), ("random", 32, 3), ("k-means++", 8, 3), ("k-means++", 32, 3)]
    for overrides in (["eval.ks=[3]"], ["data.k=3"]):
        named = evaluate(fixed, tmp_path / overrides[0].split("=")[0], *overrides)
        assert named["settings"] == default["settings"], overrides
        assert named["primary"] == default["primary"] and named["log_objective"] == default["log_objective"]


def test_the_trained_k_keeps_the_seeding_of_the_tasks(fixed, tmp_path):
    """At the trained k the tasks are drawn from a generator seeded with eval.seed · 100003 + n,
    as before eval.ks existed, so a plain report keeps its numbers: Lloyd's curve, recomputed here
    from tasks drawn that way (one batch), is the report's."""
    from ktframe.fast.lloyd import lloyd, objective

    report = evaluate(fixed, tmp_path / "one-batch", "eval.batch_size=4", "eval.inits=[random]")
    config, _ = load_checkpoint(fixed)
    for setting in report["settings"]:
        generator = torch.Generator().manual_seed(777 * 100_003 + setting["n"])
        X, C0, _ = draw(OmegaConf.create(config["data"]), 4, generator, n=setting["n"], init="random")
        trajectory = lloyd(X, C0, 3).trajectory
        expected = [objective(X.double(), trajectory[:, t].double()).log().mean().item() for t in range(4)]
        assert setting["log_objective"]["lloyd"] == pytest.approx(expected, rel=1e-12), setting["n"]


def test_another_k_on_a_model_for_one_k_is_one_line(fixed, tmp_path):
    for overrides, cli in ((["data.k=5"], True), (["eval.ks=[3,5]"], False)):
        line = refused(fixed, tmp_path / "out", *overrides, cli=cli)
        assert "k=5" in line and "trained for k=3 only" in line and "data.k_range" in line, line


def test_bad_data_k_and_eval_ks_values_are_one_line(fixed, tmp_path):
    assert "'data.k' must be an integer >= 1; got 0" in refused(fixed, tmp_path / "out", "data.k=0", cli=True)
    assert "'eval.ks' must be null or a non-empty list of integers >= 1" in refused(fixed, tmp_path / "out", "eval.ks=[0]")
    assert "data.n cannot be changed at evaluation" in refused(fixed, tmp_path / "out", "data.n=64")


# --------------------------------------------------------------------------------------------------
# 2. Baselines


def test_baselines_are_reported_at_convergence_on_the_settings_tasks(fixed, tmp_path):
    report = evaluate(fixed, tmp_path / "baselines", "eval.batch_size=4", "eval.inits=[random]", "eval.baselines=[breathing-kmeans,best-of-10]")
    config, _ = load_checkpoint(fixed)
    for setting in report["settings"]:
        n, final = setting["n"], setting["final"]
        assert set(setting["log_objective"]) == METHODS and set(final) == {"breathing-kmeans", "best-of-10"}
        assert all(math.isfinite(v) for v in final.values())
        # Computed again here: the setting's tasks (one batch, drawn first), each with its own seed.
        X, _, _ = draw(OmegaConf.create(config["data"]), 4, torch.Generator().manual_seed(777 * 100_003 + n), n=n, init="random")
        seeds = [baseline_seed(777, n, 3, task) for task in range(4)]
        assert len(set(seeds)) == 4
        best = [KMeans(n_clusters=3, n_init=10, random_state=seed).fit(points).inertia_ for points, seed in zip(X.double().numpy(), seeds)]
        assert final["best-of-10"] == pytest.approx(float(np.mean(np.log(best))), rel=1e-9, abs=1e-9)
        # The best of ten restarts to convergence is no worse than one seeding followed by 3 steps of Lloyd.
        assert final["best-of-10"] <= setting["log_objective"]["k-means++"][-1] + 1e-6
    assert report["final"] == report["settings"][1]["final"]  # the primary setting's: the training n, 32


def test_baselines_appear_in_the_table_and_the_table_rows(fixed, tmp_path):
    done = ok(run_cli(["eval", str(fixed), *SMALL, "eval.inits=[random]", "eval.baselines=[best-of-10]", "--out", str(tmp_path / "out")], tmp_path))
    header = next(line for line in done.stdout.splitlines() if line.startswith("init"))
    assert header.split()[:3] == ["init", "n", "k"] and header.split()[-1] == "best-of-10"
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("random")]
    assert [row[:3] for row in rows] == [["random", "8", "3"], ["random", "32", "3"]]
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert [float(row[-1]) for row in rows] == pytest.approx([s["final"]["best-of-10"] for s in report["settings"]], abs=1e-4)
    columns, table = table_rows(report)
    assert columns == ["init", "n", "k", "method", "step", "log_objective"]
    finals = [row for row in table if row[3] == "best-of-10"]
    assert finals == [["random", s["n"], 3, "best-of-10", None, s["final"]["best-of-10"]] for s in report["settings"]]
    assert len(table) == len(finals) + 2 * len(METHODS) * 4  # two settings, four methods, steps 0..3


def test_each_baseline_runs_task_by_task_with_its_tasks_seed():
    from bkmeans import BKMeans

    X = torch.randn(3, 12, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    seeds = [5, 6, 7]
    direct = {
        "best-of-10": lambda points, seed: KMeans(n_clusters=4, n_init=10, random_state=seed).fit(points),
        "breathing-kmeans": lambda points, seed: BKMeans(n_clusters=4, random_state=seed, n_init=1).fit(points),
    }
    assert set(direct) == set(BASELINES)
    for name, fit in direct.items():
        centers = BASELINES[name](X, 4, seeds)
        assert centers.dtype == torch.float64 and centers.shape == (3, 4, 2)
        for task, seed in enumerate(seeds):
            np.testing.assert_array_equal(centers[task].numpy(), fit(X[task].numpy(), seed).cluster_centers_, err_msg=name)
    # As many clusters as points: no room to breathe in, still k centers.
    assert BASELINES["breathing-kmeans"](X[:, :4], 4, seeds).shape == (3, 4, 2)


def test_an_unknown_baseline_is_one_line(fixed, tmp_path):
    line = refused(fixed, tmp_path / "out", "eval.baselines=[best-of-11]")
    assert "'eval.baselines'" in line and "breathing-kmeans, best-of-10" in line and "best-of-11" in line, line


# --------------------------------------------------------------------------------------------------
# 3. A model for any k up to its maximum


def test_a_model_for_any_k_is_evaluated_at_every_k_asked(any_k, tmp_path):
    report = evaluate(any_k, tmp_path / "ks", "eval.ks=[2,3,4]")
    settings = [(s["init"], s["n"], s["k"]) for s in report["settings"]]
    assert settings == [(init, n, k) for init in ("random", "k-means++") for n in (8, 32) for k in (2, 3, 4)]
    assert report["primary"] == {"init": "random", "n": 32, "k": 3}  # the checkpoint's data.k
    assert all(math.isfinite(v) for s in report["settings"] for values in s["log_objective"].values() for v in values)
    # Each k its own tasks and starts.
    starts = {s["k"]: s["log_objective"]["lloyd"][0] for s in report["settings"] if (s["init"], s["n"]) == ("random", 32)}
    assert len(set(starts.values())) == 3
    assert (tmp_path / "ks" / "eval-by-k.png").read_bytes().startswith(b"\x89PNG")  # the methods against k
    # Without the checkpoint's k the first one is primary; data.k=K asks for that k alone.
    assert evaluate(any_k, tmp_path / "k4", "data.k=4", "eval.inits=[random]")["primary"] == {"init": "random", "n": 32, "k": 4}
    assert not (tmp_path / "k4" / "eval-by-k.png").exists()


def test_a_k_above_the_models_maximum_is_one_line(any_k, tmp_path):
    for overrides, cli in ((["eval.ks=[5]"], True), (["data.k=5"], False), (["eval.ks=[2,5]"], False)):
        line = refused(any_k, tmp_path / "out", *overrides, cli=cli)
        assert "k=5" in line and "at most k=4" in line and "expected every k <= 4" in line, line
    line = refused(any_k, tmp_path / "out", "eval.ks=[2,4]", "eval.ns=[3,32]")
    assert "eval.ns holds n=3, fewer points than k=4" in line, line


# --------------------------------------------------------------------------------------------------
# 4. The model's last steps taken by Lloyd's algorithm (eval.lloyd_last)


def test_lloyd_last_finishes_the_models_run_with_lloyds_steps(fixed, tmp_path):
    """model+lloyd is the model's curve up to step T − N, then Lloyd's N steps from the centers the
    model had reached there: recomputed here from the model and the reference Lloyd on the setting's
    tasks (one batch, drawn first); the other methods are as without the option."""
    from ktframe.core.reference import lloyd
    from ktframe.fast.lloyd import objective

    plain = evaluate(fixed, tmp_path / "plain", "eval.batch_size=4", "eval.inits=[random]")
    report = evaluate(fixed, tmp_path / "finished", "eval.batch_size=4", "eval.inits=[random]", "eval.lloyd_last=2")
    config, model = load_checkpoint(fixed)
    for setting, before in zip(report["settings"], plain["settings"]):
        curves = setting["log_objective"]
        assert set(curves) == METHODS | {"model+lloyd"}
        assert {m: v for m, v in curves.items() if m != "model+lloyd"} == before["log_objective"]
        assert curves["model+lloyd"][:2] == curves["model"][:2]  # steps 0 and 1: the model's
        X, C0, _ = draw(OmegaConf.create(config["data"]), 4, torch.Generator().manual_seed(777 * 100_003 + setting["n"]), n=setting["n"], init="random")
        with torch.no_grad():
            reached = model(X, C0, n_steps=1, reembed=True).centers
        trajectory = lloyd(X, reached, 2).trajectory
        expected = [objective(X.double(), trajectory[:, t].double()).log().mean().item() for t in (1, 2)]
        # float32 centers, their sums taken in another order than the fast path's
        assert curves["model+lloyd"][2:] == pytest.approx(expected, rel=1e-6), setting["n"]
    # N = T: Lloyd's from the initial centers, that is, the lloyd curve.
    every = evaluate(fixed, tmp_path / "every", "eval.batch_size=4", "eval.inits=[random]", "eval.ns=[32]", "eval.lloyd_last=3")
    assert every["log_objective"]["model+lloyd"] == pytest.approx(every["log_objective"]["lloyd"], rel=1e-9)


def test_lloyd_last_out_of_range_is_one_line(fixed, tmp_path):
    line = refused(fixed, tmp_path / "out", "eval.lloyd_last=4", cli=True)
    assert "'eval.lloyd_last' must be an integer from 0 to eval.steps=3; got 4" in line, line
    assert "'eval.lloyd_last' must be an integer >= 0; got -1" in refused(fixed, tmp_path / "out", "eval.lloyd_last=-1")


def test_swaps_follow_the_models_and_lloyds_final_centers(fixed, tmp_path):
    """eval.swaps adds, at their end only, the swaps after model+lloyd's final centers and after
    Lloyd's, recomputed here from the setting's tasks (one batch) with the evaluation's draws; the
    curves are as without them, and a swap never raises the objective."""
    from ktframe.evaluation.evaluate import _SWAPS, _derived_seed, _finish_with_lloyd
    from ktframe.fast.lloyd import lloyd
    from ktframe.fast.swaps import swap

    plain = evaluate(fixed, tmp_path / "plain", "eval.batch_size=4", "eval.inits=[random]", "eval.ns=[32]", "eval.lloyd_last=2")
    report = evaluate(fixed, tmp_path / "swapped", "eval.batch_size=4", "eval.inits=[random]", "eval.ns=[32]", "eval.lloyd_last=2", "eval.swaps=2")
    setting = report["settings"][0]
    assert setting["log_objective"] == plain["settings"][0]["log_objective"]
    assert set(setting["final"]) == {"model+lloyd+swaps", "lloyd+swaps"}
    assert setting["final"]["model+lloyd+swaps"] <= setting["log_objective"]["model+lloyd"][-1] + 1e-9
    assert setting["final"]["lloyd+swaps"] <= setting["log_objective"]["lloyd"][-1] + 1e-9
    assert set(setting["versus"]) == {"model", "model+lloyd", "model+lloyd+swaps"} and "lloyd+swaps" in setting["versus"]["model+lloyd+swaps"]
    config, model = load_checkpoint(fixed)
    X, C0, _ = draw(OmegaConf.create(config["data"]), 4, torch.Generator().manual_seed(777 * 100_003 + 32), n=32, init="random")
    with torch.no_grad():
        finished = _finish_with_lloyd(X, model(X, C0, n_steps=3, reembed=True).trajectory, 2)[:, -1]
    draws = _derived_seed(_SWAPS, 777, 32, 3, 0)
    expected = {
        "model+lloyd+swaps": swap(X, finished, 2, 3, torch.Generator().manual_seed(draws)).objective.log().mean().item(),
        "lloyd+swaps": swap(X, lloyd(X, C0, 3).centers, 2, 3, torch.Generator().manual_seed(draws)).objective.log().mean().item(),
    }
    assert setting["final"] == pytest.approx(expected, rel=1e-9)
    assert "'eval.swaps' must be an integer >= 0; got -1" in refused(fixed, tmp_path / "out", "eval.swaps=-1")


# --------------------------------------------------------------------------------------------------
# 5. How sure a comparison is (versus)


def test_versus_gives_the_paired_difference_of_the_model_and_every_other_method(fixed, tmp_path):
    """For model and model+lloyd against every other method, the mean over tasks of the difference
    at the end, and its standard error, taken task by task: recomputed here from the model and the
    reference Lloyd on the setting's tasks (one batch, drawn first)."""
    from ktframe.core.reference import lloyd
    from ktframe.fast.lloyd import objective

    report = evaluate(
        fixed, tmp_path / "versus", "eval.batch_size=4", "eval.inits=[random]", "eval.ns=[32]", "eval.lloyd_last=1", "eval.baselines=[best-of-10]"
    )
    setting = report["settings"][0]
    versus, curves = setting["versus"], setting["log_objective"]
    assert set(versus) == {"model", "model+lloyd"} and report["versus"] == versus
    assert all(set(against) == {"lloyd", "lloyd-reseed", "k-means++", "greedy-k-means++", "best-of-10"} for against in versus.values())
    for ours, against in versus.items():
        for other, difference in against.items():
            end = setting["final"][other] if other in setting["final"] else curves[other][-1]
            assert difference["mean"] == pytest.approx(curves[ours][-1] - end, rel=1e-9, abs=1e-12)
            assert difference["sem"] > 0
    config, model = load_checkpoint(fixed)
    X, C0, _ = draw(OmegaConf.create(config["data"]), 4, torch.Generator().manual_seed(777 * 100_003 + 32), n=32, init="random")
    with torch.no_grad():
        centers = model(X, C0, n_steps=3, reembed=True).centers
    paired = objective(X.double(), centers.double()).log() - objective(X.double(), lloyd(X, C0, 3).centers.double()).log()
    assert versus["model"]["lloyd"]["mean"] == pytest.approx(paired.mean().item(), rel=1e-6)
    assert versus["model"]["lloyd"]["sem"] == pytest.approx(paired.std().item() / 2, rel=1e-5)  # four tasks: std / sqrt(4)
