"""``ktframe eval CHECKPOINT [key=value ...] [--json]``: the paper's evaluation protocol."""

from __future__ import annotations

import argparse
import json

from ktframe.cli import progress

EXAMPLES = """examples:
  ktframe eval CKPT eval.tasks=320 eval.ns=[512] eval.inits=[k-means++] eval.family=cauchy
  ktframe eval CKPT eval.ks=[4,8,16]      # one setting per k (a model trained with data.k_range: any k up to its maximum)
  ktframe eval CKPT data.k=8              # the same as eval.ks=[8] (unless eval.ks is given)
  ktframe eval CKPT eval.baselines=[breathing-kmeans,best-of-10]   # their final objective beside the others (pip install 'ktframe[baselines]')"""


def add_parser(commands) -> None:
    p = commands.add_parser(
        "eval",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", help="a .ckpt written by ktframe fit")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="eval.* keys (`ktframe fit --help` lists them), data.family and data.k; e.g. eval.tasks=320 eval.ks=[4,8] eval.baselines=[best-of-10]",
    )
    p.add_argument(
        "--out",
        help="folder for eval.json and eval.png, replacing an evaluation there (default: the run folder's eval/, or ./eval-NAME/ for a checkpoint outside a run folder; never replacing one)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(run=run)


def run(args) -> int:
    from ktframe.evaluation.evaluate import evaluate_checkpoint, format_table

    with progress.bar("eval", unit="task", quiet=args.quiet) as bar:
        report, picture = evaluate_checkpoint(args.checkpoint, args.overrides, args.out, progress=progress.follow(bar))
    print(json.dumps(report) if args.json else f"{format_table(report)}\n\nwritten: {picture.with_name('eval.json')}, {picture}")
    return 0
