"""``ktframe real-data``: trained checkpoints against Lloyd and k-means++ on real data sets that
ship inside installable packages."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ktframe.cli import progress
from ktframe.core.errors import InputError

DEFAULT_OUT = "real-data"
EXAMPLES = """examples:
  ktframe real-data                                   # the committed checkpoints of results/, every data set (pip install 'ktframe[realdata]')
  ktframe real-data --checkpoint run/checkpoints/best.ckpt --datasets iris,wine --samples 32
  ktframe real-data --datasets digits --ks 4,8,12 --out digits-report
  ktframe real-data --lloyd-last 10                   # also the model's first steps followed by 10 of Lloyd's"""


def epilog(_) -> str:
    """The data sets and their ks, under ``ktframe real-data --help``."""
    from ktframe.evaluation.datasets import DATASETS

    listed = "; ".join(f"{data.name} (k = {', '.join(map(str, data.ks))})" for data in DATASETS.values())
    return f"data sets: {listed}\n\n{EXAMPLES}"


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected data set names separated by commas; got {text!r}")
    return names


def _ks(text: str) -> list[int]:
    try:
        return [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers of clusters separated by commas, e.g. 3,10; got {text!r}") from None


def add_parser(commands) -> None:
    p = commands.add_parser("real-data", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--checkpoint", action="append", metavar="PATH",
        help="a .ckpt of ktframe fit; repeatable (default: those of results/paper-seed0.ckpt, results/anyk-seed0.ckpt, results/general.ckpt that exist)",
    )  # fmt: skip
    p.add_argument("--datasets", type=_names, help="data set names separated by commas (default: every one; listed below)")
    p.add_argument("--ks", type=_ks, help="the numbers of clusters for every data set, separated by commas (default: each data set's own, listed below)")
    p.add_argument("--samples", type=int, default=16, help="samples per data set and k (default: 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples and starts (default: 0)")
    p.add_argument(
        "--lloyd-last", type=int, default=None, metavar="N",
        help="also report model+lloyd: the model's first steps, then N of Lloyd's from its centers, as eval.lloyd_last (default: each checkpoint's own eval.lloyd_last, 0 where none)",
    )  # fmt: skip
    p.add_argument(
        "--swaps", type=int, default=None, metavar="T",
        help="also report the model's centers (after --lloyd-last's) and Lloyd's after T swaps, each followed by the model's steps of Lloyd's (default: each checkpoint's own eval.swaps, 0 where none)",
    )  # fmt: skip
    p.add_argument("--out", help=f"folder for report.md and report.json, replacing a report there (default: {DEFAULT_OUT}, never replacing one)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of Markdown")
    p.set_defaults(run=run)


def run(args) -> int:
    from ktframe.evaluation import real_data
    from ktframe.evaluation.datasets import DATASETS

    if args.seed < 0:
        raise InputError(f"--seed {args.seed}: expected a seed >= 0")
    folder = Path(args.out or DEFAULT_OUT)
    real_data.check_out(folder, named=args.out is not None)
    checkpoints = args.checkpoint or real_data.default_checkpoints()
    names = args.datasets or list(DATASETS)
    with progress.bar("real-data", unit="setting", quiet=args.quiet) as bar:
        report = real_data.evaluate(
            checkpoints,
            names,
            samples=args.samples,
            ks=args.ks,
            seed=args.seed,
            lloyd_last=args.lloyd_last,
            swaps=args.swaps,
            out=folder,
            progress=progress.follow(bar),
        )
    paths = real_data.write(report, folder)
    print(json.dumps(report) if args.json else f"{real_data.markdown(report)}\nwritten: {', '.join(map(str, paths))}")
    return 0
