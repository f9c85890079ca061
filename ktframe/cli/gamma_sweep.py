"""``ktframe gamma-sweep``: the temperature sweep of the hand-built construction, the transformer
at finite γ against Lloyd's algorithm over a grid of k, d, n and the data's scale."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ktframe.cli import progress
from ktframe.core.errors import InputError
from ktframe.core.io import write_atomically


def epilog(_: Sequence[str]) -> str:
    """The grids' sizes, under ``ktframe gamma-sweep --help``."""
    from ktframe.experiments import gamma_sweep

    return "grids: " + ", ".join(f"{name}: {grid.cells} cells" for name, grid in gamma_sweep.GRIDS.items())


def add_parser(commands) -> None:
    p = commands.add_parser("gamma-sweep")
    p.add_argument("--variant", default="soft", help="a registered variant that takes gamma (default: soft)")
    p.add_argument(
        "--grid", default="paper",
        help="paper (the paper's grid), quick (every third value of each axis but gamma), or a YAML file of the axes k, d, n, scale, gamma (default: paper)",
    )  # fmt: skip
    p.add_argument("--out", default="gamma-sweep", help="folder for gamma-sweep.csv and the heatmaps (default: gamma-sweep)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tasks (default: 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="(default: float32, as the authors' sweep)")
    p.add_argument("--resume", action="store_true", help="go on with the sweep that was stopped in --out (started with the same options)")
    p.add_argument(
        "--from", dest="source", metavar="CSV", help="take the rows of this finished sweep's gamma-sweep.csv instead of running one (to redraw or compare it)"
    )
    p.add_argument(
        "--against", metavar="CSV",
        help="compare with another sweep: a gamma-sweep.csv or the authors' results/klic_parameter_sweep.csv (github.com/rithram/kmeans-trf); writes gamma-sweep-against.md",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object (files, medians by gamma and by scale) instead of a summary")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from ktframe.experiments import gamma_sweep

    other = gamma_sweep.read_other(Path(args.against)) if args.against else None  # read before any cell runs
    folder = Path(args.out)
    if args.source:
        if args.resume:
            raise InputError("--from takes a finished sweep and --resume goes on with an unfinished one; expected one of them")
        rows = gamma_sweep.read_csv(Path(args.source))
        gamma_sweep.check_folder(folder)
        paths = gamma_sweep.write(rows, gamma_sweep.grid_of(rows), folder)
    else:
        chosen = gamma_sweep.grid(args.grid)
        with progress.bar(f"gamma-sweep {args.grid}", chosen.cells, "cell", quiet=args.quiet) as bar:
            try:
                rows, paths = gamma_sweep.run(
                    args.variant, chosen, folder, seed=args.seed, dtype=getattr(torch, args.dtype), resume=args.resume, progress=bar.update
                )
            except KeyboardInterrupt:
                bar.close()
                print(
                    f"gamma-sweep: stopped after {bar.n} of {chosen.cells} cells; {folder} keeps them: the same command with --resume goes on", file=sys.stderr
                )
                return 130
    comparison = None
    if other is not None:
        comparison = gamma_sweep.against(rows, other)
        paths.append(folder / "gamma-sweep-against.md")
        write_atomically(paths[-1], gamma_sweep.against_markdown(comparison, Path(args.against)).encode())
    by_gamma, by_scale = gamma_sweep.medians(rows, "gamma"), gamma_sweep.medians(rows, "scale")
    if args.json:
        source = {"from": args.source} if args.source else {"variant": args.variant, "grid": args.grid}
        summary = {**source, "cells": len(rows), "files": [str(p) for p in paths]}
        print(json.dumps({**summary, "median_delta_by_gamma": by_gamma, "median_delta_by_scale": by_scale, "against": comparison}))
        return 0
    print(
        f"{len(rows)} cells, {f'from {args.source}' if args.source else f'variant {args.variant}'}: median (model - Lloyd) log objective after {gamma_sweep.STEPS} steps"
    )
    print("  by gamma: " + ", ".join(f"{g:g}: {v:+.4f}" for g, v in by_gamma.items()))
    print("  by scale: " + ", ".join(f"{s:g}: {v:+.4f}" for s, v in by_scale.items()))
    if comparison is not None:
        print(f"  against {args.against} ({comparison['shared']} cells in both), by gamma: " + ", ".join(
            f"{g:g}: {v:+.4f} vs {comparison['by_gamma']['theirs'][g]:+.4f}" for g, v in comparison["by_gamma"]["ours"].items()
        ))  # fmt: skip
    print("written: " + ", ".join(str(p) for p in paths))
    return 0
