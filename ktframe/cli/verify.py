"""``ktframe verify``: a variant's hand-built model against its classical reference, by default at
the setting the variant declares exact; ``--gamma`` and ``--dtype`` override it."""

from __future__ import annotations

import json

from ktframe.cli import progress
from ktframe.cli.options import parse_gamma, parse_option, variant_options
from ktframe.plugin.verify import PAPER_DTYPE, PAPER_GAMMA, Setting, format_report, verify


def add_parser(commands) -> None:
    default = Setting()
    p = commands.add_parser("verify", help="check a variant's transformer against its classical algorithm, layer by layer")
    p.add_argument("--variant", default="lloyd", help="registered variant (default: lloyd)")
    p.add_argument("--n", type=int, default=default.n, help=f"points (default: {default.n})")
    p.add_argument("--d", type=int, default=default.d, help=f"dimensions (default: {default.d})")
    p.add_argument("--k", type=int, default=default.k, help=f"clusters (default: {default.k})")
    p.add_argument("--layers", type=int, default=default.layers, help=f"layers = Lloyd iterations (default: {default.layers})")
    p.add_argument(
        "--gamma", type=parse_gamma, default=None,
        help=f"inverse temperature, or 'inf' for the hard limit (default: the variant's declared exact setting, as `ktframe plugins` lists it; {PAPER_GAMMA:g} for a variant that declares none)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=default.seed, help=f"data and initial centers (default: {default.seed})")
    p.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default=None,
        help=f"(default: the variant's declared exact setting; {PAPER_DTYPE} for a variant that declares none)",
    )
    p.add_argument(
        "--option", dest="options", type=parse_option, action="append", default=[], metavar="KEY=VALUE",
        help="a build option of the variant, repeatable (`ktframe plugins` lists them; default: its declared exact setting's), e.g. --option trim=0.1",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(run=run)


def run(args) -> int:
    options = variant_options(args.variant, args.options)
    setting = Setting(n=args.n, d=args.d, k=args.k, layers=args.layers, gamma=args.gamma, seed=args.seed, dtype=args.dtype, options=options)
    with progress.bar(f"verify {args.variant}: the transformer, then the reference", 2, "run", quiet=args.quiet) as bar:
        report = verify(args.variant, setting, progress=progress.follow(bar))
    print(json.dumps(report) if args.json else format_report(report))
    return 0 if report["passed"] else 1
