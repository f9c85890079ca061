"""``ktframe``: parse the command line, run one command, turn user errors into one line and exit 2.

Only the command that runs is imported: ``ktframe --help``, ``ktframe --version`` and a usage
error import neither PyTorch nor Lightning nor the plugins, and answer at once.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence

from ktframe.core.errors import KtframeError, UnknownNameError
from ktframe.core.names import closest

# Each command's module (``ktframe.cli.NAME``, imported only when the command runs) and its line in
# ``ktframe --help``.
COMMANDS = {
    "fit": ("fit", "train a k-means transformer; preset=NAME picks a preset (default: quick)"),
    "eval": ("eval", "evaluate a trained checkpoint against Lloyd and k-means++ seeding"),
    "report": ("report", "aggregate the training runs below a folder: mean, spread and 95 %% interval over runs"),
    "verify": ("verify", "check a variant's transformer against its classical algorithm, layer by layer"),
    "gamma-sweep": ("gamma_sweep", "the model at finite temperature against Lloyd over a grid of k, d, n and scale; a CSV and four heatmaps"),
    "real-data": ("real_data", "trained checkpoints against Lloyd and k-means++ on real data sets that ship with installable packages"),
    "cluster": ("cluster", "cluster the rows of a CSV or .npy file"),
    "config": ("config", "show the resolved training config"),
    "plugins": ("plugins", "list installed plugins and what they register"),
}
# Commands whose positional arguments include key=value overrides.
TAKES_OVERRIDES = ("fit", "eval", "config")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2), like every other ktframe error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Commands(argparse._SubParsersAction):
    """The commands' subparsers, each given its line of :data:`COMMANDS` unless it brings its own."""

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        kwargs.setdefault("help", COMMANDS[name][1])
        return super().add_parser(name, **kwargs)


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("ktframe")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "unknown (not installed)"
        print(f"ktframe {found}")  # on standard output, as `python --version` and pip's: it is the answer, not a notice
        parser.exit(0)


def _command_of(argv: Sequence[str]) -> str | None:
    """The command named on the line: its first word that is not a global option."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(command: str | None = None, help_for: Sequence[str] | None = None) -> Parser:
    """The parser of the whole line. Only ``command``'s own parser is built (importing its module);
    the other commands are listed with their one-line help. With ``help_for`` (the line's
    ``key=value`` overrides, when it asks for help), a command that describes its config (its
    module's ``epilog``) lists the values those overrides resolve to."""
    parser = Parser(prog="ktframe", description="Clustering algorithms written as transformer circuits.")
    parser.add_argument("--version", action=_Version, help="print ktframe's version and exit")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or notices on standard error; results and errors only")
    parser.add_argument(
        "--no-plugins",
        action="store_true",
        help="run ktframe alone: its own components and variants, no other distribution's plugin (as KTFRAME_DISABLE_PLUGINS=1)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser, action=_Commands)
    commands.required = True
    for name, (module, _) in COMMANDS.items():
        if name == command:
            loaded = importlib.import_module(f"ktframe.cli.{module}")
            loaded.add_parser(commands)
            if help_for is not None and hasattr(loaded, "epilog"):
                try:
                    commands.choices[name].epilog = loaded.epilog(help_for)
                except KtframeError as exc:
                    parser.error(str(exc))
        else:
            commands.add_parser(name)
    return parser


def _dashed_key(argv: Sequence[str]) -> str | None:
    """A LightningCLI-style ``--section.key=value`` (or ``--section.key value``) on the line, as ``key=value``."""
    for i, word in enumerate(argv):
        key, equals, value = word[2:].partition("=")
        if word.startswith("--") and "." in key:
            if not equals and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                value = argv[i + 1]
            return f"{key}={value or 'VALUE'}"
    return None


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with ``key=value`` overrides allowed before and after options
    (``ktframe fit -m data.seed=0,1 --jobs 2 optim.lr=0.1``), in the order given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    wants_help = "-h" in argv or "--help" in argv
    parser = build_parser(command, [item for item in argv if "=" in item and not item.startswith("-")] if wants_help else None)
    if command is not None and command not in COMMANDS:
        hint = closest(command, list(COMMANDS))
        parser.error(f"unknown command {command!r}" + (f"; did you mean {hint!r}?" if hint else f"; expected one of: {', '.join(COMMANDS)}"))
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    if len(overrides) < len(extra) or (overrides and not hasattr(args, "overrides")):
        dashed = _dashed_key(argv) if command in TAKES_OVERRIDES else None
        if dashed is not None:
            parser.error(f"unrecognized arguments: {' '.join(extra)}; ktframe takes {dashed}, without the dashes")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def _announce_compilation(folder: str | None) -> None:
    where = f"cached in {folder}" if folder else "in memory: no writable cache folder (set KTFRAME_CACHE_DIR to keep them)"
    print(f"ktframe: compiling ktframe's CPU kernels once; {where}", file=sys.stderr, flush=True)


# What a write to standard output that did not reach its reader fails with.
_LOST_OUTPUT = (errno.EPIPE, errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EIO)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.no_plugins:
        from ktframe.plugin import manager

        manager.disable_installed()
    if not args.quiet:
        from ktframe.kernels import jit

        jit.on_first_compile(_announce_compilation)
    try:
        code = args.run(args) or 0
        sys.stdout.flush()  # here, not at exit: a result cut short (a full disk, a file size limit, a closed pipe) is an error, never exit 0
        return code
    except OSError as exc:
        if args.debug or exc.errno not in _LOST_OUTPUT or exc.filename is not None:  # a named file's error is its command's to word
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush does not fail again
        print(f"ktframe {args.command}: error: could not write to standard output ({exc.strerror}); expected a writable output", file=sys.stderr)
        return 2
    except KtframeError as exc:
        if args.debug:
            raise
        off = ""
        if isinstance(exc, UnknownNameError):  # a variant or component that a disabled plugin would have registered: say so
            from ktframe.plugin import manager

            off = manager.disabled()
        print(f"ktframe {args.command}: error: {exc}{f'; {off}' if off else ''}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
