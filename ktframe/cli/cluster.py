"""``ktframe cluster FILE --k K``: cluster a user's points and write their labels."""

from __future__ import annotations

import argparse
import math
import sys

from ktframe.cli.options import parse_gamma
from ktframe.clustering.datafile import label_lines, load_points, write_atomically
from ktframe.clustering.estimator import TransformerKMeans


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"the seed must be a non-negative integer; got {text!r}")
    return value


def add_parser(commands) -> None:
    p = commands.add_parser("cluster", help="cluster the rows of a CSV or .npy file")
    p.add_argument("file", help="a .csv (one point a row, optional header) or .npy (2-D array) file")
    p.add_argument("--k", type=int, required=True, help="number of clusters")
    p.add_argument("--variant", default="lloyd", help="registered variant (default: lloyd)")
    p.add_argument("--layers", type=int, default=10, help="layers = iterations (default: 10)")
    p.add_argument("--gamma", type=parse_gamma, default=math.inf, help="inverse temperature (default: inf, exact)")
    p.add_argument("--init", choices=("k-means++", "random"), default="k-means++")
    p.add_argument("--seed", type=_seed, default=0, help="random seed of the initialisation (default: 0)")
    p.add_argument("--dtype", choices=("float64", "float32"), default=None, help="precision of the points (default: float64, or float32 for a float32 .npy)")
    p.add_argument("--out", help="write labels here (CSV with a 'label' header); default: standard output")
    p.set_defaults(run=run)


def run(args) -> int:
    points = load_points(args.file, args.dtype)
    model = TransformerKMeans(args.k, variant=args.variant, n_layers=args.layers, gamma=args.gamma, init=args.init, random_state=args.seed)
    labels = model.fit_predict(points)
    summary = f"{points.shape[0]} points, {points.shape[1]} dimensions, k={args.k}, variant={args.variant}: objective {model.inertia_:.6g} (log {math.log(model.inertia_) if model.inertia_ > 0 else float('-inf'):.6f})"
    if args.out:
        write_atomically(args.out, label_lines(labels))
        print(f"{summary}; labels written to {args.out}")
    else:
        for block in label_lines(labels):
            sys.stdout.write(block + "\n")
        sys.stdout.flush()
        print(summary, file=sys.stderr)
    return 0
