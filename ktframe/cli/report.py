"""``ktframe report PATH [--json] [--out DIR]``: every training run (and every ``ktframe eval --out``
folder) below PATH, aggregated into mean ± spread over runs."""

from __future__ import annotations

import json
from pathlib import Path

from ktframe.cli import progress


def add_parser(commands) -> None:
    p = commands.add_parser("report")
    p.add_argument(
        "path",
        metavar="PATH",
        help="a run folder (one holding summary.json), an evaluation folder (eval.json from ktframe eval --out), or a folder holding such folders at any depth",
    )
    p.add_argument("--out", metavar="DIR", help="a new folder for report.json, report.md, report.png and training.png (default: PATH/report)")
    p.add_argument(
        "--force",
        action="store_true",
        help="write into --out although it holds an earlier report or other files: replaces report's own files there, removes nothing else",
    )
    p.add_argument(
        "--by", metavar="KEYS", default="",
        help="also report each group of runs sharing these config keys' values, comma-separated (e.g. optim.loss_lambda,data.d: a sweep's settings, seeds pooled); "
        "runs whose configs differ in other keys are grouped by those too, and the report names them",
    )  # fmt: skip
    p.add_argument("--stat", choices=("mean", "median"), default="mean", help="each cell: mean ± std over runs (ktframe's) or median [min, max] (the authors')")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of Markdown")
    p.set_defaults(run=run)


def run(args) -> int:
    from ktframe.reporting.report import build_report, markdown, pictures, write

    root = Path(args.path)
    with progress.bar("report", unit="run", quiet=args.quiet) as bar:
        report = build_report(root, [key for key in args.by.split(",") if key], progress=progress.follow(bar))
        text = markdown(report, root, args.stat)
        bar.set_postfix_str("drawing")
        out = Path(args.out) if args.out else (root if root.is_dir() else root.parent) / "report"
        paths = write(out, report, text, pictures(report, root, args.stat), force=args.force)
    print(json.dumps(report) if args.json else f"{text}\n\nwritten: {', '.join(map(str, paths))}")
    return 0
