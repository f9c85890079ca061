"""``ktframe gamma-sweep``: the temperature sweep of the hand-built construction, the transformer
at finite γ against Lloyd's algorithm over a grid of k, d, n and the data's scale."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ktframe.experiments import gamma_sweep


def add_parser(commands) -> None:
    p = commands.add_parser("gamma-sweep", help="the model at finite temperature against Lloyd over a grid of k, d, n and scale; a CSV and four heatmaps")
    p.add_argument("--variant", default="soft", help="a registered variant that takes gamma (default: soft)")
    p.add_argument(
        "--grid", default="paper",
        help=f"paper ({gamma_sweep.PAPER.cells} cells: the paper's grid), quick ({gamma_sweep.GRIDS['quick'].cells} cells: every third value of each axis but gamma), or a YAML file of the axes k, d, n, scale, gamma (default: paper)",
    )  # fmt: skip
    p.add_argument("--out", default="gamma-sweep", help="folder for gamma-sweep.csv and the heatmaps (default: gamma-sweep)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tasks (default: 0)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="(default: float32, as the authors' sweep)")
    p.add_argument("--resume", action="store_true", help="go on with the sweep that was stopped in --out (started with the same options)")
    p.add_argument("--json", action="store_true", help="print one JSON object (files, medians by gamma and by scale) instead of a summary")
    p.set_defaults(run=run)


def run(args) -> int:
    chosen = gamma_sweep.grid(args.grid)
    folder = Path(args.out)
    with tqdm(total=chosen.cells, desc=f"gamma-sweep {args.grid}", unit="cell", file=sys.stderr, disable=None) as bar:
        try:
            rows, paths = gamma_sweep.run(
                args.variant, chosen, folder, seed=args.seed, dtype=getattr(torch, args.dtype), resume=args.resume, progress=bar.update
            )
        except KeyboardInterrupt:
            bar.close()
            print(f"gamma-sweep: stopped after {bar.n} of {chosen.cells} cells; {folder} keeps them: the same command with --resume goes on", file=sys.stderr)
            return 130
    by_gamma, by_scale = gamma_sweep.medians(rows, "gamma"), gamma_sweep.medians(rows, "scale")
    if args.json:
        summary = {"variant": args.variant, "grid": args.grid, "cells": len(rows), "files": [str(p) for p in paths]}
        print(json.dumps({**summary, "median_delta_by_gamma": by_gamma, "median_delta_by_scale": by_scale}))
        return 0
    print(f"{len(rows)} cells, variant {args.variant}: median (model - Lloyd) log objective after {gamma_sweep.STEPS} steps")
    print("  by gamma: " + ", ".join(f"{g:g}: {v:+.4f}" for g, v in by_gamma.items()))
    print("  by scale: " + ", ".join(f"{s:g}: {v:+.4f}" for s, v in by_scale.items()))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0
