"""``ktframe``: parse the command line, run one command, turn user errors into one line and exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ktframe.cli import cluster, config, eval, fit, gamma_sweep, plugins, report, verify
from ktframe.core.errors import KtframeError, UnknownNameError
from ktframe.plugin import manager as pluginmanager

COMMANDS = (fit, eval, report, verify, gamma_sweep, cluster, config, plugins)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), like every other ktframe error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    parser = Parser(prog="ktframe", description="Clustering algorithms written as transformer circuits.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument(
        "--no-plugins",
        action="store_true",
        help="run ktframe alone: its own components and variants, no other distribution's plugin (as KTFRAME_DISABLE_PLUGINS=1)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with ``key=value`` overrides allowed before and after options
    (``ktframe fit -m data.seed=0,1 --jobs 2 optim.lr=0.1``), in the order given."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    if len(overrides) < len(extra) or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.no_plugins:
        pluginmanager.disable_installed()
    try:
        return args.run(args) or 0
    except KtframeError as exc:
        if args.debug:
            raise
        off = pluginmanager.disabled() if isinstance(exc, UnknownNameError) else ""
        # A variant or component that a disabled plugin would have registered: say so.
        print(f"ktframe {args.command}: error: {exc}{f'; {off}' if off else ''}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
