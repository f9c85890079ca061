"""The tables of docs/results.md's "As the authors evaluate" from the committed evaluations of
``results/faithful/`` (``evaluate.py`` writes them) and the runs' validation histories. From the
repository root: ``python results/faithful/tables.py`` prints them in Markdown.

The authors' form: each seed evaluated on tasks of its own, the median over seeds, [least, greatest]
beside, against Lloyd with re-seeding. ktframe's form: every seed on the same tasks, mean ± std.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAITHFUL = ROOT / "results" / "faithful"


def _final(folder: Path) -> dict[str, list[float]]:
    """Per method, each seed's mean log objective after the last step; per other method of the
    paired differences, each seed's mean difference from the model (``model − METHOD``)."""
    found: dict[str, list[float]] = {}
    for path in sorted(folder.glob("seed*/eval.json")):
        (setting,) = json.loads(path.read_text())["settings"]
        for method, curve in setting["log_objective"].items():
            found.setdefault(method, []).append(curve[-1])
        for other, difference in setting["versus"]["model"].items():
            found.setdefault(f"model − {other}", []).append(difference["mean"])
        found.setdefault("reseeded", []).append(setting["reseeded"])
    return found


def _median(values: list[float], sign: bool = False) -> str:
    f = "+.4f" if sign else ".4f"
    return f"{statistics.median(values):{f}} [{min(values):{f}}, {max(values):{f}}]"


def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{values[0]:.4f}"


def _history(path: Path) -> tuple[float, float] | None:
    """The last and the lowest val/ratio of a run's metrics.csv."""
    if not path.is_file():
        return None
    with path.open() as file:
        ratios = [float(row["val/ratio"]) for row in csv.DictReader(file) if row.get("val/ratio")]
    return (ratios[-1], min(ratios)) if ratios else None


def headline() -> list[str]:
    lines = [
        "| preset | model | Lloyd, re-seeding | model − Lloyd, re-seeding (per seed) | seeds better | Lloyd, keeping | model − Lloyd, keeping | k-means++ + Lloyd |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for preset in ("paper", "paper-none"):
        f = _final(FAITHFUL / preset)
        better = sum(d < 0 for d in f["model − lloyd-reseed"])
        lines.append(
            f"| `{preset}` | {_median(f['model'])} | {_median(f['lloyd-reseed'])} | {_median(f['model − lloyd-reseed'], True)} | {better} of {len(f['model'])} "
            f"| {_median(f['lloyd'])} | {_median(f['model − lloyd'], True)} | {_median(f['kmeans++'])} |"
        )
    return lines


def families() -> list[str]:
    lines = [
        "| family | model | Lloyd, re-seeding | model − Lloyd, re-seeding (per seed) | seeds better | tasks re-seeded (per seed) |",
        "|---|---|---|---|---|---|",
    ]
    for family in ("gaussian", "cauchy", "gumbel", "laplace", "lognormal"):
        f = _final(FAITHFUL / ("paper" if family == "gaussian" else f"families/{family}"))
        better = sum(d < 0 for d in f["model − lloyd-reseed"])
        reseeded = f"{int(statistics.median(f['reseeded']))} [{min(f['reseeded'])}, {max(f['reseeded'])}]"
        lines.append(
            f"| {family} | {_median(f['model'])} | {_median(f['lloyd-reseed'])} | {_median(f['model − lloyd-reseed'], True)} | {better} of {len(f['model'])} | {reseeded} |"
        )
    return lines


def shared_families() -> list[str]:
    """Lloyd with re-seeding on the shared tasks of each family (random starts), and the new
    log-normal family's shared-task evaluation of every seed."""
    lines = ["| family | model (mean ± std) | Lloyd, keeping | Lloyd, re-seeding | tasks re-seeded | model − Lloyd, re-seeding |", "|---|---|---|---|---|---|"]
    for family in ("gaussian", "cauchy", "gumbel", "laplace", "lognormal-noise", "lognormal"):
        f = _final(FAITHFUL / "shared" / family)
        if family == "lognormal":
            model = f["model"]
        else:  # the committed evaluations of every seed (results/families/, random starts at n = 512)
            model = [
                next(s for s in json.loads(p.read_text())["settings"] if (s["init"], s["n"]) == ("random", 512))["log_objective"]["model"][-1]
                for p in sorted((ROOT / "results" / "families" / family).glob("paper-seed*/eval.json"))
            ]
        lines.append(
            f"| {family} | {_mean(model)} | {f['lloyd'][0]:.4f} | {f['lloyd-reseed'][0]:.4f} | {f['reseeded'][0]} | {statistics.mean(model) - f['lloyd-reseed'][0]:+.4f} |"
        )
    return lines


SWEEPS = {
    "fig10b": ["d8", "d16"],
    "fig10a": ["k16", "k25"],
    "fig9": [f"d{d}-lambda{lam}" for d in (4, 32) for lam in ("1.0", "4.0", "7.0", "10.0")],
}


def _sweep_histories(sweep: str, setting: str, embedding: str) -> list[tuple[float, float]]:
    """(last, lowest) val/ratio of each run of a sweep's setting, from the committed histories."""
    state = json.loads((ROOT / "results" / "sweeps" / sweep / "multirun.json").read_text())
    found = []
    for job in state["jobs"]:
        s = job["swept"]
        name = {"fig9": f"d{s.get('data.d')}-lambda{s.get('optim.loss_lambda')}", "fig10a": f"k{s.get('data.k')}", "fig10b": f"d{s.get('data.d')}"}[sweep]
        if name == setting and s["model.embedding"] == embedding:
            history = _history(ROOT / "results" / "sweeps" / sweep / str(job["index"]) / "csv" / "metrics.csv")
            if history is not None:
                found.append(history)
    return found


def sweeps() -> list[str]:
    lines = [
        "| figure | setting | embedding | seeds | val/ratio, last (median [min, max]) | val/ratio, best | model, 20 steps | Lloyd, re-seeding | model − Lloyd, re-seeding (per seed) | seeds better |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sweep, settings in SWEEPS.items():
        for setting in settings:
            for embedding in ("onehot", "none"):
                f = _final(FAITHFUL / sweep / f"{setting}-{embedding}")
                histories = _sweep_histories(sweep, setting, embedding)
                last, best = [h[0] for h in histories], [h[1] for h in histories]
                better = sum(d < 0 for d in f["model − lloyd-reseed"])
                lines.append(
                    f"| {sweep} | {setting} | {embedding} | {len(f['model'])} | {_median(last)} | {_median(best)} | {_median(f['model'])} "
                    f"| {_median(f['lloyd-reseed'])} | {_median(f['model − lloyd-reseed'], True)} | {better} of {len(f['model'])} |"
                )
    return lines


def paper_histories() -> list[str]:
    """The last and the best val/ratio of the ten seeds of each preset (seed 0 of ``paper``: no history kept)."""
    lines = ["| preset | seeds | val/ratio, last (median [min, max]) | val/ratio, best | last − best, largest |", "|---|---|---|---|---|"]
    for preset in ("paper", "paper-none"):
        found = [h for s in range(10) if (h := _history(ROOT / "results" / "seeds" / f"{preset}-seed{s}-metrics.csv")) is not None]
        last, best = [h[0] for h in found], [h[1] for h in found]
        lines.append(f"| `{preset}` | {len(found)} | {_median(last)} | {_median(best)} | {max(a - b for a, b in found):+.4f} |")
    return lines


def main() -> None:
    for title, table in (
        ("The learned layer, n = 512, d = 32, k = 10, random starts", headline()),
        ("Validation histories of the ten seeds", paper_histories()),
        ("Table 1, the authors' form", families()),
        ("Table 1, shared tasks", shared_families()),
        ("Figures 9 and 10, the authors' form", sweeps()),
    ):
        print(f"### {title}\n")
        print("\n".join(table), end="\n\n")


if __name__ == "__main__":
    main()
