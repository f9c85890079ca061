"""``ktframe fit [-m] [key=value ...]``: train a k-means transformer (Lightning, any devices), or a
sweep of them."""

from __future__ import annotations

import argparse
import sys

from ktframe.core.errors import InputError
from ktframe.learning.config import describe_keys, load_config, presets


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    return value


def _keys_help() -> str:
    rows = list(describe_keys())
    width = max(len(key) for key, *_ in rows)
    lines = [f"  {key:<{width}}  {kind:<13} {default:<12} {meaning}" for key, kind, default, meaning in rows]
    return "\n".join(
        [
            f"presets: {', '.join(presets())} (preset=NAME; or preset=path/to/file.yaml)",
            "",
            "config keys (key=value; type, default of the schema before the preset, meaning):",
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
        help="train a k-means transformer; preset=NAME picks a preset (default: quick)",
        epilog=_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. preset=paper optim.lr=0.001 trainer.devices=2")
    p.add_argument(
        "-m", "--multirun", action="store_true", help="run every combination of the comma lists (KEY=a,b,c) as a run of its own, in one sweep folder"
    )
    p.add_argument("--jobs", type=_positive, default=None, help="with -m: runs at once (default: 1)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.jobs is not None and not args.multirun:
        raise InputError("--jobs needs -m: it is the number of a multirun's runs at once")
    if args.multirun:
        return _multirun(args)
    from ktframe.training.multirun import refuse_sweeps

    refuse_sweeps(args.overrides)
    cfg = load_config(args.overrides)  # first: a config error should not wait for Lightning to import
    from ktframe.training.preemption import Preempted, exit_code
    from ktframe.training.run import train

    try:
        result = train(cfg)
    except Preempted as stop:  # not an error: the run is whole up to its checkpoint
        print(f"ktframe fit: {stop}", file=sys.stderr)
        return exit_code(stop.signum)
    if result.summary["rank"] == 0:  # under DDP every rank returns here; one report
        print(f"run {result.run_id}: {result.summary['global_step']} steps, best val/ratio {result.summary['best_val_ratio']}, folder {result.run_dir}")
        if "wandb_sync" in result.summary:
            print(f"W&B ran offline; upload with: {result.summary['wandb_sync']}")
    return 0


def _multirun(args) -> int:
    from ktframe.training import multirun
    from ktframe.training.folders import new_run_id

    sweep = multirun.plan(args.overrides, lambda: f"multirun-{new_run_id()}")
    flags = [*(["--no-plugins"] if args.no_plugins else []), *(["--debug"] if args.debug else [])]
    failed = multirun.run(sweep, parallel=args.jobs or 1, cli_flags=flags)
    if failed:
        names = ", ".join(f"job {job.index} ({job.label()}, {job.run_dir}/fit.log)" for job in failed)
        print(f"ktframe fit: error: {len(failed)} of {len(sweep.jobs)} runs failed: {names}", file=sys.stderr)
        return 1
    print(f"all {len(sweep.jobs)} runs finished in {sweep.folder}; aggregate them with: ktframe report {sweep.folder}")
    return 0
