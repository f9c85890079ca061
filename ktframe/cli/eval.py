"""``ktframe eval CHECKPOINT [key=value ...] [--json]``: the paper's evaluation protocol."""

from __future__ import annotations

import json
from pathlib import Path

from ktframe.datafile import write_atomically


def add_parser(commands) -> None:
    p = commands.add_parser("eval", help="evaluate a trained checkpoint against Lloyd and k-means++ seeding")
    p.add_argument("checkpoint", help="a .ckpt written by ktframe fit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. eval.tasks=320 eval.ns=[512] eval.inits=[kmeans++] eval.family=cauchy")
    p.add_argument("--out", help="folder for eval.json and eval.png (default: the run folder's eval/)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(run=run)


def run(args) -> int:
    from ktframe.training import figures
    from ktframe.training.evaluate import eval_config, evaluate, format_table, load_checkpoint

    config, model = load_checkpoint(args.checkpoint)
    config = eval_config(config, args.overrides)
    report = evaluate(model, config)
    report["checkpoint"] = str(args.checkpoint)
    out = Path(args.out) if args.out else Path(args.checkpoint).resolve().parent.parent / "eval"
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "eval.json", [json.dumps(report, indent=2)])
    primary = report["primary"]
    figures.save({"eval": figures.objective_figure(report["log_objective"], f"init={primary['init']}, n={primary['n']}, {report['family']}")}, out)
    print(json.dumps(report) if args.json else f"{format_table(report)}\n\nwritten: {out / 'eval.json'}, {out / 'eval.png'}")
    return 0
