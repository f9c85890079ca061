"""``ktframe cluster FILE --k K``: cluster a user's points and write their labels, with a hand-built
variant or (``--checkpoint``) a trained model."""

from __future__ import annotations

import math
import os
import sys

from ktframe.cli import progress
from ktframe.cli.options import bounded, integer, parse_gamma, parse_option, variant_options
from ktframe.core.errors import InputError
from ktframe.core.io import output_path, write_atomically
from ktframe.core.limits import check_iterations, check_seed
from ktframe.core.names import canonical


def add_parser(commands) -> None:
    p = commands.add_parser("cluster", help="cluster the rows of a CSV or .npy file")
    p.add_argument("file", help="a .csv (one point a row, optional header) or .npy (2-D array) file")
    p.add_argument("--k", "--n-clusters", dest="k", type=int, required=True, help="number of clusters (--n-clusters: the same, scikit-learn's name)")
    p.add_argument("--variant", default="lloyd", help="registered variant (default: lloyd)")
    p.add_argument(
        "--option", dest="options", type=parse_option, action="append", default=[], metavar="KEY=VALUE",
        help="a build option of the variant, repeatable (`ktframe plugins` lists them), e.g. --option reset=attention",
    )  # fmt: skip
    p.add_argument(
        "--checkpoint",
        help="cluster with this trained model (a .ckpt of ktframe fit, read weights-only) instead of a hand-built variant: its steps, its scaling",
    )
    p.add_argument(
        "--layers",
        type=bounded(check_iterations, 1),
        default=None,
        help="layers = iterations (default: 10; with --checkpoint, the steps it was evaluated with)",
    )
    p.add_argument(
        "--lloyd-last", type=bounded(check_iterations), default=None, metavar="N",
        help="the last N of the steps Lloyd's algorithm's (exact), from the centers the model reaches in the others (default: 0; with --checkpoint, its own)",
    )  # fmt: skip
    p.add_argument(
        "--swaps", type=bounded(check_iterations), default=None, metavar="T",
        help="then T swaps: the least useful center moved where the error is large, kept where the objective falls (default: 0; with --checkpoint, its own)",
    )  # fmt: skip
    p.add_argument("--tol", type=float, default=1e-4, help="stop once an iteration moves the centers by at most tol x the data's mean variance (default: 1e-4)")
    p.add_argument("--gamma", type=parse_gamma, default=math.inf, help="inverse temperature (default: inf, exact)")
    p.add_argument("--init", type=canonical, choices=("k-means++", "random"), default="k-means++", help="(default: k-means++; also spelt kmeans++)")
    p.add_argument(
        "--n-init", type=integer(1, word="auto", meaning="the starts run, the best kept"), default="auto",
        help="starts run, the one of least objective kept (default: auto, scikit-learn's: 1 for k-means++, 10 for random)",
    )  # fmt: skip
    p.add_argument("--seed", type=bounded(check_seed), default=0, help="random seed of the initialisation (default: 0)")
    p.add_argument("--dtype", choices=("float64", "float32"), default=None, help="precision of the points (default: float64, or float32 for a float32 .npy)")
    p.add_argument("--out", help="write labels here (CSV with a 'label' header), never onto FILE; default (or '-'): standard output")
    p.set_defaults(run=run)


def _same_file(path: str, other: str | int) -> bool:
    """Whether ``path`` names the file ``other`` (a path or an open descriptor) names: through
    symbolic links, and as any of its hard links."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(other) if isinstance(other, int) else os.stat(other))
    except (OSError, ValueError):
        return False


def _destination(out: str | None, file: str) -> str | None:
    """Where the labels go, checked before any work: None for standard output (no ``--out``,
    ``-``, or the file standard output writes to, such as ``/dev/stdout``), else ``out``."""
    if out is None or out == "-":
        return None
    try:
        stdout = sys.stdout.fileno()
    except (OSError, ValueError):  # replaced by an object without a descriptor
        stdout = None
    if stdout is not None and _same_file(out, stdout):
        return None
    if _same_file(out, file):
        raise InputError(f"--out {out} is the input file {file}; expected another file for the labels, so that the points are kept")
    output_path(out)
    return out


def run(args) -> int:
    from ktframe.clustering.datafile import label_lines, load_points  # here: --help and usage errors import no torch
    from ktframe.clustering.estimator import TransformerKMeans

    out = _destination(args.out, args.file)
    if args.checkpoint is not None:
        given = [flag for flag, value in (("--variant", args.variant != "lloyd"), ("--gamma", args.gamma != math.inf), ("--option", args.options)) if value]
        if given:
            raise InputError(f"--checkpoint clusters with the trained model, which {' and '.join(given)} would describe otherwise; expected --checkpoint alone")
        options, layers, method = {}, args.layers, f"checkpoint={args.checkpoint}"
    else:
        options, layers, method = variant_options(args.variant, args.options), 10 if args.layers is None else args.layers, f"variant={args.variant}"
    with progress.bar(f"cluster {args.file}", 2, "stage", quiet=args.quiet) as bar:
        points = load_points(args.file, args.dtype)
        bar.update()
        model = TransformerKMeans(
            args.k, variant=args.variant, n_layers=layers, tol=args.tol, gamma=args.gamma, init=args.init, n_init=args.n_init, random_state=args.seed,
            variant_options=options or None, checkpoint=args.checkpoint, lloyd_last=args.lloyd_last, swaps=args.swaps,
        )  # fmt: skip
        labels = model.fit_predict(points)
        bar.update()
    summary = f"{points.shape[0]} points, {points.shape[1]} dimensions, k={args.k}, {method}: objective {model.inertia_:.6g} (log {math.log(model.inertia_) if model.inertia_ > 0 else float('-inf'):.6f})"
    if out is not None:
        write_atomically(out, label_lines(labels))
        print(f"{summary}; labels written to {out}")
        return 0
    sys.stdout.flush()
    stream = sys.stdout.buffer
    for block in label_lines(labels):
        data = memoryview((block + "\n").encode("utf-8"))
        while data:  # unbuffered (PYTHONUNBUFFERED), a write may take only part of a block: the rest is written again, so that a failure is seen
            data = data[stream.write(data) :]
    stream.flush()  # before the summary: labels that did not all reach standard output are main's one-line error, not a summary
    print(summary, file=sys.stderr)
    return 0
