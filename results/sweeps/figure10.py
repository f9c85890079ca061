"""The panels of the paper's Figure 10 from the committed runs, as the authors show them: 10a at
d = 32 and lambda = 10 over k = 6, 10, 16 and 25; 10b at k = 6 and lambda = 10 over d = 4, 8, 16 and
32. The sweeps hold them in three places: k = 6 (10a) and d = 4, 32 (10b) are Figure 9's runs at
lambda = 10, k = 10 is the `paper` and `paper-none` presets' ten seeds (their validation histories in
results/seeds/; seed 0 of `paper` kept none), the rest are fig10a's and fig10b's. From the
repository root: ``python results/sweeps/figure10.py`` writes results/sweeps/fig10a-panels.png and
fig10b-panels.png (the training loss and the validation ratio against the step, the median over
seeds with the 25-75 % band, as ``ktframe report`` draws them)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from ktframe.core.io import write_atomically
from ktframe.reporting import curves

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "results" / "sweeps"


def _sweep_runs(sweep: str, value: Callable[[dict[str, str]], str], **wanted: str) -> dict[tuple[str, str], list[Path]]:
    """The runs of a committed sweep whose swept values include ``wanted`` (a key's dots as
    '__'), by (``value`` of their swept values, their embedding)."""
    found: dict[tuple[str, str], list[Path]] = {}
    for job in json.loads((SWEEPS / sweep / "multirun.json").read_text())["jobs"]:
        swept, run = job["swept"], SWEEPS / sweep / job["run_dir"]
        if (run / curves.HISTORY).is_file() and all(swept.get(key.replace("__", ".")) == v for key, v in wanted.items()):
            found.setdefault((value(swept), swept["model.embedding"]), []).append(run)
    return found


def _preset_runs(scratch: Path) -> dict[str, list[Path]]:
    """The ten-seed presets' histories as run folders (a link to each CSV where the report reads it)."""
    runs: dict[str, list[Path]] = {}
    for preset, embedding in (("paper", "onehot"), ("paper-none", "none")):
        for csv in sorted((ROOT / "results").glob(f"**/{preset}-seed[0-9]-metrics.csv")):
            run = scratch / csv.stem
            (run / curves.HISTORY.parent).mkdir(parents=True)
            (run / curves.HISTORY).symlink_to(csv)
            runs.setdefault(embedding, []).append(run)
    return runs


def _figure(groups: dict[tuple[str, str], list[Path]], key: str, title: str) -> bytes:
    report = {
        "by": [key, "model.embedding"],
        "groups": [
            {"setting": {key: int(value), "model.embedding": embedding}, "training": {"curves": curves.pool(h), "summary": curves.summary(h)}}
            for (value, embedding), runs in sorted(groups.items(), key=lambda item: (int(item[0][0]), item[0][1]))
            if (h := [curves.read_history(run) for run in runs])
        ],
    }
    return curves.figure_png(report, Path(title))


def main() -> None:
    k, d = (lambda swept: swept["data.k"]), (lambda swept: swept["data.d"])  # noqa: E731
    ten_a = {**_sweep_runs("fig9", lambda _: "6", data__d="32", optim__loss_lambda="10.0"), **_sweep_runs("fig10a", k)}
    ten_b = {**_sweep_runs("fig9", d, optim__loss_lambda="10.0"), **_sweep_runs("fig10b", d)}
    with tempfile.TemporaryDirectory() as scratch:
        for embedding, runs in _preset_runs(Path(scratch)).items():
            ten_a[("10", embedding)] = runs
        pictures = {
            "fig10a-panels.png": _figure(ten_a, "data.k", "Figure 10a: d = 32, lambda = 10 (k = 6: fig9; k = 10: the paper presets' seeds)"),
            "fig10b-panels.png": _figure(ten_b, "data.d", "Figure 10b: k = 6, lambda = 10 (d = 4 and 32: fig9)"),
        }
    for name, png in pictures.items():
        write_atomically(SWEEPS / name, png)
        print(SWEEPS / name)


if __name__ == "__main__":
    main()
