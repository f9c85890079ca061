"""``ktframe fit [key=value ...]``: train a k-means transformer (Lightning, any devices)."""

from __future__ import annotations

from ktframe.training.config import load_config


def add_parser(commands) -> None:
    p = commands.add_parser("fit", help="train a k-means transformer; preset=NAME picks a preset (default: quick)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. preset=paper optim.lr=0.001 trainer.devices=2")
    p.set_defaults(run=run)


def run(args) -> int:
    cfg = load_config(args.overrides)  # first: a config error should not wait for Lightning to import
    from ktframe.training.run import train

    result = train(cfg)
    if result.summary["rank"] == 0:  # under DDP every rank returns here; one report
        print(f"run {result.run_id}: {result.summary['global_step']} steps, best val/ratio {result.summary['best_val_ratio']}, folder {result.run_dir}")
        if "wandb_sync" in result.summary:
            print(f"W&B ran offline; upload with: {result.summary['wandb_sync']}")
    return 0
