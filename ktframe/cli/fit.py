"""``ktframe fit [-m] [key=value ...]``: train a k-means transformer (Lightning, any devices), or a
sweep of them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ktframe.cli.options import integer
from ktframe.core.errors import InputError


def epilog(overrides: Sequence[str]) -> str:
    """What ``ktframe fit [key=value ...] --help`` lists below the options: every config key with
    the value the run of these overrides would use (the preset's, else the schema's default)."""
    from ktframe.learning.config import describe_keys, load_config, presets

    overrides = [item for item in overrides if "," not in item]  # a sweep's lists: its keys show the preset's values
    cfg = load_config(overrides)
    rows = list(describe_keys(values=cfg))
    width = max(len(key) for key, *_ in rows)
    lines = [f"  {key:<{width}}  {kind:<13} {value:<12} {meaning}" for key, kind, value, meaning in rows]
    given = " ".join(item for item in overrides if not item.startswith("preset="))
    return "\n".join(
        [
            f"presets: {', '.join(presets())} (preset=NAME; or preset=path/to/file.yaml)",
            "",
            f"config keys (key=value, as trainer.max_steps=20; type, value of this run: preset {cfg.preset}{f' with {given}' if given else ''}; meaning):",
            *lines,
            f"  {'trainer.KEY':<{width}}  {'any':<13} {'-':<12} any other argument of Lightning's Trainer, e.g. trainer.gradient_clip_val=1.0",
            "",
            "multirun: ktframe fit -m data.seed=0,1,2 optim.lr=0.01,0.003 runs the 6 combinations (also range(0,10));",
            "          then `ktframe report runs/SWEEP` aggregates them.",
        ]
    )


def add_parser(commands) -> None:
    p = commands.add_parser(
        "fit",
        description="Train a k-means transformer. `ktframe fit preset=paper --help` lists the values that preset runs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. preset=paper optim.lr=0.001 trainer.devices=2")
    p.add_argument(
        "-m", "--multirun", action="store_true", help="run every combination of the comma lists (KEY=a,b,c) as a run of its own, in one sweep folder"
    )
    p.add_argument("--jobs", type=integer(1), default=None, help="with -m: runs at once (default: 1)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.jobs is not None and not args.multirun:
        raise InputError("--jobs needs -m: it is the number of a multirun's runs at once")
    if args.multirun:
        return _multirun(args)
    from ktframe.learning.config import load_config
    from ktframe.training.multirun import refuse_sweeps

    refuse_sweeps(args.overrides)
    cfg = load_config(args.overrides)  # first: a config error should not wait for Lightning to import
    from ktframe.training.preemption import Preempted, exit_code
    from ktframe.training.run import train

    try:
        result = train(cfg, quiet=args.quiet)
    except Preempted as stop:  # not an error: the run is whole up to its checkpoint
        print(f"ktframe fit: {stop}", file=sys.stderr)
        return exit_code(stop.signum)
    if result.summary["rank"] == 0:  # under DDP every rank returns here; one report
        print(summary_text(result.summary, result.run_dir, cfg.data.val_tasks))
    return 0


def summary_text(summary: dict, run_dir: Path, val_tasks: int) -> str:
    """The few lines that end a fit: how it went, what the ratio means, where the run is
    (``run_dir``), what to run next."""
    ratio = summary["best_val_ratio"]
    lines = [
        f"run {summary['run_id']}: {summary['global_step']} steps ({summary['seconds']:.0f} s of training), best val/ratio {'-' if ratio is None else f'{ratio:.4f}'}",
        f"  val/ratio: the k-means objective after the model's step over that after one step of Lloyd's algorithm from the same centers, on {val_tasks} validation tasks: below 1 beats Lloyd",
        f"  folder {run_dir}: config.yaml, checkpoints/ (best.ckpt: the best val/ratio), csv/metrics.csv, figures/, summary.json",
    ]
    if "wandb_sync" in summary:
        lines.append(f"  W&B ran offline; upload with: {summary['wandb_sync']}")
    if "eval" in summary:
        lines.append(f"  evaluated: {run_dir / summary['eval']}; next: ktframe report {run_dir}")
    else:
        lines.append(f"  next: ktframe eval {run_dir / 'checkpoints' / 'best.ckpt'}")
    return "\n".join(lines)


def _multirun(args) -> int:
    from ktframe.training import multirun
    from ktframe.training.folders import new_run_id

    sweep = multirun.plan(args.overrides, lambda: f"multirun-{new_run_id()}")
    flags = [*(["--no-plugins"] if args.no_plugins else []), *(["--debug"] if args.debug else []), *(["--quiet"] if args.quiet else [])]
    failed = multirun.run(sweep, parallel=args.jobs or 1, cli_flags=flags)
    if failed:
        names = ", ".join(f"job {job.index} ({job.label()}, {job.run_dir}/fit.log)" for job in failed)
        print(f"ktframe fit: error: {len(failed)} of {len(sweep.jobs)} runs failed: {names}", file=sys.stderr)
        return 1
    print(f"all {len(sweep.jobs)} runs finished in {sweep.folder}; aggregate them with: ktframe report {sweep.folder}")
    return 0
